"""Elastic leases grow back (issue 32 item 6): an elastic over-quota allocation shrunk under reclaim holding fewer
units than it asked for (``Allocation.grow_to``) takes units back toward its count on the capacity a cycle leaves
idle (``DecisionMode.GROW``, ``Scheduler.grown``): after every request, over quota (within the limits), of its own
shape, its own nodes first."""

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.scheduler import Allocation, DecisionMode, GpuMode, Unit
from broker.scheduler.plan import Scheduler
from broker.scheduler.state import ClusterState
from tests.scheduler.builders import H100, held, invariant_problems, quota, snapshot, whole

QUOTAS = [quota("a", H100, 0, 16000), quota("b", H100, 4000, 4000), quota("c", H100, 0, 16000)]
EIGHT = [f"n1-g{index}" for index in range(8)]


def cycle(snap, requests, *, now=100.0, grow=True):
    scheduler = Scheduler(snap, grow=grow)
    decisions = scheduler.schedule(requests, now=now)
    return scheduler, decisions, scheduler.grown


def test_a_shrunk_lease_grows_back_to_its_count_when_capacity_frees():
    """a8 asked for 8, was shrunk to 6 (n1-g6, n1-g7 went to b, whose lease has ended): it takes both back."""
    snap = snapshot(("n1", H100, 8, GpuMode.WHOLE), quotas=QUOTAS,
                    allocations=[held("a8", "a", EIGHT[:6], min_units=2, grow_to=8)])
    scheduler, decisions, grown = cycle(snap, [])
    assert decisions == []
    [decision] = grown
    assert decision.mode == DecisionMode.GROW and decision.request == "a8"
    assert [unit.gpu for unit in decision.grown] == ["n1-g6", "n1-g7"]
    assert len(decision.allocation.units) == 8 and decision.allocation.preemptible
    assert decision.allocation.min_units == 2 and decision.allocation.grow_to == 8
    assert "from 6 to 8 units of its 8 (capacity freed; over quota, preemptible)" in decision.reason
    assert scheduler.cluster.allocations["a8"] == decision.allocation
    assert not scheduler.cluster.growable  # grown to its count: no longer a candidate
    # off: nothing grows
    assert cycle(snap, [], grow=False)[2] == []
    # deterministic
    assert cycle(snap, [])[2] == grown


def test_growth_is_partial_when_only_some_units_fit_and_never_beyond_the_count_or_the_limit():
    snap = snapshot(("n1", H100, 8, GpuMode.WHOLE), quotas=QUOTAS,
                    allocations=[held("a8", "a", EIGHT[:4], min_units=2, grow_to=8),
                                 held("c1", "c", "n1-g7")])
    [decision] = cycle(snap, [])[2]
    assert [unit.gpu for unit in decision.grown] == ["n1-g4", "n1-g5", "n1-g6"]  # 7 of its 8: one GPU is c's
    # the project's limit: 5000 milli leaves one GPU more
    limited = replace(snap, quotas=(quota("a", H100, 0, 5000), *QUOTAS[1:]))
    [decision] = cycle(limited, [])[2]
    assert len(decision.grown) == 1
    # at its limit, or of a project that does not borrow (weight 0): nothing
    for spec in (quota("a", H100, 0, 4000), quota("a", H100, 0, 16000, weight=0)):
        assert cycle(replace(snap, quotas=(spec, *QUOTAS[1:])), [])[2] == []
    # a lease at its count, one not elastic: no candidate
    for allocation in (held("a8", "a", EIGHT, min_units=2, grow_to=8), held("a4", "a", EIGHT[:4])):
        assert cycle(snapshot(("n1", H100, 8, GpuMode.WHOLE), ("n2", H100, 8, GpuMode.WHOLE), quotas=QUOTAS,
                              allocations=[allocation]), [])[2] == []


def test_queued_requests_come_first_growth_takes_only_what_they_leave():
    snap = snapshot(("n1", H100, 8, GpuMode.WHOLE), quotas=QUOTAS,
                    allocations=[held("a8", "a", EIGHT[:6], min_units=2, grow_to=8)])
    # an in-quota request of b takes one of the two free GPUs; a grows by the other only
    _scheduler, [decision], [grown] = cycle(snap, [whole("rb", "b", 1)])
    assert decision.mode == DecisionMode.PLACED and [u.gpu for u in decision.allocation.units] == ["n1-g6"]
    assert [unit.gpu for unit in grown.grown] == ["n1-g7"]
    # an over-quota request of c (another borrower) takes both: nothing left to grow on
    _, [decision], grown = cycle(snap, [whole("rc", "c", 2)])
    assert decision.mode == DecisionMode.PLACED and grown == []
    # a request of a itself comes first too (a queued request, not the running lease, gets the capacity)
    _, [decision], grown = cycle(snap, [whole("ra", "a", 2)])
    assert decision.mode == DecisionMode.PLACED and grown == []


