"""A request that avoids nodes (a workload re-placed after failing there, docs/leasing.md "Workloads") is
never placed, bound or reclaimed for on them, under every policy; with only avoided nodes free it waits."""

from dataclasses import replace

import pytest

from broker.scheduler import DecisionMode, GpuMode, Kind, Request, Shape, WarmInstance, plan
from tests.scheduler.builders import H100, by_request, held, invariant_problems, quota, snapshot, whole

POLICIES = ["default", "best-fit", "dot-product", "packing", "fgd", "random"]
QUOTAS = [quota("a", H100, 4000, 8000), quota("c", H100, 0, 8000)]


def avoiding(request: Request, *nodes: str) -> Request:
    return replace(request, shape=replace(request.shape, avoid_nodes=tuple(nodes)))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("avoid", "placed_on"), [((), "n1"), (("n1",), "n2"), (("n1", "n2"), "n3"),
                                                  (("n1", "n2", "n3"), None)])
def test_avoid_nodes_place_elsewhere_or_wait(policy, avoid, placed_on):
    snap = snapshot(("n1", H100, 2, GpuMode.WHOLE), ("n2", H100, 2, GpuMode.WHOLE), ("n3", H100, 2, GpuMode.WHOLE),
                    quotas=QUOTAS)
    request = avoiding(whole("r", "a"), *avoid)
    decisions = plan(snap, [request], now=100.0, policy=policy)
    decision = by_request(decisions)["r"]
    if placed_on is None:
        assert decision.mode == DecisionMode.WAITING and decision.allocation is None
    else:
        assert decision.mode == DecisionMode.PLACED
        if policy != "random":
            assert decision.allocation.node == placed_on
        assert decision.allocation.node not in avoid
    assert not invariant_problems(snap, [request], decisions)


def test_avoid_nodes_never_reclaims_on_an_avoided_node():
    # c's over-quota work fills n1 and n2; a's in-quota request avoids n1: it reclaims on n2 only
    snap = snapshot(("n1", H100, 1, GpuMode.WHOLE), ("n2", H100, 1, GpuMode.WHOLE), quotas=QUOTAS,
                    allocations=[held("c1", "c", "n1-g0", started_at=5), held("c2", "c", "n2-g0", started_at=1)])
    decision = by_request(plan(snap, [avoiding(whole("r", "a"), "n1")], now=100.0))["r"]
    assert decision.mode == DecisionMode.PREEMPT and decision.allocation.node == "n2" and decision.victims == ("c2",)
    decision = by_request(plan(snap, [avoiding(whole("r", "a"), "n1", "n2")], now=100.0))["r"]
    assert decision.mode == DecisionMode.WAITING


def test_avoid_nodes_never_binds_a_warm_instance_on_an_avoided_node():
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), ("n2", H100, 1, GpuMode.MIG), quotas=QUOTAS,
                    warm=[WarmInstance("w1", "n1-g0", "1g.10gb", 0)])
    request = Request("r", "a", "acme", Shape(Kind.MIG, 1, profile="1g.10gb", models=(H100,), avoid_nodes=("n1",)))
    decision = by_request(plan(snap, [request], now=100.0))["r"]
    assert decision.mode == DecisionMode.PLACED and decision.allocation.node == "n2" and not decision.warm
