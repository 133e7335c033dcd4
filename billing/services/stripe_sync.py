"""Stripe mirror of our invoices (docs/architecture.md §5.7): push finalized invoices, apply Stripe's webhook events.

Push (:func:`invoice_push`, run by the Celery task ``billing.tasks.invoice_push_task`` after finalization and
re-run by the periodic ``billing.tasks.invoices_push_due``): the tenant's customer (one per tenant,
``BillingAccount``), a Stripe invoice (``collection_method=send_invoice``, ``auto_advance=false``), one invoice
item per line (negative amounts for credits and discounts) carrying the invoice's Stripe tax rates (one per our
``TaxRate``, created once and stored) instead of our tax lines, a rounding item where Stripe's per-line rounding
of the tax differs from ours by cents, the prepaid credit the invoice drew as a customer balance transaction
(Stripe applies it at finalization: its ``amount_due`` falls, its ``total`` stays ours), then finalize and send.

Credit notes (:func:`credit_note_push`, ``billing.tasks.credit_note_push_task`` after issue and after their
invoice's push, re-run by ``billing.tasks.credit_notes_push_due``) follow their invoice: a note waits until its
invoice is ``sent``; a note issued by a local void voids the Stripe invoice instead. Every call that creates or
changes something carries an idempotency key derived from our ids (:func:`idempotency_key`), so a re-run after a
crash or a timeout at any point creates nothing twice while Stripe remembers the key (24 h); past that, ids we stored
(customer, Stripe invoice) are retrieved instead of created, and items already on the Stripe invoice (found by
the line id in their metadata) are not added again. Before finalizing, the Stripe invoice's total must equal
ours. A failure or timeout at Stripe leaves our invoice as it was and records ``stripe_state=failed``, the
attempt and the error; the task retries with exponential back-off.

Webhooks (:func:`stripe_event_apply`, called by ``billing.api.webhooks`` after the signature check): each event is
recorded once (``StripeEvent.event_id`` is unique; a replay changes nothing), matched to our invoice by the id
in its metadata (else by ``stripe_invoice_id``), and applied only where it moves our invoice forward:
finalized → paid | void, never back, so events arriving late or out of order are harmless.

Stripe's calls go through a ``stripe.StripeClient`` built per push from settings (no module globals).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import stripe
from django.conf import settings
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from billing.choices import InvoiceStatus, LineKind, StripeState
from billing.models import BillingAccount, CreditDraw, CreditNote, Invoice, StripeEvent, TaxRate
from billing.services.credit_notes import payment_record
from billing.services.dunning import dunning_settle, dunning_start
from core.errors import ApplicationError, Conflict, ValidationFailed
from tenants.models import Tenant

logger = logging.getLogger(__name__)

DISABLED = "Stripe is disabled (STRIPE_API_KEY is empty); the invoice was not pushed."
# What the task retries by itself: Stripe or the network failed, not our request.
RETRYABLE_ERRORS = (stripe.APIConnectionError, stripe.APIError, stripe.RateLimitError)


class StripeMismatch(ApplicationError):
    """Stripe holds something other than what we pushed (another invoice behind our stored id, other items on
    it). Not retried by the task: someone has to look."""

    status = 502
    code = "stripe_mismatch"
    title = "Stripe disagrees with our invoice"


# --- the client and keys ----------------------------------------------------------------------------------


def stripe_client() -> stripe.StripeClient:
    """A client for one push: key, API base and timeout from settings; the SDK's own network retries are off
    (or few, ``STRIPE_NETWORK_RETRIES``): the Celery task retries, with the same idempotency keys."""
    return stripe.StripeClient(
        settings.STRIPE_API_KEY,
        base_addresses={"api": settings.STRIPE_API_BASE.rstrip("/")},
        max_network_retries=settings.STRIPE_NETWORK_RETRIES,
        http_client=stripe.RequestsClient(timeout=settings.STRIPE_TIMEOUT_SECONDS),
    )


def idempotency_key(*parts: object) -> str:
    """``gpub:invoice:42:line:7`` — derived from our ids only, so every re-run sends the same key. The prefix
    (``STRIPE_IDEMPOTENCY_PREFIX``) keeps deployments that share one Stripe account apart."""
    return ":".join([settings.STRIPE_IDEMPOTENCY_PREFIX, *(str(part) for part in parts)])


def _options(*parts: object) -> dict[str, Any]:
    return {"idempotency_key": idempotency_key(*parts)}


def _timestamp(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp())


def _metadata(obj: Any) -> dict[str, Any]:
    """The metadata of an SDK object as a plain dict (``StripeObject`` is no mapping)."""
    metadata = getattr(obj, "metadata", None)
    return metadata.to_dict() if isinstance(metadata, stripe.StripeObject) else {}


def _describe(error: Exception) -> str:
    if isinstance(error, stripe.StripeError):
        where = ", ".join(part for part in (
            f"HTTP {error.http_status}" if error.http_status else "",
            f"code {error.code}" if error.code else "",
            f"param {error.param}" if getattr(error, "param", None) else "",
            f"request {error.request_id}" if error.request_id else "") if part)
        message = error.user_message or str(error) or "no message"
        return f"{type(error).__name__}" + (f" ({where})" if where else "") + f": {message}"
    return f"{type(error).__name__}: {error}"


# --- bookkeeping on our invoice (short transactions of their own) -------------------------------------------


def _bookkeep(invoice_id: int, **fields: Any) -> None:
    """Payment/Stripe fields only: the finalized-invoice trigger lets exactly these change."""
    with transaction.atomic(durable=True):
        Invoice.objects.filter(pk=invoice_id).update(**fields)


@contextmanager
def _push_lock(invoice_id: int, *, what: str = "", wait: bool = False) -> Iterator[bool]:
    """One push of an invoice at a time (a PostgreSQL session advisory lock, held across Stripe's calls without
    a transaction open; a worker that dies releases it with its connection). ``what`` names other locks of the
    same kind (a credit note's push, a tenant's balance); ``wait`` waits for it instead of giving up."""
    name = f"billing.stripe_push:{what}{invoice_id}"
    with connection.cursor() as cursor:
        if wait:
            cursor.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0)), true", [name])
            locked = bool(cursor.fetchone()[1])
        else:
            cursor.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", [name])
            locked = bool(cursor.fetchone()[0])
    try:
        yield locked
    finally:
        if locked:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [name])
            except DatabaseError:  # the connection is gone, and the lock with it
                logger.warning("could not release the Stripe push lock %s", name)


# --- push ---------------------------------------------------------------------------------------------------


def invoice_push(*, invoice_id: int) -> str:
    """Push a finalized invoice to Stripe: customer, invoice, one item per line, finalize, send. Returns the
    Stripe invoice id ("" when Stripe is disabled). Idempotent: re-running it after a failure or crash at any
    point creates nothing twice; running it for an invoice already sent does nothing.

    On a Stripe error or timeout our invoice stays as it was: ``stripe_state`` becomes ``failed``,
    ``stripe_error`` says what happened, and the error is raised again for the caller to retry."""
    invoice = Invoice.objects.select_related("tenant").get(pk=invoice_id)
    if invoice.status == InvoiceStatus.DRAFT:
        raise Conflict("Only finalized invoices are pushed to Stripe; this one is a draft.", field="invoice_id")
    if invoice.stripe_state == StripeState.SENT or invoice.status != InvoiceStatus.FINALIZED:
        return invoice.stripe_invoice_id
    if not settings.STRIPE_API_KEY:
        _bookkeep(invoice_id, stripe_error=DISABLED)
        logger.info("invoice %s not pushed: Stripe is disabled", invoice_id)
        return ""
    with _push_lock(invoice_id) as locked:
        if not locked:
            logger.info("invoice %s is being pushed by another worker", invoice_id)
            return invoice.stripe_invoice_id
        invoice.refresh_from_db()  # another worker may have finished just before we took the lock
        if invoice.stripe_state == StripeState.SENT or invoice.status != InvoiceStatus.FINALIZED:
            return invoice.stripe_invoice_id
        _bookkeep(invoice_id, stripe_state=StripeState.SENDING, stripe_attempts=F("stripe_attempts") + 1)
        try:
            stripe_invoice_id, note = _push(stripe_client(), invoice)
        except (stripe.StripeError, StripeMismatch) as error:
            message = _describe(error)
            _bookkeep(invoice_id, stripe_state=StripeState.FAILED, stripe_error=message[:4000])
            logger.warning("Stripe push of invoice %s failed: %s", invoice_id, message)
            raise
        _bookkeep(invoice_id, stripe_state=StripeState.SENT, stripe_error=note)
    logger.info("invoice %s pushed to Stripe as %s", invoice_id, stripe_invoice_id)
    return stripe_invoice_id


def _push(client: stripe.StripeClient, invoice: Invoice) -> tuple[str, str]:
    customer_id = _customer_get_or_create(client, invoice.tenant)
    stripe_invoice = _stripe_invoice_get_or_create(client, invoice, customer_id)
    note = ""
    if stripe_invoice.status == "draft":
        taxes = _taxes_for(client, invoice)
        present = _items_add(client, invoice, stripe_invoice.id, customer_id, taxes)
        stripe_invoice = client.v1.invoices.retrieve(stripe_invoice.id)
        if taxes.rate_ids and "tax_rounding" not in present and stripe_invoice.total != invoice.total_minor:
            _tax_rounding_add(client, invoice, stripe_invoice, customer_id, taxes)
            stripe_invoice = client.v1.invoices.retrieve(stripe_invoice.id)
        if stripe_invoice.total != invoice.total_minor or stripe_invoice.currency != invoice.currency.lower():
            raise StripeMismatch(
                f"Stripe invoice {stripe_invoice.id} totals {stripe_invoice.total} {stripe_invoice.currency}, ours "
                f"{invoice.total_minor} {invoice.currency.lower()}; it was not finalized.")
        # the credit drawn goes on the customer's balance just before finalizing, which applies it: one tenant's
        # balance and finalization at a time, so that another invoice of the tenant cannot take it
        with _push_lock(invoice.tenant_id, what="balance:", wait=True):
            drawn = _credit_balance_add(client, invoice, customer_id)
            stripe_invoice = client.v1.invoices.finalize_invoice(
                stripe_invoice.id, options=_options("invoice", invoice.pk, "finalize"))
        due = max(invoice.total_minor, 0) - drawn
        if stripe_invoice.amount_due != due:
            note = (f"Stripe's amount due is {stripe_invoice.amount_due}, ours {due} (the customer's Stripe balance "
                    f"held other credit or debit). ")
    if stripe_invoice.status == "open":
        client.v1.invoices.send_invoice(stripe_invoice.id, options=_options("invoice", invoice.pk, "send"))
    elif stripe_invoice.status != "paid":  # void or uncollectible at Stripe: its webhook tells the rest
        return stripe_invoice.id, note + f"The Stripe invoice {stripe_invoice.id} is {stripe_invoice.status}; not sent."
    return stripe_invoice.id, note.strip()


def _customer_get_or_create(client: stripe.StripeClient, tenant: Tenant) -> str:
    account = BillingAccount.objects.filter(tenant=tenant).first()
    if account is not None:
        return account.stripe_customer_id
    customer = client.v1.customers.create(
        params={"name": tenant.name, "email": tenant.billing_email,
                "metadata": {"tenant_id": str(tenant.pk), "tenant_slug": tenant.slug}},
        options=_options("tenant", tenant.pk, "customer"))
    with transaction.atomic(durable=True):
        account, _ = BillingAccount.objects.get_or_create(tenant=tenant,
                                                          defaults={"stripe_customer_id": customer.id})
    return account.stripe_customer_id


def _stripe_invoice_get_or_create(client: stripe.StripeClient, invoice: Invoice, customer_id: str) -> Any:
    if invoice.stripe_invoice_id:  # created before (perhaps more than 24 h ago): never create a second one
        stripe_invoice = client.v1.invoices.retrieve(invoice.stripe_invoice_id)
    else:
        next_month = (invoice.period.replace(day=28) + timedelta(days=4)).replace(day=1)
        stripe_invoice = client.v1.invoices.create(
            params={
                "customer": customer_id, "currency": invoice.currency.lower(), "collection_method": "send_invoice",
                "days_until_due": settings.STRIPE_DAYS_UNTIL_DUE, "auto_advance": False,
                "pending_invoice_items_behavior": "exclude",
                "description": f"GPU capacity {invoice.period:%B %Y} ({invoice.number})",
                "metadata": {"invoice_id": str(invoice.pk), "invoice_number": invoice.number or "",
                             "tenant_id": str(invoice.tenant_id), "period_start": invoice.period.isoformat(),
                             "period_end": next_month.isoformat()},
            },
            options=_options("invoice", invoice.pk, "create"))
        with transaction.atomic(durable=True):  # stored at once: a re-run retrieves instead of creating
            Invoice.objects.filter(pk=invoice.pk, stripe_invoice_id="").update(stripe_invoice_id=stripe_invoice.id)
        invoice.stripe_invoice_id = Invoice.objects.values_list("stripe_invoice_id", flat=True).get(pk=invoice.pk)
    ours = _metadata(stripe_invoice).get("invoice_id")
    if stripe_invoice.id != invoice.stripe_invoice_id or ours != str(invoice.pk):
        raise StripeMismatch(f"Stripe invoice {stripe_invoice.id} (metadata invoice_id {ours!r}) is not the one "
                             f"stored for invoice {invoice.pk} ({invoice.stripe_invoice_id}).")
    return stripe_invoice


@dataclass(frozen=True)
class Taxes:
    """How an invoice's taxes go to Stripe: ``rate_ids`` (Stripe tax rates every other item carries; Stripe
    computes the tax) and ``line_ids`` (our tax lines those rates replace, not pushed as items). Empty: no tax, a
    reverse charge (its zero line is pushed, with its legal note), or rates Stripe cannot compute as we do (an
    inclusive and an exclusive rate together: we tax the whole net, Stripe the net less the inclusive tax), whose
    tax lines are then pushed as items like any other line."""

    rate_ids: list[str] = field(default_factory=list)
    line_ids: set[int] = field(default_factory=set)
    exclusive: int = 0  # how many of the rates add to the total


def _taxes_for(client: stripe.StripeClient, invoice: Invoice) -> Taxes:
    lines = [line for line in invoice.lines.filter(kind=LineKind.TAX).order_by("position")
             if isinstance(line.evidence, dict) and isinstance(line.evidence.get("tax_rate"), int)]
    if not lines:
        return Taxes()
    rates = TaxRate.objects.in_bulk([line.evidence["tax_rate"] for line in lines])
    if len(rates) != len(lines) or len({rate.inclusive for rate in rates.values()}) > 1:
        return Taxes()
    rate_ids = [_tax_rate_get_or_create(client, rates[line.evidence["tax_rate"]]) for line in lines]
    return Taxes(rate_ids, {line.pk for line in lines},
                 exclusive=sum(1 for rate in rates.values() if not rate.inclusive))


def _tax_rate_get_or_create(client: stripe.StripeClient, rate: TaxRate) -> str:
    """Our tax rate's Stripe tax rate: created once (stored at once), reused by every invoice after."""
    if rate.stripe_tax_rate_id:
        return rate.stripe_tax_rate_id
    params: dict[str, Any] = {
        "display_name": rate.name[:50], "percentage": float(rate.percentage), "inclusive": rate.inclusive,
        "jurisdiction": rate.jurisdiction[:50],
        "metadata": {"tax_rate_id": str(rate.pk), "tenant_id": str(rate.tenant_id)},
    }
    country = rate.jurisdiction.split("-", 1)[0]
    if len(country) == 2 and country.isascii() and country.isalpha() and country.isupper():
        params["country"] = country  # "DE", "US-CA" → US
    created = client.v1.tax_rates.create(params=params, options=_options("tax_rate", rate.pk, "create"))
    with transaction.atomic(durable=True):
        TaxRate.objects.filter(pk=rate.pk, stripe_tax_rate_id="").update(stripe_tax_rate_id=created.id)
    return TaxRate.objects.values_list("stripe_tax_rate_id", flat=True).get(pk=rate.pk)


