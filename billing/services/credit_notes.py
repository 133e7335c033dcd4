"""Corrections after finalisation (Stripe's credit notes and refunds): a credit note against a finalized or paid
invoice, whole or per line, with a reason; a local void that issues the matching credit note; payments received
and refunds of them (credit notes and voids reach Stripe after commit: ``billing.services.stripe_sync``).
Nothing here changes the invoice's lines or amounts (the database refuses it, migration 0003): a correction is
a row of its own, immutable too (migration 0008), and the invoice's balance follows (``billing.selectors.balances``).
Each service is one transaction that writes its audit row."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from billing.choices import CreditNoteReason, InvoiceStatus
from billing.core.pricing import format_money
from billing.models import CreditNote, CreditNoteLine, Invoice, InvoiceLine, Payment, Refund
from billing.selectors.balances import credited_by_line
from billing.services.dunning import dunning_settle
from core.errors import Conflict, ValidationFailed
from tenants.audit import audit_record

MAX_MINOR = 10**15


def _minor(value: Any, field: str) -> int:
    """A positive whole number of minor units, else an error naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < MAX_MINOR:
        raise ValidationFailed(f"{field} must be a positive whole number of minor units.", field=field)
    return value


def _text(value: Any, field: str, *, limit: int, required: bool = True) -> str:
    text = value.strip() if isinstance(value, str) else ""
    if (required and not text) or (value is not None and not isinstance(value, str)):
        raise ValidationFailed(f"{field} is required: say why.", field=field)
    if len(text) > limit:
        raise ValidationFailed(f"{field} has at most {limit} characters.", field=field)
    return text


def _credited(invoice: Invoice) -> int:
    return CreditNote.objects.filter(invoice=invoice).aggregate(s=Sum("amount_minor"))["s"] or 0


def _locked(invoice: Invoice) -> Invoice:
    invoice = Invoice.objects.select_for_update().get(pk=invoice.pk)
    if invoice.status not in (InvoiceStatus.FINALIZED, InvoiceStatus.PAID):
        raise Conflict(f"Invoice {invoice.number or invoice.pk} is {invoice.status}: only a finalized or paid "
                       f"invoice takes a credit note.", field="invoice")
    return invoice


def _issue(*, invoice: Invoice, reason: str, memo: str, lines: list[CreditNoteLine], by_user, now: datetime,
           voids: bool = False) -> CreditNote:
    count = CreditNote.objects.filter(invoice=invoice).count()
    note = CreditNote(tenant_id=invoice.tenant_id, invoice=invoice, number=f"{invoice.number}-CN{count + 1:02d}",
                      currency=invoice.currency, reason=reason, memo=memo, voids_invoice=voids,
                      amount_minor=sum(line.amount_minor for line in lines), issued_at=now,
                      issued_by=by_user if getattr(by_user, "is_authenticated", False) else None)
    note.save()
    for line in lines:
        line.credit_note = note
    CreditNoteLine.objects.bulk_create(lines)
    audit_record(tenant=invoice.tenant, by=by_user, action="billing.credit_note_issue", target=note.number,
                 data={"invoice": invoice.number, "reason": reason, "amount_minor": note.amount_minor,
                       "currency": note.currency, "lines": [{"invoice_line": ln.invoice_line_id,
                                                             "amount_minor": ln.amount_minor} for ln in lines],
                       "voids_invoice": voids})
    note_id = note.pk
    transaction.on_commit(lambda: _push_later(note_id))
    return note


def _push_later(credit_note_id: int) -> None:
    """Stripe's push of the note after commit (it waits there until its invoice is in Stripe), sent by name
    (``billing.tasks`` registers it: ``core.task_registry``); nothing is enqueued while Stripe is disabled."""
    from django.conf import settings

    from core.task_registry import task

    if settings.STRIPE_API_KEY:
        task("billing", "credit_note_push_task").delay(credit_note_id)


def credit_note_issue(*, invoice: Invoice, reason: str, memo: str, lines: list[dict] | None = None,
                      amount_minor: int | None = None, by_user=None, now: datetime | None = None) -> CreditNote:
    """Credit a finalized or paid invoice: ``lines`` (``[{"position", "amount_minor"}]``, each at most what is
    left of that line) or ``amount_minor`` of the whole invoice (at most its total less the notes already
    issued). Errors name the field; nothing is written on a refusal."""
    now = now or timezone.now()
    if reason not in CreditNoteReason.values:
        raise ValidationFailed(f"reason must be one of {', '.join(CreditNoteReason.values)}.", field="reason")
    memo = _text(memo, "memo", limit=500)
    if (lines is None) == (amount_minor is None):
        raise ValidationFailed("Give either lines (a credit per invoice line) or amount_minor (of the whole "
                               "invoice).", field="lines")
    with transaction.atomic():
        invoice = _locked(invoice)
        left = invoice.total_minor - _credited(invoice)
        if lines is not None:
            if not isinstance(lines, list) or not lines:
                raise ValidationFailed("lines must be a non-empty list.", field="lines")
            by_position = {line.position: line for line in InvoiceLine.objects.filter(invoice=invoice)}
            taken = credited_by_line(invoice)
            rows, seen = [], set()
            for index, item in enumerate(lines):
                where = f"lines[{index}]"
                if not isinstance(item, dict):
                    raise ValidationFailed(f"{where} must be an object with position and amount_minor.", field=where)
                position = item.get("position")
                line = by_position.get(position) if isinstance(position, int) else None
                if line is None or position in seen:
                    raise ValidationFailed(f"{where}.position must name a line of invoice {invoice.number}, once.",
                                           field=f"{where}.position")
                seen.add(position)
                amount = _minor(item.get("amount_minor"), f"{where}.amount_minor")
                room = line.amount_minor - taken.get(line.pk, 0)
                if amount > room:
                    raise ValidationFailed(f"{where}.amount_minor: line {position} has "
                                           f"{format_money(max(room, 0), invoice.currency)} left to credit.",
                                           field=f"{where}.amount_minor")
                rows.append(CreditNoteLine(invoice_line=line, amount_minor=amount,
                                           description=f"Credit of line {position}: {line.description}"[:300]))
            if sum(row.amount_minor for row in rows) > left:
                raise ValidationFailed(f"The invoice has {format_money(max(left, 0), invoice.currency)} left to "
                                       f"credit.", field="lines")
        else:
            amount = _minor(amount_minor, "amount_minor")
            if amount > left:
                raise ValidationFailed(f"amount_minor: the invoice has {format_money(max(left, 0), invoice.currency)}"
                                       f" left to credit.", field="amount_minor")
            rows = [CreditNoteLine(amount_minor=amount, description=f"Credit on invoice {invoice.number}")]
        note = _issue(invoice=invoice, reason=reason, memo=memo, lines=rows, by_user=by_user, now=now)
        dunning_settle(invoice=invoice, why=f"credit note {note.number}", now=now)
        return note


