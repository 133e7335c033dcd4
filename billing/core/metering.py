"""Allocation metering from lease events (the authority): pure functions, no database.

A lease holds GPU capacity from its ACTIVE event until the event that takes it out of ACTIVE/PREEMPTED
(release, expiry, failure, requeue at a preemption deadline). ``held_intervals`` turns a lease's events
into those intervals; ``split_hours`` cuts an interval at every UTC hour boundary (month boundaries are
hour boundaries), clipped to a metering window. Seconds are exact (microseconds kept), never rounded here.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

HOLDING = frozenset({"active", "preempted"})
HOUR = timedelta(hours=1)


def held_intervals(events: Iterable[tuple[datetime, str]], *, until: datetime) -> list[tuple[datetime, datetime]]:
    """[(start, end)] while the lease was ACTIVE or PREEMPTED; ``events`` as (time, to_state) in order.
    An interval still open is closed at ``until``."""
    intervals: list[tuple[datetime, datetime]] = []
    start: datetime | None = None
    for at, state in events:
        if state in HOLDING:
            if start is None:
                start = at
        elif start is not None:
            intervals.append((start, at))
            start = None
    if start is not None and until > start:
        intervals.append((start, until))
    return intervals


def hour_floor(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def split_hours(start: datetime, end: datetime, *, window: tuple[datetime, datetime]) -> list[tuple[datetime, float]]:
    """(hour start, seconds) for the part of [start, end) inside ``window``, cut at UTC hour boundaries."""
    low, high = max(start, window[0]), min(end, window[1])
    out: list[tuple[datetime, float]] = []
    cursor = low
    while cursor < high:
        bucket = hour_floor(cursor)
        stop = min(bucket + HOUR, high)
        out.append((bucket, (stop - cursor).total_seconds()))
        cursor = stop
    return out
