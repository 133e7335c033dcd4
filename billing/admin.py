"""Django admin for money that people set: price books (with their rates inline), billing terms and spend caps.

Every save and delete goes through ``billing.services`` (``price_book_create`` / ``_update`` / ``_delete``,
``billing_terms_set`` / ``_delete``, ``spend_cap_create`` / ``_update`` / ``_delete``), so the admin keeps
the same rules as the API and the portal — a book that has started is read-only, terms of past months stay,
one cap per scope — and every change is audited. Each admin write is one service call (``core.admin.ServiceAdmin``:
no wrapping transaction); a refusal comes back as a message, nothing saved."""

from __future__ import annotations

from datetime import UTC

from django.contrib import admin
from django.utils import timezone

from billing import services
from billing.models import (
    BillingTerms,
    CreditDraw,
    CreditGrant,
    CreditNote,
    CreditNoteLine,
    DunningCase,
    DunningTerms,
    Payment,
    PriceBook,
    PriceRate,
    Refund,
    SpendAlert,
    SpendAlertRule,
    SpendCap,
    TaxProfile,
    TaxRate,
)
from billing.services.credit_notes import credit_note_issue, payment_record, refund_record
from billing.services.credits import credit_grant_create
from billing.services.dunning import dunning_terms_set
from billing.services.tax import tax_profile_set, tax_rate_create, tax_rate_deactivate
from core.admin import ReadOnlyAdmin, ServiceAdmin


# -- price books -------------------------------------------------------------------------------------------------
class PriceRateInline(admin.TabularInline):
    model = PriceRate
    extra = 3
    fields = ["tier", "kind", "mig_profile", "per_hour"]

    def has_change_permission(self, request, obj=None):
        return super().has_change_permission(request, obj) and (obj is None or _upcoming(obj))

    def has_add_permission(self, request, obj=None):
        return super().has_add_permission(request, obj) and (obj is None or _upcoming(obj))

    def has_delete_permission(self, request, obj=None):
        return super().has_delete_permission(request, obj) and (obj is None or _upcoming(obj))


def _upcoming(book: PriceBook) -> bool:
    return book.effective_from > timezone.now()


@admin.register(PriceBook)
class PriceBookAdmin(ServiceAdmin):
    """A book that has not started can change (its rates are replaced as a whole by what the inline holds);
    one that has started is shown read-only: changing prices is a new book from a later date."""

    list_display = ["name", "currency", "tenant", "effective_from", "over_quota_multiplier", "interactive_multiplier",
                    "profiling_multiplier", "energy_per_kwh"]
    list_filter = ["currency", "tenant"]
    search_fields = ["name", "tenant__slug"]
    list_select_related = ["tenant"]
    inlines = [PriceRateInline]
    fields = ["name", "currency", "tenant", "effective_from", "over_quota_multiplier", "interactive_multiplier",
              "profiling_multiplier", "energy_per_kwh"]

    def get_readonly_fields(self, request, obj=None):
        return ["currency", "tenant"] if obj is not None else []  # its scope: another scope is another book

    def has_change_permission(self, request, obj=None):
        return super().has_change_permission(request, obj) and (obj is None or _upcoming(obj))

    def has_delete_permission(self, request, obj=None):
        return super().has_delete_permission(request, obj) and (obj is None or _upcoming(obj))

    def save_model(self, request, obj, form, change):
        """Nothing yet: the book and its rates are written together by ``save_related`` (one service call)."""

    def save_related(self, request, form, formsets, change):
        rates = []
        for formset in formsets:
            # the service writes the rates; the admin's change message reads what a formset saved: nothing
            formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
            for row in formset.forms:
                data = getattr(row, "cleaned_data", None) or {}
                if not data or data.get("DELETE") or (row.instance.pk is None and not row.has_changed()):
                    continue
                rates.append({"tier": data.get("tier"), "kind": data.get("kind"),
                              "mig_profile": data.get("mig_profile") or "", "per_hour": data.get("per_hour")})
        values = {name: form.cleaned_data.get(name) for name in ("name", "effective_from", "over_quota_multiplier",
                                                                 "interactive_multiplier", "profiling_multiplier",
                                                                 "energy_per_kwh")}
        book = form.instance
        if change:
            book = services.price_book_update(book=book, changes={**values, "rates": rates}, by_user=request.user)
        else:
            book = services.price_book_create(currency=form.cleaned_data.get("currency"),
                                              tenant=form.cleaned_data.get("tenant"), rates=rates,
                                              by_user=request.user, **values)
        form.instance.pk = book.pk  # the admin's own log entry and redirect name it

    def delete_model(self, request, obj):
        services.price_book_delete(book=obj, by_user=request.user)