def invoice_void(*, invoice: Invoice, memo: str, by_user=None, now: datetime | None = None) -> Invoice:
    """Void a finalized (unpaid) invoice here: the credit note for what is left to credit (reason
    ``order_change``, marked as the void's) and the invoice's status ``void``, in one transaction. A paid
    invoice is not voided: credit it and refund the payment."""
    now = now or timezone.now()
    memo = _text(memo, "memo", limit=500)
    with transaction.atomic():
        invoice = _locked(invoice)
        if invoice.status != InvoiceStatus.FINALIZED:
            raise Conflict(f"Invoice {invoice.number} is paid: credit it and refund the payment instead.",
                           field="invoice")
        left = invoice.total_minor - _credited(invoice)
        note = None
        if left > 0:
            note = _issue(invoice=invoice, reason=CreditNoteReason.ORDER_CHANGE, memo=f"Void: {memo}"[:500],
                          lines=[CreditNoteLine(amount_minor=left, description=f"Void of invoice {invoice.number}")],
                          by_user=by_user, now=now, voids=True)
        Invoice.objects.filter(pk=invoice.pk, status=InvoiceStatus.FINALIZED).update(
            status=InvoiceStatus.VOID, voided_at=now)
        audit_record(tenant=invoice.tenant, by=by_user, action="billing.invoice_void", target=invoice.number,
                     data={"memo": memo, "credit_note": note.number if note else None})
        dunning_settle(invoice=invoice, why="voided", now=now)
        invoice.refresh_from_db()
    return invoice


def payment_record(*, invoice: Invoice, amount_minor: int, received_at: datetime | None = None,
                   reference: str = "", by_user=None, now: datetime | None = None) -> Payment:
    """Money received against a finalized or paid invoice (a bank transfer, Stripe's payment)."""
    now = now or timezone.now()
    amount = _minor(amount_minor, "amount_minor")
    reference = _text(reference, "reference", limit=100, required=False)
    with transaction.atomic():
        invoice = Invoice.objects.select_for_update().get(pk=invoice.pk)
        if invoice.status == InvoiceStatus.DRAFT:
            raise Conflict("A draft invoice takes no payment.", field="invoice")
        payment = Payment.objects.create(tenant_id=invoice.tenant_id, invoice=invoice, currency=invoice.currency,
                                         amount_minor=amount, received_at=received_at or now, reference=reference,
                                         recorded_by=by_user if getattr(by_user, "is_authenticated", False) else None)
        audit_record(tenant=invoice.tenant, by=by_user, action="billing.payment_record", target=invoice.number,
                     data={"payment": payment.pk, "amount_minor": amount, "currency": invoice.currency,
                           "reference": reference})
        dunning_settle(invoice=invoice, why=f"payment {reference or payment.pk}", now=now)
    return payment


def refund_record(*, payment: Payment, amount_minor: int, reason: str, reference: str = "", by_user=None,
                  now: datetime | None = None) -> Refund:
    """Money given back from a payment; all its refunds together never exceed it."""
    now = now or timezone.now()
    amount = _minor(amount_minor, "amount_minor")
    reason = _text(reason, "reason", limit=300)
    reference = _text(reference, "reference", limit=100, required=False)
    with transaction.atomic():
        payment = Payment.objects.select_for_update().select_related("invoice__tenant").get(pk=payment.pk)
        refunded = payment.refunds.aggregate(s=Sum("amount_minor"))["s"] or 0
        if amount > payment.amount_minor - refunded:
            raise ValidationFailed(f"amount_minor: the payment has "
                                   f"{format_money(payment.amount_minor - refunded, payment.currency)} left to refund.",
                                   field="amount_minor")
        refund = Refund.objects.create(tenant_id=payment.tenant_id, payment=payment, amount_minor=amount,
                                       reason=reason, refunded_at=now, reference=reference,
                                       recorded_by=by_user if getattr(by_user, "is_authenticated", False) else None)
        audit_record(tenant=payment.invoice.tenant, by=by_user, action="billing.refund_record",
                     target=payment.invoice.number, data={"payment": payment.pk, "refund": refund.pk,
                                                          "amount_minor": amount, "reason": reason})
    return refund
