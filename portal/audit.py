"""The tenant's audit trail in the portal (``/settings/audit``), for its admins and owners: the same reader as
``GET /api/v1/audit-events`` (``tenants.audit.audit_event_list``), filtered by the same parameters, one page of
the newest events at a time; the CSV link is the API's (the browser's session authenticates it)."""

from __future__ import annotations

from urllib.parse import urlencode

from django.shortcuts import render

from portal.views import TenantView
from tenants.api.audit import moment_param
from tenants.audit import audit_event_list

PAGE_SIZE = 100
FILTERS = ("actor", "kind", "object", "since", "until")


class AuditView(TenantView):
    template_name = "portal/settings_audit.html"
    http_method_names = ["get"]

    def get(self, request):
        filters = {name: request.GET.get(name, "").strip() for name in FILTERS}
        events = audit_event_list(actor=self.actor, username=filters["actor"], kind=filters["kind"],
                                  target=filters["object"], since=moment_param(request, "since") if filters["since"]
                                  else None, until=moment_param(request, "until") if filters["until"] else None)
        query = urlencode({name: value for name, value in filters.items() if value})
        return render(request, self.template_name, {
            "events": list(events[:PAGE_SIZE]), "filters": filters, "page_size": PAGE_SIZE, "tab": "audit",
            "csv_url": f"/api/v1/audit-events?{query + '&' if query else ''}format=csv"})