def _items_add(client: stripe.StripeClient, invoice: Invoice, stripe_invoice_id: str, customer_id: str,
               taxes: Taxes) -> set[str]:
    """One invoice item per line, in position order, carrying the tax rates (the tax lines they replace are not
    items); lines already on the Stripe invoice are skipped. Returns what was there already (line ids, and
    ``tax_rounding`` for the rounding item)."""
    present = set()
    for item in client.v1.invoice_items.list(params={"invoice": stripe_invoice_id, "limit": 100}).auto_paging_iter():
        metadata = _metadata(item)
        present.add(metadata.get("invoice_line_id") or metadata.get("kind"))
    period_start = _timestamp(invoice.period)
    period_end = _timestamp((invoice.period.replace(day=28) + timedelta(days=4)).replace(day=1))
    for line in invoice.lines.order_by("position"):
        if str(line.pk) in present or line.pk in taxes.line_ids:
            continue
        params: dict[str, Any] = {
            "customer": customer_id, "invoice": stripe_invoice_id, "amount": line.amount_minor,
            "currency": invoice.currency.lower(), "period": {"start": period_start, "end": period_end},
            "metadata": {"invoice_id": str(invoice.pk), "invoice_line_id": str(line.pk),
                         "position": str(line.position), "kind": line.kind},
        }
        if line.description:
            params["description"] = line.description
        if taxes.rate_ids and line.kind != LineKind.TAX:
            params["tax_rates"] = taxes.rate_ids
        client.v1.invoice_items.create(params=params, options=_options("invoice", invoice.pk, "line", line.pk))
    return present


