"""`auto` tier selection: the cheapest model that serves the shape, and the decision says why."""

from broker.scheduler import Gpu, GpuMode, Kind, Node, QuotaSpec, Request, Shape, Snapshot, plan


def _fleet(**quota_limits):
    nodes = (Node("n1"), Node("n2"), Node("n3"), Node("n4"))
    gpus = (Gpu("l4", "n1", "L4", GpuMode.WHOLE), Gpu("a100", "n2", "A100-40GB", GpuMode.MIG),
            Gpu("h100", "n3", "H100-80GB", GpuMode.WHOLE), Gpu("h100-mig", "n4", "H100-80GB", GpuMode.MIG))
    quotas = tuple(QuotaSpec("p", "t", tier, 0, limit, 1) for tier, limit in quota_limits.items())
    return Snapshot(nodes, gpus, quotas=quotas, prices={"L4": 80, "A100-40GB": 200, "H100-80GB": 400})


def test_auto_tier_picks_cheapest_model_with_enough_memory():
    snapshot = _fleet(**{"L4": 1000, "H100-80GB": 1000})
    decisions = plan(snapshot, [Request("s", "p", "t", Shape(Kind.WHOLE, memory_mib=16_000)),
                                Request("l", "p", "t", Shape(Kind.WHOLE, memory_mib=60_000))], now=0)
    small, large = sorted(decisions, key=lambda d: d.request, reverse=True)
    assert small.allocation.tier == "L4" and "the cheapest that fits" in small.reason
    assert large.allocation.tier == "H100-80GB"
    assert "L4 (80) cannot serve the shape" in large.reason


def test_auto_tier_falls_back_when_cheaper_tier_has_no_quota():
    snapshot = _fleet(**{"H100-80GB": 1000})  # no L4 quota
    decision = plan(snapshot, [Request("s", "p", "t", Shape(Kind.WHOLE, memory_mib=8_000))], now=0)[0]
    assert decision.allocation.tier == "H100-80GB"
    assert "L4 (80) has no room or quota" in decision.reason


def test_auto_tier_mig_by_compute_size_picks_cheapest_profile():
    snapshot = _fleet(**{"A100-40GB": 1000, "H100-80GB": 1000})
    decision = plan(snapshot, [Request("m", "p", "t", Shape(Kind.MIG, profile="3g", memory_mib=18_000))], now=0)[0]
    assert decision.allocation.tier == "A100-40GB"
    assert decision.allocation.units[0].mig_profile == "3g.20gb"
    too_big = plan(snapshot, [Request("m", "p", "t", Shape(Kind.MIG, profile="3g", memory_mib=30_000))], now=0)[0]
    assert too_big.allocation.units[0].mig_profile == "3g.40gb"  # the A100-40GB 3g has 19.6 GiB
