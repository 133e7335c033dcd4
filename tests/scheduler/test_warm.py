"""Warm instances (docs/scheduling.md "Warm instances"): pre-created MIG instances that no lease holds. A request of
their profile on their tier binds one (``Decision.warm``) instead of a new placement; until then nothing else is
placed over it; it is never a preemption victim and counts toward nobody's quota."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.scheduler import (
    Allocation,
    DecisionMode,
    Gpu,
    GpuMode,
    Kind,
    Node,
    Request,
    Shape,
    Snapshot,
    Unit,
    WarmInstance,
    plan,
)
from broker.scheduler.placement import POLICIES
from broker.scheduler.plan import Scheduler
from gpus.mig import MigPlacement, layout_problem, profile_get, profiles_for
from tests.scheduler.builders import (
    A100,
    H100,
    by_request,
    invariant_problems,
    mig,
    outcome,
    quota,
    snapshot,
    warm,
)
from tests.scheduler.test_properties import quota_sets, request_lists

QUOTAS = [quota("p", H100, 8000, 8000), quota("p", A100, 8000, 8000), quota("borrower", H100, 0, 8000)]


def _one(snap: Snapshot, request: Request, now: float = 0.0):
    decisions = plan(snap, [request], now=now)
    assert invariant_problems(snap, [request], decisions) == []
    return decisions[0]


def _slots(decision) -> list[tuple[str, str, int]]:
    return [(unit.gpu, unit.mig_profile, unit.mig_start) for unit in decision.allocation.units]


def test_warm_in_quota_request_binds_the_instance():
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), quotas=QUOTAS, warm=[warm("w1", "n1-g0", "1g.10gb", 3)])
    decision = _one(snap, mig("r", "p", "1g.10gb"), now=50)
    assert decision.mode == DecisionMode.PLACED
    assert decision.warm == ("w1",)
    assert _slots(decision) == [("n1-g0", "1g.10gb", 3)]  # the slot the policy would not have chosen
    unit = decision.allocation.units[0]
    assert (unit.milli, unit.memory_mib) == (142, 9984)
    assert decision.allocation.preemptible is False
    assert decision.allocation.started_at == 50
    assert "warm instance w1" in decision.reason


def test_warm_over_quota_request_binds_the_instance_as_preemptible():
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), quotas=QUOTAS, warm=[warm("w1", "n1-g0", "2g.20gb", 2)])
    decision = _one(snap, mig("r", "borrower", "2g.20gb"))
    assert decision.warm == ("w1",)
    assert decision.allocation.preemptible is True
    assert "over quota, preemptible" in decision.reason


def test_warm_profile_names_are_matched_as_the_catalogue_spells_them():
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), quotas=QUOTAS, warm=[warm("w1", "n1-g0", "MIG 1G.10GB", 5)])
    decision = _one(snap, mig("r", "p", "1g.10gb"))
    assert decision.warm == ("w1",)
    assert _slots(decision) == [("n1-g0", "1g.10gb", 5)]


def test_warm_other_profile_is_not_bound():
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), quotas=QUOTAS, warm=[warm("w1", "n1-g0", "1g.10gb", 0)])
    decision = _one(snap, mig("r", "p", "2g.20gb"))
    assert decision.mode == DecisionMode.PLACED
    assert decision.warm == ()
    assert "warm" not in decision.reason
    assert decision.allocation.units[0].mig_start != 0  # slot 0 is the warm 1g's


def test_warm_other_tier_is_not_bound():
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), ("n2", A100, 1, GpuMode.MIG), quotas=QUOTAS,
                    warm=[warm("w1", "n1-g0", "1g.10gb", 0)])
    decision = _one(snap, mig("r", "p", "1g.10gb", models=(A100,)))
    assert decision.warm == ()
    assert decision.allocation.tier == A100


@pytest.mark.parametrize(
    ("requests", "placed_starts"),
    [
        (["7g.80gb"], []),  # the warm 1g takes a slice: no 7g
        (["4g.40gb"], []),  # 4g only at 0, where the warm 1g is
        (["3g.40gb", "3g.40gb"], [4]),  # 3g at 4; the second 3g would overlap the warm 1g at 0
        (["2g.20gb"] * 4, [2, 4]),  # 2g starts only at 0, 2, 4: the one at 0 would overlap the warm 1g
    ],
)
def test_warm_instance_slots_are_never_given_to_other_shapes(requests, placed_starts):
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), quotas=QUOTAS, warm=[warm("w1", "n1-g0", "1g.10gb", 0)])
    batch = [mig(f"r{i}", "p", profile, submitted_at=i) for i, profile in enumerate(requests)]
    decisions = plan(snap, batch, now=0)
    assert invariant_problems(snap, batch, decisions) == []
    placed = [d for d in decisions if d.mode == DecisionMode.PLACED]
    assert sorted(unit.mig_start for d in placed for unit in d.allocation.units) == placed_starts
    assert all(d.warm == () for d in decisions)
    waiting = [d for d in decisions if d.mode == DecisionMode.WAITING]
    assert len(waiting) == len(requests) - len(placed_starts)


def test_warm_instance_on_cordoned_node_is_not_bound():
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), ("n2", H100, 1, GpuMode.MIG), quotas=QUOTAS, cordoned=("n1",),
                    warm=[warm("w1", "n1-g0", "1g.10gb", 0)])
    decision = _one(snap, mig("r", "p", "1g.10gb"))
    assert decision.warm == ()
    assert decision.allocation.node == "n2"


def test_warm_instance_on_node_without_host_cpu_is_not_bound():
    nodes = (Node("n1", cpu_milli=1000), Node("n2", cpu_milli=8000))
    base = snapshot(("n1", H100, 1, GpuMode.MIG), ("n2", H100, 1, GpuMode.MIG), quotas=QUOTAS,
                    warm=[warm("w1", "n1-g0", "1g.10gb", 0)])
    snap = replace(base, nodes=nodes)
    request = Request("r", "p", "acme", Shape(Kind.MIG, profile="1g.10gb", models=(H100,), cpu_milli=2000))
    decision = _one(snap, request)
    assert decision.warm == ()
    assert decision.allocation.node == "n2"
    small = replace(request, shape=replace(request.shape, cpu_milli=500))
    assert _one(snap, small).warm == ("w1",)


def test_warm_only_capacity_is_bound_by_in_quota_request_without_preemption():
    # the borrower fills the GPU but for the warm 1g at 6: an in-quota 1g binds it, nobody is preempted
    held = [
        Allocation("b4", "borrower", "acme", H100, "n1", (Unit("n1-g0", 571, 40320, "4g.40gb", 0),), True),
        Allocation("b2", "borrower", "acme", H100, "n1", (Unit("n1-g0", 285, 20096, "2g.20gb", 4),), True),
    ]
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), quotas=QUOTAS, allocations=held,
                    warm=[warm("w1", "n1-g0", "1g.10gb", 6)])
    decision = _one(snap, mig("r", "p", "1g.10gb"), now=100)
    assert decision.mode == DecisionMode.PLACED
    assert decision.victims == ()
    assert decision.warm == ("w1",)


@pytest.mark.parametrize(
    ("profile", "mode", "victims"),
    [
        ("2g.20gb", DecisionMode.PREEMPT, ("b2",)),  # the borrower's 2g makes room; the warm 1g stays
        ("7g.80gb", DecisionMode.WAITING, ()),  # only taking the warm 1g too would fit a 7g: it waits
        ("4g.40gb", DecisionMode.PREEMPT, ("b4",)),
    ],
)
def test_warm_instance_is_never_a_preemption_victim(profile, mode, victims):
    held = [
        Allocation("b4", "borrower", "acme", H100, "n1", (Unit("n1-g0", 571, 40320, "4g.40gb", 0),), True, 0.0),
        Allocation("b2", "borrower", "acme", H100, "n1", (Unit("n1-g0", 285, 20096, "2g.20gb", 4),), True, 1.0),
    ]
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), quotas=QUOTAS, allocations=held,
                    warm=[warm("w1", "n1-g0", "1g.10gb", 6)])
    request = mig("r", "p", profile)
    decisions = plan(snap, [request], now=100)
    assert invariant_problems(snap, [request], decisions) == []  # the warm 1g is still in place afterwards
    [decision] = decisions
    assert decision.mode == mode
    assert decision.victims == victims
    assert decision.warm == ()


def test_warm_two_requests_one_instance_one_binds_one_is_placed():
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), quotas=QUOTAS, warm=[warm("w1", "n1-g0", "1g.10gb", 6)])
    batch = [mig("r1", "p", "1g.10gb", submitted_at=1), mig("r2", "p", "1g.10gb", submitted_at=2)]
    decisions = plan(snap, batch, now=0)
    assert invariant_problems(snap, batch, decisions) == []
    found = by_request(decisions)
    assert found["r1"].warm == ("w1",)  # the first served binds it
    assert found["r2"].warm == ()
    assert found["r2"].mode == DecisionMode.PLACED
    assert found["r2"].allocation.units[0].mig_start != 6


def test_warm_instance_is_bound_once_per_plan():
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), quotas=QUOTAS, warm=[warm("w1", "n1-g0", "7g.80gb", 0)])
    batch = [mig("r1", "p", "7g.80gb", submitted_at=1), mig("r2", "p", "7g.80gb", submitted_at=2)]
    found = by_request(plan(snap, batch, now=0))
    assert found["r1"].warm == ("w1",)
    assert found["r2"].mode == DecisionMode.WAITING


def test_warm_choice_is_the_lowest_node_gpu_start_and_id():
    instances = [
        warm("w-z", "n2-g0", "1g.10gb", 0),
        warm("w-y", "n1-g1", "1g.10gb", 0),
        warm("w-x", "n1-g0", "1g.10gb", 6),
        warm("w-b", "n1-g0", "1g.10gb", 2),
        warm("w-a", "n1-g1", "1g.10gb", 1),
    ]
    snap = snapshot(("n1", H100, 2, GpuMode.MIG), ("n2", H100, 1, GpuMode.MIG), quotas=QUOTAS, warm=instances)
    batch = [mig(f"r{i}", "p", "1g.10gb", submitted_at=i) for i in range(5)]
    decisions = plan(snap, batch, now=0)
    assert invariant_problems(snap, batch, decisions) == []
    assert [d.warm for d in decisions] == [("w-b",), ("w-x",), ("w-y",), ("w-a",), ("w-z",)]
    # the order the snapshot lists them in does not matter
    shuffled = replace(snap, warm=tuple(reversed(instances)))
    assert plan(shuffled, batch, now=0) == decisions


def test_warm_gang_binds_instances_on_one_node_only():
    spread = [warm("w1", "n1-g0", "3g.40gb", 4), warm("w2", "n2-g0", "3g.40gb", 4)]
    together = [*spread, warm("w3", "n2-g1", "3g.40gb", 0)]
    specs = (("n1", H100, 1, GpuMode.MIG), ("n2", H100, 2, GpuMode.MIG))
    snap = snapshot(*specs, quotas=QUOTAS, warm=spread)
    decision = _one(snap, mig("r", "p", "3g.40gb", count=2))
    assert decision.warm == ()  # one on each node: a gang cannot bind them
    assert decision.mode == DecisionMode.PLACED
    snap = snapshot(*specs, quotas=QUOTAS, warm=together)
    decision = _one(snap, mig("r", "p", "3g.40gb", count=2))
    assert decision.warm == ("w2", "w3")
    assert decision.allocation.node == "n2"


def test_warm_auto_tier_binds_when_tier_and_resolved_profile_match():
    specs = (("n1", H100, 1, GpuMode.MIG), ("n2", A100, 1, GpuMode.MIG))
    prices = {A100: 200, H100: 400}
    auto = Request("r", "p", "acme", Shape(Kind.MIG, profile="1g"))
    # the A100 is cheaper and "1g" resolves to its smallest 1g, the 1g.5gb
    snap = snapshot(*specs, quotas=QUOTAS, prices=prices, warm=[warm("w5", "n2-g0", "1g.5gb", 3)])
    decision = _one(snap, auto)
    assert decision.warm == ("w5",)
    assert "auto: A100-40GB" in decision.reason
    # a 1g.10gb on the A100 is not what "1g" resolves to; the H100's 1g.10gb is on a tier not chosen
    others = [warm("w10", "n2-g0", "1g.10gb", 2), warm("wh", "n1-g0", "1g.10gb", 0)]
    decision = _one(snapshot(*specs, quotas=QUOTAS, prices=prices, warm=others), auto)
    assert decision.warm == ()
    assert decision.allocation.tier == A100


def test_warm_instances_count_toward_no_quota():
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), quotas=[quota("p", H100, 142, 142)],
                    warm=[warm("w1", "n1-g0", "1g.10gb", 0), warm("w2", "n1-g0", "1g.10gb", 1)])
    scheduler = Scheduler(snap)
    assert scheduler.cluster.project_usage == {} and scheduler.cluster.tenant_usage == {}
    assert scheduler.cluster.allocations == {}
    batch = [mig("r1", "p", "1g.10gb", submitted_at=1), mig("r2", "p", "1g.10gb", submitted_at=2)]
    found = by_request(plan(snap, batch, now=0))
    assert found["r1"].warm == ("w1",) and found["r1"].allocation.preemptible is False
    assert found["r2"].mode == DecisionMode.WAITING  # the project's limit, not the warm instances
    assert "quota limit" in found["r2"].reason


def test_warm_plan_is_pure_and_repeatable():
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), quotas=QUOTAS,
                    warm=[warm("w1", "n1-g0", "1g.10gb", 0), warm("w2", "n1-g0", "2g.20gb", 2)])
    before = copy.deepcopy(snap)
    batch = [mig("r1", "p", "1g.10gb", submitted_at=1), mig("r2", "p", "2g.20gb", submitted_at=2)]
    decisions = plan(snap, batch, now=0)
    assert snap == before
    assert plan(snap, batch, now=0) == decisions
    assert [d.warm for d in decisions] == [("w1",), ("w2",)]


@pytest.mark.parametrize(
    ("instance", "message"),
    [
        (warm("w", "n9-g0", "1g.10gb", 0), "unknown GPU"),
        (warm("w", "n2-g0", "1g.10gb", 0), "not in MIG mode"),
        (warm("w", "n1-g0", "1g.5gb", 0), "not offered"),
        (warm("w", "n1-g0", "3g.40gb", 2), "cannot start at slot 2"),
        (warm("w", "n1-g0", "1g.10gb", 4), "overlaps"),  # the allocation's 3g at 4
    ],
)
def test_warm_instance_that_is_not_a_free_mig_slot_is_refused(instance, message):
    held = Allocation("a", "p", "acme", H100, "n1", (Unit("n1-g0", 428, 40320, "3g.40gb", 4),), False)
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), ("n2", H100, 1, GpuMode.WHOLE), quotas=QUOTAS,
                    allocations=[held], warm=[instance])
    with pytest.raises(ValueError, match=message):
        plan(snap, [], now=0)


def test_warm_state_apply_and_remove_undo_each_other():
    snap = snapshot(("n1", H100, 2, GpuMode.MIG), quotas=QUOTAS)
    scheduler = Scheduler(snap)
    cluster = scheduler.cluster
    signatures = dict(cluster.node_signature)
    masks = {gpu_id: (gpu.slot_mask, gpu.compute_used, gpu.units) for gpu_id, gpu in cluster.gpus.items()}
    cluster.apply_warm(WarmInstance("w", "n1-g1", "3g.40gb", 4))
    assert cluster.gpus["n1-g1"].slot_mask == 0b11110000
    assert cluster.node_signature != signatures
    cluster.remove_warm("w")
    assert cluster.node_signature == signatures
    assert {gpu_id: (gpu.slot_mask, gpu.compute_used, gpu.units) for gpu_id, gpu in cluster.gpus.items()} == masks
    assert cluster.warm == {} and cluster.warm_units == {} and cluster.warm_index == {}


# -- properties -------------------------------------------------------------------------------------------------

MIG_MODELS = (H100, A100)
PROJECTS = {"p0": "t0", "p1": "t0", "p2": "t1"}
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def warm_scenarios(draw):
    """MIG-heavy fleets, warm instances on valid free slots, quotas and two request lists (MIG shapes mostly)."""
    nodes, gpus = [], []
    for index in range(draw(st.integers(1, 3))):
        node_id = f"n{index}"
        model = draw(st.sampled_from(MIG_MODELS))
        cpu = draw(st.sampled_from([0, 0, 2000]))
        nodes.append(Node(node_id, cpu_milli=cpu, cordoned=draw(st.integers(0, 5)) == 0))
        for gpu_index in range(draw(st.integers(1, 3))):
            mode = draw(st.sampled_from([GpuMode.MIG, GpuMode.MIG, GpuMode.MIG, GpuMode.WHOLE]))
            gpus.append(Gpu(f"{node_id}-g{gpu_index}", node_id, model, mode, gpu_index))
    instances = []
    for gpu in gpus:
        if gpu.mode != GpuMode.MIG:
            continue
        layout: list[MigPlacement] = []
        offered = profiles_for(gpu.model)
        for _ in range(draw(st.integers(0, 4))):
            profile = draw(st.sampled_from(offered))
            start = draw(st.sampled_from(profile.starts))
            candidate = (*layout, MigPlacement(start, profile))
            if layout_problem(candidate) is None:
                layout.append(MigPlacement(start, profile))
                instances.append(WarmInstance(f"w{len(instances)}", gpu.id, profile.name, start))
    quotas, tenant_quotas = draw(quota_sets())
    snap = Snapshot(tuple(nodes), tuple(gpus), (), quotas, tenant_quotas, {A100: 200, H100: 400},
                    min_runtime_seconds=draw(st.sampled_from([0.0, 30.0])), warm=tuple(instances))
    present = tuple(sorted({gpu.model for gpu in gpus}))
    first = draw(request_lists("a", present))
    second = draw(request_lists("b", present))
    # more MIG requests than the shared strategy draws: the profiles of the warm instances themselves
    if instances:
        extra = draw(st.lists(st.tuples(st.sampled_from(instances), st.sampled_from(sorted(PROJECTS)),
                                        st.integers(1, 2)), max_size=6))
        model_of = {gpu.id: gpu.model for gpu in gpus}
        first += [
            Request(f"c{i}", project, PROJECTS[project],
                    Shape(Kind.MIG, count, profile=instance.profile, models=(model_of[instance.gpu],)), float(i))
            for i, (instance, project, count) in enumerate(extra)
        ]
    return snap, first, second, draw(st.sampled_from(sorted(POLICIES)))


def _missed_warm(snap: Snapshot, requests: list[Request], decisions) -> list[str]:
    """A count-1 MIG decision that did not bind while a matching warm instance stayed unbound on a node that
    accepts any request (not cordoned, CPU not tracked): the binding was missed."""
    bound = {warm_id for decision in decisions for warm_id in decision.warm}
    nodes = {node.id: node for node in snap.nodes}
    gpus = {gpu.id: gpu for gpu in snap.gpus}
    free = {
        (gpus[w.gpu].model, profile_get(gpus[w.gpu].model, w.profile).name)
        for w in snap.warm
        if w.id not in bound and not nodes[gpus[w.gpu].node].cordoned and not nodes[gpus[w.gpu].node].cpu_milli
    }
    shapes = {request.id: request.shape for request in requests}
    problems = []
    for decision in decisions:
        allocation = decision.allocation
        if allocation is None or decision.warm or shapes[decision.request].kind != Kind.MIG:
            continue
        if len(allocation.units) == 1 and (allocation.tier, allocation.units[0].mig_profile) in free:
            problems.append(f"{decision.request}: placed anew while a warm {allocation.units[0].mig_profile} was free")
    return problems


@SETTINGS
@given(scenario=warm_scenarios())
def test_warm_properties_over_two_cycles(scenario):
    snap, first, second, policy = scenario
    decisions = plan(snap, first, now=0.0, policy=policy)
    # no two units overlap (bound, placed and unbound warm), each warm instance bound at most once and exactly
    assert invariant_problems(snap, first, decisions) == []
    assert _missed_warm(snap, first, decisions) == []
    bound = {warm_id for decision in decisions for warm_id in decision.warm}
    after = tuple(outcome(snap, decisions).allocations.values())
    snap2 = replace(snap, allocations=after, warm=tuple(w for w in snap.warm if w.id not in bound))
    decisions2 = plan(snap2, second, now=100.0, policy=policy)
    assert invariant_problems(snap2, second, decisions2) == []
    assert _missed_warm(snap2, second, decisions2) == []
    assert all(victim not in {w.id for w in snap.warm} for d in decisions2 for victim in d.victims)


@SETTINGS
@given(scenario=warm_scenarios())
def test_warm_properties_scheduler_across_cycles_matches_plan_per_cycle(scenario):
    snap, first, second, policy = scenario
    if POLICIES[policy].uses_random:
        policy = "default"
    scheduler = Scheduler(snap, policy=policy)
    decisions = scheduler.schedule(first, now=0.0)
    before = copy.deepcopy(snap)
    assert decisions == plan(snap, first, now=0.0, policy=policy)
    assert snap == before
    bound = {warm_id for decision in decisions for warm_id in decision.warm}
    snap2 = replace(snap, allocations=tuple(outcome(snap, decisions).allocations.values()),
                    warm=tuple(w for w in snap.warm if w.id not in bound))
    assert scheduler.schedule(second, now=100.0) == plan(snap2, second, now=100.0, policy=policy)
