"""Reclaim (docs/architecture.md §3): an in-quota request that does not fit preempts over-quota work — the shallowest
classes of the victim order, then the least capacity taken, then the fewest victims; lowest priority, youngest first,
never non-preemptible work, never work younger than the minimum runtime."""

import pytest

from broker.scheduler import Allocation, DecisionMode, GpuMode, Unit, plan
from broker.scheduler.plan import Scheduler
from tests.scheduler.builders import (
    H100,
    by_request,
    held,
    invariant_problems,
    outcome,
    quota,
    snapshot,
    whole,
)

QUOTAS = [
    quota("a", H100, 1000, 8000),
    quota("b", H100, 2000, 2000),
    quota("c", H100, 0, 8000),
    quota("d", H100, 2000, 2000),
]
# n3 (2 GPUs) held within d's deserved: nothing to reclaim there
N3_FULL = [held("d0", "d", "n3-g0", preemptible=False), held("d1", "d", "n3-g1", preemptible=False)]


def test_reclaim_in_quota_request_preempts_over_quota_project():
    # a deserves 1 GPU but holds all 4 (3 over quota); b asks for 1 within its deserved
    snap = snapshot(
        ("n1", H100, 4, GpuMode.WHOLE),
        quotas=QUOTAS,
        allocations=[
            held("a0", "a", "n1-g0", preemptible=False, started_at=0),
            held("a1", "a", "n1-g1", started_at=1),
            held("a2", "a", "n1-g2", started_at=2),
            held("a3", "a", "n1-g3", started_at=3),
        ],
    )
    requests = [whole("rb", "b")]
    [decision] = plan(snap, requests, now=100)
    assert decision.mode == DecisionMode.PREEMPT
    assert decision.victims == ("a3",)  # one victim, the youngest of a's over-quota work
    assert decision.allocation.preemptible is False
    assert [unit.gpu for unit in decision.allocation.units] == ["n1-g3"]
    assert "a3 (a)" in decision.reason
    assert invariant_problems(snap, requests, [decision]) == []


def test_reclaim_never_preempts_non_preemptible_work():
    # every GPU is held within deserved: b's in-quota request waits, nobody is preempted
    snap = snapshot(
        ("n1", H100, 2, GpuMode.WHOLE),
        quotas=[quota("a", H100, 2000, 8000), quota("b", H100, 1000, 1000)],
        allocations=[held("a0", "a", "n1-g0", preemptible=False), held("a1", "a", "n1-g1", preemptible=False)],
    )
    [decision] = plan(snap, [whole("rb", "b")], now=100)
    assert decision.mode == DecisionMode.WAITING
    assert decision.victims == ()
    assert "no node has 1 free" in decision.reason


def test_reclaim_victims_are_only_the_over_quota_allocations_needed():
    # b needs 2 GPUs on one node; n1 has a non-preemptible and a preemptible, n2 two preemptible
    snap = snapshot(
        ("n1", H100, 2, GpuMode.WHOLE),
        ("n2", H100, 2, GpuMode.WHOLE),
        quotas=QUOTAS,
        allocations=[
            held("a0", "a", "n1-g0", preemptible=False),
            held("a1", "a", "n1-g1"),
            held("a2", "a", "n2-g0"),
            held("a3", "a", "n2-g1"),
        ],
    )
    requests = [whole("rb", "b", 2)]
    [decision] = plan(snap, requests, now=100)
    assert decision.mode == DecisionMode.PREEMPT
    assert sorted(decision.victims) == ["a2", "a3"]
    assert decision.allocation.node == "n2"
    assert invariant_problems(snap, requests, [decision]) == []


