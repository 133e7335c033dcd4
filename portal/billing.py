"""Portal pages for money: a tenant's usage and invoices, and the platform's billing reports.

Tenant pages read through ``billing.selectors`` (scoped like the API); the reports are for platform
staff only and read ``billing.reports``. Charts are drawn server-side (``presenters.bar_chart``): no
JavaScript and no chart library needed.
"""

from __future__ import annotations

import csv
import io
from datetime import date

from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone

from billing import documents, reports
from billing import selectors as billing
from billing.pricing import format_money
from billing.services import period_bounds, period_parse
from config.errors import ValidationFailed
from portal import presenters
from portal.ops import StaffView
from portal.views import TenantView


def _month(request, default: date) -> tuple[date, str]:
    raw = request.GET.get("month", "")
    if not raw:
        return default, ""
    try:
        return period_parse(raw), ""
    except ValidationFailed as error:
        return default, error.message


def _months_back(month: date, count: int) -> list[date]:
    out = [month]
    for _ in range(count - 1):
        previous = out[-1]
        out.append(date(previous.year - (previous.month == 1), (previous.month - 2) % 12 + 1, 1))
    return out


class UsageView(TenantView):
    template_name = "portal/usage.html"

    def get(self, request):
        now = timezone.now()
        this_month = now.date().replace(day=1)
        month, error = _month(request, this_month)
        start, end = period_bounds(month)
        end = min(end, now) if month == this_month else end
        summaries = {}
        if end > start:  # nothing yet in the first instant of a month
            summaries = {group: billing.usage_summary(actor=self.actor, start=start, end=end, group_by=group)
                         for group in ("project", "model", "day")}
        currency = self.actor.tenant.currency
        days = summaries.get("day", {}).get("groups", [])
        context = {
            "month": month, "months": _months_back(this_month, 12), "error": error, "currency": currency,
            "by_project": summaries.get("project", {}).get("groups", []),
            "by_model": summaries.get("model", {}).get("groups", []),
            "chart": presenters.bar_chart([(d["key"][8:], float(d["gpu_hours"])) for d in days],
                                          label="GPU-hours per day", unit="GPU-h"),
            "money": lambda minor: format_money(minor, currency),
        }
        for rows in (context["by_project"], context["by_model"]):
            for row in rows:
                row["amount"] = "—" if row["amount_minor"] is None else format_money(row["amount_minor"], currency)
                row["active_pct"] = None if row["engine_active_avg"] is None else float(row["engine_active_avg"]) * 100
        return render(request, self.template_name, context)


class InvoiceListView(TenantView):
    template_name = "portal/invoices.html"

    def get(self, request):
        invoices = list(billing.invoice_list(actor=self.actor))
        for invoice in invoices:
            invoice.total_display = format_money(invoice.total_minor, invoice.currency)
        return render(request, self.template_name, {"invoices": invoices})


class InvoiceDetailView(TenantView):
    template_name = "portal/invoice_detail.html"

    def get(self, request, pk: int):
        invoice = billing.invoice_get(actor=self.actor, invoice_id=pk)
        return render(request, self.template_name, documents.invoice_context(invoice))


class InvoiceDocumentView(TenantView):
    def get(self, request, pk: int, fmt: str):
        return documents.invoice_download(billing.invoice_get(actor=self.actor, invoice_id=pk), fmt)


# -- platform staff ------------------------------------------------------------------------------------------
class BillingReportView(StaffView):
    template_name = "ops/billing.html"

    def get(self, request):
        now = timezone.now()
        this_month = now.date().replace(day=1)
        month, error = _month(request, this_month)
        start, end = month, period_bounds(month)[1].date()
        report = request.GET.get("report", "")
        by_tenant = reports.revenue(start=start, end=end, group_by="tenant")
        if request.GET.get("format") == "csv":
            return self._csv(report or "tenant", start, end)
        history_start = _months_back(month, 6)[-1]
        by_month = reports.revenue(start=history_start, end=end, group_by="month")
        context = {
            "month": month, "months": _months_back(this_month, 12), "error": error,
            "by_tenant": by_tenant,
            "by_project": reports.revenue(start=start, end=end, group_by="project"),
            "by_model": reports.revenue(start=start, end=end, group_by="model"),
            "revenue_charts": [(currency, presenters.bar_chart(
                [(key, amount / 100) for key, amount in series], label=f"Revenue per month ({currency})",
                unit=currency)) for currency, series in reports.monthly_series(by_month).items()],
            "slo": reports.slo_attainment(period=month),
            "idle": reports.top_idle_leases(period=month),
            "totals": _totals(by_tenant),
        }
        return render(request, self.template_name, context)

    def _csv(self, report: str, start: date, end: date) -> HttpResponse:
        if report not in reports.GROUPS:
            return HttpResponse(f"report must be one of {', '.join(reports.GROUPS)}", status=400,
                                content_type="text/plain")
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([*_key_names(report), "currency", "amount", "gpu_hours", "used_gpu_hours", "idle_gpu_hours",
                         "idle_cost", "over_quota_pct", "drafts"])
        for row in reports.revenue(start=start, end=end, group_by=report):
            writer.writerow([*row.key, row.currency, row.amount_minor / 100, row.gpu_hours,
                             round(row.used_gpu_hours, 6), row.idle_gpu_hours, round(row.idle_cost_minor / 100, 2),
                             "" if row.over_quota_pct is None else round(row.over_quota_pct, 2), row.drafts])
        response = HttpResponse(out.getvalue(), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="revenue-{report}-{start:%Y-%m}.csv"'
        return response


def _key_names(report: str) -> list[str]:
    return {"tenant": ["tenant"], "project": ["tenant", "project"], "model": ["model"], "month": ["month"]}[report]


def _totals(rows: list[reports.Row]) -> list[dict]:
    by_currency: dict[str, dict] = {}
    for row in rows:
        total = by_currency.setdefault(row.currency, {"currency": row.currency, "amount": 0, "gpu_hours": 0,
                                                      "idle_gpu_hours": 0, "idle_cost": 0, "used": 0, "measured": 0,
                                                      "over": 0})
        total["amount"] += row.amount_minor
        total["gpu_hours"] += row.gpu_hours
        total["idle_gpu_hours"] += row.idle_gpu_hours
        total["idle_cost"] += row.idle_cost_minor
        total["used"] += row.used_gpu_hours
        total["measured"] += row.measured_gpu_hours
        total["over"] += row.over_quota_gpu_hours
    out = []
    for total in by_currency.values():
        out.append({
            "currency": total["currency"], "amount": format_money(total["amount"], total["currency"]),
            "gpu_hours": total["gpu_hours"], "idle_gpu_hours": total["idle_gpu_hours"],
            "idle_cost": format_money(round(total["idle_cost"]), total["currency"]),
            "used_pct": float(total["used"] / total["measured"] * 100) if total["measured"] else None,
            "over_pct": float(total["over"] / total["gpu_hours"] * 100) if total["gpu_hours"] else None,
        })
    return out

