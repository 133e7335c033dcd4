"""Lease groups in the scheduling core (docs/scheduling.md "Lease groups"): the queued requests of one group are
placed in one decision when every member fits — each member on any node, with its own quota check — or none is.

Policy under test: a group reserves nothing. When it does not fit, what it tried is undone and every request
behind it is decided as if the group were not there; so a group never blocks smaller work. A member needing a
reclaim gives its victims notice and every member waits, to start together. Until it has aged: a group that has
waited ``Snapshot.group_reserve_after_seconds`` (off, 0, unless set; the broker sets it) is served first and
reserves the tiers it needs against younger requests, so a stream of small requests cannot starve it (the
``ageing`` tests)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.scheduler import DecisionMode, GpuMode, Kind, Request, Shape, plan
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
from tests.scheduler.test_properties import SETTINGS, _plan, reclaim_scenarios, scenarios

QUOTAS = [quota("a", H100, 8000, 8000), quota("b", H100, 8000, 8000)]


def grouped(request: Request, group: str) -> Request:
    return replace(request, group=group)


def test_a_group_is_placed_across_nodes_in_one_decision():
    # two nodes of 2 GPUs; three 1-GPU stages: they fit only across both nodes
    snap = snapshot(("n1", H100, 2, GpuMode.WHOLE), ("n2", H100, 2, GpuMode.WHOLE), quotas=QUOTAS)
    stages = [grouped(whole(f"s{i}", "a", submitted_at=i), "pipe") for i in range(3)]
    decisions = by_request(plan(snap, stages, now=0.0))
    assert {d.mode for d in decisions.values()} == {DecisionMode.PLACED}
    assert {decisions[f"s{i}"].allocation.node for i in range(3)} == {"n1", "n2"}
    assert all("with group pipe (3 members placed together)" in d.reason for d in decisions.values())
    assert all(d.allocation.group == "pipe" for d in decisions.values())


def test_a_group_that_does_not_fit_whole_places_none_and_names_the_member():
    # 2 free GPUs; a group of 1 + 1 + 2 GPUs (gang): the first two would fit, the third does not
    snap = snapshot(("n1", H100, 2, GpuMode.WHOLE), quotas=QUOTAS)
    stages = [grouped(whole("s0", "a", submitted_at=0), "pipe"), grouped(whole("s1", "a", submitted_at=1), "pipe"),
              grouped(whole("s2", "a", 2, submitted_at=2), "pipe")]
    decisions = plan(snap, stages, now=0.0)
    assert [d.mode for d in decisions] == [DecisionMode.WAITING] * 3
    for decision in decisions:
        assert decision.allocation is None
        assert decision.reason.startswith("waiting: group pipe: request s2 (2 x whole GPU) does not fit: ")
        assert "no node has 2 free H100-80GB GPUs" in decision.reason
        assert decision.reason.endswith("no member is placed until all 3 fit")
    assert invariant_problems(snap, stages, decisions) == []


def test_a_waiting_group_reserves_nothing_smaller_work_behind_it_is_placed():
    # the group came first (same project, earlier); it does not fit; the single request behind it takes a GPU
    snap = snapshot(("n1", H100, 2, GpuMode.WHOLE), quotas=QUOTAS)
    requests = [grouped(whole("g0", "a", submitted_at=0), "big"), grouped(whole("g1", "a", 3, submitted_at=0), "big"),
                whole("small", "a", submitted_at=5), whole("other", "b", submitted_at=9)]
    decisions = by_request(plan(snap, requests, now=0.0))
    assert decisions["g0"].mode == decisions["g1"].mode == DecisionMode.WAITING
    assert decisions["small"].mode == decisions["other"].mode == DecisionMode.PLACED
    assert decisions["g0"].queue_position == 1 and decisions["g1"].queue_position == 2


def test_quota_applies_to_each_member_in_turn():
    # a may hold 2 GPUs: a group of three 1-GPU members waits whole, naming the third and the limit
    snap = snapshot(("n1", H100, 4, GpuMode.WHOLE), quotas=[quota("a", H100, 2000, 2000)])
    stages = [grouped(whole(f"s{i}", "a", submitted_at=i), "pipe") for i in range(3)]
    decisions = plan(snap, stages, now=0.0)
    assert {d.mode for d in decisions} == {DecisionMode.WAITING}
    assert "request s2 (1 x whole GPU) does not fit: project quota limit for H100-80GB exhausted (2000/2000" in (
        decisions[0].reason)


def test_over_quota_members_defer_the_group_to_the_over_quota_pass():
    # a deserves 1 GPU, may borrow up to 3: the group (1 in quota + 2 over) is placed, two members preemptible;
    # b's in-quota request, although later, is served first (in-quota pass)
    snap = snapshot(("n1", H100, 4, GpuMode.WHOLE), quotas=[quota("a", H100, 1000, 3000), quota("b", H100, 1000, 1000)])
    requests = [grouped(whole(f"s{i}", "a", submitted_at=i), "pipe") for i in range(3)] + [
        whole("b0", "b", submitted_at=10)]
    decisions = plan(snap, requests, now=0.0)
    assert [d.request for d in decisions] == ["b0", "s0", "s1", "s2"]
    assert {d.mode for d in decisions} == {DecisionMode.PLACED}
    assert [d.allocation.preemptible for d in decisions[1:]] == [False, True, True]


def test_a_member_that_needs_a_reclaim_starts_nobody_until_the_victims_leave():
    # n1: 2 free GPUs; n2: 2 GPUs borrowed by c (over quota). a's group of 4 in-quota GPUs: two fit now, two need
    # the reclaim. No member starts: the reclaiming ones give notice, the others wait; next cycle all start.
    borrowed = [held("c0", "c", "n2-g0", started_at=0), held("c1", "c", "n2-g1", started_at=0)]
    quotas = [quota("a", H100, 4000, 4000), quota("c", H100, 0, 4000)]
    snap = snapshot(("n1", H100, 2, GpuMode.WHOLE), ("n2", H100, 2, GpuMode.WHOLE), quotas=quotas,
                    allocations=borrowed)
    stages = [grouped(whole(f"s{i}", "a", submitted_at=i), "pipe") for i in range(4)]
    decisions = by_request(plan(snap, stages, now=100.0))
    assert sorted(d.mode for d in decisions.values()) == sorted([DecisionMode.WAITING] * 2 + [DecisionMode.PREEMPT] * 2)
    assert sorted(v for d in decisions.values() for v in d.victims) == ["c0", "c1"]
    waiting = [d for d in decisions.values() if d.mode == DecisionMode.WAITING]
    assert all("starts with its other members once the capacity reclaimed for request" in d.reason for d in waiting)
    assert invariant_problems(snap, stages, list(decisions.values())) == []
    # the victims have left: the whole group starts together
    after = snapshot(("n1", H100, 2, GpuMode.WHOLE), ("n2", H100, 2, GpuMode.WHOLE), quotas=quotas)
    assert {d.mode for d in plan(after, stages, now=200.0)} == {DecisionMode.PLACED}


def test_a_member_never_reclaims_from_its_own_group():
    # a's running member s0 is over quota (preemptible); the requeued member s1 is in quota and finds no room:
    # it does not take its sibling's GPU
    quotas = [quota("a", H100, 1000, 2000)]
    snap = snapshot(("n1", H100, 1, GpuMode.WHOLE), quotas=quotas,
                    allocations=[replace(held("s0", "a", "n1-g0", started_at=0), group="pipe")])
    decisions = plan(snap, [grouped(whole("s1", "a"), "pipe")], now=100.0)
    assert decisions[0].mode == DecisionMode.WAITING and not decisions[0].victims


def test_a_group_of_one_is_a_request_alone():
    snap = snapshot(("n1", H100, 2, GpuMode.WHOLE), quotas=QUOTAS)
    alone = plan(snap, [whole("r", "a")], now=0.0)[0]
    single = plan(snap, [grouped(whole("r", "a"), "solo")], now=0.0)[0]
    assert (single.mode, single.allocation.units, single.reason) == (alone.mode, alone.allocation.units, alone.reason)


# -- properties ------------------------------------------------------------------------------------------------


def _group_problems(requests: list[Request], decisions) -> list[str]:
    """A group is never partly placed: all its members placed, or none of them."""
    modes: dict[str, set] = {}
    for request, decision in ((r, d) for d in decisions for r in requests if r.id == d.request):
        if request.group:
            modes.setdefault(request.group, set()).add(decision.mode == DecisionMode.PLACED)
    return [f"group {group} partly placed" for group, placed in modes.items() if len(placed) > 1]


def _with_groups(requests: list[Request], labels: list[int]) -> list[Request]:
    return [replace(r, group=f"G{label}") if label else r for r, label in zip(requests, labels, strict=False)]


labels = st.lists(st.integers(0, 2), min_size=12, max_size=12)


@pytest.mark.parametrize("policy", ["default", "best-fit"])
@SETTINGS
@given(scenario=scenarios(), first_labels=labels, second_labels=labels)
def test_properties_a_group_is_never_partly_placed(policy, scenario, first_labels, second_labels):
    snap, first, second, seed = scenario
    first, second = _with_groups(first, first_labels), _with_groups(second, second_labels)
    decisions = _plan(snap, first, 0.0, policy, seed)
    assert invariant_problems(snap, first, decisions) == []
    assert _group_problems(first, decisions) == []
    snap2 = replace(snap, allocations=tuple(outcome(snap, decisions).allocations.values()))
    decisions2 = _plan(snap2, second, 100.0, policy, seed)
    assert invariant_problems(snap2, second, decisions2) == []
    assert _group_problems(second, decisions2) == []


@SETTINGS
@given(scenario=reclaim_scenarios(), second_labels=labels)
def test_properties_groups_that_reclaim_are_never_partly_placed(scenario, second_labels):
    snap, borrower, claimants, seed = scenario
    first = _plan(snap, borrower, 0.0, "default", seed)
    running = tuple(replace(a, started_at=80.0 if i % 2 else 0.0)
                    for i, a in enumerate(outcome(snap, first).allocations.values()))
    snap2 = replace(snap, allocations=running)
    claimants = _with_groups(claimants, second_labels)
    decisions = _plan(snap2, claimants, 100.0, "default", seed)
    assert invariant_problems(snap2, claimants, decisions) == []
    assert _group_problems(claimants, decisions) == []


@pytest.mark.parametrize("policy", ["default", "best-fit"])
@SETTINGS
@given(scenario=scenarios(), members=st.integers(1, 3), position=st.integers(-1, 200))
def test_properties_a_group_that_cannot_fit_changes_nobody_elses_decision(policy, scenario, members, position):
    """Reserve-nothing: adding a group whose last member can never be placed (a gang larger than any node) leaves
    every other request's decision (mode, allocation, victims, warm instances bound) exactly as without it,
    wherever the group sits in the queue: smaller requests are never held back by a group."""
    snap, requests, _, seed = scenario
    project = requests[0].project if requests else "p0"
    tenant = requests[0].tenant if requests else "t0"
    shape = Shape(Kind.WHOLE, 1, models=(H100,))
    group = [Request(f"grp{i}", project, tenant, shape, float(position), 0, group="G") for i in range(members)]
    group.append(Request("grp-last", project, tenant, Shape(Kind.WHOLE, 64, models=(H100,)), float(position) + 0.5,
                         0, group="G"))
    workload = None
    alone = {d.request: d for d in plan(snap, requests, now=0.0, policy=policy, seed=seed, workload=workload)}
    mixed = plan(snap, requests + group, now=0.0, policy=policy, seed=seed, workload=workload)
    assert {d.mode for d in mixed if d.request.startswith("grp")} == {DecisionMode.WAITING}
    for decision in mixed:
        if decision.request.startswith("grp"):
            continue
        before = alone[decision.request]
        assert (decision.mode, decision.allocation, decision.victims, decision.warm) == (
            before.mode, before.allocation, before.victims, before.warm)


def _stream(reserve_after: float, *, until: float = 600.0) -> tuple[float | None, list[float]]:
    """One node of 4 H100s; project a sends a 1-GPU request every 10 s, each holding its GPU 25 s (about three
    running at a time); project b's group of 4 one-GPU members arrives at t=5 and fits only when all 4 GPUs are
    free at once. A cycle every 10 s over the live allocations. Returns when the group was placed (None: never)
    and when each small request was placed."""
    base = snapshot(("n1", H100, 4, GpuMode.WHOLE), quotas=QUOTAS)
    base = replace(base, group_reserve_after_seconds=reserve_after)
    live: dict[str, tuple[object, float]] = {}  # allocation id -> (allocation, ends at)
    queued = [grouped(whole(f"g{i}", "b", submitted_at=5.0), "pipe") for i in range(4)]
    placed_group, small_placed, now = None, [], 0.0
    while now <= until:
        live = {k: v for k, v in live.items() if v[1] > now}
        queued.append(whole(f"s{int(now)}", "a", submitted_at=now))
        snap = replace(base, allocations=tuple(allocation for allocation, _ in live.values()))
        decisions = plan(snap, queued, now=now)
        assert invariant_problems(snap, queued, decisions) == []
        for decision in decisions:
            if decision.mode == DecisionMode.PLACED:
                member = decision.request.startswith("g")
                live[decision.request] = (decision.allocation, now + (3600.0 if member else 25.0))
                if member:
                    placed_group = now if placed_group is None else placed_group
                else:
                    small_placed.append(now)
        placed = {d.request for d in decisions if d.mode == DecisionMode.PLACED}
        queued = [r for r in queued if r.id not in placed]
        if placed_group is not None:
            assert not [r for r in queued if r.id.startswith("g")], "the group placed whole"
        now += 10.0
    return placed_group, small_placed


def test_ageing_a_large_group_is_placed_eventually_under_a_stream_of_small_requests():
    # without ageing the group starves: a GPU frees every 10 s and a small request takes it each time
    never, small = _stream(0.0)
    assert never is None and len(small) >= 55
    # with ageing (60 s) the group, once aged, reserves the H100s: the small requests younger than it wait, the
    # running ones finish, and the group is placed whole as soon as the four are free
    placed, small = _stream(60.0)
    assert placed is not None and 65.0 <= placed <= 65.0 + 40.0, placed
    # the reservation ends with the group's placement: small work is placed again later (once the group's GPUs are
    # given back: here it holds them an hour, so none in the run) and none was placed while the group waited aged
    assert not [t for t in small if 65.0 + 10.0 <= t < placed]


def test_ageing_holds_back_only_younger_requests_and_a_quota_bound_group_reserves_nothing():
    snap = replace(snapshot(("n1", H100, 2, GpuMode.WHOLE), quotas=QUOTAS), group_reserve_after_seconds=60.0)
    group = [grouped(whole(f"g{i}", "b", submitted_at=0.0), "pipe") for i in range(3)]  # 3 GPUs: never fits here
    older = whole("old", "a", submitted_at=-10.0)
    younger = whole("young", "a", submitted_at=30.0)
    decisions = by_request(plan(snap, [*group, older, younger], now=100.0))
    assert decisions["old"].mode == DecisionMode.PLACED  # older than the group: not held back
    assert decisions["young"].mode == DecisionMode.WAITING
    assert "reserved for an older lease group" in decisions["young"].reason
    assert all("reserves H100-80GB against younger requests" in decisions[f"g{i}"].reason for i in range(3))
    # not aged yet (the same at t=50): no reservation, the younger request is placed
    decisions = by_request(plan(snap, [*group, older, younger], now=50.0))
    assert decisions["young"].mode == DecisionMode.PLACED
    # a group its quota holds back (limit 2 GPUs for 3 members) reserves nothing, however long it waits
    tight = replace(snap, quotas=(quota("a", H100, 8000, 8000), quota("b", H100, 2000, 2000)))
    decisions = by_request(plan(tight, [*group, older, younger], now=100.0))
    assert decisions["young"].mode == DecisionMode.PLACED