def test_reclaim_prefers_the_node_with_fewest_victims():
    # n1: two single-GPU victims; n2: one two-GPU victim
    snap = snapshot(
        ("n1", H100, 2, GpuMode.WHOLE),
        ("n2", H100, 2, GpuMode.WHOLE),
        quotas=QUOTAS,
        allocations=[
            held("a1", "a", "n1-g0", started_at=5),
            held("a2", "a", "n1-g1", started_at=6),
            held("a3", "a", ("n2-g0", "n2-g1"), started_at=1),
        ],
    )
    requests = [whole("rb", "b", 2)]
    [decision] = plan(snap, requests, now=100)
    assert decision.mode == DecisionMode.PREEMPT
    assert decision.victims == ("a3",)
    assert invariant_problems(snap, requests, [decision]) == []


@pytest.mark.parametrize(
    ("allocations", "victim"),
    [
        # same node: the youngest of equals
        ([held("old", "a", "n1-g0", started_at=10), held("young", "a", "n1-g1", started_at=20)], "young"),
        # same node: the lowest priority, even when older
        (
            [
                held("low", "a", "n1-g0", started_at=10, priority=0),
                held("high", "a", "n1-g1", started_at=20, priority=5),
            ],
            "low",
        ),
        # same node: the project furthest above its fair share (a: 2 over, c: 1 over, equal weights)
        (
            [
                held("c1", "c", "n1-g0", started_at=30),
                held("a1", "a", "n1-g1", started_at=10),
                held("a2", "a", "n1-g2", started_at=11),
                held("a0", "a", "n1-g3", preemptible=False),
            ],
            "a2",
        ),
    ],
    ids=["youngest", "lowest-priority", "furthest-above-fair-share"],
)
def test_reclaim_victim_order_on_one_node(allocations, victim):
    # the node is full: exactly one allocation must go
    snap = snapshot(("n1", H100, len(allocations), GpuMode.WHOLE), quotas=QUOTAS, allocations=allocations)
    requests = [whole("rb", "b")]
    [decision] = plan(snap, requests, now=100)
    assert decision.mode == DecisionMode.PREEMPT
    assert decision.victims == (victim,)
    assert invariant_problems(snap, requests, [decision]) == []


@pytest.mark.parametrize(
    ("allocations", "victim"),
    [
        ([held("old", "a", "n1-g0", started_at=10), held("young", "a", "n2-g0", started_at=20), *N3_FULL], "young"),
        (
            [
                held("high", "a", "n1-g0", started_at=20, priority=5),
                held("low", "a", "n2-g0", started_at=10, priority=0),
                *N3_FULL,
            ],
            "low",
        ),
        (
            [
                held("c1", "c", "n1-g0", started_at=30),
                held("a1", "a", "n2-g0", started_at=10),
                held("a2", "a", "n3-g0", started_at=11),
                held("a0", "a", "n3-g1", preemptible=False),
            ],
            "a2",
        ),
    ],
    ids=["youngest", "lowest-priority", "furthest-above-fair-share"],
)
def test_reclaim_victim_order_across_nodes(allocations, victim):
    snap = snapshot(
        ("n1", H100, 1, GpuMode.WHOLE),
        ("n2", H100, 1, GpuMode.WHOLE),
        ("n3", H100, 2, GpuMode.WHOLE),
        quotas=QUOTAS,
        allocations=allocations,
    )
    requests = [whole("rb", "b")]
    decisions = plan(snap, requests, now=100)
    [decision] = decisions
    assert decision.mode == DecisionMode.PREEMPT
    assert decision.victims == (victim,)


def test_reclaim_min_runtime_protects_young_allocations_then_waits():
    snap = snapshot(
        ("n1", H100, 2, GpuMode.WHOLE),
        quotas=QUOTAS,
        min_runtime_seconds=60,
        allocations=[held("a1", "a", "n1-g0", started_at=50), held("a2", "a", "n1-g1", started_at=60)],
    )
    [decision] = plan(snap, [whole("rb", "b")], now=100)
    assert decision.mode == DecisionMode.WAITING
    assert decision.victims == ()
    assert decision.reason.startswith("waiting: ")