def _tax_rounding_add(client: stripe.StripeClient, invoice: Invoice, stripe_invoice: Any, customer_id: str,
                      taxes: Taxes) -> None:
    """Stripe rounds each line's tax, we round each rate's once on the net: the difference (a few minor units,
    never more than one per taxed line and rate) is one untaxed item, so Stripe's total is ours to the cent. A
    larger difference is not rounding: refused (``StripeMismatch``), nothing finalized."""
    difference = invoice.total_minor - stripe_invoice.total
    taxed = invoice.lines.exclude(kind=LineKind.TAX).count()
    if not taxes.exclusive or abs(difference) > taxed * taxes.exclusive:
        raise StripeMismatch(
            f"Stripe invoice {stripe_invoice.id} totals {stripe_invoice.total}, ours {invoice.total_minor}: more than "
            f"the tax's rounding can explain; it was not finalized.")
    client.v1.invoice_items.create(params={
        "customer": customer_id, "invoice": stripe_invoice.id, "amount": difference,
        "currency": invoice.currency.lower(),
        "description": "Tax rounding: this invoice rounds each tax rate once on the net, Stripe each line",
        "metadata": {"invoice_id": str(invoice.pk), "kind": "tax_rounding"},
    }, options=_options("invoice", invoice.pk, "tax_rounding"))


