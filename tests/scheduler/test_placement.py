"""Placement (docs/architecture.md §3): MIG start slots, shares within 1000 milli and GPU memory, whole GPUs exclusive,
gangs on one node and all-or-nothing, cordoned nodes skipped, allowed models, ``auto`` cheapest tier."""

import pytest

from broker.scheduler import Allocation, DecisionMode, Gpu, GpuMode, Node, Snapshot, Unit, plan
from broker.scheduler.placement import POLICIES
from gpus.catalogue import model_get
from gpus.mig import layout_problem
from tests.scheduler.builders import (
    A100,
    H100,
    L4,
    by_request,
    held,
    invariant_problems,
    mig,
    mig_layouts,
    node_gpus,
    outcome,
    quota,
    share,
    snapshot,
    whole,
)

QUOTAS = [quota("p", model, 100_000, 100_000) for model in (H100, A100, L4)]
PRICES = {H100: 400, A100: 200, L4: 80}


def _run(snap, requests, **kwargs):
    decisions = plan(snap, requests, now=0, **kwargs)
    assert invariant_problems(snap, requests, decisions) == []
    return decisions, by_request(decisions)


# -- MIG ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profiles", "placed", "starts"),
    [
        (["3g.40gb", "3g.40gb"], 2, [0, 4]),
        (["4g.40gb", "3g.40gb"], 2, [0, 4]),
        (["1g.10gb"] * 8, 7, None),  # 7 compute slices
        (["2g.20gb"] * 3 + ["1g.10gb"], 4, [0, 2, 4, 6]),
        (["7g.80gb", "1g.10gb"], 1, [0]),
        (["1g.10gb", "3g.40gb", "3g.40gb"], 2, None),  # any 1g blocks one of the two 3g starts
        (["1g.10gb+me", "1g.10gb+me"], 1, None),  # one media-extension instance per GPU
        (["1g.20gb"] * 5, 4, [0, 2, 4, 6]),
        (["3g.40gb"] + ["1g.10gb"] * 5, 5, [0, 1, 2, 3, 4]),  # 3g at 4, four 1g in slots 0-3: 7 slices
    ],
)
def test_placement_mig_one_gpu_valid_start_slots(profiles, placed, starts):
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), quotas=QUOTAS)
    requests = [mig(f"r{i}", "p", profile, submitted_at=i) for i, profile in enumerate(profiles)]
    decisions, _ = _run(snap, requests)
    allocations = list(outcome(snap, decisions).allocations.values())
    assert sum(d.mode == DecisionMode.PLACED for d in decisions) == placed
    layouts = mig_layouts(snap, allocations)
    assert layout_problem(layouts["n1-g0"]) is None
    if starts is not None:
        assert sorted(p.start for p in layouts["n1-g0"]) == starts


@pytest.mark.parametrize(("profiles", "placed"), [(["3g.40gb", "4g.40gb"], 2), (["3g.40gb", "2g.20gb", "2g.20gb"], 3)])
def test_placement_mig_3g_leaves_room_for_the_rest(profiles, placed):
    # a 3g at slot 4 leaves slots 0-3 for a 4g or two 2g; at slot 0 it would block them
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), quotas=QUOTAS)
    requests = [mig(f"r{i}", "p", profile, submitted_at=i) for i, profile in enumerate(profiles)]
    decisions, _ = _run(snap, requests)
    assert sum(d.mode == DecisionMode.PLACED for d in decisions) == placed


def test_placement_mig_3g_starts_only_at_0_or_4():
    # a 1g at slot 1 (existing): a 3g can go only at 4, a second 3g nowhere
    existing = Allocation("old", "p", "acme", H100, "n1", (Unit("n1-g0", 143, 9984, "1g.10gb", 1),), False)
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), quotas=QUOTAS, allocations=[existing])
    requests = [mig("r1", "p", "3g.40gb", submitted_at=1), mig("r2", "p", "3g.40gb", submitted_at=2)]
    _, decisions = _run(snap, requests)
    assert decisions["r1"].allocation.units[0].mig_start == 4
    assert decisions["r2"].mode == DecisionMode.WAITING


@pytest.mark.parametrize(("model", "profile"), [(A100, "3g.20gb"), (A100, "1g.5gb"), (H100, "2g.20gb")])
def test_placement_mig_gang_on_one_node_valid_layouts(model, profile):
    snap = snapshot(("n1", model, 2, GpuMode.MIG), quotas=QUOTAS)
    requests = [mig("r", "p", profile, count=3, models=(model,))]
    _, found = _run(snap, requests)
    allocation = found["r"].allocation
    assert len(allocation.units) == 3
    for layout in mig_layouts(snap, [allocation]).values():
        assert layout_problem(layout) is None


