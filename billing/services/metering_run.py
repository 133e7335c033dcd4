"""The metering run: every complete UTC hour is metered once per source and its window closed.

``MeterWindow`` keeps one row per (source, hour). ``meter_pending`` adds the rows for every hour from the
metering start (``METERING_START``, else the hour of the first lease that held capacity) up to the last
hour that ended at least ``METERING_GRACE_SECONDS`` ago, then meters the open ones, oldest first:

- ``allocation``: ``usage_meter_window`` over the hour (lease events, the billing authority);
- ``utilisation``: ``utilisation_meter_hour`` (Prometheus).

A window that succeeded is closed (``closed_at``, ``rows``); one that failed keeps ``closed_at`` empty,
gets ``attempts`` + 1 and ``last_error``, and is tried again by the next run. Prometheus down or late
stops the utilisation side of a run at its first open hour (the later ones could not do better); the
allocation side goes on. Both meters upsert whole hours, so a run that dies half-way and its re-run give
the same rows, and a closed hour is never metered again by this run: nothing is billed twice, nothing is
lost. One run at a time (a PostgreSQL advisory lock); a second one returns at once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import F, Max, Min
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from billing.choices import MeterSource
from billing.core.metering import HOLDING, HOUR, hour_floor
from billing.models import MeterWindow
from billing.services import usage_meter_window
from billing.services.utilisation import MeteringDeferred, utilisation_meter_hour
from broker.models import LeaseEvent
from core.errors import ApplicationError, ValidationFailed

logger = logging.getLogger(__name__)
RUN_LOCK = 0x6770_6D72  # "gpmr"


def metering_start() -> datetime | None:
    """The first hour to meter: ``METERING_START`` (ISO 8601, UTC when no offset is given), else the
    hour of the first lease event that held capacity; None when nothing was ever held."""
    configured = settings.METERING_START
    if configured:
        moment = configured if isinstance(configured, datetime) else parse_datetime(str(configured))
        if moment is None:
            raise ValidationFailed(f"METERING_START {configured!r} is not an ISO 8601 date-time.",
                                   field="METERING_START")
        if timezone.is_naive(moment):
            moment = moment.replace(tzinfo=UTC)
        return hour_floor(moment.astimezone(UTC))
    first = LeaseEvent.objects.filter(to_state__in=HOLDING).aggregate(first=Min("at"))["first"]
    return hour_floor(first) if first else None


def _hours(start: datetime, end: datetime) -> Iterator[datetime]:
    cursor = start
    while cursor < end:
        yield cursor
        cursor += HOUR


def meter_windows_create(*, start: datetime, end: datetime) -> int:
    """Rows for every hour of [start, end) and both sources (existing ones are kept); returns the number of
    hours added. Only the hours outside the range already present are written, so a run costs two
    aggregate queries when nothing is new."""
    added = 0
    for source in MeterSource.values:
        known = MeterWindow.objects.filter(source=source).aggregate(first=Min("hour_start"), last=Max("hour_start"))
        if known["first"] is None:
            hours = list(_hours(start, end))
        else:
            hours = [*_hours(start, min(end, known["first"])), *_hours(max(start, known["last"] + HOUR), end)]
        MeterWindow.objects.bulk_create([MeterWindow(source=source, hour_start=hour) for hour in hours],
                                        ignore_conflicts=True)
        added += len(hours)
    return added


@contextmanager
def _run_lock() -> Iterator[bool]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [RUN_LOCK])
        acquired = cursor.fetchone()[0]
    try:
        yield acquired
    finally:
        if acquired:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [RUN_LOCK])


def _meter(window: MeterWindow, now: datetime) -> int:
    if window.source == MeterSource.ALLOCATION:
        return usage_meter_window(start=window.hour_start, end=window.hour_start + HOUR, now=now)
    return utilisation_meter_hour(hour_start=window.hour_start, now=now)


def _failed(window: MeterWindow, error: Exception) -> None:
    message = getattr(error, "message", "") or f"{type(error).__name__}: {error}"
    MeterWindow.objects.filter(pk=window.pk, closed_at__isnull=True).update(
        attempts=F("attempts") + 1, last_error=message[:2000])


def meter_pending(*, now: datetime | None = None) -> dict:
    """Create the missing windows up to the last complete hour (minus the grace period) and meter every
    open one, at most ``METERING_BATCH_HOURS`` per source and run, oldest first. Returns what it did."""
    now = now or timezone.now()
    until = hour_floor(now - timedelta(seconds=settings.METERING_GRACE_SECONDS))
    result: dict = {"until": until.isoformat(), "created": 0, "closed": {s: 0 for s in MeterSource.values},
                    "failed": {s: 0 for s in MeterSource.values}, "rows": {s: 0 for s in MeterSource.values},
                    "deferred": 0, "open": 0, "errors": []}
    with _run_lock() as acquired:
        if not acquired:
            return {**result, "skipped": "another metering run holds the lock"}
        start = metering_start()
        if start is not None and start < until:
            result["created"] = meter_windows_create(start=start, end=until)
        for source in MeterSource.values:
            windows = list(MeterWindow.objects.filter(source=source, closed_at__isnull=True, hour_start__lt=until)
                           .order_by("hour_start")[:settings.METERING_BATCH_HOURS])
            for position, window in enumerate(windows):
                try:
                    rows = _meter(window, now)
                except ApplicationError as error:
                    _failed(window, error)
                    result["failed"][source] += 1
                    result["errors"].append(f"{source} {window.hour_start:%Y-%m-%d %H}:00: {error.message}")
                    if isinstance(error, MeteringDeferred):
                        # Prometheus down or behind: the later hours cannot do better in this run
                        result["deferred"] += len(windows) - position - 1
                        break
                    continue
                except Exception as error:  # recorded on the window, then raised for the worker's log
                    _failed(window, error)
                    raise
                closed = MeterWindow.objects.filter(pk=window.pk, closed_at__isnull=True).update(
                    closed_at=now, rows=rows, attempts=F("attempts") + 1, last_error="")
                result["closed"][source] += closed
                result["rows"][source] += rows
    result["open"] = MeterWindow.objects.filter(closed_at__isnull=True).count()
    if result["errors"]:
        logger.warning("metering run: %d window(s) left open: %s", len(result["errors"]), result["errors"][0])
    return result


LIVE_METER_KEY = "billing:usage-meter-recent"
LIVE_METER_EVERY_SECONDS = 15


def usage_meter_recent(*, tenant_id: int, now: datetime | None = None) -> datetime:
    """Meter the hour in progress up to ``now`` — and the hour before while the hourly run has not closed it —
    so that usage is visible before the first invoice run and within minutes of a lease starting, not only
    once its hour is complete and ``meter_pending`` has run (issue 29). Only the tenant's leases: a reader pays
    for its own tenant's rows, never the fleet's. Returns the moment the usage rows are metered to: ``now``, or
    the time of a metering of the tenant at most ``LIVE_METER_EVERY_SECONDS`` ago (its page views and API reads
    share one metering per 15 s; the cache only throttles, the rows stay exact).

    The rows of the hour in progress are partial and the hourly run recomputes them whole later (upserts:
    nothing is counted twice); readers label them an estimate (``usage_summary``'s ``metered_until``)."""
    from django.core.cache import cache

    now = now or timezone.now()
    key = f"{LIVE_METER_KEY}:{tenant_id}"
    last = cache.get(key)
    if isinstance(last, datetime) and timedelta(0) <= now - last < timedelta(seconds=LIVE_METER_EVERY_SECONDS):
        return last
    current = hour_floor(now)
    previous_closed = MeterWindow.objects.filter(source=MeterSource.ALLOCATION, hour_start=current - HOUR,
                                                 closed_at__isnull=False).exists()
    start = current if previous_closed else current - HOUR
    usage_meter_window(start=start, end=current + HOUR, now=now, tenant_id=tenant_id)
    cache.set(key, now, LIVE_METER_EVERY_SECONDS * 4)
    return now
