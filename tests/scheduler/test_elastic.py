"""Elastic leases and reclaim by need (issue 32 item 6): an elastic over-quota allocation (``Shape.min_count``)
gives back units under reclaim instead of being preempted whole, never below its minimum; whole victims are the
set that takes the least capacity, then the fewest, then the best ranked in the victim order."""


from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.scheduler import Allocation, DecisionMode, GpuMode, Unit, plan
from tests.scheduler.builders import H100, held, invariant_problems, outcome, quota, share, snapshot, whole

QUOTAS = [quota("a", H100, 0, 16000), quota("b", H100, 4000, 4000), quota("c", H100, 0, 16000)]
EIGHT = [f"n1-g{index}" for index in range(8)]


def test_elastic_over_quota_lease_shrinks_to_free_what_is_needed():
    """The demo of issue 32: an 8-GPU over-quota lease, 2 GPUs needed in quota: 2 taken, 6 keep running."""
    snap = snapshot(("n1", H100, 8, GpuMode.WHOLE), quotas=QUOTAS, allocations=[held("a8", "a", EIGHT, min_units=2)])
    [decision] = plan(snap, [whole("rb", "b", 2)], now=100)
    assert decision.mode == DecisionMode.SHRINK
    assert decision.victims == ()
    [(shrunk, taken)] = decision.shrunk
    assert shrunk == "a8" and [unit.gpu for unit in taken] == ["n1-g6", "n1-g7"]  # its last units first
    assert sorted(unit.gpu for unit in decision.allocation.units) == ["n1-g6", "n1-g7"]
    assert "from 8 to 6 units (its minimum 2)" in decision.reason
    after = outcome(snap, [decision]).allocations
    assert len(after["a8"].units) == 6 and after["a8"].min_units == 2
    assert invariant_problems(snap, [whole("rb", "b", 2)], [decision]) == []


def test_not_elastic_or_at_its_minimum_is_preempted_whole():
    for min_units in (0, 7, 8):  # not elastic; would go below its minimum of 7; min = count is not elastic
        snap = snapshot(("n1", H100, 8, GpuMode.WHOLE), quotas=QUOTAS,
                        allocations=[held("a8", "a", EIGHT, min_units=min_units)])
        [decision] = plan(snap, [whole("rb", "b", 2)], now=100)
        assert decision.mode == DecisionMode.PREEMPT and decision.victims == ("a8",), min_units


def test_placed_elastic_request_carries_its_minimum_and_mig_is_never_elastic():
    snap = snapshot(("n1", H100, 8, GpuMode.WHOLE), quotas=QUOTAS)
    [decision] = plan(snap, [whole("ra", "a", 4, min_count=1)], now=0)
    assert decision.allocation.min_units == 1 and decision.allocation.preemptible
    [decision] = plan(snap, [whole("ra", "a", 4, min_count=4)], now=0)
    assert decision.allocation.min_units == 0  # min = count: nothing to give back


def test_in_quota_elastic_work_is_never_shrunk():
    snap = snapshot(("n1", H100, 8, GpuMode.WHOLE), quotas=QUOTAS,
                    allocations=[held("b4", "b", EIGHT[:4], preemptible=False, min_units=1),
                                 held("a4", "a", EIGHT[4:], min_units=0)])
    [decision] = plan(snap, [whole("rc", "c", 1)], now=100)
    assert decision.mode == DecisionMode.WAITING  # c borrows: over quota, no idle capacity, no reclaim
    [decision] = plan(snap, [whole("rb", "b", 1, submitted_at=1)], now=100)
    assert decision.mode == DecisionMode.WAITING  # b at its limit with its own in-quota work
    snap = snapshot(("n1", H100, 8, GpuMode.WHOLE), quotas=[*QUOTAS[:1], quota("b", H100, 8000, 8000), QUOTAS[2]],
                    allocations=[held("b4", "b", EIGHT[:4], preemptible=False, min_units=1),
                                 held("a4", "a", EIGHT[4:])])
    [decision] = plan(snap, [whole("rb", "b", 1, submitted_at=1)], now=100)
    assert decision.mode == DecisionMode.PREEMPT and decision.victims == ("a4",)  # never b4, in quota


def test_shrink_beats_a_whole_victim_taking_as_much_when_it_ranks_first_and_a_bigger_one_always():
    # a (deepest over its share: 8 GPUs) is elastic; c borrows 2 GPUs on n2
    allocations = [held("a8", "a", EIGHT, min_units=4), held("c2", "c", ["n2-g0", "n2-g1"])]
    snap = snapshot(("n1", H100, 8, GpuMode.WHOLE), ("n2", H100, 2, GpuMode.WHOLE), quotas=QUOTAS,
                    allocations=allocations)
    [decision] = plan(snap, [whole("rb", "b", 2)], now=100)
    # 2 GPUs either way; a is furthest above its fair share (ranked first): it gives back 2 units rather than c
    # losing its lease
    assert decision.mode == DecisionMode.SHRINK and decision.shrunk[0][0] == "a8"
    # a 2-GPU lease of a itself (younger) takes as much capacity as the shrink, in one lease: either frees 2 GPUs
    allocations = [held("a8", "a", EIGHT, min_units=4, started_at=0), held("a2", "a", ["n2-g0", "n2-g1"], started_at=5)]
    snap = snapshot(("n1", H100, 8, GpuMode.WHOLE), ("n2", H100, 2, GpuMode.WHOLE), quotas=QUOTAS,
                    allocations=allocations)
    [decision] = plan(snap, [whole("rb", "b", 2)], now=100)
    assert decision.mode in (DecisionMode.SHRINK, DecisionMode.PREEMPT)
    taken = sum(u.milli for _, units in decision.shrunk for u in units) + 2000 * len(decision.victims)
    assert taken == 2000
    # a 4-GPU lease of c on n2 is the only whole victim there: the shrink of a's (2 GPUs) takes less
    allocations = [held("a8", "a", EIGHT, min_units=4), held("c4", "c", [f"n2-g{i}" for i in range(4)])]
    snap = snapshot(("n1", H100, 8, GpuMode.WHOLE), ("n2", H100, 4, GpuMode.WHOLE), quotas=QUOTAS,
                    allocations=allocations)
    [decision] = plan(snap, [whole("rb", "b", 2)], now=100)
    assert decision.mode == DecisionMode.SHRINK and decision.shrunk[0][0] == "a8"


