"""Celery tasks of billing: thin, idempotent, one service call each (STYLE.md)."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.utils import timezone

from billing import services
from billing.services import metering_run
from billing.services.stripe_sync import invoice_push_task, invoices_push_due  # noqa: F401  (registers the Stripe tasks)


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