def _credit_balance_add(client: stripe.StripeClient, invoice: Invoice, customer_id: str) -> int:
    """The prepaid credit the invoice drew at its finalization (``CreditDraw``) as one customer balance
    transaction (negative: a credit), which Stripe applies to the invoice when it is finalized next. Created once:
    the stored id, else one found by ``metadata[invoice_id]`` (a re-run past the key's 24 h). Returns the amount."""
    draws = list(CreditDraw.objects.filter(invoice=invoice).order_by("grant_id"))
    drawn = sum(draw.amount_minor for draw in draws)
    if drawn <= 0 or Invoice.objects.filter(pk=invoice.pk).exclude(stripe_balance_transaction_id="").exists():
        return drawn
    found = next((entry.id for entry in client.v1.customers.balance_transactions.list(
        customer_id, params={"limit": 100}).auto_paging_iter()
        if entry.type == "adjustment" and _metadata(entry).get("invoice_id") == str(invoice.pk)), None)
    if found is None:
        found = client.v1.customers.balance_transactions.create(customer_id, params={
            "amount": -drawn, "currency": invoice.currency.lower(),
            "description": f"Prepaid credit drawn by invoice {invoice.number}",
            "metadata": {"invoice_id": str(invoice.pk), "invoice_number": invoice.number or "",
                         "credit_grants": ",".join(str(draw.grant_id) for draw in draws)[:500]},
        }, options=_options("invoice", invoice.pk, "credit")).id
    _bookkeep(invoice.pk, stripe_balance_transaction_id=found)
    return drawn


