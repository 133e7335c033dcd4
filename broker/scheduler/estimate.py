"""Estimated start times of the requests a cycle left waiting: when each would start if the running work left at
its expiry and nothing else arrived.

``estimated_starts(scheduler, requests, decisions, now=…)`` continues from the scheduler's working state after
``schedule`` (what it placed holds its capacity, what it reclaimed is gone) and replays the future: the running
allocations end at their lease's expiry (``Snapshot.ends_at``; the ones placed this cycle ``now`` plus their
request's ``duration_seconds``), earliest first; after each expiry the waiting requests are tried again in their
queue order, each on its tiers within its quota limit (over its guarantee it borrows, as the over-quota pass
lets it; interactive work only within it) through the same placement policy, and one that fits is held from then
to then plus its duration. A request's estimate is the first such time: ``now`` when it would fit at once (an
ageing group's reservation held it back), None when it does not fit before the known expiries run out (work
without an end, a request no fleet could hold) or the search budget (``budget`` placement tries) is spent. The
cycle's reservations (``broker.scheduler.reserve``) are kept: their holders are tried first, and a holder's estimate
is at the latest its reservation's start, which the plan promises. The members of a lease group all get the same
estimate: when the last of them fits in the replay (each member is tried on its own there, in queue order), at the
latest the group's reservation's start where it holds one.

It counts neither reclaim nor future arrivals nor releases before expiry, so it is an estimate: the Philly replay
measures its error (``bench/sim/philly.py``; docs/scheduling.md, "Estimated start times"). Pure: the working
state it changes is the caller's own, discarded after the cycle.
"""

from __future__ import annotations

import heapq

from broker.scheduler.types import Allocation, Decision, DecisionMode, Request, WorkloadClass

BUDGET = 20_000  # placement tries one estimate makes at most (a cycle at fleet scale: docs/scheduling.md)


def estimated_starts(scheduler, requests: list[Request], decisions: list[Decision], *, now: float,
                     budget: int = BUDGET, ends: dict[str, float] | None = None) -> dict[str, float | None]:
    """Request id → estimated start (seconds, the snapshot's epoch) for every waiting decision. ``ends``: the
    running allocations' expiries when they are not the snapshot's (the trace simulator's, whose state lives on
    across cycles). The working state is as it was afterwards (what-if: every change undone)."""
    by_id = {request.id: request for request in requests}
    waiting = [by_id[d.request] for d in sorted((d for d in decisions if d.mode == DecisionMode.WAITING),
                                                key=lambda d: d.queue_position)]
    estimates: dict[str, float | None] = {request.id: None for request in waiting}
    if not waiting:
        return estimates
    # a lease group's reservation is every member's
    reserved = {member: r.start for r in scheduler.reserved for member in r.requests if member in estimates}
    if reserved:  # the plan holds GPUs for them from their reservation's start: they go first, and start then at
        # the latest
        waiting.sort(key=lambda request: (request.id not in reserved, reserved.get(request.id, 0.0)))
    cluster = scheduler.cluster
    ends = scheduler.ends if ends is None else ends
    durations = {request.id: request.duration_seconds for request in requests}
    events: list[tuple[float, str]] = []
    for allocation_id, allocation in cluster.allocations.items():
        end = ends.get(allocation_id)
        if end is None and allocation.started_at == now and durations.get(allocation_id):
            end = now + durations[allocation_id]  # placed by this cycle
        if end is not None:
            events.append((max(end, now), allocation_id))
    heapq.heapify(events)
    pending = list(waiting)
    removed: list[Allocation] = []
    added: list[str] = []
    try:
        _replay(scheduler, pending, events, estimates, removed, added, at=now, budget=budget)
    finally:  # undo: the placements made (those still held), then the expiries of what was there before
        mine = set(added)
        for allocation_id in reversed(added):
            if allocation_id in cluster.allocations:
                cluster.remove(allocation_id)
        for allocation in reversed(removed):
            if allocation.id not in mine:
                cluster.apply(allocation)
    for reservation in scheduler.reserved:
        if reservation.group:  # the members start together: when the last of them fits, at the latest then
            ats = [estimates[m] for m in reservation.members if m in estimates]
            at = None if not ats or None in ats else max(ats)
            for member in reservation.members:
                if member in estimates:
                    estimates[member] = reservation.start if at is None else min(at, reservation.start)
        elif reservation.request in estimates:
            at = estimates[reservation.request]
            estimates[reservation.request] = reservation.start if at is None else min(at, reservation.start)
    # a lease group without a reservation starts together too: every member when the last of them fits in the
    # replay (None when one of them never does)
    held = {reservation.group for reservation in scheduler.reserved if reservation.group}
    groups: dict[str, list[str]] = {}
    for request in waiting:
        if request.group and request.group not in held:
            groups.setdefault(request.group, []).append(request.id)
    for members in groups.values():
        if len(members) > 1:
            ats = [estimates[member] for member in members]
            at = None if None in ats else max(ats)
            for member in members:
                estimates[member] = at
    return estimates


def _replay(scheduler, pending: list[Request], events: list, estimates: dict, removed: list, added: list, *,
            at: float, budget: int) -> None:
    cluster = scheduler.cluster
    tries = 0
    while pending and tries < budget:
        still = []
        failed: set = set()  # (tier, shape) that did not fit at this time: capacity only shrinks until the next expiry
        for request in pending:
            if tries >= budget:
                still.append(request)
                continue
            placed, spent = _try_at(scheduler, request, at, failed)
            tries += spent
            if placed is None:
                still.append(request)
                continue
            estimates[request.id] = at
            added.append(placed.id)
            if request.duration_seconds:
                heapq.heappush(events, (at + request.duration_seconds, placed.id))
        pending = still
        if not pending or not events:
            break
        at = events[0][0]
        while events and events[0][0] == at:  # every allocation that ends then leaves together
            _, allocation_id = heapq.heappop(events)
            if allocation_id in cluster.allocations:
                removed.append(cluster.remove(allocation_id))


def _try_at(scheduler, request: Request, at: float, failed: set) -> tuple[Allocation | None, int]:
    """Place ``request`` at ``at`` on the first of its tiers its quota limit admits and where it fits (the
    allocation applied to the working state), and the placement tries spent."""
    tries = 0
    for tier, need in scheduler.tiers_for(request):
        if (tier, request.shape) in failed:
            continue
        blocked, in_quota = scheduler.quota_check(request, tier, need)
        if blocked is not None or (not in_quota and request.workload_class == WorkloadClass.INTERACTIVE):
            continue
        if not in_quota and scheduler._cohort_members and scheduler.cohort_check(request.tenant, tier,
                                                                                need.total_milli):
            continue  # the cohorts keep this idle capacity for others (docs/scheduling.md)
        tries += 1
        found = scheduler._find(need)
        if found is None:
            failed.add((tier, request.shape))
            continue
        allocation = scheduler._allocation(request, tier, need, found, preemptible=not in_quota, now=at)
        scheduler.cluster.apply(allocation)
        return allocation, tries
    return None, tries


__all__ = ["BUDGET", "estimated_starts"]