def test_no_growth_on_a_tier_where_a_waiting_request_could_use_the_idle_capacity():
    """A group waits for its other member (which does not fit); its first member would fit on the idle GPUs: the
    growth leaves them."""
    snap = snapshot(("n1", H100, 8, GpuMode.WHOLE), quotas=QUOTAS,
                    allocations=[held("a8", "a", EIGHT[:6], min_units=2, grow_to=8)])
    scheduler = Scheduler(snap)
    members = [replace(whole("g1", "b", 2), group="gb"), replace(whole("g2", "b", 2, models=("A100-80GB",)),
                                                                     group="gb")]
    decisions = scheduler.schedule(members, now=100.0)
    assert all(d.mode == DecisionMode.WAITING for d in decisions)
    assert scheduler.grown == []


def test_growth_never_takes_what_a_reclaim_of_the_cycle_frees_nor_grows_a_lease_it_touched():
    """b reclaims one GPU from c's 2-GPU lease (c2, not elastic): the other GPU of c2 is free in the plan but c
    still holds it until it leaves; a (shrunk to 4 on n1, its minimum) does not grow there."""
    snap = snapshot(("n1", H100, 4, GpuMode.WHOLE), ("n2", H100, 2, GpuMode.WHOLE), quotas=QUOTAS,
                    allocations=[held("a8", "a", [f"n1-g{i}" for i in range(4)], min_units=4, grow_to=8),
                                 held("c2", "c", ["n2-g0", "n2-g1"])])
    _, [decision], grown = cycle(snap, [whole("rb", "b", 1)])
    assert decision.mode == DecisionMode.PREEMPT and decision.victims == ("c2",)
    assert grown == []  # a8 is not a spread lease anyway; see the spread case below
    spread = replace(snap, allocations=(replace(snap.allocations[0], grow_spread=True), snap.allocations[1]))
    _scheduler, [decision], grown = cycle(spread, [whole("rb", "b", 1)])
    assert decision.mode == DecisionMode.PREEMPT and grown == []
    # a lease shrunk in this very cycle does not grow in it
    snap = snapshot(("n1", H100, 8, GpuMode.WHOLE), quotas=QUOTAS,
                    allocations=[held("a8", "a", EIGHT, min_units=2, grow_to=8)])
    _, [decision], grown = cycle(snap, [whole("rb", "b", 1)])
    assert decision.mode == DecisionMode.SHRINK and grown == []


def test_a_gang_lease_grows_on_its_own_node_only_a_spread_one_elsewhere_its_nvlink_domain_first():
    allocation = held("a8", "a", ["n1-g0", "n1-g1"], min_units=1, grow_to=4)
    busy = held("c6", "c", [f"n1-g{i}" for i in range(2, 8)])
    snap = snapshot(("n1", H100, 8, GpuMode.WHOLE), ("n2", H100, 8, GpuMode.WHOLE), quotas=QUOTAS,
                    allocations=[allocation, busy])
    assert cycle(snap, [])[2] == []  # its node is full; a gang does not spread to n2
    spread = replace(snap, allocations=(replace(allocation, grow_spread=True), busy))
    [decision] = cycle(spread, [])[2]
    assert [unit.gpu for unit in decision.grown] == ["n2-g0", "n2-g1"]
    # NVLink: n3 shares its domain with n1, so it comes before n2
    gpus = tuple(replace(gpu, nvlink_domain="d1") if gpu.node in ("n1", "n3") else gpu
                 for gpu in snapshot(("n1", H100, 8, GpuMode.WHOLE), ("n2", H100, 8, GpuMode.WHOLE),
                                     ("n3", H100, 8, GpuMode.WHOLE)).gpus)
    snap3 = replace(spread, nodes=snapshot(("n1", H100, 8, GpuMode.WHOLE), ("n2", H100, 8, GpuMode.WHOLE),
                                           ("n3", H100, 8, GpuMode.WHOLE)).nodes, gpus=gpus)
    [decision] = cycle(snap3, [])[2]
    assert [unit.gpu for unit in decision.grown] == ["n3-g0", "n3-g1"]


def test_shares_grow_with_their_own_milli_and_memory_one_per_gpu():
    units = (Unit("n1-g0", 500, 40_000),)
    elastic = Allocation("as", "a", "acme", H100, "n1", units, True, 0.0, min_units=1, grow_to=3)
    snap = snapshot(("n1", H100, 2, GpuMode.SHARED), quotas=QUOTAS, allocations=[elastic])
    [decision] = cycle(snap, [])[2]
    assert decision.grown == (Unit("n1-g1", 500, 40_000),)  # one per GPU: n1-g0 already holds one of its units