def test_placement_mig_gang_of_media_extension_profiles_uses_two_gpus():
    snap = snapshot(("n1", H100, 2, GpuMode.MIG), quotas=QUOTAS)
    requests = [mig("r", "p", "1g.10gb+me", count=2)]
    _, found = _run(snap, requests)
    assert found["r"].mode == DecisionMode.PLACED
    assert len({unit.gpu for unit in found["r"].allocation.units}) == 2


def test_placement_mig_never_on_whole_or_shared_gpus():
    snap = snapshot(("n1", H100, 1, GpuMode.WHOLE), ("n2", H100, 1, GpuMode.SHARED), quotas=QUOTAS)
    _, found = _run(snap, [mig("r", "p", "1g.10gb")])
    assert found["r"].mode == DecisionMode.WAITING
    assert "1g.10gb" in found["r"].reason


# -- shares and whole GPUs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shares", "placed"),
    [
        ([(300, 1000)] * 4, 3),  # 900 milli; a fourth would be 1200
        ([(500, 1000)] * 3, 2),
        ([(1000, 1000)] * 2, 1),
        ([(100, 40_000)] * 3, 2),  # memory: 80,000 of 81,559 MiB
        ([(600, 1000), (300, 1000), (100, 80_000)], 2),  # milli fits, memory not
        ([(250, 20_000)] * 4 + [(1, 1)], 4),  # memory would fit, milli not
        ([(250, 20_000)] * 3 + [(1, 20_000)], 4),
    ],
)
def test_placement_shares_stay_within_milli_and_memory(shares, placed):
    snap = snapshot(("n1", H100, 1, GpuMode.SHARED), quotas=QUOTAS)
    requests = [share(f"r{i}", "p", milli, memory, submitted_at=i) for i, (milli, memory) in enumerate(shares)]
    decisions, _ = _run(snap, requests)
    assert sum(d.mode == DecisionMode.PLACED for d in decisions) == placed
    allocations = outcome(snap, decisions).allocations.values()
    assert sum(a.milli for a in allocations) <= 1000
    assert sum(u.memory_mib for a in allocations for u in a.units) <= model_get(H100).memory_mib


def test_placement_share_waits_with_figures():
    snap = snapshot(("n1", H100, 1, GpuMode.SHARED), quotas=QUOTAS)
    requests = [share("r1", "p", 800, 1000, submitted_at=1), share("r2", "p", 300, 2000, submitted_at=2)]
    _, found = _run(snap, requests)
    assert found["r2"].mode == DecisionMode.WAITING
    assert found["r2"].reason == f"waiting: no {H100} GPU has 300 milli and 2000 MiB free"


def test_placement_share_larger_than_any_gpu_memory_waits():
    snap = snapshot(("n1", L4, 1, GpuMode.SHARED), quotas=QUOTAS)
    _, found = _run(snap, [share("r", "p", 100, 30_000, models=(L4,))])
    assert found["r"].mode == DecisionMode.WAITING
    assert "no GPU model offers this shape" in found["r"].reason


def test_placement_whole_gpus_are_exclusive():
    snap = snapshot(("n1", H100, 2, GpuMode.WHOLE), quotas=QUOTAS)
    requests = [whole(f"r{i}", "p", submitted_at=i) for i in range(3)]
    _, found = _run(snap, requests)
    assert {found["r0"].allocation.units[0].gpu, found["r1"].allocation.units[0].gpu} == {"n1-g0", "n1-g1"}
    assert found["r2"].mode == DecisionMode.WAITING
    assert found["r2"].reason == f"waiting: no node has 1 free {H100} GPU"


def test_placement_share_never_on_whole_mode_gpu():
    snap = snapshot(("n1", H100, 2, GpuMode.WHOLE), quotas=QUOTAS)
    _, found = _run(snap, [share("r", "p", 100, 1000)])
    assert found["r"].mode == DecisionMode.WAITING


