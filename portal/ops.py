"""Platform staff pages: the fleet map, the queue, tenants (quotas, SLO contracts, billing terms, suspension).

Staff act on the platform, not inside a tenant, so these pages read through the platform selectors
(``broker.selectors.node_list``…, ``tenants.selectors.platform_*``) and write through the same services
the Django admin and the management commands use, with the same error messages."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone

from broker import selectors as broker
from broker import services as broker_services
from core.errors import ApplicationError
from gpus.catalogue import TIER_CODES
from portal import forms, presenters
from portal.views import PortalView
from tenants import selectors, services
from tenants.choices import SloMetric, TenantStatus


class StaffView(PortalView):
    """Platform staff only (``is_staff``); everyone else gets 403."""

    def dispatch(self, request, *args, **kwargs):
        if request.user.is_authenticated and not request.user.is_staff:
            return self.handle_no_permission()
        return super().dispatch(request, *args, **kwargs)


# -- fleet -----------------------------------------------------------------------------------------------
class FleetView(StaffView):
    template_name = "ops/fleet.html"

    def get(self, request):
        nodes = list(broker.node_list())
        allocations = list(broker.allocation_list_live())
        utilisation = broker.fleet_utilisation()
        tenants = list({a.lease.tenant_id: a.lease.tenant for a in allocations}.values())
        cards, colours = presenters.fleet_map(nodes, allocations, tenants, utilisation)
        legend = sorted(((t.slug, t.name, colours[t.pk]) for t in tenants), key=lambda item: item[0])
        gpus = sum(len(card.gpus) for card in cards)
        context = {
            "cards": cards,
            "legend": legend,
            "telemetry_down": utilisation is None,
            "totals": {"nodes": len(cards), "gpus": gpus, "allocations": len(allocations),
                       "cordoned": sum(card.cordoned for card in cards)},
            "now": timezone.now(),
        }
        if request.htmx and request.htmx.target == "fleet-live":
            return render(request, "ops/partials/_fleet.html", context)
        return render(request, self.template_name, context)


class NodeCordonView(StaffView):
    def post(self, request, node_id: str):
        node = broker.node_get(node_id=node_id)
        reason = request.POST.get("reason", "").strip()[:200]
        if request.POST.get("action") == "uncordon":
            broker_services.node_uncordon(node=node, by_user=request.user, reason=reason)
            messages.success(request, f"{node.node_id} is open to new work again.")
        else:
            broker_services.node_cordon(node=node, by_user=request.user, reason=reason)
            messages.success(request, f"{node.node_id} is cordoned: no new work is placed there; running leases "
                                      f"keep running.")
        return redirect(f"{reverse('portal:fleet')}#node-{node.node_id}")


# -- queue -----------------------------------------------------------------------------------------------
class QueueView(StaffView):
    template_name = "ops/queue.html"

    def get(self, request):
        pools: dict[str, list] = {}
        for lease in broker.queue_list():
            pool = lease.models_allowed[0] if lease.models_allowed else "auto"
            pools.setdefault(pool, []).append((lease, presenters.shape_label(lease)))
        ordered = sorted(pools.items(), key=lambda item: (item[0] == "auto", item[0]))
        context = {"pools": ordered, "total": sum(len(items) for _, items in ordered), "now": timezone.now()}
        if request.htmx and request.htmx.target == "queue-live":
            return render(request, "ops/partials/_queue.html", context)
        return render(request, self.template_name, context)


# -- tenants ---------------------------------------------------------------------------------------------
class TenantListView(StaffView):
    template_name = "ops/tenants.html"

    def get(self, request):
        return render(request, self.template_name, {"tenants": selectors.platform_tenant_list()})


class TenantNewView(StaffView):
    """The new-tenant page: ``tenant_create`` as the admin and the staff API call it (the same checks and
    messages, audited in the staff user's name); a refusal comes back under its field with the values as typed."""

    template_name = "ops/tenant_new.html"

    def render_form(self, request, *, error: ApplicationError | None = None, status: int = 200):
        from tenants.choices import CURRENCIES

        errors = forms.FieldErrors(error, shown={"name", "slug", "billing_email", "currency"})
        return render(request, self.template_name, {"errors": errors, "values": request.POST,
                                                    "currencies": CURRENCIES}, status=status)

    def get(self, request):
        return self.render_form(request)

    def post(self, request):
        try:
            tenant = services.tenant_create(
                name=request.POST.get("name", ""), slug=request.POST.get("slug", "").strip(),
                billing_email=request.POST.get("billing_email", "").strip(),
                currency=request.POST.get("currency", "USD"), by_user=request.user)
        except ApplicationError as error:
            return self.render_form(request, error=error, status=error.status)
        messages.success(request, f"Tenant {tenant.name} created. Set its quotas and add its projects below.")
        return redirect("portal:ops-tenant", slug=tenant.slug)


def _terms_context(tenant) -> dict:
    """The billing-terms card: every start (the latest first, amounts formatted), the terms of this month's
    invoice, and the form's defaults (this month, the terms in force)."""
    from billing import selectors as billing
    from billing.core.pricing import format_money, from_minor
    from portal.presenters import _text

    now = timezone.now()
    in_force = billing.billing_terms_in_force(tenant=tenant, at=now)
    rows = [{"terms": terms, "commit": format_money(terms.monthly_commit_minor, tenant.currency),
             "current": in_force is not None and terms.pk == in_force.pk}
            for terms in billing.billing_terms_list(tenant=tenant)]
    return {"rows": rows, "in_force": in_force, "this_month": f"{now:%Y-%m}",
            "discount": _text(in_force.discount_pct) if in_force else "0",
            "commit": _text(from_minor(in_force.monthly_commit_minor, tenant.currency)) if in_force else "0"}


class TenantDetailView(StaffView):
    """Quotas (tenant and project), SLO contracts, billing terms and the tenant's status, each an inline form; a form
    that fails comes back with the service's message under the field and the values as typed."""

    template_name = "ops/tenant_detail.html"

    def render_page(self, request, slug: str, *, form: str = "", error: ApplicationError | None = None,
                    field: str | None = None, status: int = 200):
        tenant = selectors.platform_tenant_get(slug=slug)
        errors = forms.FieldErrors()
        if error is not None:
            errors[forms.field_key(field if field is not None else error.field) or "__all__"] = error.message
        values = request.POST if form else {}
        contract_forms = [
            presenters.contract_form(f"contract-{c.pk}", c, form=form, values=values, errors=errors,
                                     step_rows=forms.SLO_STEP_ROWS)
            for c in selectors.platform_slo_contract_list(tenant=tenant)]
        context = {
            "tenant": tenant,
            "tenant_quotas": selectors.platform_tenant_quota_list(tenant=tenant),
            "projects": selectors.platform_project_list(tenant=tenant),
            "contract_forms": contract_forms,
            "new_contract_form": presenters.contract_form("contract-new", None, form=form, values=values,
                                                          errors=errors, step_rows=forms.SLO_STEP_ROWS),
            "tiers": TIER_CODES,
            "metrics": SloMetric.choices,
            "form": form,
            "errors": errors,
            "values": values,
            "statuses": TenantStatus,
            "terms": _terms_context(tenant),
        }
        return render(request, self.template_name, context, status=status)

    def get(self, request, slug: str):
        return self.render_page(request, slug)


class TenantStatusView(TenantDetailView):
    def post(self, request, slug: str):
        tenant = selectors.platform_tenant_get(slug=slug)
        status = request.POST.get("status", "")
        try:
            tenant = services.tenant_set_status(tenant=tenant, status=status, by_user=request.user,
                                                reason=request.POST.get("reason", "").strip()[:200])
        except ApplicationError as error:
            return self.render_page(request, slug, form="status", error=error, status=error.status)
        messages.success(request, f"{tenant.name} is {tenant.get_status_display().lower()}."
                         + (" Its running leases are being released and its queued ones held; members can look and "
                            "release but start no new work." if tenant.status == "suspended" else ""))
        return redirect("portal:ops-tenant", slug=slug)


class TenantQuotaSetView(TenantDetailView):
    def post(self, request, slug: str):
        tenant = selectors.platform_tenant_get(slug=slug)
        form = request.POST.get("form", "tenant-quota")
        try:
            quota = services.tenant_quota_set(tenant=tenant, by_user=request.user,
                                              **forms.quota_input(request.POST, with_weight=False))
        except ApplicationError as error:
            return self.render_page(request, slug, form=form, error=error, status=error.status)
        messages.success(request, f"Tenant quota for {quota.tier} saved.")
        return redirect("portal:ops-tenant", slug=slug)


class ProjectQuotaSetView(TenantDetailView):
    def post(self, request, slug: str):
        tenant = selectors.platform_tenant_get(slug=slug)
        form = request.POST.get("form", "project-quota")
        project = selectors.platform_project_list(tenant=tenant).filter(slug=request.POST.get("project", "")).first()
        if project is None:
            error = ApplicationError(f"No project {request.POST.get('project', '')!r} in this tenant.",
                                     field="project")
            return self.render_page(request, slug, form=form, error=error, status=404)
        try:
            quota = services.quota_set(project=project, by_user=request.user,
                                       **forms.quota_input(request.POST, with_weight=True))
        except ApplicationError as error:
            return self.render_page(request, slug, form=form, error=error, status=error.status)
        messages.success(request, f"Quota of {project.slug} for {quota.tier} saved.")
        return redirect("portal:ops-tenant", slug=slug)


class ProjectStatusView(TenantDetailView):
    """Suspend or reactivate one project (``project_set_status``, as the staff API does)."""

    def post(self, request, slug: str, project: str):
        tenant = selectors.platform_tenant_get(slug=slug)
        target = selectors.platform_project_list(tenant=tenant).filter(slug=project).first()
        if target is None:
            error = ApplicationError(f"No project {project!r} in this tenant.", field="project")
            return self.render_page(request, slug, form=f"ps-{project}", error=error, status=404)
        try:
            target = services.project_set_status(project=target, status=request.POST.get("status", ""),
                                                 by_user=request.user,
                                                 reason=request.POST.get("reason", "").strip()[:200])
        except ApplicationError as error:
            return self.render_page(request, slug, form=f"ps-{project}", error=error, status=error.status)
        messages.success(request, f"Project {target.slug} is {target.get_status_display().lower()}."
                         + (" It takes no new lease requests; its running leases keep running."
                            if target.status == "suspended" else ""))
        return redirect("portal:ops-tenant", slug=slug)


class SloContractSaveView(TenantDetailView):
    def post(self, request, slug: str, pk: int | None = None):
        tenant = selectors.platform_tenant_get(slug=slug)
        contract = selectors.platform_slo_contract_get(tenant=tenant, pk=pk) if pk else None
        form = f"contract-{pk}" if pk else "contract-new"
        rows: list[int] = []
        try:
            values, rows = forms.slo_contract_input(request.POST)
            contract = services.slo_contract_save(tenant=tenant, contract=contract, by_user=request.user, **values)
        except ApplicationError as error:
            return self.render_page(request, slug, form=form, error=error, status=error.status,
                                    field=forms.slo_step_field(error.field, rows))
        messages.success(request, f"SLO contract {contract.name} saved.")
        return redirect("portal:ops-tenant", slug=slug)


class BillingTermsSetView(TenantDetailView):
    """The terms form: a discount and a committed monthly minimum (in the tenant's currency) from a month on."""

    def post(self, request, slug: str):
        from billing import services as billing_services
        from billing.core.pricing import format_money

        tenant = selectors.platform_tenant_get(slug=slug)
        try:
            values = forms.billing_terms_input(request.POST, currency=tenant.currency)
            terms = billing_services.billing_terms_set(tenant=tenant, by_user=request.user, **values)
        except ApplicationError as error:
            return self.render_page(request, slug, form="terms", error=error, status=error.status)
        messages.success(request, f"Billing terms of {tenant.name} from {terms.effective_from:%Y-%m}: discount "
                                  f"{terms.discount_pct}%, committed minimum "
                                  f"{format_money(terms.monthly_commit_minor, tenant.currency)} a month.")
        return redirect("portal:ops-tenant", slug=slug)