# --- credit notes ----------------------------------------------------------------------------------------------


WAITING = "Waiting for invoice {number} to reach Stripe; pushed after it."


def _note_bookkeep(credit_note_id: int, **fields: Any) -> None:
    """Stripe fields only: the credit note's immutability trigger lets exactly these change."""
    with transaction.atomic(durable=True):
        CreditNote.objects.filter(pk=credit_note_id).update(**fields)


def credit_note_push(*, credit_note_id: int) -> str:
    """Push one credit note to Stripe once its invoice is there (``stripe_state=sent``); before that it waits
    (``stripe_error`` says so) and is pushed after the invoice. A note issued by a local void voids the Stripe
    invoice instead (Stripe keeps no credit note for a void). Returns the Stripe credit note id ("" while waiting,
    disabled, or for a void). Idempotent as :func:`invoice_push`: the same key on every re-run, the stored id,
    else a note found on the Stripe invoice by ``metadata[credit_note_id]``; failures are recorded and raised."""
    note = CreditNote.objects.select_related("invoice").get(pk=credit_note_id)
    if note.stripe_state == StripeState.SENT:
        return note.stripe_credit_note_id
    if not settings.STRIPE_API_KEY:
        _note_bookkeep(credit_note_id, stripe_error=DISABLED.replace("invoice", "credit note"))
        return ""
    if note.invoice.stripe_state != StripeState.SENT or not note.invoice.stripe_invoice_id:
        _note_bookkeep(credit_note_id, stripe_error=WAITING.format(number=note.invoice.number))
        logger.info("credit note %s waits for invoice %s", note.number, note.invoice.number)
        return ""
    with _push_lock(credit_note_id, what="credit_note:") as locked:
        if not locked:
            return note.stripe_credit_note_id
        note.refresh_from_db()
        if note.stripe_state == StripeState.SENT:
            return note.stripe_credit_note_id
        _note_bookkeep(credit_note_id, stripe_state=StripeState.SENDING, stripe_attempts=F("stripe_attempts") + 1)
        try:
            stripe_id, message = _credit_note_push(stripe_client(), note)
        except (stripe.StripeError, StripeMismatch) as error:
            message = _describe(error)
            _note_bookkeep(credit_note_id, stripe_state=StripeState.FAILED, stripe_error=message[:4000])
            logger.warning("Stripe push of credit note %s failed: %s", note.number, message)
            raise
        _note_bookkeep(credit_note_id, stripe_state=StripeState.SENT, stripe_error=message)
    logger.info("credit note %s pushed to Stripe (%s)", note.number, stripe_id or message)
    return stripe_id