def test_placement_whole_request_takes_an_empty_shared_gpu_only():
    snap = snapshot(("n1", H100, 2, GpuMode.SHARED), quotas=QUOTAS)
    requests = [
        share("s", "p", 100, 1000, submitted_at=1),
        whole("w1", "p", submitted_at=2),
        whole("w2", "p", submitted_at=3),
        share("s2", "p", 100, 1000, submitted_at=4),
    ]
    _, found = _run(snap, requests)
    assert found["w1"].mode == DecisionMode.PLACED
    assert found["w1"].allocation.units[0].gpu != found["s"].allocation.units[0].gpu
    assert found["w1"].allocation.units[0].milli == 1000
    assert found["w2"].mode == DecisionMode.WAITING
    assert found["s2"].allocation.units[0].gpu == found["s"].allocation.units[0].gpu


# -- gangs -------------------------------------------------------------------------------------------------


def test_placement_gang_all_on_one_node():
    snap = snapshot(("n1", H100, 2, GpuMode.WHOLE), ("n2", H100, 4, GpuMode.WHOLE), quotas=QUOTAS)
    requests = [whole("small", "p", 1, submitted_at=1), whole("gang", "p", 3, submitted_at=2)]
    _, found = _run(snap, requests)
    units = found["gang"].allocation.units
    assert {unit.gpu.rsplit("-g", 1)[0] for unit in units} == {"n2"}
    assert found["gang"].allocation.node == "n2"


def test_placement_gang_that_cannot_fit_places_nothing():
    # 4 GPUs free in all but never 3 on one node: the gang waits and holds nothing
    snap = snapshot(("n1", H100, 2, GpuMode.WHOLE), ("n2", H100, 2, GpuMode.WHOLE), quotas=QUOTAS)
    requests = [whole("gang", "p", 3, submitted_at=1)] + [whole(f"r{i}", "p", submitted_at=2 + i) for i in range(4)]
    _, found = _run(snap, requests)
    assert found["gang"].mode == DecisionMode.WAITING
    assert found["gang"].allocation is None
    assert found["gang"].reason == f"waiting: no node has 3 free {H100} GPUs"
    assert all(found[f"r{i}"].mode == DecisionMode.PLACED for i in range(4))


def test_placement_non_gang_spreads_over_nodes():
    snap = snapshot(("n1", H100, 1, GpuMode.WHOLE), ("n2", H100, 1, GpuMode.WHOLE), quotas=QUOTAS)
    _, found = _run(snap, [whole("r", "p", 2, gang=False)])
    assert sorted(unit.gpu for unit in found["r"].allocation.units) == ["n1-g0", "n2-g0"]


def test_placement_capacity_of_non_gang_spread_is_held():
    snap = snapshot(("n1", H100, 1, GpuMode.WHOLE), ("n2", H100, 1, GpuMode.WHOLE), quotas=QUOTAS)
    requests = [whole("spread", "p", 2, gang=False, submitted_at=1), whole("next", "p", submitted_at=2)]
    _, found = _run(snap, requests)
    assert found["spread"].mode == DecisionMode.PLACED
    assert found["next"].mode == DecisionMode.WAITING


def test_placement_non_gang_that_cannot_fit_places_nothing():
    snap = snapshot(("n1", H100, 1, GpuMode.WHOLE), ("n2", H100, 1, GpuMode.WHOLE), quotas=QUOTAS)
    requests = [whole("spread", "p", 3, gang=False, submitted_at=1)]
    _, found = _run(snap, requests)
    assert found["spread"].mode == DecisionMode.WAITING


# -- nodes, models, auto ------------------------------------------------------------------------------


def test_placement_cordoned_nodes_get_nothing():
    snap = snapshot(
        ("n1", H100, 4, GpuMode.WHOLE),
        ("n2", H100, 1, GpuMode.WHOLE),
        ("n3", H100, 2, GpuMode.MIG),
        ("n4", H100, 2, GpuMode.SHARED),
        cordoned=("n1", "n3", "n4"),
        quotas=QUOTAS,
    )
    requests = [
        whole("w1", "p", submitted_at=1),
        whole("w2", "p", submitted_at=2),
        mig("m", "p", "1g.10gb", submitted_at=3),
        share("s", "p", 100, 100, submitted_at=4),
    ]
    _, found = _run(snap, requests)
    assert found["w1"].allocation.node == "n2"
    assert [found[r].mode for r in ("w2", "m", "s")] == [DecisionMode.WAITING] * 3


def test_placement_cordoned_node_work_is_not_reclaimed_for_new_work():
    snap = snapshot(
        ("n1", H100, 1, GpuMode.WHOLE),
        cordoned=("n1",),
        quotas=[quota("a", H100, 0, 8000), quota("b", H100, 1000, 1000)],
        allocations=[held("a1", "a", "n1-g0")],
    )
    [decision] = plan(snap, [whole("rb", "b")], now=100)
    assert decision.mode == DecisionMode.WAITING
    assert decision.victims == ()


