"""Fair share (docs/architecture.md §3): idle capacity is divided among over-quota demand by weighted max-min
fairness on ``over_quota_weight``."""

from collections import Counter

import pytest

from broker.scheduler import DecisionMode, GpuMode, plan
from tests.scheduler.builders import H100, L4, held, invariant_problems, quota, share, snapshot, whole


def _admitted(decisions, requests) -> Counter:
    project_of = {request.id: request.project for request in requests}
    return Counter(project_of[d.request] for d in decisions if d.mode == DecisionMode.PLACED)


@pytest.mark.parametrize(
    ("gpus", "weights", "expected"),
    [
        (8, (1, 3), {"a": 2, "b": 6}),
        (16, (1, 3), {"a": 4, "b": 12}),
        (12, (1, 1), {"a": 6, "b": 6}),
        (9, (1, 2), {"a": 3, "b": 6}),
    ],
)
def test_fairness_idle_capacity_divided_by_weight(gpus, weights, expected):
    # both projects deserve nothing and want every GPU; a submitted everything first
    snap = snapshot(
        ("n1", L4, gpus, GpuMode.WHOLE),
        quotas=[quota("a", L4, 0, 100_000, weight=weights[0]), quota("b", L4, 0, 100_000, weight=weights[1])],
    )
    requests = [whole(f"a{i}", "a", models=(L4,), submitted_at=i) for i in range(gpus)]
    requests += [whole(f"b{i}", "b", models=(L4,), submitted_at=100 + i) for i in range(gpus)]
    decisions = plan(snap, requests, now=1000)
    assert _admitted(decisions, requests) == expected
    assert all(d.allocation.preemptible for d in decisions if d.allocation)
    assert invariant_problems(snap, requests, decisions) == []


def test_fairness_counts_existing_over_quota_use():
    # a already borrows 2 GPUs: of 4 idle, b (same weight) gets 3 and a 1 (2+1 vs 3)
    snap = snapshot(
        ("n1", L4, 6, GpuMode.WHOLE),
        quotas=[quota("a", L4, 0, 100_000), quota("b", L4, 0, 100_000)],
        allocations=[held("x1", "a", "n1-g0", tier=L4), held("x2", "a", "n1-g1", tier=L4)],
    )
    requests = [whole(f"a{i}", "a", models=(L4,), submitted_at=i) for i in range(4)]
    requests += [whole(f"b{i}", "b", models=(L4,), submitted_at=10 + i) for i in range(4)]
    decisions = plan(snap, requests, now=1000)
    assert _admitted(decisions, requests) == {"a": 1, "b": 3}


def test_fairness_in_quota_work_comes_before_borrowing():
    # b's in-quota request is served even though a's over-quota requests were submitted first
    snap = snapshot(
        ("n1", L4, 2, GpuMode.WHOLE), quotas=[quota("a", L4, 0, 100_000, weight=10), quota("b", L4, 1000, 1000)]
    )
    requests = [
        whole("a1", "a", models=(L4,), submitted_at=1),
        whole("a2", "a", models=(L4,), submitted_at=2),
        whole("b1", "b", models=(L4,), submitted_at=3),
    ]
    decisions = {d.request: d for d in plan(snap, requests, now=10)}
    assert decisions["b1"].mode == DecisionMode.PLACED and not decisions["b1"].allocation.preemptible
    assert decisions["a1"].mode == DecisionMode.PLACED and decisions["a1"].allocation.preemptible
    assert decisions["a2"].mode == DecisionMode.WAITING


def test_fairness_shares_divide_by_weight_in_milli():
    # 4 shared GPUs, 250-milli shares: 16 slots, weights 1:3 -> 4:12
    snap = snapshot(
        ("n1", H100, 4, GpuMode.SHARED),
        quotas=[quota("a", H100, 0, 100_000, weight=1), quota("b", H100, 0, 100_000, weight=3)],
    )
    requests = [share(f"a{i}", "a", 250, 1000, submitted_at=i) for i in range(16)]
    requests += [share(f"b{i}", "b", 250, 1000, submitted_at=100 + i) for i in range(16)]
    decisions = plan(snap, requests, now=1000)
    assert _admitted(decisions, requests) == {"a": 4, "b": 12}
    assert invariant_problems(snap, requests, decisions) == []