def _credit_note_push(client: stripe.StripeClient, note: CreditNote) -> tuple[str, str]:
    invoice = note.invoice
    stripe_invoice = client.v1.invoices.retrieve(invoice.stripe_invoice_id)
    if note.voids_invoice:
        if stripe_invoice.status == "open":
            client.v1.invoices.void_invoice(stripe_invoice.id, options=_options("invoice", invoice.pk, "void"))
        elif stripe_invoice.status != "void":
            raise StripeMismatch(f"Invoice {invoice.number} was voided here but is {stripe_invoice.status} at Stripe "
                                 f"({stripe_invoice.id}); it was not voided there.")
        return "", f"Voided the Stripe invoice {stripe_invoice.id} (Stripe keeps no credit note for a void)."
    if stripe_invoice.status not in ("open", "paid"):
        raise StripeMismatch(f"The Stripe invoice {stripe_invoice.id} is {stripe_invoice.status}: it takes no "
                             f"credit note.")
    if note.stripe_credit_note_id:
        return note.stripe_credit_note_id, ""
    found = next((cn.id for cn in client.v1.credit_notes.list(
        params={"invoice": stripe_invoice.id, "limit": 100}).auto_paging_iter()
        if _metadata(cn).get("credit_note_id") == str(note.pk)), None)
    if found is None:
        # one custom line per line of ours, for exactly its amount: a line of the Stripe invoice named instead
        # would have Stripe add that line's tax on top, and our credit notes are what the balance loses
        params: dict[str, Any] = {
            "invoice": stripe_invoice.id, "reason": note.reason, "memo": note.memo,
            "metadata": {"credit_note_id": str(note.pk), "credit_note_number": note.number,
                         "invoice_id": str(invoice.pk), "invoice_number": invoice.number or "",
                         "tenant_id": str(note.tenant_id)},
            "lines": [{"type": "custom_line_item", "unit_amount": line.amount_minor, "quantity": 1,
                       "description": line.description,
                       "metadata": {"credit_note_line_id": str(line.pk),
                                    **({"invoice_line_id": str(line.invoice_line_id)} if line.invoice_line_id
                                       else {})}}
                      for line in note.lines.order_by("pk")],
        }
        if stripe_invoice.status == "paid":  # after payment: the money goes back outside Stripe (our refunds)
            params["out_of_band_amount"] = note.amount_minor
        found = client.v1.credit_notes.create(params=params, options=_options("credit_note", note.pk, "create")).id
    _note_bookkeep(note.pk, stripe_credit_note_id=found)
    return found, ""