@pytest.mark.parametrize(
    ("models", "tiers"),
    [((L4,), {L4}), ((A100,), {A100}), ((A100, L4), {A100, L4}), ((H100, L4), {H100, L4})],
)
def test_placement_models_constraint_respected(models, tiers):
    snap = snapshot(
        ("n1", H100, 2, GpuMode.WHOLE),
        ("n2", A100, 2, GpuMode.WHOLE),
        ("n3", L4, 2, GpuMode.WHOLE),
        quotas=QUOTAS,
        prices=PRICES,
    )
    requests = [whole(f"r{i}", "p", models=models, submitted_at=i) for i in range(5)]
    decisions, _ = _run(snap, requests)
    placed = [d.allocation for d in decisions if d.allocation]
    assert len(placed) == 2 * len(models)
    assert {a.tier for a in placed} == tiers


def test_placement_model_not_in_fleet_waits():
    snap = snapshot(("n1", H100, 2, GpuMode.WHOLE), quotas=QUOTAS)
    _, found = _run(snap, [whole("r", "p", models=("T4",))])
    assert found["r"].mode == DecisionMode.WAITING
    assert "no GPU model offers this shape" in found["r"].reason and "T4" in found["r"].reason


@pytest.mark.parametrize(
    ("memory_mib", "tier"),
    [
        (0, L4),
        (20_000, L4),
        (23_034, L4),
        (23_035, A100),
        (30_000, A100),
        (40_960, A100),
        (50_000, H100),
        (90_000, None),
    ],
)
def test_placement_auto_whole_picks_cheapest_model_with_enough_memory(memory_mib, tier):
    snap = snapshot(
        ("n1", H100, 1, GpuMode.WHOLE),
        ("n2", A100, 1, GpuMode.WHOLE),
        ("n3", L4, 1, GpuMode.WHOLE),
        quotas=QUOTAS,
        prices=PRICES,
    )
    _, found = _run(snap, [whole("r", "p", models=(), memory_mib=memory_mib)])
    if tier is None:
        assert found["r"].mode == DecisionMode.WAITING
    else:
        assert found["r"].allocation.tier == tier


@pytest.mark.parametrize(
    ("prices", "tier"),
    [
        ({H100: 100, A100: 200, L4: 300}, H100),
        ({H100: 300, A100: 100, L4: 200}, A100),
        ({A100: 100, L4: 200}, A100),
        ({L4: 1}, L4),
    ],
)
def test_placement_auto_follows_the_price_book(prices, tier):
    # a model without a price comes last
    snap = snapshot(
        ("n1", H100, 1, GpuMode.WHOLE),
        ("n2", A100, 1, GpuMode.WHOLE),
        ("n3", L4, 1, GpuMode.WHOLE),
        quotas=QUOTAS,
        prices=prices,
    )
    _, found = _run(snap, [whole("r", "p", models=())])
    assert found["r"].allocation.tier == tier


def test_placement_auto_falls_back_to_next_cheapest_when_full():
    snap = snapshot(
        ("n1", H100, 1, GpuMode.WHOLE),
        ("n2", A100, 1, GpuMode.WHOLE),
        ("n3", L4, 1, GpuMode.WHOLE),
        quotas=QUOTAS,
        prices=PRICES,
    )
    requests = [whole(f"r{i}", "p", models=(), submitted_at=i) for i in range(4)]
    _, found = _run(snap, requests)
    assert [found[f"r{i}"].allocation.tier for i in range(3)] == [L4, A100, H100]
    assert found["r3"].mode == DecisionMode.WAITING


@pytest.mark.parametrize(
    ("memory_mib", "tier"),
    [(1000, L4), (23_034, L4), (30_000, A100), (60_000, H100)],
)
def test_placement_auto_share_picks_cheapest_model_with_enough_memory(memory_mib, tier):
    snap = snapshot(
        ("n1", H100, 1, GpuMode.SHARED),
        ("n2", A100, 1, GpuMode.SHARED),
        ("n3", L4, 1, GpuMode.SHARED),
        quotas=QUOTAS,
        prices=PRICES,
    )
    _, found = _run(snap, [share("r", "p", 250, memory_mib, models=())])
    assert found["r"].allocation.tier == tier


