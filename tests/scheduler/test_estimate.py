"""Estimated start times (``broker.scheduler.estimate``): the plan continued over the running work's expiries, in
queue order, undone afterwards."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings

from broker.scheduler import DecisionMode, GpuMode
from broker.scheduler.estimate import estimated_starts
from broker.scheduler.plan import Scheduler
from tests.scheduler.builders import L4, held, outcome, quota, snapshot, whole
from tests.scheduler.test_properties import scenarios


def _estimate(snap, requests, now):
    scheduler = Scheduler(snap)
    decisions = scheduler.schedule(requests, now=now)
    return decisions, estimated_starts(scheduler, requests, decisions, now=now)


def test_estimate_from_expiries_in_queue_order():
    # two GPUs busy until 100 and 200; a one-GPU request (50 s) and then a two-GPU gang wait: the first starts at
    # 100 when g0 frees, the gang at 200 when g1 frees (the first one's 50 s ended at 150); a third that no node
    # could hold is not estimated
    snap = snapshot(("n1", L4, 2, GpuMode.WHOLE), allocations=[held("x", "a", "n1-g0", tier=L4, preemptible=False),
                                                               held("y", "a", "n1-g1", tier=L4, preemptible=False)],
                    quotas=[quota("a", L4, 8000, 8000)])
    snap = replace(snap, ends_at={"x": 100.0, "y": 200.0})
    requests = [replace(whole("r1", "a", models=(L4,), submitted_at=1), duration_seconds=50),
                replace(whole("r2", "a", 2, models=(L4,), submitted_at=2), duration_seconds=600),
                whole("r3", "a", 4, models=(L4,), submitted_at=3)]
    decisions, estimates = _estimate(snap, requests, 10.0)
    assert [d.mode for d in decisions] == [DecisionMode.WAITING] * 3
    assert estimates == {"r1": 100.0, "r2": 200.0, "r3": None}


def test_estimate_unknown_without_expiries_and_within_the_quota_limit():
    snap = snapshot(("n1", L4, 2, GpuMode.WHOLE), allocations=[held("x", "a", "n1-g0", tier=L4, preemptible=False),
                                                               held("y", "b", "n1-g1", tier=L4, preemptible=False)],
                    quotas=[quota("a", L4, 1000, 1000), quota("b", L4, 1000, 2000)])
    requests = [whole("a1", "a", models=(L4,), submitted_at=1), whole("b1", "b", models=(L4,), submitted_at=2)]
    assert _estimate(snap, requests, 10.0)[1] == {"a1": None, "b1": None}  # no expiry known
    # y ends at 50: b1 (within b's limit) starts then; a1 never does while x (a's whole limit) runs without end
    assert _estimate(replace(snap, ends_at={"y": 50.0}), requests, 10.0)[1] == {"a1": None, "b1": 50.0}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_estimate_undoes_itself_and_never_before_now(scenario):
    snap, first, second, _ = scenario
    running = tuple(outcome(snap, Scheduler(snap).schedule(first, now=0.0)).allocations.values())
    snap = replace(snap, allocations=running, ends_at={a.id: 50.0 + 10 * i for i, a in enumerate(running)})
    second = [replace(r, duration_seconds=30) for r in second]
    scheduler = Scheduler(snap)
    decisions = scheduler.schedule(second, now=20.0)
    before = dict(scheduler.cluster.allocations)
    def usage():  # (a spread request's trial placements leave a zero entry of no project: nothing held)
        return {k: list(v) for k, v in scheduler.cluster.project_usage.items() if any(v)}

    held_before = usage()
    estimates = estimated_starts(scheduler, second, decisions, now=20.0)
    assert scheduler.cluster.allocations == before
    assert usage() == held_before
    assert all(at is None or at >= 20.0 for at in estimates.values())
    assert set(estimates) == {d.request for d in decisions if d.mode == DecisionMode.WAITING}
