"""What is still owed: an invoice's balance due (total − credit notes − credits drawn − payments + refunds) and
a tenant's prepaid credit balance, grant by grant."""

from __future__ import annotations

from datetime import datetime

from django.db.models import BigIntegerField, OuterRef, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce

from billing.models import CreditDraw, CreditGrant, CreditNote, CreditNoteLine, DunningCase, Invoice, Payment, Refund
from tenants.access import Actor, restrict


def _sum(model, link: str, ref: str = "pk") -> Coalesce:
    rows = (model.objects.filter(**{link: OuterRef(ref)}).order_by().values(link)
            .annotate(s=Sum("amount_minor")).values("s"))
    return Coalesce(Subquery(rows, output_field=BigIntegerField()), Value(0))


def invoices_with_balance(queryset: QuerySet[Invoice]) -> QuerySet[Invoice]:
    """``queryset`` with ``credit_notes_minor``, ``credits_drawn_minor``, ``payments_minor``, ``refunds_minor``
    and ``balance_due_minor`` (negative: owed to the tenant, settled by a refund)."""
    return queryset.annotate(
        credit_notes_minor=_sum(CreditNote, "invoice"), credits_drawn_minor=_sum(CreditDraw, "invoice"),
        payments_minor=_sum(Payment, "invoice"), refunds_minor=_sum(Refund, "payment__invoice"),
    ).annotate(balance_due_minor=_balance_expression())


def _balance_expression():
    from django.db.models import F

    return (F("total_minor") - F("credit_notes_minor") - F("credits_drawn_minor") - F("payments_minor")
            + F("refunds_minor"))


def invoice_balance(*, invoice: Invoice) -> dict[str, int]:
    """The balance of one invoice, its parts named as ``invoices_with_balance`` names them."""
    row = invoices_with_balance(Invoice.objects.filter(pk=invoice.pk)).values(
        "total_minor", "credit_notes_minor", "credits_drawn_minor", "payments_minor", "refunds_minor",
        "balance_due_minor").get()
    return dict(row)


def credit_grants_with_remaining(queryset: QuerySet[CreditGrant]) -> QuerySet[CreditGrant]:
    return queryset.annotate(drawn_minor=_sum(CreditDraw, "grant")).annotate(
        remaining_minor=_remaining_expression())


def _remaining_expression():
    from django.db.models import F

    return F("amount_minor") - F("drawn_minor")


def credit_balance(*, actor: Actor | None = None, tenant=None, now: datetime) -> dict:
    """The tenant's prepaid credit: every grant with what is left of it and whether it can still be drawn, and
    the usable balance per currency (unexpired grants' remainders)."""
    queryset = CreditGrant.objects.all()
    queryset = restrict(queryset, actor) if actor is not None else queryset.filter(tenant=tenant)
    grants = list(credit_grants_with_remaining(queryset).order_by("priority", "expires_at", "pk"))
    available: dict[str, int] = {}
    for grant in grants:
        grant.usable = grant.remaining_minor > 0 and (grant.expires_at is None or grant.expires_at > now)
        if grant.usable:
            available[grant.currency] = available.get(grant.currency, 0) + grant.remaining_minor
    return {"available_minor": available, "grants": grants}


def credit_note_list(*, actor: Actor) -> QuerySet[CreditNote]:
    return restrict(CreditNote.objects.select_related("invoice"), actor).order_by("-issued_at", "-pk")


def credit_note_get(*, actor: Actor, pk: int) -> CreditNote:
    from core.errors import NotFound

    note = restrict(CreditNote.objects.select_related("invoice", "tenant").prefetch_related("lines__invoice_line"),
                    actor).filter(pk=pk).first()
    if note is None:
        raise NotFound(f"No credit note {pk} in this tenant.", field="id")
    return note


def corrections_report(*, start: datetime, end: datetime) -> dict:
    """Platform staff's view of a month (``/ops/billing``): credit notes, payments and refunds written in
    [start, end), and the invoices of any month with a balance still due (or owed back), oldest first."""
    return {
        "credit_notes": list(CreditNote.objects.filter(issued_at__gte=start, issued_at__lt=end)
                             .select_related("tenant", "invoice").order_by("issued_at", "pk")),
        "payments": list(Payment.objects.filter(received_at__gte=start, received_at__lt=end)
                         .select_related("tenant", "invoice").order_by("received_at", "pk")),
        "refunds": list(Refund.objects.filter(refunded_at__gte=start, refunded_at__lt=end)
                        .select_related("tenant", "payment__invoice").order_by("refunded_at", "pk")),
        "dunning": list(DunningCase.objects.exclude(state="resolved").select_related("tenant", "invoice")
                        .order_by("grace_ends_at")[:200]),
        "open_balances": list(invoices_with_balance(Invoice.objects.exclude(status__in=["draft", "void"]))
                              .exclude(balance_due_minor=0).select_related("tenant").order_by("period", "pk")[:200]),
    }


def credited_by_line(invoice: Invoice) -> dict[int, int]:
    """What the invoice's credit notes took of each of its lines so far: invoice line id → minor units."""
    return dict(CreditNoteLine.objects.filter(invoice_line__invoice=invoice).values("invoice_line")
                .annotate(s=Sum("amount_minor")).values_list("invoice_line", "s"))


def staff_invoice_detail(*, pk: int) -> dict:
    """Platform staff's page of one invoice (``/ops/billing/invoices/<pk>``): the invoice with its balance, each
    line with what credit notes took of it already (``credited_minor``) and what is left, and its credit notes
    with their Stripe state. A draft is shown too (it takes no credit note)."""
    from core.errors import NotFound

    invoice = invoices_with_balance(Invoice.objects.filter(pk=pk)).select_related("tenant").first()
    if invoice is None:
        raise NotFound(f"No invoice {pk}.", field="id")
    credited = credited_by_line(invoice)
    lines = list(invoice.lines.order_by("position"))
    for line in lines:
        line.credited_minor = credited.get(line.pk, 0)
        line.creditable_minor = max(line.amount_minor - line.credited_minor, 0)
    notes = list(CreditNote.objects.filter(invoice=invoice).prefetch_related("lines").order_by("issued_at", "pk"))
    return {"invoice": invoice, "lines": lines, "credit_notes": notes,
            "left_to_credit_minor": max(invoice.total_minor - invoice.credit_notes_minor, 0)}


def invoices_of_month(*, period) -> list[Invoice]:
    """Every invoice of a month with its balance, for the staff billing page's links to each invoice."""
    return list(invoices_with_balance(Invoice.objects.filter(period=period)).select_related("tenant")
                .order_by("tenant__slug", "pk")[:500])