@pytest.mark.parametrize(
    ("profile", "memory_mib", "tier", "placed_profile"),
    [
        ("1g", 0, A100, "1g.5gb"),
        ("3g", 0, A100, "3g.20gb"),
        ("3g", 30_000, H100, "3g.40gb"),
        ("1g", 9_000, A100, "1g.10gb"),
        ("7g", 50_000, H100, "7g.80gb"),
    ],
)
def test_placement_auto_mig_picks_cheapest_profile_with_enough_memory(profile, memory_mib, tier, placed_profile):
    snap = snapshot(
        ("n1", H100, 1, GpuMode.MIG),
        ("n2", A100, 1, GpuMode.MIG),
        ("n3", L4, 1, GpuMode.WHOLE),
        quotas=QUOTAS,
        prices=PRICES,
    )
    _, found = _run(snap, [mig("r", "p", profile, models=(), memory_mib=memory_mib)])
    assert found["r"].allocation.tier == tier
    assert found["r"].allocation.units[0].mig_profile == placed_profile


def test_placement_node_with_mixed_models_offers_each_model():
    nodes = (Node("n1"),)
    gpus = (Gpu("n1-g0", "n1", L4, GpuMode.WHOLE, 0), Gpu("n1-g1", "n1", H100, GpuMode.WHOLE, 1))
    snap = Snapshot(nodes, gpus, quotas=tuple(QUOTAS))
    _, found = _run(snap, [whole("r", "p", models=(H100,))])
    assert found["r"].mode == DecisionMode.PLACED
    assert found["r"].allocation.units[0].gpu == "n1-g1"


def test_placement_host_cpu_never_overcommitted():
    nodes = (Node("a", cpu_milli=1000), Node("b"))
    gpus = node_gpus("a", L4, 2) + node_gpus("b", L4, 2)
    existing = Allocation("pre", "p", "acme", L4, "b", (Unit("b-g0", 1000, 23_034),), False)
    snap = Snapshot(nodes, gpus, (existing,), tuple(QUOTAS))
    requests = [whole(f"r{i}", "p", models=(L4,), cpu_milli=1000, submitted_at=i) for i in range(3)]
    _, found = _run(snap, requests)  # the invariant check counts CPU per tracked node
    assert found["r2"].mode == DecisionMode.WAITING


def test_placement_host_cpu_respected():
    nodes = (Node("a", cpu_milli=1500),)
    snap = Snapshot(nodes, node_gpus("a", L4, 4), quotas=tuple(QUOTAS))
    requests = [whole(f"r{i}", "p", models=(L4,), cpu_milli=1000, submitted_at=i) for i in range(2)]
    _, found = _run(snap, requests)
    assert found["r0"].mode == DecisionMode.PLACED
    assert found["r1"].mode == DecisionMode.WAITING


# -- every policy ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_placement_every_policy_places_validly(policy):
    snap = snapshot(
        ("n1", H100, 2, GpuMode.MIG),
        ("n2", A100, 2, GpuMode.MIG),
        ("n3", H100, 2, GpuMode.SHARED),
        ("n4", L4, 4, GpuMode.WHOLE),
        ("n5", L4, 2, GpuMode.SHARED),
        quotas=QUOTAS,
        prices=PRICES,
    )
    requests = []
    for i in range(6):
        requests += [
            mig(f"m3-{i}", "p", "3g", models=(), submitted_at=i),
            mig(f"m1-{i}", "p", "1g.10gb", submitted_at=i),
            share(f"s-{i}", "p", 300, 8000, models=(), submitted_at=i),
            whole(f"w-{i}", "p", models=(L4,), submitted_at=i),
            whole(f"g-{i}", "p", 2, models=(L4,), submitted_at=i),
        ]
    decisions, _ = _run(snap, requests, policy=policy, seed=7)
    placed = [d for d in decisions if d.mode == DecisionMode.PLACED]
    assert len(placed) >= 20  # the fleet has room for most of it
    allocations = outcome(snap, decisions).allocations.values()
    for layout in mig_layouts(snap, allocations).values():
        assert layout_problem(layout) is None


def test_placement_non_gang_host_cpu_never_overcommitted():
    nodes = (Node("n1", cpu_milli=2000), Node("n2", cpu_milli=2000))
    snap = Snapshot(nodes, node_gpus("n1", H100, 1) + node_gpus("n2", H100, 1), quotas=tuple(QUOTAS))
    _, found = _run(snap, [whole("r", "p", 2, gang=False, cpu_milli=4000)])
    assert found["r"].mode == DecisionMode.WAITING
