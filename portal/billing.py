"""Portal pages for money: a tenant's usage, invoices and budgets (spend caps), and the platform's billing
reports and price books.

Tenant pages read through ``billing.selectors`` (scoped like the API) and write through ``billing.services``
(spend caps: admins); the reports and price books are for platform staff only. Charts are drawn server-side
(``presenters.bar_chart``): no JavaScript and no chart library needed.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import date, timedelta

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone

from billing import selectors as billing
from billing import services as billing_services
from billing.choices import CapAction, RateKind
from billing.core.pricing import format_money, from_minor
from billing.selectors import balances, documents, reports
from billing.services import period_bounds, period_parse
from billing.services.metering_run import usage_meter_recent
from core.errors import ApplicationError, NotFound, ValidationFailed
from core.parsers import MAX_ID, parse_integer
from gpus.catalogue import TIER_CODES
from portal import forms, presenters
from portal.ops import StaffView
from portal.views import TenantView
from tenants.selectors import project_get


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
        # this month: the hour in progress metered on demand (usage shows before any hourly run or invoice),
        # and the page says its figures are a live estimate
        metered_until = usage_meter_recent(tenant_id=self.actor.tenant.pk, now=now) if month == this_month else None
        if end > start:  # nothing yet in the first instant of a month
            summaries = {group: billing.usage_summary(actor=self.actor, start=start, end=end, group_by=group)
                         for group in ("project", "model", "day")}
        currency = self.actor.tenant.currency
        days = summaries.get("day", {}).get("groups", [])
        context = {
            "month": month, "months": _months_back(this_month, 12), "error": error, "currency": currency,
            "metered_until": metered_until,
            "by_project": summaries.get("project", {}).get("groups", []),
            "by_model": summaries.get("model", {}).get("groups", []),
            "chart": presenters.bar_chart([(d["key"][8:], float(d["gpu_hours"])) for d in days],
                                          label="GPU-hours per day", unit="GPU-h",
                                          slots=[f"{day:02d}" for day in range(1, (period_bounds(month)[1]
                                                                                   - timedelta(days=1)).day + 1)]),
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
                [(key, float(from_minor(amount, currency))) for key, amount in series],
                label=f"Revenue per month ({currency})", unit=currency,
                slots=[f"{m:%Y-%m}" for m in reversed(_months_back(month, 6))]))
                for currency, series in reports.monthly_series(by_month).items()],
            "slo": reports.slo_attainment(period=month),
            "idle": reports.top_idle_leases(period=month),
            "totals": _totals(by_tenant),
            "corrections": balances.corrections_report(start=period_bounds(month)[0], end=period_bounds(month)[1]),
            "invoices": balances.invoices_of_month(period=month),
        }
        return render(request, self.template_name, context)

    def _csv(self, report: str, start: date, end: date) -> HttpResponse:
        if report not in reports.GROUPS:
            return HttpResponse(f"report must be one of {', '.join(reports.GROUPS)}", status=400,
                                content_type="text/plain")
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([*_key_names(report), "currency", "amount", "gpu_hours", "used_gpu_hours", "idle_gpu_hours",
                         "idle_cost", "over_quota_pct", "drafts", "adjustment"])
        for row in reports.revenue(start=start, end=end, group_by=report):
            # amounts in major units with the currency's own decimals (cents for USD, none for JPY)
            writer.writerow([*row.key, row.currency, from_minor(row.amount_minor, row.currency), row.gpu_hours,
                             round(row.used_gpu_hours, 6), row.idle_gpu_hours,
                             from_minor(round(row.idle_cost_minor), row.currency),
                             "" if row.over_quota_pct is None else round(row.over_quota_pct, 2), row.drafts,
                             row.adjustment])
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



# -- settings: budgets (spend caps) ----------------------------------------------------------------------------
@dataclass(frozen=True)
class BudgetRow:
    """One scope on the Budgets page, ready to display: figures formatted, the bar's widths, the form's key."""

    key: str  # the form's key and element id: "tenant" or the project's slug
    label: str
    project: str  # the project slug posted ("" for the whole tenant)
    cap: object  # billing.models.SpendCap or None
    spent: str
    forecast: str
    cap_text: str  # the cap as typed in the form (major units), "" without one
    cap_money: str  # the cap formatted ("1,000.00 USD"), "" without one
    spent_pct: float  # of the cap (the bar's first part; 0 without a cap)
    running_pct: float  # the running leases' part of the forecast, beyond what is spent
    over: bool


def _budget_rows(budgets: list, currency: str) -> list[BudgetRow]:
    from portal.presenters import _text

    rows = []
    for budget in budgets:
        project = budget.project
        spent_pct = budget.used_pct or 0.0
        rows.append(BudgetRow(
            key=project.slug if project else "tenant",
            label=f"Project {project.name}" if project else "Whole tenant (every project together)",
            project=project.slug if project else "", cap=budget.cap,
            spent=format_money(budget.spent_minor, currency), forecast=format_money(budget.forecast_minor, currency),
            cap_text=_text(from_minor(budget.cap.monthly_minor, currency)) if budget.cap else "",
            cap_money=format_money(budget.cap.monthly_minor, currency) if budget.cap else "",
            spent_pct=spent_pct, running_pct=max(0.0, (budget.forecast_pct or 0.0) - spent_pct), over=budget.over))
    return rows


class BudgetsView(TenantView):
    """This month's spend of the tenant and of each project against its spend cap; admins set, change and
    remove caps (``manage``), everyone in the tenant reads. One form per scope: it creates the scope's cap or
    changes the one there is."""

    template_name = "portal/settings_budgets.html"
    write_action = "manage"

    def render_page(self, request, *, error: ApplicationError | None = None, form: str = "", status: int = 200):
        currency = self.actor.tenant.currency
        errors = forms.FieldErrors()
        if error is not None:
            errors.add(error, shown={"monthly_minor", "action"})
        context = {
            "budgets": _budget_rows(billing.budget_list(actor=self.actor), currency),
            "currency": currency,
            "actions": CapAction.choices,
            "can_manage": self.actor.can("manage"),
            "errors": errors,
            "form": form,
            "values": request.POST if form else {},
            "tab": "budgets",
        }
        return render(request, self.template_name, context, status=status)

    def get(self, request):
        return self.render_page(request)

    def post(self, request):
        slug = request.POST.get("project", "").strip()
        form = slug or "tenant"
        try:
            project = project_get(actor=self.actor, slug=slug) if slug else None
            values = forms.spend_cap_input(request.POST, currency=self.actor.tenant.currency)
            cap = billing.spend_cap_list(actor=self.actor).filter(project=project).first()
            if cap is None:
                cap = billing_services.spend_cap_create(tenant=self.actor.tenant, project=project, actor=self.actor,
                                                        **values)
            else:
                cap = billing_services.spend_cap_update(cap=cap, actor=self.actor, **values)
        except ApplicationError as error:
            return self.render_page(request, error=error, form=form, status=error.status)
        scope = f"project {project.slug}" if project else "the whole tenant"
        messages.success(request, f"Spend cap of {scope}: {format_money(cap.monthly_minor, cap.tenant.currency)} a "
                                  f"month, {cap.get_action_display().lower()}.")
        return redirect("portal:budgets")


class BudgetDeleteView(TenantView):
    http_method_names = ["post"]
    write_action = "manage"

    def post(self, request, pk: int):
        cap = billing.spend_cap_get(actor=self.actor, pk=pk)
        try:
            billing_services.spend_cap_delete(cap=cap, actor=self.actor)
        except ApplicationError as error:
            messages.error(request, error.message)
        else:
            scope = f"project {cap.project.slug}" if cap.project else "the whole tenant"
            messages.success(request, f"The spend cap of {scope} is removed.")
        return redirect("portal:budgets")


# -- platform staff: price books ---------------------------------------------------------------------------------
MIN_RATE_ROWS, SPARE_RATE_ROWS = 8, 3
STATE_LABELS = {"upcoming": "Upcoming", "in_force": "In force", "superseded": "Superseded"}


def _book_form(*, prefix: str, book=None, copy=None, values=None, errors: dict | None = None,
               create: bool) -> dict:
    """The fields of the price-book form: the book's values (or the copied book's, for a new one), or what was
    typed with the service's message under its field when this form was sent and refused."""
    from portal.presenters import FormField, _text

    errors = errors or {}
    source = book or copy
    typed = values is not None

    def field(name: str, label: str, current, *, type_: str = "text", numeric: bool = False) -> FormField:
        value = values.get(name, "") if typed else _text(current)
        return FormField(name, f"{prefix}-{name}", label, value, errors.get(forms.field_key(name), ""), type_, numeric)

    head = [field("name", "Name", (source.name + (" (new)" if copy is not None else "")) if source else ""),
            field("effective_from", "Effective from (UTC)", book.effective_from if book else None,
                  type_="datetime-local")]
    numbers = [field("over_quota_multiplier", "Over-quota multiplier",
                     source.over_quota_multiplier if source else "0.6", numeric=True),
               field("interactive_multiplier", "Interactive multiplier",
                     source.interactive_multiplier if source else "1.25", numeric=True),
               field("profiling_multiplier", "Profiling multiplier (profiling leases)",
                     source.profiling_multiplier if source else "1", numeric=True),
               field("energy_per_kwh", "Energy per kWh (empty: none)", source.energy_per_kwh if source else None,
                     numeric=True)]
    if typed:
        indexes = sorted({int(m.group(1)) for key in values if (m := forms.RATE_ROW.match(key))})
        current = [{"tier": values.get(f"rate-{i}-tier", ""), "kind": values.get(f"rate-{i}-kind", "whole"),
                    "mig_profile": values.get(f"rate-{i}-mig_profile", ""),
                    "per_hour": values.get(f"rate-{i}-per_hour", "")} for i in indexes]
    else:
        current = [{"tier": r.tier, "kind": r.kind, "mig_profile": r.mig_profile, "per_hour": _text(r.per_hour)}
                   for r in (source.rates.all() if source else [])]
    count = max(MIN_RATE_ROWS, len(current) + (0 if typed else SPARE_RATE_ROWS))
    rates = []
    for row in range(count):
        rate = current[row] if row < len(current) else {"tier": "", "kind": "whole", "mig_profile": "", "per_hour": ""}
        rates.append({"row": str(row), **rate,  # a string: the template joins it into element ids
                      "errors": {name: errors.get(f"rate_{row}_{name}", "")
                                 for name in ("tier", "kind", "mig_profile", "per_hour")}})
    return {"prefix": prefix, "head": head, "numbers": numbers, "rates": rates, "create": create,
            "currency": values.get("currency", "") if typed else (source.currency if source else "USD"),
            "tenant": values.get("tenant", "") if typed else (source.tenant.slug if source and source.tenant else ""),
            "errors": errors, "general": errors.get("__all__", "")}