def credit_note_ids_push_due(*, invoice_id: int | None = None) -> list[int]:
    """Credit notes not (yet) in Stripe whose invoice is: never pushed, failed, or left half-way."""
    notes = CreditNote.objects.filter(invoice__stripe_state=StripeState.SENT).exclude(stripe_state=StripeState.SENT)
    if invoice_id is not None:
        notes = notes.filter(invoice_id=invoice_id)
    return list(notes.order_by("pk").values_list("pk", flat=True))


def invoice_ids_push_due() -> list[int]:
    """Finalized invoices not (yet) in Stripe: never pushed, failed, or left half-way by a dead worker."""
    return list(Invoice.objects.filter(status=InvoiceStatus.FINALIZED).exclude(stripe_state=StripeState.SENT)
                .order_by("pk").values_list("pk", flat=True))


# --- webhook events ---------------------------------------------------------------------------------------


def _event_fields(payload: Any) -> tuple[str, str, datetime, dict[str, Any]]:
    if not isinstance(payload, dict):
        raise ValidationFailed("The event must be a JSON object.", field="body")
    event_id, event_type, created = payload.get("id"), payload.get("type"), payload.get("created")
    obj = (payload.get("data") or {}).get("object") if isinstance(payload.get("data"), dict) else None
    if not isinstance(event_id, str) or not event_id or len(event_id) > 64:
        raise ValidationFailed("The event has no valid id.", field="id")
    if not isinstance(event_type, str) or not event_type or len(event_type) > 64:
        raise ValidationFailed("The event has no valid type.", field="type")
    if not isinstance(created, int) or isinstance(created, bool) or created < 0:
        raise ValidationFailed("The event has no valid created time.", field="created")
    if not isinstance(obj, dict):
        raise ValidationFailed("The event has no data.object.", field="data.object")
    return event_id, event_type, datetime.fromtimestamp(created, UTC), obj


def _invoice_for(obj: dict[str, Any]) -> Invoice | None:
    """Our invoice for a Stripe invoice object, locked: by the id in its metadata (when the stored Stripe id
    and number agree), else by ``stripe_invoice_id``."""
    if obj.get("object") != "invoice":
        return None
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    ours = str(metadata.get("invoice_id", ""))
    invoices = Invoice.objects.select_for_update()
    if ours.isascii() and ours.isdigit() and len(ours) < 19:
        invoice = invoices.filter(pk=int(ours)).first()
        if (invoice is not None and invoice.stripe_invoice_id in ("", obj.get("id"))
                and metadata.get("invoice_number", invoice.number) == invoice.number):
            return invoice
    if isinstance(obj.get("id"), str) and obj["id"]:
        return invoices.filter(stripe_invoice_id=obj["id"]).first()
    return None


def _moment(obj: dict[str, Any], key: str, default: datetime) -> datetime:
    value = (obj.get("status_transitions") or {}).get(key)
    return datetime.fromtimestamp(value, UTC) if isinstance(value, int) and not isinstance(value, bool) else default


