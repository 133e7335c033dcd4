"""Priority orders work inside one project, never across projects' fair shares (issue 13, item 3).

A project that sends ``priority: 100`` must not take the idle GPUs an equal-weight project would get, jump
ahead of another project's guarantee, or shield its borrowed work from reclaim."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.scheduler import DecisionMode, GpuMode, plan
from tests.scheduler.builders import L4, held, invariant_problems, quota, snapshot, whole


def _placed(decisions, requests) -> Counter:
    project_of = {request.id: request.project for request in requests}
    return Counter(project_of[d.request] for d in decisions if d.mode != DecisionMode.WAITING)


def _requests(project: str, count: int, priorities, *, start: float = 0) -> list:
    return [whole(f"{project}{i}", project, models=(L4,), submitted_at=start + i,
                  priority=priorities[i % len(priorities)]) for i in range(count)]


@pytest.mark.parametrize(
    ("gpus", "deserved", "a_priority", "b_priority", "expected"),
    [
        # the hole: b sends 100 and used to take every idle GPU; now the equal weights split them
        (8, 0, (0,), (100,), {"a": 4, "b": 4}),
        (8, 0, (100,), (0,), {"a": 4, "b": 4}),
        (8, 0, (-100,), (100, 50), {"a": 4, "b": 4}),
        # guarantees first, then the idle capacity split evenly, whatever b sends
        (10, 2000, (0,), (100,), {"a": 5, "b": 5}),
        # an oversold guarantee (each deserves 4 of 6): served by the part of the guarantee in use
        (6, 4000, (0,), (100,), {"a": 3, "b": 3}),
    ],
    ids=["over-quota-b-high", "over-quota-a-high", "mixed", "in-quota-then-idle", "oversold-guarantee"],
)
def test_priority_does_not_cross_projects(gpus, deserved, a_priority, b_priority, expected):
    snap = snapshot(("n1", L4, gpus, GpuMode.WHOLE),
                    quotas=[quota("a", L4, deserved, 100_000), quota("b", L4, deserved, 100_000)])
    # a asked first: under the old order b's priority 100 still took every idle GPU
    requests = _requests("a", gpus, a_priority) + _requests("b", gpus, b_priority, start=100)
    decisions = plan(snap, requests, now=1000)
    assert _placed(decisions, requests) == expected
    assert invariant_problems(snap, requests, decisions) == []


def test_priority_still_orders_work_inside_a_project():
    snap = snapshot(("n1", L4, 2, GpuMode.WHOLE), quotas=[quota("a", L4, 0, 100_000), quota("b", L4, 0, 100_000)])
    requests = [whole("a-low", "a", models=(L4,), submitted_at=1, priority=0),
                whole("a-high", "a", models=(L4,), submitted_at=2, priority=10),
                whole("b-late", "b", models=(L4,), submitted_at=3, priority=-5)]
    decisions = {d.request: d for d in plan(snap, requests, now=1000)}
    assert decisions["a-high"].mode == DecisionMode.PLACED  # a's own high-priority request goes first
    assert decisions["a-low"].mode == DecisionMode.WAITING
    assert decisions["b-late"].mode == DecisionMode.PLACED  # b's share, despite its low priority


def test_priority_does_not_shield_borrowed_work_from_reclaim():
    # a and b each borrow one GPU (equal over-quota use, equal weights); a's is high priority and older.
    # c's in-quota request must reclaim one: the youngest project's borrowed work, not "b's because it
    # is low priority"
    snap = snapshot(("n1", L4, 2, GpuMode.WHOLE),
                    quotas=[quota("a", L4, 0, 100_000), quota("b", L4, 0, 100_000), quota("c", L4, 1000, 1000)],
                    allocations=[held("a1", "a", "n1-g0", tier=L4, started_at=20, priority=100),
                                 held("b1", "b", "n1-g1", tier=L4, started_at=10, priority=0)])
    requests = [whole("c1", "c", models=(L4,))]
    [decision] = plan(snap, requests, now=100)
    assert decision.mode == DecisionMode.PREEMPT
    assert decision.victims == ("a1",)  # the younger one: a's priority 100 did not protect it
    assert invariant_problems(snap, requests, [decision]) == []


@settings(max_examples=60, deadline=None)
@given(
    gpus=st.integers(1, 12),
    deserved=st.sampled_from([0, 1000, 2000, 3000]),
    a_count=st.integers(0, 12),
    b_count=st.integers(0, 12),
    a_priorities=st.lists(st.integers(-100, 100), min_size=1, max_size=4),
    b_priorities=st.lists(st.integers(-100, 100), min_size=1, max_size=4),
    other_b_priorities=st.lists(st.integers(-100, 100), min_size=1, max_size=4),
)
def test_priority_property_a_projects_share_ignores_the_other_projects_priorities(
        gpus, deserved, a_count, b_count, a_priorities, b_priorities, other_b_priorities):
    """With equal weights and equal quotas, what a gets of the GPUs does not depend on b's priorities."""
    snap = snapshot(("n1", L4, gpus, GpuMode.WHOLE),
                    quotas=[quota("a", L4, deserved, 100_000), quota("b", L4, deserved, 100_000)])
    a_requests = _requests("a", a_count, a_priorities)
    shares = []
    for priorities in (b_priorities, other_b_priorities):
        requests = a_requests + _requests("b", b_count, priorities, start=50)
        decisions = plan(snap, requests, now=1000)
        assert invariant_problems(snap, requests, decisions) == []
        shares.append(_placed(decisions, requests)["a"])
    assert shares[0] == shares[1]
    # and the split is the max-min fair one: a gets its demand, or half of the GPUs (the odd one on a tie
    # goes to the lower project id, a), or what b leaves
    assert shares[0] == min(a_count, max(gpus - b_count, (gpus + 1) // 2))