def test_several_shrunk_leases_grow_in_fair_share_order():
    """Two shrunk leases, room for two GPUs: the project borrowing the least per weight grows first, re-ranked
    after each growth, so the two end level (a: 3 → 4; c: 3 → 4); ties go to the project id."""
    snap = snapshot(("n1", H100, 8, GpuMode.WHOLE), quotas=QUOTAS,
                    allocations=[held("a6", "a", ["n1-g0", "n1-g1", "n1-g2"], min_units=1, grow_to=6),
                                 held("c6", "c", ["n1-g3", "n1-g4", "n1-g5"], min_units=1, grow_to=6)])
    grown = cycle(snap, [])[2]
    # one decision per lease per cycle: a (tie, lower id) takes both GPUs first... then c has none
    assert [d.request for d in grown] == ["a6"] and len(grown[0].grown) == 2
    # with a borrowing more already, c goes first
    snap = replace(snap, allocations=(*snap.allocations, held("a1", "a", "n1-g6")))
    grown = cycle(snap, [])[2]
    assert [d.request for d in grown] == ["c6"] and [u.gpu for u in grown[0].grown] == ["n1-g7"]


def test_host_cpu_per_unit_comes_along_and_bounds_growth():
    snap = snapshot(("n1", H100, 8, GpuMode.WHOLE), quotas=QUOTAS,
                    allocations=[held("a8", "a", EIGHT[:2], min_units=1, grow_to=8, cpu_milli=2000)])
    nodes = (replace(snap.nodes[0], cpu_milli=5000),)
    [decision] = cycle(replace(snap, nodes=nodes), [])[2]
    assert len(decision.grown) == 3 and decision.allocation.cpu_milli == 5000  # 1000 per unit, 5 units


def test_without_a_shrunk_lease_the_growth_pass_does_nothing():
    snap = snapshot(("n1", H100, 8, GpuMode.WHOLE), quotas=QUOTAS, allocations=[held("a4", "a", EIGHT[:4])])
    assert not ClusterState.from_snapshot(snap).growable
    _scheduler, decisions, grown = cycle(snap, [whole("rc", "c", 2)])
    assert grown == [] and decisions[0].mode == DecisionMode.PLACED


@st.composite
def shrunk_fleets(draw):
    nodes = draw(st.integers(1, 3))
    allocations, index = [], 0
    for node in range(nodes):
        free = list(range(8))
        while free:
            size = draw(st.integers(1, len(free)))
            gpus, free = [f"n{node}-g{i}" for i in free[:size]], free[size:]
            if draw(st.booleans()):
                continue  # left idle
            owner = draw(st.sampled_from(["a", "c", "b"]))
            grow_to = size + draw(st.integers(0, 4)) if owner != "b" else 0
            allocations.append(held(f"{owner}{index}", owner, gpus, preemptible=owner != "b",
                                    min_units=1 if grow_to > 1 else 0, grow_to=grow_to if grow_to > 1 else 0,
                                    priority=draw(st.integers(0, 1))))
            index += 1
    used = {owner: sum(len(a.units) * 1000 for a in allocations if a.project == owner) for owner in "ab"}
    quotas = [quota("a", H100, 0, used["a"] + draw(st.sampled_from([0, 1000, 100_000]))),
              quota("c", H100, 0, 100_000), quota("b", H100, used["b"] + 4000, used["b"] + 4000)]
    snap = snapshot(*[(f"n{node}", H100, 8, GpuMode.WHOLE) for node in range(nodes)], quotas=quotas,
                    allocations=allocations)
    requests = [whole(f"r{i}", draw(st.sampled_from("abc")), draw(st.integers(1, 3)), submitted_at=float(i))
                for i in range(draw(st.integers(0, 3)))]
    return snap, requests


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=shrunk_fleets())
def test_properties_growth_respects_count_quota_and_capacity_and_is_deterministic(scenario):
    snap, requests = scenario
    _scheduler, decisions, grown = cycle(snap, requests)
    again = cycle(snap, requests)
    assert (decisions, grown) == (again[1], again[2])
    before = {allocation.id: allocation for allocation in snap.allocations}
    # every rule of the fleet holds with the growth applied (capacity, quota limits), the requests' decisions are
    # those without growth (growth comes last and changes none of them)
    assert decisions == cycle(snap, requests, grow=False)[1]
    grown_snap = replace(snap, allocations=tuple(
        next((d.allocation for d in grown if d.request == a.id), a) for a in snap.allocations))
    assert invariant_problems(grown_snap, requests, decisions) == []
    for decision in grown:
        old = before[decision.request]
        assert decision.mode == DecisionMode.GROW and old.grow_to > len(old.units)
        assert len(old.units) < len(decision.allocation.units) <= old.grow_to
        assert decision.allocation.units[:len(old.units)] == old.units
        assert {unit.gpu.split("-")[0] for unit in decision.grown} == {old.node}  # a gang: its own node
        assert decision.allocation.preemptible