def _field_errors(error: ApplicationError | None, rows: list[int], shown: set[str]) -> forms.FieldErrors:
    errors = forms.FieldErrors()
    if error is not None:
        key = forms.field_key(forms.rate_field(error.field, rows))
        errors[key if key in shown or key.startswith("rate_") else "__all__"] = error.message
    return errors


BOOK_FIELDS_SHOWN = {"name", "effective_from", "over_quota_multiplier", "interactive_multiplier",
                     "profiling_multiplier", "energy_per_kwh", "currency", "tenant"}


class PriceBookListView(StaffView):
    """Every price book by scope (the general list of each currency, then each tenant's own), with its state;
    a form for a new book (``?copy=<id>`` starts from a book's values: changing prices is a new book from a
    date). Books that have not started open for editing (``PriceBookDetailView``)."""

    template_name = "ops/price_books.html"

    def render_page(self, request, *, error: ApplicationError | None = None, rows: list[int] | None = None,
                    status: int = 200):
        from tenants.choices import CURRENCIES
        from tenants.selectors import platform_tenant_list

        states = billing.price_book_states()
        scopes: dict[str, list] = {}
        for book in billing.price_book_list():
            label = f"Tenant {book.tenant.slug} ({book.currency})" if book.tenant else f"General list, {book.currency}"
            scopes.setdefault(label, []).append({"book": book, "state": states.get(book.pk, "upcoming"),
                                                 "state_label": STATE_LABELS[states.get(book.pk, "upcoming")]})
        copy = None
        if request.method == "GET" and request.GET.get("copy", ""):
            copy = billing.price_book_get(pk=parse_integer(request.GET["copy"], field="copy", low=1, high=MAX_ID))
        errors = _field_errors(error, rows or [], BOOK_FIELDS_SHOWN)
        context = {
            "scopes": list(scopes.items()),
            "new_form": _book_form(prefix="book-new", copy=copy, values=request.POST if error else None,
                                   errors=errors, create=True),
            "copy": copy,
            "currencies": CURRENCIES,
            "tenants": platform_tenant_list(),
            "tiers": TIER_CODES,
            "kinds": RateKind.choices,
        }
        return render(request, self.template_name, context, status=status)

    def get(self, request):
        return self.render_page(request)

    def post(self, request):
        from tenants.selectors import platform_tenant_get

        rows: list[int] = []
        try:
            values, rows = forms.price_book_input(request.POST, create=True)
            slug = values.pop("tenant")
            tenant = None
            if slug:
                try:
                    tenant = platform_tenant_get(slug=slug)
                except NotFound as error:
                    raise ValidationFailed(error.message, field="tenant") from None
            book = billing_services.price_book_create(tenant=tenant, by_user=request.user, **values)
        except ApplicationError as error:
            return self.render_page(request, error=error, rows=rows, status=error.status)
        messages.success(request, f"Price book {book.name} created: its prices apply from "
                                  f"{book.effective_from:%Y-%m-%d %H:%M} UTC.")
        return redirect("portal:ops-price-book", pk=book.pk)


