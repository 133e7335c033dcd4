"""Allocation metering from lease events (the authority): pure functions, no database.

A lease holds GPU capacity from its ACTIVE event until the event that takes it out of ACTIVE/PREEMPTED
(release, expiry, failure, requeue at a preemption deadline), and never past its end time (``ends_at``: the
expiry task's lag is not billed). ``held_intervals`` turns a lease's events
into those intervals; ``split_hours`` cuts an interval at every UTC hour boundary (month boundaries are
hour boundaries), clipped to a metering window. Seconds are exact (microseconds kept), never rounded here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

HOLDING = frozenset({"active", "preempted"})
HOUR = timedelta(hours=1)
MICROSECOND = Decimal("0.000001")


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


@dataclass(frozen=True)
class HeldUnit:
    """An allocation as metering sees it: what it held and from when to when (``freed_at`` None: still held)."""

    id: int
    created_at: datetime
    freed_at: datetime | None
    tier: str
    kind: str
    mig_profile: str
    milli: int
    memory_mib: int
    preemptible: bool


@dataclass(frozen=True)
class LeaseHour:
    """One usage row: the seconds a lease held capacity in one UTC hour, and what it held."""

    hour_start: datetime
    seconds: Decimal  # exact to the microsecond, at most 3600
    tier: str
    kind: str
    mig_profile: str
    gpu_milli: int
    memory_mib: int
    over_quota: bool


def held_pieces(events: Iterable[tuple], *, until: datetime) -> list[tuple[datetime, datetime, bool]]:
    """``held_intervals`` cut at every resize (an elastic lease shrunk or grown back while it held: ``events`` as
    (time, to_state) or (time, to_state, resized), a resize being an event to ``active`` whose reason starts
    ``resized:``, written by ``broker.services.elastic``): [(start, end, resized)], ``resized`` True for every piece
    of an interval that was cut at least once (its pieces are billed by what each held, ``lease_hours``)."""
    edges: list[list] = []  # [at, real, interval number]
    was, number = False, 0
    for event in events:
        at, state = event[0], event[1]
        resized = len(event) > 2 and bool(event[2])
        holds = state in HOLDING
        if holds != was:
            number += 1
            edges.append([at, holds, number, False])
        elif holds and resized:
            edges.append([at, True, number, True])
        was = holds
    cut = {edge[2] for edge in edges if edge[3]}
    pieces = []
    for position, (at, holds, interval, _cut) in enumerate(edges):
        if not holds:
            continue
        end = edges[position + 1][0] if position + 1 < len(edges) else until
        pieces.append((at, min(end, until), interval in cut))
    return pieces


def lease_hours(events: Iterable[tuple], units: Iterable[HeldUnit], *, start: datetime,
                until: datetime, ends_at: datetime | None = None) -> list[LeaseHour]:
    """The usage rows of one lease for the window [start, until), from its events before ``until`` (in order)
    and its allocations (in id order). This is the reference the set-based SQL of
    ``billing.services.metering`` is tested against (tests/billing/test_metering_sql.py):

    - the seconds of an hour are the sum of the held intervals' pieces in it, exact, capped at 3600;
    - what was held in an hour is what the first held interval touching it held when it began (allocations
      created at or before its start and not freed by then); the tier, kind, profile and over-quota flag are
      the first such allocation's (lowest id), milli and memory their sums. It depends only on the interval's
      start, never on where it ends, so a row is final once its hour is past and metering a window cut in two
      gives what metering it whole gives (an earlier rule, "held for the interval's whole length", let a
      window's end decide: an allocation freed while the lease stayed active was billed in one cut and not
      in the other);
    - an elastic lease's resize (``held_pieces``) cuts its interval: each piece is an interval for the rule above,
      and in an hour where a piece of a cut interval lies, those pieces count by what each held: the row's seconds
      are the plain pieces' seconds plus the cut pieces' milli-seconds divided by the row's ``gpu_milli``
      (rounded to the microsecond), so ``seconds x gpu_milli`` (what invoices, reports and budgets sum) bills a
      lease shrunk from 8 GPUs to 6 at t 8 GPUs before t and 6 after; an hour in which one grew back (a cut piece
      held more than the row's first interval) gets the most a cut piece held as its ``gpu_milli`` (and memory),
      its seconds ``(plain x first milli + cut milli-seconds) / that``: a lease grown from 6 to 8 at t is billed 6
      GPUs before t and 8 after, and the seconds stay within the hour;
    - an hour whose first interval held no allocation gives no row;
    - nothing is billed after the lease's end (``ends_at``, None: open): the expiry task that ends it runs up to
      its period later, and the held intervals stop at the end time whatever its lag (issue 29)."""
    units = list(units)
    seconds: dict[datetime, Decimal] = {}
    plain: dict[datetime, Decimal] = {}
    cut_ms: dict[datetime, Decimal] = {}
    cut_top: dict[datetime, tuple[int, int]] = {}  # the most milli (and memory) a cut piece in the hour held
    held: dict[datetime, list[HeldUnit]] = {}
    for begin, finish, resized in held_pieces(events, until=until):
        if ends_at is not None:
            finish = min(finish, ends_at)
        if finish <= begin:
            continue
        during = [u for u in units if u.created_at <= begin and (u.freed_at is None or u.freed_at > begin)]
        milli = sum(u.milli for u in during)
        memory = sum(u.memory_mib for u in during)
        for bucket, piece in split_hours(begin, finish, window=(start, until)):
            exact = Decimal(str(piece))
            seconds[bucket] = seconds.get(bucket, Decimal(0)) + exact
            if resized:
                cut_ms[bucket] = cut_ms.get(bucket, Decimal(0)) + exact * milli
                top = cut_top.get(bucket, (0, 0))
                cut_top[bucket] = (max(top[0], milli), max(top[1], memory))
            else:
                plain[bucket] = plain.get(bucket, Decimal(0)) + exact
            held.setdefault(bucket, during)
    rows = []
    for bucket in sorted(seconds):
        during = held[bucket]
        if not during:
            continue
        first = during[0]
        gpu_milli = sum(u.milli for u in during)
        memory_mib = sum(u.memory_mib for u in during)
        total = seconds[bucket]
        if bucket in cut_ms and gpu_milli:
            top_milli, top_memory = cut_top[bucket]
            if top_milli <= gpu_milli:
                total = (plain.get(bucket, Decimal(0)) + cut_ms[bucket] / gpu_milli).quantize(MICROSECOND,
                                                                                              rounding=ROUND_HALF_UP)
            else:  # it grew in the hour: the row holds the most it held, its seconds scaled to match
                total = ((plain.get(bucket, Decimal(0)) * gpu_milli + cut_ms[bucket]) / top_milli).quantize(
                    MICROSECOND, rounding=ROUND_HALF_UP)
                gpu_milli, memory_mib = top_milli, max(memory_mib, top_memory)
        rows.append(LeaseHour(hour_start=bucket, seconds=min(total, Decimal(3600)), tier=first.tier,
                              kind=first.kind, mig_profile=first.mig_profile,
                              gpu_milli=gpu_milli, memory_mib=memory_mib,
                              over_quota=first.preemptible))
    return rows