# -- billing terms -----------------------------------------------------------------------------------------------
@admin.register(BillingTerms)
class BillingTermsAdmin(ServiceAdmin):
    """Terms start on the first of a month (this one or later); a month already started is changed by saving
    terms from that month again. The tenant and the start of saved terms are their identity."""

    list_display = ["tenant", "effective_from", "discount_pct", "monthly_commit_minor"]
    list_filter = ["tenant"]
    list_select_related = ["tenant"]
    fields = ["tenant", "effective_from", "discount_pct", "monthly_commit_minor"]

    def get_readonly_fields(self, request, obj=None):
        return ["tenant", "effective_from"] if obj is not None else []

    def has_change_permission(self, request, obj=None):
        return super().has_change_permission(request, obj) and (obj is None or _terms_open(obj))

    def has_delete_permission(self, request, obj=None):
        return super().has_delete_permission(request, obj) and (obj is None or _terms_open(obj))

    def save_model(self, request, obj, form, change):
        start = obj.effective_from
        saved = services.billing_terms_set(
            tenant=obj.tenant, period=None if start is None else start.astimezone(UTC).date(),
            discount_pct=obj.discount_pct, monthly_commit_minor=obj.monthly_commit_minor, by_user=request.user)
        obj.pk = saved.pk

    def delete_model(self, request, obj):
        services.billing_terms_delete(terms=obj, by_user=request.user)


def _terms_open(terms: BillingTerms) -> bool:
    return terms.effective_from.date() >= timezone.now().date().replace(day=1)


# -- spend caps ----------------------------------------------------------------------------------------------------
@admin.register(SpendCap)
class SpendCapAdmin(ServiceAdmin):
    """Platform staff may set a tenant's caps here too (tenant admins do on their Budgets page and the API)."""

    list_display = ["tenant", "project", "monthly_minor", "action"]
    list_filter = ["action", "tenant"]
    list_select_related = ["tenant", "project"]
    fields = ["tenant", "project", "monthly_minor", "action"]

    def get_readonly_fields(self, request, obj=None):
        return ["tenant", "project"] if obj is not None else []  # the scope: another scope is another cap

    def save_model(self, request, obj, form, change):
        if change:
            cap = services.spend_cap_update(cap=obj, monthly_minor=obj.monthly_minor, action=obj.action,
                                            by_user=request.user)
        else:
            cap = services.spend_cap_create(tenant=obj.tenant, project=obj.project, monthly_minor=obj.monthly_minor,
                                            action=obj.action, by_user=request.user)
        obj.pk = cap.pk

    def delete_model(self, request, obj):
        services.spend_cap_delete(cap=obj, by_user=request.user)


# -- corrections and prepaid credit (issue 33): added through the services, never changed or deleted -----------
class _AppendOnlyAdmin(ServiceAdmin):
    """Rows the database keeps immutable (migration 0008): the admin adds them through a service and shows them;
    it never offers a change or a delete."""

    add_fields: list[str] = []

    def get_fields(self, request, obj=None):
        return self.add_fields if obj is None else [f.name for f in self.model._meta.fields]

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else [f.name for f in self.model._meta.fields]

    def has_change_permission(self, request, obj=None):
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return False


