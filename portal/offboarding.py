"""The tenant's exports and its closure in the portal (``/settings/exports``), for its owners: the same services
as ``/api/v1/tenant/exports`` and ``/api/v1/tenant/close`` (``tenants.offboarding``); the zip downloads from the
API's archive route (the browser's session authenticates it)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import logout
from django.shortcuts import redirect, render

from core.errors import ApplicationError
from portal.views import TenantView
from tenants import offboarding


class ExportsView(TenantView):
    template_name = "portal/settings_exports.html"
    write_action = "leave"  # taking one's data out: allowed while suspended; the service requires an owner

    def render_page(self, request, *, error=None, status=200):
        return render(request, self.template_name, {
            "exports": list(offboarding.tenant_export_list(actor=self.actor)[:20]), "tab": "exports",
            "error": error}, status=status)

    def get(self, request):
        return self.render_page(request)

    def post(self, request):
        export = offboarding.tenant_export_request(actor=self.actor)
        messages.success(request, f"Export {export.pk} requested; it is built in the background. Reload this page "
                                  f"to download it once ready.")
        return redirect("portal:exports")


class TenantCloseView(ExportsView):
    http_method_names = ["post"]

    def post(self, request):
        try:
            tenant = offboarding.tenant_close(actor=self.actor, confirm=request.POST.get("confirm", ""))
        except ApplicationError as error:
            if error.status == 403:
                raise
            return self.render_page(request, error=error.message, status=error.status)
        logout(request)  # the closing owner's own account may just have been pseudonymised
        messages.success(request, f"{tenant.name} is closed.")
        return redirect("login")