class PriceBookDetailView(StaffView):
    """One book and its rates; while it has not started, the form to change it and a button to delete it."""

    template_name = "ops/price_book_detail.html"

    def render_page(self, request, pk: int, *, error: ApplicationError | None = None, rows: list[int] | None = None,
                    status: int = 200):
        book = billing.price_book_get(pk=pk)
        state = billing.price_book_states().get(book.pk, "upcoming")
        errors = _field_errors(error, rows or [], BOOK_FIELDS_SHOWN)
        context = {
            "book": book,
            "state": state,
            "state_label": STATE_LABELS[state],
            "editable": state == "upcoming",
            "error": error.message if error is not None else "",
            "form": _book_form(prefix=f"book-{book.pk}", book=book, values=request.POST if error else None,
                               errors=errors, create=False),
            "tiers": TIER_CODES,
            "kinds": RateKind.choices,
        }
        return render(request, self.template_name, context, status=status)

    def get(self, request, pk: int):
        return self.render_page(request, pk)

    def post(self, request, pk: int):
        book = billing.price_book_get(pk=pk)
        rows: list[int] = []
        try:
            values, rows = forms.price_book_input(request.POST, create=False)
            book = billing_services.price_book_update(book=book, changes=values, by_user=request.user)
        except ApplicationError as error:
            return self.render_page(request, pk, error=error, rows=rows, status=error.status)
        messages.success(request, f"Price book {book.name} saved.")
        return redirect("portal:ops-price-book", pk=book.pk)


