"""Celery tasks of billing: thin, idempotent, one service call each (STYLE.md)."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from billing import services
from billing.services import metering_run, stripe_sync
from core.task_registry import tasks_register


@shared_task(name="billing.invoice_run_due", acks_late=True)
def invoice_run_due() -> list[dict]:
    """Last month's invoices (finalized once the month is closed) and this month's drafts, from what
    ``meter_pending`` has metered (no re-metering of the month here: that is the meter's job)."""
    now = timezone.now()
    this_month = now.date().replace(day=1)
    last_month = (this_month - timedelta(days=1)).replace(day=1)
    return [services.invoice_run(period=month, now=now, meter=False) for month in (last_month, this_month)]


@shared_task(name="billing.meter_pending", acks_late=True)
def meter_pending() -> dict:
    """Every complete hour metered (allocations and utilisation); open windows retried (idempotent)."""
    return metering_run.meter_pending()


# The Stripe tasks keep the names they were registered under in billing.services.stripe_sync (beat entries,
# queued messages and the observability hooks refer to them by name).
@shared_task(name="billing.services.stripe_sync.invoice_push_task", bind=True, acks_late=True,
             autoretry_for=stripe_sync.RETRYABLE_ERRORS, retry_backoff=30, retry_backoff_max=3600, retry_jitter=True,
             max_retries=settings.STRIPE_MAX_RETRIES)
def invoice_push_task(self, invoice_id: int) -> str:
    """Push one invoice; Stripe or network failures are retried with exponential back-off (30 s doubling up
    to an hour, ``STRIPE_MAX_RETRIES`` times); the periodic re-push takes over after that. Its credit notes that
    waited for it are enqueued once it is in Stripe."""
    stripe_id = stripe_sync.invoice_push(invoice_id=invoice_id)
    for credit_note_id in stripe_sync.credit_note_ids_push_due(invoice_id=invoice_id):
        credit_note_push_task.delay(credit_note_id)
    return stripe_id


@shared_task(name="billing.services.stripe_sync.invoices_push_due", acks_late=True)
def invoices_push_due() -> int:
    """Periodic: enqueue a push for every finalized invoice not in Stripe yet; returns how many."""
    if not settings.STRIPE_API_KEY:
        return 0
    invoice_ids = stripe_sync.invoice_ids_push_due()
    for invoice_id in invoice_ids:
        invoice_push_task.delay(invoice_id)
    return len(invoice_ids)


@shared_task(name="billing.credit_note_push_task", bind=True, acks_late=True,
             autoretry_for=stripe_sync.RETRYABLE_ERRORS, retry_backoff=30, retry_backoff_max=3600, retry_jitter=True,
             max_retries=settings.STRIPE_MAX_RETRIES)
def credit_note_push_task(self, credit_note_id: int) -> str:
    """Push one credit note (after its invoice; it waits otherwise), retried as the invoice push is."""
    return stripe_sync.credit_note_push(credit_note_id=credit_note_id)


@shared_task(name="billing.credit_notes_push_due", acks_late=True)
def credit_notes_push_due() -> int:
    """Periodic: enqueue a push for every credit note not in Stripe yet whose invoice is; returns how many."""
    if not settings.STRIPE_API_KEY:
        return 0
    credit_note_ids = stripe_sync.credit_note_ids_push_due()
    for credit_note_id in credit_note_ids:
        credit_note_push_task.delay(credit_note_id)
    return len(credit_note_ids)


@shared_task(name="billing.credit_expiry_notify", acks_late=True)
def credit_expiry_notify() -> int:
    """Periodic: announce prepaid credit grants expiring soon with a balance left (once each)."""
    from billing.services.credits import credit_expiry_notify as notify

    return notify()


@shared_task(name="billing.dunning_advance", acks_late=True)
def dunning_advance() -> dict:
    """Periodic: dunning reminders due, and tenants restricted after their grace period."""
    from billing.services.dunning import dunning_advance as advance

    return advance()


tasks_register("billing", invoice_run_due=invoice_run_due, meter_pending=meter_pending,
               credit_expiry_notify=credit_expiry_notify, dunning_advance=dunning_advance,
               invoice_push_task=invoice_push_task, invoices_push_due=invoices_push_due,
               credit_note_push_task=credit_note_push_task, credit_notes_push_due=credit_notes_push_due)
