"""The score functions behind the ``fgd`` and ``default`` policies (docs/scheduling.md, placement policies)."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.scheduler.placement import (
    DefaultPolicy,
    FgdPolicy,
    Need,
    node_fragmentation,
    node_stranding,
    remainder_waste,
)
from broker.scheduler.state import FULL, GpuState, NodeState
from broker.scheduler.types import Gpu, GpuMode, Kind, Node, Unit


def _node(model: str, used: list[int], cpu: int = 64_000, free_cpu: int | None = None, memory: int = 262_144):
    node = Node("n", cpu_milli=cpu, memory_mib=memory)
    gpus = [GpuState(Gpu(f"n/{i}", "n", model, GpuMode.SHARED, i), 16_384, used_milli=u, units=int(u > 0))
            for i, u in enumerate(used)]
    return NodeState(node, gpus, cpu if free_cpu is None else free_cpu, memory)


def _share(milli: int, cpu: int, models=()):
    return Need(Kind.SHARE, 1, tuple(models), milli, 0, None, True, cpu, 0)


def _whole(count: int, cpu: int):
    return Need(Kind.WHOLE, count, (), FULL, 0, None, True, cpu, 0)


CPU_ONLY = Need(Kind.SHARE, 0, (), 0, 0, None, True, 4_000, 0)
WORKLOAD = [(_whole(1, 8_000), 0.5), (_share(500, 4_000), 0.2), (_share(810, 3_000, ("T4",)), 0.1),
            (_whole(8, 32_000), 0.05), (CPU_ONLY, 0.15)]


def test_fgd_renormalises_the_typical_shapes():
    policy = FgdPolicy(workload=[(need, p * 0.95) for need, p in WORKLOAD])
    assert math.isclose(sum(p for _, p in policy.workload), 1.0)


def test_fgd_scores_like_the_authors_simulator_integer_sigmoid():
    """int(100 * sigmoid((before - after) / 1000)), negated because lower is better here."""
    policy = FgdPolicy(workload=WORKLOAD)
    node = _node("G2", [0, 0, 0, 0, 0, 0, 0, 500])
    need = _share(500, 4_000)
    units = (Unit("n/7", 500, 0),)
    before = node_fragmentation(node, [g.free_milli for g in node.gpus], node.free_cpu_milli, policy.workload)
    after = node_fragmentation(node, [FULL] * 7 + [0], node.free_cpu_milli - 4_000, policy.workload)
    expected = int(100 / (1 + math.exp((after - before) / 1000)))
    assert policy.score(None, node, units, need) == -expected
    assert isinstance(policy.score(None, node, units, need), int)


def test_fgd_near_equal_placements_tie():
    """Fragmentation increases a few milli apart get the same integer score, so the node order decides."""
    policy = FgdPolicy(workload=[(_share(300, 1_000), 1.0)])
    need = _share(300, 1_000)
    # free 1000 -> 700 (fragment 0 -> 0) and free 650 -> 350 (fragment 0 -> 0): both keep a 300 fitting
    first = policy.score(None, _node("T4", [0, FULL]), (Unit("n/0", 300, 0),), need)
    second = policy.score(None, _node("T4", [350, FULL]), (Unit("n/0", 300, 0),), need)
    assert first == second


@pytest.mark.parametrize("seed", range(20))
def test_default_fast_stranding_equals_the_reference(seed):
    """The one-model fast path of DefaultPolicy computes node_stranding's sum (GPU and CPU parts)."""
    rng = random.Random(seed)
    policy = DefaultPolicy(workload=WORKLOAD)
    model = rng.choice(["G2", "T4"])
    used = [rng.choice([0, 0, 190, 470, 500, 810, FULL]) for _ in range(rng.choice([1, 2, 4, 8]))]
    node = _node(model, used, free_cpu=rng.choice([0, 2_000, 3_000, 9_000, 40_000, 64_000]))
    free = [g.free_milli for g in node.gpus]
    gpu_part, host_part = policy._stranding(node, free, node.free_cpu_milli, node.free_memory_mib)
    for weight in (0.0, 0.25, 1.0):
        reference = node_stranding(node, free, node.free_cpu_milli, node.free_memory_mib, policy.workload,
                                   host_weight=weight)
        assert math.isclose(gpu_part + weight * host_part, reference, abs_tol=1e-6)


def test_default_stranding_sees_gpus_behind_exhausted_cpu():
    """Eight free GPUs and 12 free cores: a 1-GPU / 8-core need can use one of them, the rest are unfed."""
    policy = DefaultPolicy(workload=[(_whole(1, 8_000), 1.0)])
    node = _node("G2", [0] * 8, free_cpu=12_000)
    gpu_part, host_part = policy._stranding(node, [FULL] * 8, 12_000, node.free_memory_mib)
    assert gpu_part == 0 and host_part == 7 * FULL


def test_remainder_waste_follows_the_shapes_that_fit():
    """One share of 320 and no stop: a 350 hole leaves 30, a 530 hole 210, a fresh GPU 1000 - 3 x 320."""
    waste = remainder_waste([(_share(320, 1_000), 1.0)], stop=0.0)
    assert waste[0] == 0 and waste[350] == 30 and waste[530] == 210 and waste[FULL] == 40
    assert waste[319] == 319  # nothing fits: all of it is waste


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, FULL), st.floats(0.01, 1.0)), min_size=0, max_size=6),
       st.floats(0.0, 1.0), st.integers(0, FULL))
