"""Stripe mirror of our invoices (docs/architecture.md §5.7): push finalized invoices, apply Stripe's webhook events.

Push (:func:`invoice_push`, run by the Celery task ``billing.tasks.invoice_push_task`` after finalization and
re-run by the periodic ``billing.tasks.invoices_push_due``): the tenant's customer (one per tenant,
``BillingAccount``), a Stripe invoice (``collection_method=send_invoice``, ``auto_advance=false``), one invoice
item per line (negative amounts for credits and discounts), then finalize and send. Every call that creates or
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
from datetime import UTC, date, datetime, timedelta
from typing import Any

import stripe
from django.conf import settings
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from billing.choices import InvoiceStatus, StripeState
from billing.models import BillingAccount, Invoice, StripeEvent
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
def _push_lock(invoice_id: int) -> Iterator[bool]:
    """One push of an invoice at a time (a PostgreSQL session advisory lock, held across Stripe's calls without
    a transaction open; a worker that dies releases it with its connection)."""
    name = f"billing.stripe_push:{invoice_id}"
    with connection.cursor() as cursor:
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
                logger.warning("could not release the Stripe push lock of invoice %s", invoice_id)


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
    if stripe_invoice.status == "draft":
        _items_add(client, invoice, stripe_invoice.id, customer_id)
        stripe_invoice = client.v1.invoices.retrieve(stripe_invoice.id)
        if stripe_invoice.total != invoice.total_minor or stripe_invoice.currency != invoice.currency.lower():
            raise StripeMismatch(
                f"Stripe invoice {stripe_invoice.id} totals {stripe_invoice.total} {stripe_invoice.currency}, ours "
                f"{invoice.total_minor} {invoice.currency.lower()}; it was not finalized.")
        stripe_invoice = client.v1.invoices.finalize_invoice(
            stripe_invoice.id, options=_options("invoice", invoice.pk, "finalize"))
    if stripe_invoice.status == "open":
        client.v1.invoices.send_invoice(stripe_invoice.id, options=_options("invoice", invoice.pk, "send"))
    elif stripe_invoice.status != "paid":  # void or uncollectible at Stripe: its webhook tells the rest
        return stripe_invoice.id, f"The Stripe invoice {stripe_invoice.id} is {stripe_invoice.status}; not sent."
    return stripe_invoice.id, ""


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


def _items_add(client: stripe.StripeClient, invoice: Invoice, stripe_invoice_id: str, customer_id: str) -> None:
    """One invoice item per line, in position order; lines already on the Stripe invoice are skipped."""
    present = {
        _metadata(item).get("invoice_line_id")
        for item in client.v1.invoice_items.list(params={"invoice": stripe_invoice_id, "limit": 100}).auto_paging_iter()
    }
    period_start = _timestamp(invoice.period)
    period_end = _timestamp((invoice.period.replace(day=28) + timedelta(days=4)).replace(day=1))
    for line in invoice.lines.order_by("position"):
        if str(line.pk) in present:
            continue
        params: dict[str, Any] = {
            "customer": customer_id, "invoice": stripe_invoice_id, "amount": line.amount_minor,
            "currency": invoice.currency.lower(), "period": {"start": period_start, "end": period_end},
            "metadata": {"invoice_id": str(invoice.pk), "invoice_line_id": str(line.pk),
                         "position": str(line.position), "kind": line.kind},
        }
        if line.description:
            params["description"] = line.description
        client.v1.invoice_items.create(params=params, options=_options("invoice", invoice.pk, "line", line.pk))


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
