"""The placement search evaluates one node per class (``ClusterState``: nodes whose canonical signatures are
equal) and keeps per-need heaps across decisions. It must decide exactly what evaluating every node at every
decision decides: the lowest score, ties on the lowest node id, on that node the first best option. This runs
both on random fleets (NVLink domains unique per node, shared, or several per node; closed GPUs; cordoned and
CPU-tracked nodes) over two cycles, the second from the first one's allocations, with reclaims, and compares
every decision."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.scheduler import GpuMode, Node, Snapshot, Unit
from broker.scheduler.placement import POLICIES, Need, Placer
from broker.scheduler.plan import Scheduler
from tests.scheduler.builders import node_gpus, outcome
from tests.scheduler.test_properties import MIG_MODELS, MODELS, _workload, quota_sets, request_lists

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DETERMINISTIC = sorted(name for name, policy in POLICIES.items() if not policy.uses_random)


class EveryNodePlacer(Placer):
    """The reference: every node evaluated at every search, no classes, no memo, no heaps."""

    def find(self, need: Need) -> tuple[str, tuple[Unit, ...]] | None:
        best = None
        for node_id in sorted(self.cluster.nodes):
            node = self.cluster.nodes[node_id]
            if need.models and node.models.isdisjoint(need.models):
                continue
            here = None
            for units in self.policy.node_options(node, need):
                score = self.policy.placement_score(self.cluster, node, units, need)
                if here is None or score < here[0]:
                    here = (score, units)
            if here is not None and (best is None or (round(here[0], 6), node_id) < best[0]):
                best = ((round(here[0], 6), node_id), here[1])
        return None if best is None else (best[0][1], best[1])


@st.composite
def fleets(draw) -> tuple[tuple[Node, ...], tuple]:
    """Up to 8 nodes of few shapes (so that classes have several members), NVLink domains per ``scheme``."""
    scheme = draw(st.sampled_from(["per-node", "shared", "two-per-node"]))
    nodes, gpus = [], []
    for index in range(draw(st.integers(1, 8))):
        node_id = f"n{index}"
        model = draw(st.sampled_from(MODELS))
        modes = [GpuMode.WHOLE, GpuMode.SHARED] + ([GpuMode.MIG] if model in MIG_MODELS else [])
        cpu = draw(st.sampled_from([0, 0, 4000, 16_000]))
        memory = draw(st.sampled_from([0, 0, 65_536]))
        nodes.append(Node(node_id, cpu_milli=cpu, memory_mib=memory, cordoned=draw(st.integers(0, 8)) == 0))
        for gpu in node_gpus(node_id, model, draw(st.integers(1, 4))):
            domain = {"per-node": f"{node_id}/nv", "shared": "", "two-per-node": f"d{gpu.index % 2}"}[scheme]
            gpus.append(replace(gpu, mode=draw(st.sampled_from(modes)), nvlink_domain=domain,
                                closed=draw(st.integers(0, 12)) == 0))
    return tuple(nodes), tuple(gpus)


@st.composite
def scenarios(draw):
    nodes, gpus = draw(fleets())
    quotas, tenant_quotas = draw(quota_sets())
    present = tuple(sorted({gpu.model for gpu in gpus}))
    snap = Snapshot(nodes, gpus, (), quotas, tenant_quotas, min_runtime_seconds=draw(st.sampled_from([0.0, 50.0])))
    return (snap, draw(request_lists("a", present, max_size=20)), draw(request_lists("b", present, max_size=20)),
            draw(st.booleans()))


def _both(snap: Snapshot, requests, now: float, policy: str, workload):
    searched = Scheduler(snap, policy=policy, workload=workload)
    reference = Scheduler(snap, policy=policy, workload=workload)
    reference.placer = EveryNodePlacer(reference.cluster, reference.policy)
    return searched.schedule(requests, now=now), reference.schedule(requests, now=now)


@pytest.mark.parametrize("policy", DETERMINISTIC)
@SETTINGS
@given(scenario=scenarios())
def test_search_equivalence_class_search_decides_as_every_node(policy, scenario):
    snap, first, second, with_workload = scenario
    workload = _workload(snap, first + second) if with_workload else None
    decisions, expected = _both(snap, first, 0.0, policy, workload)
    assert decisions == expected
    snap2 = replace(snap, allocations=tuple(outcome(snap, decisions).allocations.values()))
    decisions2, expected2 = _both(snap2, second, 100.0, policy, workload)
    assert decisions2 == expected2


def test_search_equivalence_domain_names_do_not_split_classes():
    """Nodes that differ only in their NVLink domains' names are one class: the search evaluates one of them."""
    gpus = tuple(replace(gpu, nvlink_domain=f"{node}/nv") for node in ("a", "b", "c")
                 for gpu in node_gpus(node, MODELS[0], 4))
    scheduler = Scheduler(Snapshot(tuple(Node(node) for node in "abc"), gpus))
    assert len(set(scheduler.cluster.node_signature.values())) == 1
    # the GPUs' order in the node is part of the class: the same use on another GPU is another class
    cluster = scheduler.cluster
    cluster.apply(replace_allocation("x", "a", "a-g0"))
    cluster.apply(replace_allocation("y", "b", "b-g3"))
    assert len(set(cluster.node_signature.values())) == 3


def replace_allocation(allocation_id: str, node: str, gpu: str):
    from broker.scheduler import Allocation

    return Allocation(allocation_id, "p", "t", MODELS[0], node, (Unit(gpu, 1000, 81_559),), False)


def test_search_equivalence_holds_across_log_compaction():
    """A long-lived scheduler (the simulator's use): thousands of placements and releases compact the class log
    (``log_generation`` rises, classes no node is in are forgotten); every decision still equals the brute force's."""
    import random

    from broker.scheduler import Kind, Request, Shape

    nodes = tuple(Node(f"n{i}") for i in range(6))
    gpus = tuple(replace(gpu, mode=(GpuMode.WHOLE, GpuMode.SHARED, GpuMode.MIG)[i % 3], nvlink_domain=f"n{i}/nv")
                 for i in range(6) for gpu in node_gpus(f"n{i}", MODELS[0], 4))
    snap = Snapshot(nodes, gpus, enforce_quotas=False)
    searched = Scheduler(snap, policy="default")
    reference = Scheduler(snap, policy="default")
    reference.placer = EveryNodePlacer(reference.cluster, reference.policy)
    searched.cluster.LOG_SLACK = 50  # compact often
    shapes = [Shape(Kind.WHOLE, 1), Shape(Kind.WHOLE, 2), Shape(Kind.MIG, 1, profile="1g.10gb"),
              Shape(Kind.MIG, 1, profile="3g.40gb"), Shape(Kind.SHARE, 1, milli=250, memory_mib=8000),
              Shape(Kind.SHARE, 1, milli=600, memory_mib=30_000)]
    rng = random.Random(7)
    for step in range(1500):
        request = Request(f"r{step}", "p", "t", rng.choice(shapes), float(step))
        decided = searched.schedule([request], now=float(step))
        assert decided == reference.schedule([request], now=float(step))
        running = sorted(searched.cluster.allocations)
        if running and (decided[0].allocation is None or rng.random() < 0.45):
            gone = rng.choice(running)
            searched.cluster.remove(gone)
            reference.cluster.remove(gone)
    assert searched.cluster.log_generation > 0