def test_reclaim_min_runtime_takes_an_old_enough_allocation_over_a_younger_one():
    snap = snapshot(
        ("n1", H100, 2, GpuMode.WHOLE),
        quotas=QUOTAS,
        min_runtime_seconds=60,
        allocations=[held("a1", "a", "n1-g0", started_at=40), held("a2", "a", "n1-g1", started_at=60)],
    )
    [decision] = plan(snap, [whole("rb", "b")], now=100)
    assert decision.mode == DecisionMode.PREEMPT
    assert decision.victims == ("a1",)  # a2 is younger but has run only 40 of its 60 seconds


def test_reclaim_only_for_in_quota_requests():
    # c deserves nothing: its request is over quota and may not preempt a's over-quota work
    snap = snapshot(
        ("n1", H100, 2, GpuMode.WHOLE), quotas=QUOTAS, allocations=[held("a1", "a", "n1-g0"), held("a2", "a", "n1-g1")]
    )
    [decision] = plan(snap, [whole("rc", "c")], now=100)
    assert decision.mode == DecisionMode.WAITING
    assert decision.victims == ()


def test_reclaim_uses_free_capacity_before_preempting():
    snap = snapshot(("n1", H100, 2, GpuMode.WHOLE), quotas=QUOTAS, allocations=[held("a1", "a", "n1-g0")])
    [decision] = plan(snap, [whole("rb", "b")], now=100)
    assert decision.mode == DecisionMode.PLACED
    assert decision.victims == ()


def test_reclaim_several_requests_take_distinct_victims():
    snap = snapshot(
        ("n1", H100, 4, GpuMode.WHOLE),
        quotas=QUOTAS,
        allocations=[
            held("a0", "a", "n1-g0", preemptible=False),
            held("a1", "a", "n1-g1", started_at=1),
            held("a2", "a", "n1-g2", started_at=2),
            held("a3", "a", "n1-g3", started_at=3),
        ],
    )
    requests = [whole("rb1", "b", submitted_at=1), whole("rb2", "b", submitted_at=2), whole("rb3", "b", submitted_at=3)]
    decisions = plan(snap, requests, now=100)
    found = by_request(decisions)
    assert found["rb1"].victims == ("a3",)
    assert found["rb2"].victims == ("a2",)
    assert found["rb3"].mode == DecisionMode.WAITING  # b's deserved (2 GPUs) is used up: no more reclaim
    assert outcome(snap, decisions).victims == {"a2", "a3"}
    assert invariant_problems(snap, requests, decisions) == []


def test_reclaim_scheduler_keeps_state_across_cycles():
    # the live service and the simulator hold a Scheduler: the victim's capacity stays with b next cycle
    snap = snapshot(
        ("n1", H100, 2, GpuMode.WHOLE),
        quotas=QUOTAS,
        allocations=[held("a1", "a", "n1-g0"), held("a2", "a", "n1-g1", started_at=5)],
    )
    scheduler = Scheduler(snap)
    [first] = scheduler.schedule([whole("rb", "b")], now=100)
    assert first.mode == DecisionMode.PREEMPT and first.victims == ("a2",)
    # next cycle: b asks for its second deserved GPU; the only over-quota work left is a1
    [second] = scheduler.schedule([whole("rb2", "b", submitted_at=101)], now=200)
    assert second.mode == DecisionMode.PREEMPT and second.victims == ("a1",)
    [third] = scheduler.schedule([whole("rb3", "b", submitted_at=201)], now=300)
    assert third.mode == DecisionMode.WAITING  # b is at its limit of 2 GPUs
    assert "limit" in third.reason