def test_remainder_waste_is_between_zero_and_the_hole(shares, stop, free):
    waste = remainder_waste([(_share(milli, 1_000), p) for milli, p in shares], stop=stop)
    assert len(waste) == FULL + 1 and waste[0] == 0
    assert -1e-9 <= waste[free] <= free + 1e-9
    if stop == 1.0 or not shares:
        assert waste[free] == pytest.approx(free)


def test_remainder_waste_ignores_multi_gpu_mig_and_cpu_only_shapes():
    assert remainder_waste([(_whole(8, 32_000), 0.5), (CPU_ONLY, 0.5)]) == [float(f) for f in range(FULL + 1)]


def test_default_puts_a_share_where_its_hole_is_likely_filled():
    """Shares of 470 and 320 arrive alike: a 320 goes into the 350 hole (leaving 30), not the 530 hole that a 470
    can still fill; the look-ahead alone says so too."""
    workload = [(_share(470, 1_000), 0.5), (_share(320, 1_000), 0.5)]
    policy = DefaultPolicy(workload=workload)
    need = _share(320, 1_000)
    node = _node("T4", [650, 470])  # GPU 0 has 350 free, GPU 1 has 530 free
    into_350 = policy.score(None, node, (Unit("n/0", 320, 0),), need)
    into_530 = policy.score(None, node, (Unit("n/1", 320, 0),), need)
    assert into_350 < into_530
    waste = policy._remainder
    assert waste[30] - waste[350] < waste[210] - waste[530]


def test_default_without_one_gpu_shapes_adds_no_remainder_term():
    """The live cycle without demand history: the term would be the same for every placement of a task."""
    assert DefaultPolicy()._remainder is None
    assert DefaultPolicy(workload=[(_whole(8, 32_000), 1.0)])._remainder is None
    assert DefaultPolicy(workload=WORKLOAD)._remainder is not None


def test_default_values_a_hole_by_the_shapes_the_node_can_still_feed():
    """The look-ahead counts only the one-GPU shapes the node's free CPU can still take: with 2 cores left a 530
    hole is all waste (a 470 needs 4), with 8 cores it is what a 470 leaves of it."""
    policy = DefaultPolicy(workload=[(_share(470, 4_000), 1.0)])
    fed, starved = policy._remainder_table("T4", 8_000, None), policy._remainder_table("T4", 2_000, None)
    assert fed is policy._remainder_table("T4", 9_000, None)  # one table per set of shapes that fit
    assert starved[530] == 530 and fed[530] < 530
    # a model the shape does not allow: nothing fits either
    only_t4 = DefaultPolicy(workload=[(_share(470, 4_000, ("T4",)), 1.0)])
    assert only_t4._remainder_table("G2", 8_000, None)[530] == 530


def test_default_keeps_the_cores_that_feed_open_holes_from_cpu_only_work():
    """A CPU-only task goes to the node whose open hole it does not starve: on the node with 8 cores, spending 6
    leaves too few for the 470 that could fill its 530 hole; the node with 40 cores keeps enough."""
    policy = DefaultPolicy(workload=[(_share(470, 4_000), 0.5), (Need(Kind.SHARE, 0, (), 0, 0, None, True, 6_000, 0),
                                                                 0.5)])
    cpu_only = Need(Kind.SHARE, 0, (), 0, 0, None, True, 6_000, 0)
    tight = _node("T4", [470, FULL], cpu=64_000, free_cpu=8_000)
    roomy = _node("T4", [470, FULL], cpu=64_000, free_cpu=40_000)
    assert policy.score(None, tight, (), cpu_only) > policy.score(None, roomy, (), cpu_only)
    free = [530, FULL]
    assert policy._remainder_delta(tight, free, free, cpu_only) > 0  # the look-ahead alone says so too
    assert policy._remainder_delta(roomy, free, free, cpu_only) == 0


def test_default_balance_sends_cpu_heavy_work_where_cores_are_plentiful():
    """The balance term sees the demand mix's CPU per GPU (here 12 cores a GPU): a 2-core task goes to the node
    whose free cores could feed only half its free GPUs, a 20-core one to the node with cores to spare."""
    policy = DefaultPolicy(workload=[(_whole(1, 8_000), 0.5), (_whole(1, 16_000), 0.5)])
    assert policy._cpu_per_gpu_milli == 12.0
    poor = _node("G2", [0, 0, 0, 0], cpu=96_000, free_cpu=24_000)
    rich = _node("G2", [0, 0, 0, 0], cpu=96_000, free_cpu=96_000)
    unit = (Unit("n/0", FULL, 0),)
    light, heavy = _whole(1, 2_000), _whole(1, 20_000)
    assert policy._balance(3_000, 22_000) - policy._balance(4_000, 24_000) < 0  # the light task on the poor node
    assert policy._balance(3_000, 76_000) - policy._balance(4_000, 96_000) == 0
    assert policy.score(None, poor, unit, light) < policy.score(None, rich, unit, light)
    assert policy.score(None, rich, unit, heavy) < policy.score(None, poor, unit, heavy)


def test_default_without_a_cpu_mix_adds_no_balance_term():
    """The live cycle without demand history (or a mix that asks for no CPU) decides as before."""
    assert DefaultPolicy()._cpu_per_gpu_milli is None
    assert DefaultPolicy(workload=[(_whole(1, 0), 1.0)])._cpu_per_gpu_milli is None
    assert DefaultPolicy(workload=[(CPU_ONLY, 1.0)])._cpu_per_gpu_milli is None
