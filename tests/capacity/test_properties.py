"""Property tests (hypothesis) of the capacity planner's invariants on random fleets, queues and series:

- no adjustment touches a GPU that holds a live in-quota instance (idle reclaim of that very lease aside);
- every MIG layout it proposes is valid under ``gpus.mig``;
- idempotent and deterministic: the same snapshot gives the same list, whatever the order of its parts;
- only in-quota training whose workload can resume is suspended, only while units wait for its model, and such a
  lease is never released.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.scheduler.types import GpuMode, Kind, WorkloadClass
from capacity.planner import (
    AdjustmentKind,
    Arrivals,
    CapacityGpu,
    CapacitySnapshot,
    DemandShape,
    History,
    IdleRule,
    Instance,
    Mode,
    Policy,
    Price,
    ReclaimClass,
    ReclaimStep,
    Utilisation,
    Waiting,
    WarmInstance,
    layout_problems,
    plan_capacity,
)
from gpus.mig import MigPlacement, free_starts, profiles_for

MODELS = ("H100-80GB", "A100-40GB", "L4")
NOW = 1_000_000.0
POLICIES = (
    Policy(),
    Policy(mode_switch=Mode.AUTO, mig_layout=Mode.AUTO, warm_pool=Mode.AUTO, idle_reclaim=Mode.AUTO),
    # training reclaim switched on as well: a resumable lease is still suspended, never released
    Policy(idle_reclaim=Mode.AUTO, idle_rules=tuple((c, IdleRule(True, 50, 3600, 1800)) for c in ReclaimClass)),
)


def _profiles(model: str):
    return [p for p in profiles_for(model) if not p.shape.media_extensions]


@st.composite
def snapshots(draw):
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    gpus = []
    leases = []
    for index in range(draw(st.integers(0, 10))):
        model = rng.choice(MODELS)
        modes = [GpuMode.WHOLE, GpuMode.SHARED] + ([GpuMode.MIG] if profiles_for(model) else [])
        mode = rng.choice(modes)
        instances, warm = [], []
        occupancy = rng.random()
        if mode == GpuMode.MIG:
            layout: list[MigPlacement] = []
            for _ in range(rng.randint(0, 4)):
                profile = rng.choice(_profiles(model))
                starts = free_starts(layout, profile)
                if not starts:
                    continue
                start = rng.choice(starts)
                layout.append(MigPlacement(start, profile))
                if occupancy < 0.6:
                    name = f"l{index}-{start}"
                    instances.append(Instance(name, rng.choice("ab"), rng.random() < 0.5,
                                              rng.choice(list(WorkloadClass)), profile.name, start,
                                              profile.gpu_milli, started_at=NOW - 7200,
                                              noticed_at=rng.choice([None, NOW - 2000])))
                else:
                    warm.append(WarmInstance(f"w{index}-{start}", profile.name, start, rng.random() < 0.8))
        elif mode == GpuMode.WHOLE and occupancy < 0.5:
            instances.append(Instance(f"l{index}", rng.choice("ab"), rng.random() < 0.5,
                                      rng.choice(list(WorkloadClass)), started_at=NOW - 7200,
                                      noticed_at=rng.choice([None, NOW - 2000]), resumable=rng.random() < 0.5))
        elif mode == GpuMode.SHARED and occupancy < 0.5:
            used = 0
            for part in range(rng.randint(1, 3)):
                milli = rng.choice([250, 300, 500])
                if used + milli > 1000:
                    break
                used += milli
                instances.append(Instance(f"l{index}s{part}", rng.choice("ab"), rng.random() < 0.5,
                                          WorkloadClass.INTERACTIVE, milli=milli, started_at=NOW - 7200))
        gpus.append(CapacityGpu(f"g{index:02d}", f"n{index // 4}", model, mode, tuple(instances), tuple(warm)))
        leases += [i.lease for i in instances]

    def shape() -> DemandShape:
        model = rng.choice(MODELS)
        kinds = [Kind.WHOLE, Kind.SHARE] + ([Kind.MIG] if profiles_for(model) else [])
        kind = rng.choice(kinds)
        if kind == Kind.MIG:
            return DemandShape(model, kind, rng.choice(_profiles(model)).name)
        if kind == Kind.SHARE:
            return DemandShape(model, kind, milli=rng.choice([250, 500]))
        return DemandShape(model, kind)

    queue = tuple(Waiting(f"r{i}", rng.choice("ab"), shape(), rng.randint(1, 2), rng.random() < 0.6,
                          waited_seconds=rng.randint(0, 3600)) for i in range(draw(st.integers(0, 8))))
    arrivals = tuple(Arrivals(shape(), rng.randint(1, 400)) for _ in range(draw(st.integers(0, 5))))
    utilisation = tuple(
        Utilisation(lease, NOW - 3600, 60, tuple(rng.choice([0, 10, 30, 400]) for _ in range(60)),
                    tuple(rng.randint(0, 20000) for _ in range(60)))
        for lease in leases if rng.random() < 0.8)
    prices = (Price("H100-80GB", 7000), Price("A100-40GB", 3000), Price("L4", 800))
    return CapacitySnapshot(gpus=tuple(gpus), queue=queue, history=History(NOW - 6 * 3600, NOW, arrivals),
                            utilisation=utilisation, prices=prices, policies=(draw(st.sampled_from(POLICIES)),))


def _in_quota_gpus(snapshot: CapacitySnapshot) -> set[str]:
    return {gpu.id for gpu in snapshot.gpus if any(i.in_quota for i in gpu.instances)}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_properties_never_touches_a_gpu_with_a_live_in_quota_instance(snapshot):
    protected = _in_quota_gpus(snapshot)
    in_quota_leases = {i.lease for gpu in snapshot.gpus for i in gpu.instances if i.in_quota}
    for adjustment in plan_capacity(snapshot, now=NOW):
        if adjustment.kind == AdjustmentKind.IDLE_RECLAIM:
            assert adjustment.risk == (adjustment.change.lease,)
            continue
        touched = {adjustment.change.gpu} - {""} if adjustment.change.to_mode else set()
        touched |= {slot.gpu for slot in adjustment.change.slots}
        assert not touched & protected, adjustment
        assert not set(adjustment.risk) & in_quota_leases, adjustment


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_properties_every_proposed_layout_is_valid(snapshot):
    adjustments = plan_capacity(snapshot, now=NOW)
    assert layout_problems(snapshot, adjustments) == []
    for adjustment in adjustments:  # a switch into MIG carries slots only of its own GPU
        for slot in adjustment.change.slots:
            if adjustment.change.gpu:
                assert slot.gpu == adjustment.change.gpu


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(), st.randoms(use_true_random=False))
def test_properties_idempotent_and_independent_of_input_order(snapshot, rng):
    first = plan_capacity(snapshot, now=NOW)
    assert plan_capacity(snapshot, now=NOW) == first
    shuffled = CapacitySnapshot(
        gpus=tuple(rng.sample(snapshot.gpus, len(snapshot.gpus))),
        queue=tuple(rng.sample(snapshot.queue, len(snapshot.queue))),
        history=History(snapshot.history.start, snapshot.history.end,
                        tuple(rng.sample(snapshot.history.arrivals, len(snapshot.history.arrivals)))),
        utilisation=tuple(rng.sample(snapshot.utilisation, len(snapshot.utilisation))),
        prices=snapshot.prices, policies=snapshot.policies)
    assert plan_capacity(shuffled, now=NOW) == first


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_properties_only_resumable_in_quota_training_is_suspended_and_only_for_waiting_work(snapshot):
    instances = {i.lease: (gpu, i) for gpu in snapshot.gpus for i in gpu.instances}
    waiting = {w.shape.model for w in snapshot.queue}
    for adjustment in plan_capacity(snapshot, now=NOW):
        if adjustment.kind != AdjustmentKind.IDLE_RECLAIM:
            continue
        gpu, instance = instances[adjustment.change.lease]
        resumable = instance.in_quota and instance.resumable and instance.workload_class == WorkloadClass.TRAINING
        step = ReclaimStep(adjustment.change.step)
        if step == ReclaimStep.SUSPEND:
            assert resumable and gpu.model in waiting, adjustment
        if resumable:
            assert step != ReclaimStep.RELEASE, adjustment
            if step in (ReclaimStep.NOTICE, ReclaimStep.SUSPEND):
                assert gpu.model in waiting, adjustment