def test_reclaim_takes_the_least_capacity_on_one_node():
    """Issue 32 item 6: the victims that take the least GPU capacity (the least borrowed work thrown away) win over
    fewer victims; with the capacity equal, the fewest victims."""
    def on(gpu, allocation_id, milli, started_at):
        return Allocation(allocation_id, "a", "acme", H100, "n1", (Unit(gpu, milli, 1000),), True, started_at)

    snap = snapshot(
        ("n1", H100, 2, GpuMode.SHARED),
        quotas=QUOTAS,
        allocations=[on("n1-g0", "v1", 300, 20), on("n1-g0", "v2", 300, 19), on("n1-g1", "v3", 1000, 10)],
    )
    requests = [whole("rb", "b")]
    [decision] = plan(snap, requests, now=100)
    assert decision.mode == DecisionMode.PREEMPT
    assert sorted(decision.victims) == ["v1", "v2"]  # 600 milli taken, not v3's 1000
    snap = snapshot(
        ("n1", H100, 2, GpuMode.SHARED),
        quotas=QUOTAS,
        allocations=[on("n1-g0", "v1", 500, 20), on("n1-g0", "v2", 500, 19), on("n1-g1", "v3", 1000, 10)],
    )
    [decision] = plan(snap, requests, now=100)
    assert decision.victims == ("v3",)  # 1000 milli either way: one victim rather than two


def test_reclaim_for_a_spread_request_takes_victims_on_several_nodes():
    # b asks for 3 GPUs without a gang: no node alone can free 3, but victims on n1 and n2 together can
    snap = snapshot(
        ("n1", H100, 2, GpuMode.WHOLE),
        ("n2", H100, 2, GpuMode.WHOLE),
        quotas=[quota("a", H100, 1000, 8000), quota("b", H100, 3000, 3000)],
        allocations=[
            held("a0", "a", "n1-g0", preemptible=False, started_at=0),
            held("a1", "a", "n1-g1", started_at=1),
            held("a2", "a", "n2-g0", started_at=2),
            held("a3", "a", "n2-g1", started_at=3),
        ],
    )
    requests = [whole("rb", "b", 3, gang=False)]
    [decision] = plan(snap, requests, now=100)
    assert decision.mode == DecisionMode.PREEMPT
    assert sorted(decision.victims) == ["a1", "a2", "a3"]
    assert sorted(unit.gpu for unit in decision.allocation.units) == ["n1-g1", "n2-g0", "n2-g1"]
    assert invariant_problems(snap, requests, [decision]) == []


def test_reclaim_for_a_spread_request_uses_free_gpus_and_only_the_victims_needed():
    # one GPU free on n1; b needs 2 spread: one victim suffices, the youngest of a's over-quota work
    snap = snapshot(
        ("n1", H100, 2, GpuMode.WHOLE),
        ("n2", H100, 2, GpuMode.WHOLE),
        quotas=[quota("a", H100, 1000, 8000), quota("b", H100, 2000, 2000)],
        allocations=[
            held("a0", "a", "n1-g0", preemptible=False, started_at=0),
            held("a2", "a", "n2-g0", started_at=2),
            held("a3", "a", "n2-g1", started_at=3),
        ],
    )
    requests = [whole("rb", "b", 2, gang=False)]
    [decision] = plan(snap, requests, now=100)
    assert decision.mode == DecisionMode.PREEMPT
    assert decision.victims == ("a3",)
    assert invariant_problems(snap, requests, [decision]) == []


def test_reclaim_for_a_spread_request_that_cannot_be_met_changes_nothing():
    # b needs 3 spread GPUs but only 2 are preemptible: it waits, nobody is preempted
    snap = snapshot(
        ("n1", H100, 2, GpuMode.WHOLE),
        ("n2", H100, 2, GpuMode.WHOLE),
        quotas=[quota("a", H100, 2000, 8000), quota("b", H100, 3000, 3000)],
        allocations=[
            held("a0", "a", "n1-g0", preemptible=False),
            held("a1", "a", "n2-g0", preemptible=False),
            held("a2", "a", "n1-g1"),
            held("a3", "a", "n2-g1"),
        ],
    )
    scheduler = Scheduler(snap)
    [decision] = scheduler.schedule([whole("rb", "b", 3, gang=False)], now=100)
    assert decision.mode == DecisionMode.WAITING
    assert "fewer than 3" in decision.reason
    assert sorted(scheduler.cluster.allocations) == ["a0", "a1", "a2", "a3"]