def test_whole_victims_take_the_least_capacity_beyond_the_need():
    """Two 1-GPU leases of a on n2 free what is needed; a's 8-GPU lease on n1 would throw 6 GPUs of work away."""
    allocations = [held("a8", "a", EIGHT), held("a1", "a", "n2-g0", started_at=3), held("a1b", "a", "n2-g1")]
    snap = snapshot(("n1", H100, 8, GpuMode.WHOLE), ("n2", H100, 2, GpuMode.WHOLE), quotas=QUOTAS,
                    allocations=allocations)
    [decision] = plan(snap, [whole("rb", "b", 2)], now=100)
    assert decision.mode == DecisionMode.PREEMPT and sorted(decision.victims) == ["a1", "a1b"]


def test_shares_shrink_too():
    units = tuple(Unit(f"n1-g{index}", 500, 40_000) for index in range(2))
    elastic = Allocation("as", "a", "acme", H100, "n1", units, True, 0.0, min_units=1)
    full = tuple(Unit(f"n1-g{index}", 500, 40_000) for index in range(2))
    other = Allocation("ax", "a", "acme", H100, "n1", full, True, 50.0)
    snap = snapshot(("n1", H100, 2, GpuMode.SHARED), quotas=QUOTAS, allocations=[elastic, other])
    [decision] = plan(snap, [share("rb", "b", 500, 40_000)], now=100)
    assert decision.mode == DecisionMode.SHRINK
    assert decision.shrunk == (("as", (units[1],)),)


@st.composite
def elastic_reclaim_scenarios(draw):
    """Whole-GPU nodes of 8 filled by the borrowers' (a, c) over-quota allocations of random sizes, some elastic at
    random minimums, and some in-quota work of b and d (never preemptible); then b and d ask within what they
    deserve, which only a reclaim can serve."""
    nodes = draw(st.integers(1, 3))
    allocations, index = [], 0
    for node in range(nodes):
        free = list(range(8))
        while free:
            size = draw(st.integers(1, len(free)))
            gpus, free = [f"n{node}-g{i}" for i in free[:size]], free[size:]
            owner = draw(st.sampled_from(["a", "a", "c", "b", "d"]))
            in_quota = owner in ("b", "d")
            minimum = draw(st.integers(0, size)) if draw(st.booleans()) else 0
            allocations.append(held(f"{owner}{index}", owner, gpus, preemptible=not in_quota, min_units=minimum,
                                    started_at=draw(st.sampled_from([0.0, 80.0])),
                                    priority=draw(st.integers(0, 1))))
            index += 1
    used = {owner: sum(len(a.units) * 1000 for a in allocations if a.project == owner) for owner in "bd"}
    quotas = [quota("a", H100, 0, 100_000, draw(st.integers(1, 3))), quota("c", H100, 0, 100_000, 1)]
    for owner in "bd":
        deserved = used[owner] + draw(st.sampled_from([1000, 2000, 4000, 8000]))
        quotas.append(quota(owner, H100, deserved, deserved))
    specs = [(f"n{node}", H100, 8, GpuMode.WHOLE) for node in range(nodes)]
    snap = snapshot(*specs, quotas=quotas, allocations=allocations,
                    min_runtime_seconds=draw(st.sampled_from([0.0, 50.0])))
    claimants = [whole(f"r{i}", draw(st.sampled_from("bd")), draw(st.integers(1, 4)), submitted_at=float(i),
                       gang=draw(st.booleans()))
                 for i in range(draw(st.integers(1, 4)))]
    return snap, claimants


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=elastic_reclaim_scenarios())
def test_properties_a_shrink_never_goes_below_its_minimum_never_touches_in_quota_and_frees_enough(scenario):
    snap, claimants = scenario
    decisions = plan(snap, claimants, now=100.0)
    # every rule of the fleet holds with the shrinks applied: what was taken back made room for what was placed
    assert invariant_problems(snap, claimants, decisions) == []
    assert decisions == plan(snap, claimants, now=100.0)  # deterministic
    running = {allocation.id: allocation for allocation in snap.allocations}
    for decision in decisions:
        assert all(running[victim].preemptible for victim in decision.victims)  # in-quota work is never a victim
        if decision.mode != DecisionMode.SHRINK:
            assert decision.shrunk == ()
            continue
        assert decision.victims == () and decision.allocation is not None
        for allocation_id, taken in decision.shrunk:
            before = running[allocation_id]
            assert before.preemptible  # only over-quota work gives units back
            assert 0 < before.min_units <= len(before.units) - len(taken)  # never below its minimum
            assert set(taken) <= set(before.units)
            assert before.started_at + snap.min_runtime_seconds <= 100.0