def _transition(invoice: Invoice, to: str, fields: dict[str, Any]) -> str:
    """finalized → paid | void through a conditional update; the database trigger has the last word."""
    if invoice.status == to:
        return f"ignored: the invoice is already {to}"
    if invoice.status != InvoiceStatus.FINALIZED:
        return f"ignored: the invoice is {invoice.status} (status moves only finalized → paid | void)"
    try:
        with transaction.atomic():
            changed = Invoice.objects.filter(pk=invoice.pk, status=InvoiceStatus.FINALIZED).update(status=to, **fields)
    except IntegrityError as error:
        return f"refused by the database: {str(error).splitlines()[0]}"[:200]
    return f"applied: finalized → {to}" if changed else "ignored: the invoice changed meanwhile"


def _apply(event_id: str, event_type: str, created: datetime, obj: dict[str, Any], invoice: Invoice) -> str:
    newest = max(invoice.stripe_event_at or created, created)
    seen = {"stripe_event_at": newest}
    if not invoice.stripe_invoice_id and isinstance(obj.get("id"), str):
        seen["stripe_invoice_id"] = obj["id"]
    if event_type == "invoice.paid":
        outcome = _transition(invoice, InvoiceStatus.PAID,
                              {"paid_at": _moment(obj, "paid_at", created), "payment_error": "", **seen})
        if outcome.startswith("applied"):
            _paid(invoice, obj, created)
    elif event_type == "invoice.voided":
        outcome = _transition(invoice, InvoiceStatus.VOID, {"voided_at": _moment(obj, "voided_at", created), **seen})
    elif event_type == "invoice.payment_failed":
        if invoice.status != InvoiceStatus.FINALIZED:
            outcome = f"ignored: the invoice is {invoice.status}"
        elif invoice.stripe_event_at and created < invoice.stripe_event_at:
            outcome = "ignored: older than the newest Stripe event applied"
        else:
            Invoice.objects.filter(pk=invoice.pk).update(
                payment_error=f"Payment failed at {created:%Y-%m-%d %H:%M:%S} UTC (Stripe attempt "
                              f"{obj.get('attempt_count', '?')}, event {event_id}).", **seen)
            dunning_start(invoice=invoice, reason=f"Stripe {event_id}: payment failed", now=created)
            outcome = "applied: payment error recorded, dunning started"
    elif event_type == "invoice.sent":
        Invoice.objects.filter(pk=invoice.pk).update(stripe_state=StripeState.SENT, stripe_error="", **seen)
        outcome = "applied: sent"
    elif event_type == "invoice.finalized":
        Invoice.objects.filter(pk=invoice.pk).update(**seen)
        outcome = "applied: finalized at Stripe"
    else:
        outcome = "ignored: event type not handled"
    return outcome


def _paid(invoice: Invoice, obj: dict[str, Any], created: datetime) -> None:
    """What Stripe collected becomes our payment row (its balance follows), and a dunning case resolves."""
    amount = obj.get("amount_paid")
    if isinstance(amount, int) and not isinstance(amount, bool) and amount > 0:
        payment_record(invoice=invoice, amount_minor=amount, received_at=_moment(obj, "paid_at", created),
                       reference=str(obj.get("id", ""))[:100], now=created)
    dunning_settle(invoice=invoice, why="paid at Stripe", now=created)


def stripe_event_apply(*, payload: Any, now: datetime | None = None) -> tuple[StripeEvent, bool]:
    """Record one verified Stripe event and apply it to our invoice; returns (the record, whether it is new).
    A replay (same event id) returns the first record and changes nothing. One transaction."""
    now = now or timezone.now()
    event_id, event_type, created, obj = _event_fields(payload)
    with transaction.atomic(durable=True):
        invoice = _invoice_for(obj)  # the row lock serialises deliveries of events of one invoice
        existing = StripeEvent.objects.filter(event_id=event_id).first()
        if existing is not None:
            return existing, False
        try:
            with transaction.atomic():
                outcome = (_apply(event_id, event_type, created, obj, invoice) if invoice is not None
                           else "ignored: no matching invoice" if event_type.startswith("invoice.")
                           else "ignored: event type not handled")
                record = StripeEvent.objects.create(event_id=event_id, type=event_type, created=created,
                                                    received_at=now, invoice=invoice, outcome=outcome[:200],
                                                    payload=payload)
        except IntegrityError:  # the same event, delivered twice at once: the other delivery recorded it
            return StripeEvent.objects.get(event_id=event_id), False
    logger.info("Stripe event %s (%s): %s", event_id, event_type, outcome)
    return record, True