class CreditNoteLineInline(admin.TabularInline):
    model = CreditNoteLine
    fields = ["invoice_line", "description", "amount_minor"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(CreditNote)
class CreditNoteAdmin(_AppendOnlyAdmin):
    """A credit on the whole of a finalized or paid invoice (per line: the staff API)."""

    list_display = ["number", "tenant", "invoice", "reason", "amount_minor", "currency", "voids_invoice", "issued_at"]
    list_filter = ["reason", "voids_invoice", "tenant"]
    list_select_related = ["tenant", "invoice"]
    add_fields = ["invoice", "reason", "memo", "amount_minor"]
    inlines = [CreditNoteLineInline]

    def get_inlines(self, request, obj):
        return self.inlines if obj is not None else []

    def save_model(self, request, obj, form, change):
        note = credit_note_issue(invoice=obj.invoice, reason=obj.reason, memo=obj.memo, amount_minor=obj.amount_minor,
                                 by_user=request.user)
        obj.pk = note.pk


@admin.register(Payment)
class PaymentAdmin(_AppendOnlyAdmin):
    list_display = ["invoice", "tenant", "amount_minor", "currency", "received_at", "reference"]
    list_select_related = ["tenant", "invoice"]
    add_fields = ["invoice", "amount_minor", "received_at", "reference"]

    def save_model(self, request, obj, form, change):
        payment = payment_record(invoice=obj.invoice, amount_minor=obj.amount_minor, received_at=obj.received_at,
                                 reference=obj.reference, by_user=request.user)
        obj.pk = payment.pk


@admin.register(Refund)
class RefundAdmin(_AppendOnlyAdmin):
    list_display = ["payment", "tenant", "amount_minor", "reason", "refunded_at"]
    list_select_related = ["tenant", "payment"]
    add_fields = ["payment", "amount_minor", "reason", "reference"]

    def save_model(self, request, obj, form, change):
        refund = refund_record(payment=obj.payment, amount_minor=obj.amount_minor, reason=obj.reason,
                               reference=obj.reference, by_user=request.user)
        obj.pk = refund.pk


class CreditDrawInline(admin.TabularInline):
    model = CreditDraw
    fields = ["invoice", "amount_minor", "drawn_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(CreditGrant)
class CreditGrantAdmin(_AppendOnlyAdmin):
    """Prepaid credit: granted here (or by the staff API), drawn by invoices at finalisation (inline below)."""

    list_display = ["tenant", "amount_minor", "currency", "priority", "expires_at", "granted_at", "reason"]
    list_filter = ["currency", "tenant"]
    list_select_related = ["tenant"]
    add_fields = ["tenant", "amount_minor", "priority", "expires_at", "reason"]
    inlines = [CreditDrawInline]

    def get_inlines(self, request, obj):
        return self.inlines if obj is not None else []

    def save_model(self, request, obj, form, change):
        grant = credit_grant_create(tenant=obj.tenant, amount_minor=obj.amount_minor, priority=obj.priority,
                                    expires_at=obj.expires_at, reason=obj.reason, by_user=request.user)
        obj.pk = grant.pk


# -- dunning ---------------------------------------------------------------------------------------------------------
@admin.register(DunningTerms)
class DunningTermsAdmin(ServiceAdmin):
    """A tenant's dunning schedule (else BILLING_DUNNING_REMINDER_DAYS / _GRACE_DAYS); saved by the service."""

    list_display = ["tenant", "reminder_days", "grace_days", "stop_running_leases"]
    fields = ["tenant", "reminder_days", "grace_days", "stop_running_leases"]

    def get_readonly_fields(self, request, obj=None):
        return ["tenant"] if obj is not None else []

    def save_model(self, request, obj, form, change):
        terms = dunning_terms_set(tenant=obj.tenant, reminder_days=obj.reminder_days, grace_days=obj.grace_days,
                                  stop_running_leases=obj.stop_running_leases, by_user=request.user)
        obj.pk = terms.pk

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(DunningCase)
class DunningCaseAdmin(admin.ModelAdmin):
    """Cases are opened by failed payments and moved by ``dunning_advance`` and settlements: read-only here."""

    list_display = ["invoice", "tenant", "state", "started_at", "reminders_sent", "grace_ends_at", "restricted_at",
                    "resolved_at"]
    list_filter = ["state"]
    list_select_related = ["invoice", "tenant"]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

# -- taxes -----------------------------------------------------------------------------------------------------------
@admin.register(TaxProfile)
class TaxProfileAdmin(ServiceAdmin):
    list_display = ["tenant", "tax_id", "reverse_charge"]
    fields = ["tenant", "tax_id", "reverse_charge", "legal_note"]

    def get_readonly_fields(self, request, obj=None):
        return ["tenant"] if obj is not None else []

    def save_model(self, request, obj, form, change):
        profile = tax_profile_set(tenant=obj.tenant, tax_id=obj.tax_id, reverse_charge=obj.reverse_charge,
                                  legal_note=obj.legal_note, by_user=request.user)
        obj.pk = profile.pk

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(TaxRate)
class TaxRateAdmin(ServiceAdmin):
    """Rates are added, and deactivated (unticking ``active``), never edited: an invoice names the rate it used."""

    list_display = ["tenant", "jurisdiction", "name", "percentage", "inclusive", "active"]
    list_filter = ["active", "inclusive", "jurisdiction"]
    fields = ["tenant", "jurisdiction", "name", "percentage", "inclusive", "active"]

    def get_readonly_fields(self, request, obj=None):
        return ["tenant", "jurisdiction", "name", "percentage", "inclusive"] if obj is not None else ["active"]

    def save_model(self, request, obj, form, change):
        if change:
            if not obj.active:
                tax_rate_deactivate(rate=obj, by_user=request.user)
            return
        rate = tax_rate_create(tenant=obj.tenant, jurisdiction=obj.jurisdiction, name=obj.name,
                               percentage=obj.percentage, inclusive=obj.inclusive, by_user=request.user)
        obj.pk = rate.pk

    def has_delete_permission(self, request, obj=None):
        return False


# -- spend alerts (issue 33): read-only; a tenant's admins set the rules (API, portal), alerts are raised by the run --
@admin.register(SpendAlertRule)
class SpendAlertRuleAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "project", "thresholds_pct", "budget_minor", "forecast", "created_at"]
    list_filter = ["forecast"]
    search_fields = ["tenant__slug", "project__slug"]


@admin.register(SpendAlert)
class SpendAlertAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "tenant", "project", "period", "basis", "threshold_pct", "amount_minor", "currency"]
    list_filter = ["basis", "period"]
    search_fields = ["tenant__slug", "project__slug", "message"]
