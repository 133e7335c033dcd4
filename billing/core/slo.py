"""SLO measurement from lease events (pure functions, no database).

- **Time to GPU** of in-quota requests: seconds from the REQUESTED event to the first ACTIVE event, for
  leases requested in the period, first placed within their project's guarantee (not over quota) and covered
  by it when requested: the scheduler records whether the project's guaranteed use, plus the project's own
  requests ahead of the lease, plus the lease fit the deserved share (``Lease.guarantee_covered``). A lease that
  waited behind its own project's queue is the project's wait, not the platform's: it is not sampled (counted in
  ``SloFigures.not_covered``); one with nothing recorded (placed before the scheduler recorded it) is. The p95 is
  the nearest-rank 95th percentile.
- **Availability** of active leases: time held ÷ (time held + time lost involuntarily). A lease that
  leaves ACTIVE/PREEMPTED for FAILED (instance vanished, node silent, agent failure) lost the time from
  that moment until its planned end, clipped to the period.
- **Preemption notice honoured**: of the preemptions that started in the period, the percentage whose
  lease kept running at least the contract's notice (the holder releasing early counts as honoured).

A contract's credit steps turn the figures into a credit percentage: per metric, the largest step
crossed (time to GPU above its threshold; percentages below theirs); the sum is capped by the contract.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

HOLDING = ("active", "preempted")
NOTICE_TOLERANCE_SECONDS = 1.0


@dataclass
class LeaseHistory:
    lease_id: int
    requested_at: datetime
    over_quota: bool
    ends_at: datetime | None
    events: Sequence[tuple[datetime, str, str, str]]  # (at, from_state, to_state, actor)
    covered: bool | None = None  # covered by the guarantee when requested, its project's queue counted (None: unknown)


@dataclass
class SloFigures:
    ttg_samples: list[float] = field(default_factory=list)
    not_covered: list[int] = field(default_factory=list)  # in-quota leases left out: not covered when requested
    held_seconds: float = 0.0
    lost_seconds: float = 0.0
    losses: list[dict] = field(default_factory=list)
    preemptions: int = 0
    honoured: int = 0
    short_notices: list[dict] = field(default_factory=list)

    @property
    def ttg_p95(self) -> float | None:
        if not self.ttg_samples:
            return None
        ordered = sorted(self.ttg_samples)
        return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]

    @property
    def availability_pct(self) -> float | None:
        total = self.held_seconds + self.lost_seconds
        return None if total <= 0 else 100.0 * self.held_seconds / total

    @property
    def notice_pct(self) -> float | None:
        return None if not self.preemptions else 100.0 * self.honoured / self.preemptions


def measure(histories: Iterable[LeaseHistory], *, start: datetime, end: datetime, notice_seconds: int) -> SloFigures:
    figures = SloFigures()
    for lease in histories:
        events = list(lease.events)
        if start <= lease.requested_at < end and not lease.over_quota:
            first_active = next((at for at, _f, to, _a in events if to == "active"), None)
            if first_active is not None and first_active < end:
                if lease.covered is False:
                    figures.not_covered.append(lease.lease_id)
                else:
                    figures.ttg_samples.append((first_active - lease.requested_at).total_seconds())
        held_from: datetime | None = None
        for index, (at, _from, to, _actor) in enumerate(events):
            if to in HOLDING:
                if held_from is None:
                    held_from = at
                if to == "preempted" and start <= at < end:
                    figures.preemptions += 1
                    later = events[index + 1] if index + 1 < len(events) else None
                    if later is None:
                        figures.honoured += 1  # still within its notice at measurement time
                    else:
                        ran = (later[0] - at).total_seconds()
                        voluntary = later[2] == "releasing" and later[3].startswith("user:")
                        if later[2] == "failed":
                            figures.preemptions -= 1  # lost during the notice: counted as availability
                        elif voluntary or ran >= notice_seconds - NOTICE_TOLERANCE_SECONDS:
                            figures.honoured += 1
                        else:
                            figures.short_notices.append({"lease": lease.lease_id, "notice_seconds": round(ran, 3),
                                                          "at": at.isoformat()})
                continue
            if held_from is not None:
                low, high = max(held_from, start), min(at, end)
                if high > low:
                    figures.held_seconds += (high - low).total_seconds()
                if to == "failed" and start <= at < end:
                    planned = min(lease.ends_at or end, end)
                    if planned > at:
                        lost = (planned - at).total_seconds()
                        figures.lost_seconds += lost
                        figures.losses.append({"lease": lease.lease_id, "at": at.isoformat(),
                                               "lost_seconds": round(lost, 3)})
                held_from = None
        if held_from is not None:
            low = max(held_from, start)
            if end > low:
                figures.held_seconds += (end - low).total_seconds()
    return figures


def credit_for(figures: SloFigures, steps: Iterable[tuple[str, Decimal, Decimal]],
               max_credit_pct: Decimal) -> tuple[Decimal, dict]:
    """(credit percent, evidence per metric) from a contract's steps (metric, threshold, credit_pct)."""
    measured = {
        "time_to_gpu_p95": figures.ttg_p95,
        "availability": figures.availability_pct,
        "preemption_notice": figures.notice_pct,
    }
    evidence: dict[str, dict] = {}
    total = Decimal(0)
    for metric, value in measured.items():
        reached: tuple[Decimal, Decimal] | None = None
        for step_metric, threshold, credit in steps:
            if step_metric != metric or value is None:
                continue
            crossed = value > float(threshold) if metric == "time_to_gpu_p95" else value < float(threshold)
            if crossed and (reached is None or credit > reached[1]):
                reached = (threshold, credit)
        evidence[metric] = {"measured": None if value is None else round(value, 3),
                            "threshold": None if reached is None else str(reached[0]),
                            "credit_pct": "0" if reached is None else str(reached[1])}
        if reached is not None:
            total += reached[1]
    return min(total, max_credit_pct), evidence
