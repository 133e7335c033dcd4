"""Portal pages. Views read through the same tenant-scoped selectors as the API."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.mixins import LoginRequiredMixin
from django.shortcuts import redirect, render
from django.views import View

from tenants import selectors


class DashboardView(LoginRequiredMixin, View):
    template_name = "portal/dashboard.html"

    def get(self, request):
        actor = request.actor
        if not actor:
            return render(request, "portal/no_tenant.html", status=403)
        projects = list(selectors.project_list(actor=actor))
        quotas = list(selectors.quota_list(actor=actor))
        by_project = {p.pk: [q for q in quotas if q.project_id == p.pk] for p in projects}
        context = {
            "tenant": actor.tenant,
            "projects": [(p, by_project[p.pk]) for p in projects],
            "tenant_quotas": selectors.tenant_quota_list(actor=actor),
        }
        return render(request, self.template_name, context)


class TenantSwitchView(LoginRequiredMixin, View):
    """Choose which of the user's tenants the portal shows (POST, CSRF-protected)."""

    def post(self, request):
        slug = request.POST.get("tenant", "")
        if not selectors.membership_list_for_user(user=request.user).filter(tenant__slug=slug).exists():
            messages.error(request, "You are not a member of that tenant.")
        else:
            request.session[selectors.SESSION_TENANT_KEY] = slug
        return redirect("portal:dashboard")
