"""Portal pages for cost allocation, spend alerts and exports (issue 33): a month's charges by label, requesting user
or project (and its CSV), the tenant's label keys (admins), an invoice's FOCUS export and breakdown CSV, and the spend
alert rules with the alerts raised. Reads through ``billing.selectors``, writes through the services (admins)."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect, render
from django.utils import timezone

from billing import selectors as billing
from billing.core.pricing import format_money
from billing.selectors import allocation
from billing.selectors.alerts import spend_alert_list, spend_alert_rule_get, spend_alert_rule_list
from billing.services import alerts, period_parse
from core.errors import ApplicationError, ValidationFailed
from portal import forms
from portal.views import TenantView
from tenants import services as tenant_services
from tenants.selectors import project_get, project_list


def _month(request):
    raw = request.GET.get("month", "")
    this_month = timezone.now().date().replace(day=1)
    if not raw:
        return this_month, ""
    try:
        return period_parse(raw), ""
    except ValidationFailed as error:
        return this_month, error.message


class UsageBreakdownView(TenantView):
    """A month's usage charges by label, user or project; ``format=csv`` downloads it. Admins set the label keys."""

    template_name = "portal/usage_breakdown.html"
    write_action = "manage"

    def render_page(self, request, *, error: ApplicationError | None = None, status: int = 200):
        month, month_error = _month(request)
        by = request.GET.get("by", "project")
        tenant = self.actor.tenant
        breakdown, by_error = None, ""
        try:
            breakdown = allocation.usage_breakdown(tenant=tenant, period=month, by=by)
        except ValidationFailed as failed:
            by_error = failed.message
        if breakdown is not None and request.GET.get("format") == "csv":
            from billing.api.allocation import csv_response

            return csv_response(allocation.breakdown_csv(breakdown), f"usage-{month:%Y-%m}-{by.replace(':', '-')}")
        rows = [] if breakdown is None else [
            {**group, "amount": format_money(group["amount_minor"], tenant.currency)} for group in breakdown["groups"]]
        context = {
            "month": month, "by": by, "error": month_error or by_error, "rows": rows,
            "total": format_money(breakdown["total_minor"], tenant.currency) if breakdown else "",
            "choices": [("project", "Project"), ("user", "Requesting user")]
            + [(f"label:{key}", f"Label {key}") for key in tenant.allowed_label_keys],
            "label_keys": tenant.allowed_label_keys, "own_keys": bool(tenant.label_keys),
            "can_manage": self.actor.can("manage"), "keys_error": error.message if error else "",
        }
        return render(request, self.template_name, context, status=status)

    def get(self, request):
        return self.render_page(request)

    def post(self, request):
        keys = [k.strip() for k in request.POST.get("label_keys", "").split(",") if k.strip()]
        try:
            tenant_services.tenant_label_keys_set(actor=self.actor, keys=keys)
        except ApplicationError as error:
            return self.render_page(request, error=error, status=error.status)
        messages.success(request, "Label keys saved.")
        return redirect("portal:usage-breakdown")


class InvoiceFocusView(TenantView):
    def get(self, request, pk: int, fmt: str):
        from billing.api.allocation import focus_response
        from billing.services import focus

        invoice = billing.invoice_get(actor=self.actor, invoice_id=pk)
        return focus_response(focus.focus_rows(invoice), invoice.number or f"draft-{invoice.pk}", fmt)


class InvoiceBreakdownView(TenantView):
    def get(self, request, pk: int):
        from billing.api.allocation import csv_response

        invoice = billing.invoice_get(actor=self.actor, invoice_id=pk)
        by = request.GET.get("by", "project")
        try:
            result = allocation.invoice_breakdown(invoice=invoice, by=by)
        except ValidationFailed as error:
            messages.error(request, error.message)
            return redirect("portal:invoice", pk=pk)
        return csv_response(allocation.breakdown_csv(result), f"{result['invoice']}-{by.replace(':', '-')}")


class SpendAlertsView(TenantView):
    """The alert rules (admins set and remove them) and the alerts raised, newest first."""

    template_name = "portal/settings_spend_alerts.html"
    write_action = "manage"

    def render_page(self, request, *, error: ApplicationError | None = None, status: int = 200):
        currency = self.actor.tenant.currency
        errors = forms.FieldErrors()
        if error is not None:
            errors.add(error, shown={"project", "thresholds_pct", "budget_minor", "forecast"})
        alerts_raised = list(spend_alert_list(actor=self.actor)[:50])
        for alert in alerts_raised:
            alert.amount_display = format_money(alert.amount_minor, currency)
        rules = list(spend_alert_rule_list(actor=self.actor))
        for rule in rules:
            rule.budget_display = format_money(rule.budget_minor, currency) if rule.budget_minor else "its spend cap"
        context = {"rules": rules, "alerts": alerts_raised, "projects": list(project_list(actor=self.actor)),
                   "currency": currency, "can_manage": self.actor.can("manage"), "errors": errors,
                   "values": request.POST if error else {}, "tab": "spend-alerts"}
        return render(request, self.template_name, context, status=status)

    def get(self, request):
        return self.render_page(request)

    def post(self, request):
        data = request.POST
        try:
            if data.get("delete"):
                rule = spend_alert_rule_get(actor=self.actor, pk=forms.number(data.get("delete")))
                alerts.spend_alert_rule_delete(actor=self.actor, rule=rule)
                messages.success(request, "Alert rule removed.")
                return redirect("portal:spend-alerts")
            slug = data.get("project", "").strip()
            project = project_get(actor=self.actor, slug=slug) if slug else None
            thresholds = [forms.number(t) for t in data.get("thresholds_pct", "").split(",") if t.strip()] or None
            budget = data.get("budget", "").strip()
            budget_minor = forms.money_minor(budget, self.actor.tenant.currency, "budget_minor") \
                if budget else None
            alerts.spend_alert_rule_set(actor=self.actor, project=project, thresholds_pct=thresholds,
                                        budget_minor=budget_minor, forecast=data.get("forecast") == "on")
        except ApplicationError as error:
            return self.render_page(request, error=error, status=error.status)
        messages.success(request, "Alert rule saved.")
        return redirect("portal:spend-alerts")