class PriceBookDeleteView(StaffView):
    http_method_names = ["post"]

    def post(self, request, pk: int):
        book = billing.price_book_get(pk=pk)
        try:
            billing_services.price_book_delete(book=book, by_user=request.user)
        except ApplicationError as error:
            messages.error(request, error.message)
            return redirect("portal:ops-price-book", pk=pk)
        messages.success(request, f"Price book {book.name} deleted.")
        return redirect("portal:ops-price-books")


# -- platform staff: one invoice, its credit notes and void -------------------------------------------------------
CREDIT_NOTE_FIELDS = {"scope", "amount", "reason", "memo", "lines"}


class StaffInvoiceView(StaffView):
    """One invoice for platform staff (``/ops/billing/invoices/<pk>``): its lines with what is left to credit, its
    balance, its credit notes with their Stripe state; a form to issue a credit note (the whole invoice or per
    line, a reason, a memo) and a button to void it here (``billing.services.credit_notes``, which audit each
    write). Errors are shown by their field."""

    template_name = "ops/invoice_detail.html"

    def render_page(self, request, pk: int, *, errors: forms.FieldErrors | None = None, void_error: str = "",
                    status: int = 200):
        from billing.choices import CreditNoteReason, InvoiceStatus

        detail = balances.staff_invoice_detail(pk=pk)
        invoice = detail["invoice"]
        posted = request.POST if errors or void_error else {}
        errors = errors or forms.FieldErrors()
        context = {
            **detail,
            "line_rows": [{"line": line, "field": f"line_{line.position}",
                           "value": posted.get(f"line_{line.position}", ""),
                           "error": errors.get(f"line_{line.position}", "")} for line in detail["lines"]],
            "errors": errors,
            "void_error": void_error,
            "reasons": CreditNoteReason.choices,
            "creditable": invoice.status in (InvoiceStatus.FINALIZED, InvoiceStatus.PAID),
            "voidable": invoice.status == InvoiceStatus.FINALIZED,
            "form": {"scope": posted.get("scope", "whole"), "amount": posted.get("amount", ""),
                     "reason": posted.get("reason", ""), "memo": posted.get("memo", ""),
                     "void_memo": posted.get("void_memo", "") if void_error else ""},
        }
        return render(request, self.template_name, context, status=status)

    def get(self, request, pk: int):
        return self.render_page(request, pk)

    def post(self, request, pk: int):
        """``action=void`` voids the invoice here (memo ``void_memo``); anything else issues a credit note."""
        from billing.services.credit_notes import credit_note_issue, invoice_void

        detail = balances.staff_invoice_detail(pk=pk)
        invoice = detail["invoice"]
        if request.POST.get("action") == "void":
            try:
                invoice_void(invoice=invoice, memo=request.POST.get("void_memo", ""), by_user=request.user)
            except ApplicationError as error:
                return self.render_page(request, pk, void_error=error.message, status=error.status)
            messages.success(request, f"Invoice {invoice.number} voided here, with its credit note for what was left; "
                                      f"the Stripe invoice is voided after it.")
            return redirect("portal:ops-invoice", pk=pk)
        positions = [line.position for line in detail["lines"]]
        names: dict[str, str] = {}
        try:
            values, names = forms.credit_note_input(request.POST, positions=positions, currency=invoice.currency)
            note = credit_note_issue(invoice=invoice, by_user=request.user, **values)
        except ApplicationError as error:
            error.field = names.get(error.field or "", error.field)
            shown = CREDIT_NOTE_FIELDS | {f"line_{position}" for position in positions}
            return self.render_page(request, pk, errors=forms.FieldErrors(error, shown=shown), status=error.status)
        amount = format_money(note.amount_minor, note.currency)
        messages.success(request, f"Credit note {note.number} issued for {amount}; it goes to Stripe after the "
                                  f"invoice.")
        return redirect("portal:ops-invoice", pk=pk)
