"""The capacity planner (``capacity.planner``): table-driven cases per kind. No database."""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.scheduler.types import GpuMode, Kind, QuotaSpec, WorkloadClass
from capacity.planner import (
    AdjustmentKind,
    Arrivals,
    CapacityGpu,
    CapacitySnapshot,
    CreateLatency,
    DemandShape,
    History,
    IdleRule,
    Instance,
    Mode,
    Policy,
    Price,
    QuotaUse,
    ReclaimClass,
    Utilisation,
    Waiting,
    WarmInstance,
    layout_problems,
    plan_capacity,
    poisson_pool_size,
)

H100 = "H100-80GB"
NOW = 100_000.0
MIG3 = DemandShape(H100, Kind.MIG, "3g.40gb")
MIG1 = DemandShape(H100, Kind.MIG, "1g.10gb")
WHOLE = DemandShape(H100, Kind.WHOLE)


def gpu(index: int, mode: GpuMode = GpuMode.WHOLE, *instances: Instance, warm=()) -> CapacityGpu:
    return CapacityGpu(f"g{index}", "n0", H100, mode, tuple(instances), tuple(warm))


def lease(name: str, *, in_quota=True, klass=WorkloadClass.INTERACTIVE, profile="", start=-1, milli=1000,
          noticed_at=None) -> Instance:
    return Instance(name, "p1", in_quota, klass, profile, start, milli, started_at=0.0, noticed_at=noticed_at)


def series(name: str, engine: int, *, minutes=60, fb=1000) -> Utilisation:
    return Utilisation(name, NOW - minutes * 60, 60, (engine,) * minutes, (fb,) * minutes)


def of(adjustments, kind):
    return [a for a in adjustments if a.kind == kind]


AUTO = Policy(mode_switch=Mode.AUTO, mig_layout=Mode.AUTO, warm_pool=Mode.AUTO, idle_reclaim=Mode.AUTO)


# -- 1. modes and layouts --------------------------------------------------------------------------------


def test_planner_switches_an_idle_whole_gpu_to_mig_for_a_queue_of_mig_requests():
    snapshot = CapacitySnapshot(
        gpus=(gpu(0, GpuMode.WHOLE, lease("busy")), gpu(1), gpu(2)),
        queue=(Waiting("r1", "p1", MIG3, waited_seconds=600), Waiting("r2", "p1", MIG3, waited_seconds=300)),
        policies=(AUTO,),
    )
    adjustments = plan_capacity(snapshot, now=NOW)
    layouts = of(adjustments, AdjustmentKind.MIG_LAYOUT)
    assert len(layouts) == 1  # two 3g fit one GPU
    change = layouts[0].change
    assert change.gpu == "g2" and change.from_mode == "whole" and change.to_mode == "mig"
    assert sorted((s.start, s.profile) for s in change.slots) == [(0, "3g.40gb"), (4, "3g.40gb")]
    assert layouts[0].mode == Mode.AUTO and layouts[0].risk == ()
    assert layouts[0].expected_gain.time_to_gpu_seconds == 600
    assert "2 queued request unit(s)" in layouts[0].reason
    assert layout_problems(snapshot, adjustments) == []


def test_planner_switches_only_inside_the_node_pools_a_waiting_request_is_bound_to():
    """A request bound to pool "b" (its project's binding, docs/scheduling.md "Cohorts and pools") is served by
    a switch of an idle GPU in "b", never of one in "a" that it could not use; an idle GPU of the right mode in
    "a" does not count as room for it; with no GPU in "b" to switch, nothing is proposed for it."""
    def pooled(index, pool, mode=GpuMode.MIG):
        return replace(gpu(index, mode), pool=pool)

    bound = Waiting("r1", "p1", WHOLE, waited_seconds=600, pools=("b",))
    snapshot = CapacitySnapshot(gpus=(pooled(0, "a"), pooled(1, "a", GpuMode.WHOLE), pooled(2, "b")),
                                queue=(bound,), policies=(AUTO,))
    adjustments = plan_capacity(snapshot, now=NOW)
    switches = of(adjustments, AdjustmentKind.MODE_SWITCH)
    assert [(a.change.gpu, a.change.to_mode) for a in switches] == [("g2", "whole")]
    assert layout_problems(snapshot, adjustments) == []
    # unbound, the idle whole GPU in "a" serves it as it is: no switch
    free = replace(snapshot, queue=(replace(bound, pools=()),))
    assert of(plan_capacity(free, now=NOW), AdjustmentKind.MODE_SWITCH) == []
    # bound to "b" with no GPU there but busy ones: nothing to switch for it (the "a" GPUs stay as they are)
    nothing = replace(snapshot, gpus=(pooled(0, "a"), pooled(1, "a", GpuMode.WHOLE),
                                      replace(gpu(2, GpuMode.MIG, lease("busy", profile="7g.80gb", start=0)),
                                              pool="b")))
    assert [a.change.gpu for a in plan_capacity(nothing, now=NOW)
            if dict(a.evidence.figures).get("queued milli served")] == []
    # MIG units of two pools: each switch serves only the units its pool allows
    mig = CapacitySnapshot(gpus=(pooled(0, "a", GpuMode.WHOLE), pooled(1, "b", GpuMode.WHOLE)),
                           queue=(Waiting("m1", "p1", MIG3, waited_seconds=600, pools=("b",)),
                                  Waiting("m2", "p2", MIG3, waited_seconds=500, pools=("a",))), policies=(AUTO,))
    layouts = of(plan_capacity(mig, now=NOW), AdjustmentKind.MIG_LAYOUT)
    assert sorted(a.change.gpu for a in layouts) == ["g0", "g1"]
    assert all(len(a.change.slots) == 1 for a in layouts)


def test_planner_does_not_switch_when_the_queue_fits_as_things_are():
    snapshot = CapacitySnapshot(gpus=(gpu(0, GpuMode.MIG), gpu(1)), queue=(Waiting("r1", "p1", MIG3),))
    assert of(plan_capacity(snapshot, now=NOW), AdjustmentKind.MIG_LAYOUT) == []


@pytest.mark.parametrize(
    ("instances", "in_quota_queue", "expect_drain"),
    [
        ((lease("over", in_quota=False, profile="1g.10gb", start=0, milli=142),), True, True),  # gains 1000 > 142
        ((lease("inq", in_quota=True, profile="1g.10gb", start=0, milli=142),), True, False),  # in-quota: never
        ((lease("over", in_quota=False, profile="1g.10gb", start=0, milli=142),), False, False),  # queue over quota
    ],
)
def test_planner_drains_only_over_quota_holders_for_in_quota_queue(instances, in_quota_queue, expect_drain):
    snapshot = CapacitySnapshot(gpus=(gpu(0, GpuMode.MIG, *instances),),
                                queue=(Waiting("r1", "p2", WHOLE, in_quota=in_quota_queue),))
    switches = of(plan_capacity(snapshot, now=NOW), AdjustmentKind.MODE_SWITCH)
    if expect_drain:
        assert len(switches) == 1 and switches[0].change.drain and switches[0].risk == ("over",)
        assert "gains 1000 milli, the drain takes 142" in switches[0].reason
    else:
        assert switches == []


def test_planner_never_drains_when_the_queue_gains_less_than_it_loses():
    holder = lease("over", in_quota=False)  # a whole over-quota GPU (1000) for one 1g (142)
    snapshot = CapacitySnapshot(gpus=(gpu(0, GpuMode.WHOLE, holder),), queue=(Waiting("r1", "p2", MIG1),))
    assert plan_capacity(snapshot, now=NOW) == []


def test_planner_rebalances_idle_gpus_toward_the_history_mix():
    history = History(NOW - 6 * 3600, NOW, (Arrivals(MIG1, 70),))  # only MIG demand (70 x 142 milli)
    snapshot = CapacitySnapshot(gpus=(gpu(0), gpu(1)), history=history)
    switches = of(plan_capacity(snapshot, now=NOW), AdjustmentKind.MIG_LAYOUT)
    assert sorted(a.change.gpu for a in switches) == ["g0", "g1"]
    # the default policy applies what touches only idle GPUs
    assert all(a.change.to_mode == "mig" and a.mode == Mode.AUTO for a in switches)


def test_planner_switches_a_gpu_held_only_by_warm_members_for_queued_work_no_idle_gpu_serves():
    """A whole-GPU request waits; the only GPU no lease holds carries warm 1g members (the platform's): the
    switch takes it, its members destroyed first, applied by default. A plain idle GPU goes first."""
    warm = (WarmInstance("w1", "1g.10gb", 0),)
    snapshot = CapacitySnapshot(gpus=(gpu(0, GpuMode.MIG, lease("a", profile="1g.10gb", start=0, milli=142)),
                                      gpu(1, GpuMode.MIG, warm=warm)),
                                queue=(Waiting("r1", "p1", WHOLE, waited_seconds=120),))
    [switch] = of(plan_capacity(snapshot, now=NOW), AdjustmentKind.MODE_SWITCH)
    assert (switch.change.gpu, switch.change.to_mode, switch.mode, switch.risk) == ("g1", "whole", Mode.AUTO, ())
    assert "1 warm pool instance(s) are destroyed first" in switch.reason
    plain = CapacitySnapshot(gpus=(*snapshot.gpus, gpu(2, GpuMode.MIG)), queue=snapshot.queue)
    assert [a.change.gpu for a in of(plan_capacity(plain, now=NOW), AdjustmentKind.MODE_SWITCH)] == ["g2"]
    # a queued 1g request binds the member instead: the GPU is not taken
    both = CapacitySnapshot(gpus=snapshot.gpus, queue=(Waiting("r0", "p1", MIG1, waited_seconds=300),
                                                       *snapshot.queue))
    assert of(plan_capacity(both, now=NOW), AdjustmentKind.MODE_SWITCH) == []


# -- 2. warm pools ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expected", "size"),
    [(0.0, 0), (0.01, 1), (0.05, 1), (0.5, 3), (1.0, 4), (5.0, 10)],
)
def test_planner_poisson_pool_size_is_the_smallest_n_with_miss_under_5_percent(expected, size):
    assert poisson_pool_size(expected, 50) == size


def test_planner_fits_the_queue_on_a_gpu_being_switched_and_proposes_nothing_for_that_gpu():
    """A GPU changing mode (a drain or a switch under way: the schedule cycle's reclaim across modes) is capacity of
    the mode it is being switched to: the queue waiting for it is fitted there, so no second GPU is switched for it;
    and nothing is proposed for the changing GPU itself (no warm member, no rebalance, no other switch)."""
    changing = replace(gpu(1, GpuMode.MIG), changing=True)
    queue = (Waiting("r1", "p1", MIG3, waited_seconds=600), Waiting("r2", "p1", MIG3, waited_seconds=300))
    history = History(NOW - 3600, NOW, (Arrivals(MIG1, 120), Arrivals(WHOLE, 500)))
    snapshot = CapacitySnapshot(gpus=(gpu(0, GpuMode.WHOLE, lease("busy")), changing, gpu(2)), queue=queue,
                                history=history, prices=(Price(H100, 7000),),
                                policies=(replace(AUTO, warm_target_p95_seconds=1, cold_provision_seconds=30),))
    adjustments = plan_capacity(snapshot, now=NOW)
    assert not of(adjustments, AdjustmentKind.MIG_LAYOUT) and not of(adjustments, AdjustmentKind.MODE_SWITCH)
    assert all(adjustment.change.gpu != "g1" for adjustment in adjustments)
    assert all(slot.gpu != "g1" for adjustment in adjustments for slot in adjustment.change.slots)
    # a third 3g does not fit the changing GPU's two halves: the idle whole GPU is switched for it
    more = replace(snapshot, queue=(*queue, Waiting("r3", "p1", MIG3, waited_seconds=100)))
    layouts = of(plan_capacity(more, now=NOW), AdjustmentKind.MIG_LAYOUT)
    assert [layout.change.gpu for layout in layouts] == ["g2"]


def test_planner_sizes_a_warm_pool_from_arrivals_and_places_it_on_idle_mig_gpus():
    # 120 arrivals of 1g in an hour, refill 30 s: 1 expected per refill -> 4 warm (P(X >= 4) = 1.9 %); the
    # 1 s SLO needs the pool, though 4 members hold more instance time (4 h/h) than they save (0.95 h/h)
    history = History(NOW - 3600, NOW, (Arrivals(MIG1, 120),))
    snapshot = CapacitySnapshot(
        gpus=(gpu(0, GpuMode.MIG, lease("a", profile="1g.10gb", start=0, milli=142)), gpu(1, GpuMode.MIG)),
        history=history, prices=(Price(H100, 7000),),
        policies=(replace(AUTO, warm_target_p95_seconds=1, cold_provision_seconds=30),))
    pools = of(plan_capacity(snapshot, now=NOW), AdjustmentKind.WARM_POOL)
    assert len(pools) == 1
    change = pools[0].change
    assert (change.size_before, change.size_after) == (0, 4)
    assert {s.gpu for s in change.slots} == {"g1"}  # never on a GPU a lease holds
    assert pools[0].expected_gain.money_minor == -4 * (7000 * 142 // 1000)
    assert pools[0].expected_gain.time_to_gpu_seconds == 30
    assert layout_problems(snapshot, pools) == []


def test_planner_shrinks_the_warm_pool_when_demand_falls():
    warm = (WarmInstance("w1", "1g.10gb", 0), WarmInstance("w2", "1g.10gb", 1))
    snapshot = CapacitySnapshot(gpus=(gpu(0, GpuMode.MIG, warm=warm),), history=History(NOW - 3600, NOW, ()))
    pools = of(plan_capacity(snapshot, now=NOW), AdjustmentKind.WARM_POOL)
    assert [(a.change.size_before, a.change.size_after, a.change.remove) for a in pools] == [(2, 0, ("w1", "w2"))]


def test_planner_keeps_no_pool_when_the_cold_path_meets_the_target():
    history = History(NOW - 3600, NOW, (Arrivals(MIG1, 120),))
    policy = Policy(warm_target_p95_seconds=60, cold_provision_seconds=30)
    snapshot = CapacitySnapshot(gpus=(gpu(0, GpuMode.MIG),), history=history, policies=(policy,))
    assert of(plan_capacity(snapshot, now=NOW), AdjustmentKind.WARM_POOL) == []


def test_planner_proposes_no_pool_whose_holding_exceeds_the_time_it_saves_unless_an_slo_needs_it():
    """The demo's case: 3 arrivals in 360 min. A member would hold an hour of instance time per hour to save
    a few seconds of waiting: with no SLO nothing is proposed and an existing pool is shrunk away; with the
    default 1 s SLO and creates measured at 5 s the pool is proposed, its negative balance in its gain."""
    history = History(NOW - 6 * 3600, NOW, (Arrivals(MIG1, 3),))
    no_slo = Policy(warm_target_p95_seconds=None)
    slow = (CreateLatency(H100, "1g.10gb", 5000, 3),)
    snapshot = CapacitySnapshot(gpus=(gpu(0, GpuMode.MIG),), history=history, policies=(no_slo,), create_latency=slow)
    assert of(plan_capacity(snapshot, now=NOW), AdjustmentKind.WARM_POOL) == []
    held = CapacitySnapshot(gpus=(gpu(0, GpuMode.MIG, warm=(WarmInstance("w1", "1g.10gb", 0),)),), history=history,
                            policies=(no_slo,), create_latency=slow)
    [shrink] = of(plan_capacity(held, now=NOW), AdjustmentKind.WARM_POOL)
    assert (shrink.change.size_after, shrink.change.remove) == (0, ("w1",))
    assert "cost more than the time it saves" in shrink.reason and shrink.mode == Mode.AUTO

    [pool] = of(plan_capacity(CapacitySnapshot(gpus=snapshot.gpus, history=history, create_latency=slow), now=NOW),
                AdjustmentKind.WARM_POOL)
    figures = dict(pool.evidence.figures)
    assert pool.change.size_after == 1 and "misses the 1 s target" in pool.reason
    assert figures["time saved per hour (s)"] == 2 and figures["held per hour (s)"] == 3600  # 0.5/h x 5 s x 95 %
    assert pool.expected_gain.gpu_seconds == (2 - 3600) * 142 // 1000 < 0
    assert pool.expected_gain.time_to_gpu_seconds == 5 and "a cold create takes 5.00 s" in pool.reason


def test_planner_uses_the_measured_cold_create_not_a_constant():
    """A fleet whose creates take 0.06 s meets a 1 s SLO cold: no pool, whatever the arrivals. Without a
    measurement the assumed 30 s misses it and a pool is sized from it; the model's measurement stands in
    for a profile with none of its own; an operator's cold_provision_seconds wins over both."""
    history = History(NOW - 3600, NOW, (Arrivals(MIG1, 120),))
    slo = Policy(warm_target_p95_seconds=1)
    gpus = (gpu(0, GpuMode.MIG),)
    fast = (CreateLatency(H100, "1g.10gb", 60, 12), CreateLatency(H100, "", 60, 12))
    assert of(plan_capacity(CapacitySnapshot(gpus=gpus, history=history, policies=(slo,), create_latency=fast),
                            now=NOW), AdjustmentKind.WARM_POOL) == []
    [assumed] = of(plan_capacity(CapacitySnapshot(gpus=gpus, history=history, policies=(slo,)), now=NOW),
                   AdjustmentKind.WARM_POOL)
    assert dict(assumed.evidence.figures)["cold create milliseconds"] == 30_000
    assert "no create measured yet" in assumed.reason
    model_only = (CreateLatency(H100, "", 5000, 3),)
    [by_model] = of(plan_capacity(CapacitySnapshot(gpus=gpus, history=history, policies=(slo,),
                                                   create_latency=model_only), now=NOW), AdjustmentKind.WARM_POOL)
    assert dict(by_model.evidence.figures)["cold create milliseconds"] == 5000
    operator = replace(slo, cold_provision_seconds=20)
    [set_by_hand] = of(plan_capacity(CapacitySnapshot(gpus=gpus, history=history, policies=(operator,),
                                                      create_latency=fast), now=NOW), AdjustmentKind.WARM_POOL)
    assert dict(set_by_hand.evidence.figures)["cold create milliseconds"] == 20_000


def test_planner_default_policy_applies_idle_capacity_and_advises_what_touches_a_lease():
    """Default policy: an idle GPU's switch is auto; a drain of over-quota leases is advice, unless idle reclaim
    of the drained project is auto too; idle reclaim is advice."""
    over = lease("over", in_quota=False, profile="1g.10gb", start=0, milli=142)
    drain = CapacitySnapshot(gpus=(gpu(0, GpuMode.MIG, over),), queue=(Waiting("r1", "p2", WHOLE),))
    [switch] = of(plan_capacity(drain, now=NOW), AdjustmentKind.MODE_SWITCH)
    assert switch.change.drain and switch.mode == Mode.ADVISE
    reclaim_auto = Policy(scope="project:p1", idle_reclaim=Mode.AUTO)
    drain_auto = CapacitySnapshot(drain.gpus, queue=drain.queue, policies=(Policy(), reclaim_auto))
    assert of(plan_capacity(drain_auto, now=NOW), AdjustmentKind.MODE_SWITCH)[0].mode == Mode.AUTO
    idle_lease = CapacitySnapshot(gpus=(gpu(0, GpuMode.WHOLE, lease("a")),), utilisation=(series("a", 10),))
    [reclaim] = plan_capacity(idle_lease, now=NOW)
    assert reclaim.kind == AdjustmentKind.IDLE_RECLAIM and reclaim.mode == Mode.ADVISE


# -- 3. idle reclaim ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("instance", "engine", "step"),
    [
        (lease("a"), 10, "notice"),  # interactive, 1 % < 5 %
        (lease("a"), 80, None),  # busy
        (lease("a", noticed_at=NOW - 1000), 10, "release"),  # notice 900 s ago, still idle
        (lease("a", noticed_at=NOW - 100), 10, None),  # notice still running
        (lease("a", in_quota=False, noticed_at=NOW - 400), 10, "preempt"),  # over quota: preempted, requeued
        (lease("a", klass=WorkloadClass.TRAINING), 0, None),  # training: off by default
    ],
)
def test_planner_idle_reclaim_steps(instance, engine, step):
    snapshot = CapacitySnapshot(gpus=(gpu(0, GpuMode.WHOLE, instance),), utilisation=(series("a", engine),))
    reclaims = of(plan_capacity(snapshot, now=NOW), AdjustmentKind.IDLE_RECLAIM)
    assert [a.change.step for a in reclaims] == ([step] if step else [])
    for adjustment in reclaims:
        assert adjustment.risk == ("a",)
        assert dict(adjustment.evidence.figures)["mean engine active (permille)"] == engine


def test_planner_idle_reclaim_needs_the_whole_window_of_evidence():
    snapshot = CapacitySnapshot(gpus=(gpu(0, GpuMode.WHOLE, lease("a")),), utilisation=(series("a", 0, minutes=20),))
    assert of(plan_capacity(snapshot, now=NOW), AdjustmentKind.IDLE_RECLAIM) == []


def test_planner_idle_reclaim_follows_the_project_policy():
    off = Policy(scope="project:p1", idle_reclaim=Mode.OFF)
    training_on = Policy(scope="project:p1", idle_rules=((ReclaimClass.TRAINING, IdleRule(True, 50, 1800, 600)),))
    instance = lease("a", klass=WorkloadClass.TRAINING)
    base = CapacitySnapshot(gpus=(gpu(0, GpuMode.WHOLE, instance),), utilisation=(series("a", 0),))
    assert of(plan_capacity(base, now=NOW), AdjustmentKind.IDLE_RECLAIM) == []
    on = CapacitySnapshot(base.gpus, utilisation=base.utilisation, policies=(Policy(), training_on))
    assert len(of(plan_capacity(on, now=NOW), AdjustmentKind.IDLE_RECLAIM)) == 1
    interactive = CapacitySnapshot((gpu(0, GpuMode.WHOLE, lease("a")),), utilisation=base.utilisation,
                                   policies=(Policy(), off))
    assert of(plan_capacity(interactive, now=NOW), AdjustmentKind.IDLE_RECLAIM) == []


def test_planner_idle_reclaim_of_an_opted_in_class_is_auto_where_the_mode_is_advise():
    """A project opted in to idle reclaim of its interactive leases (``idle_auto_classes``): their reclaim is
    ``auto`` with the interactive rule as it stands; another class stays advice; ``off`` stays off; a lease of
    another project is untouched."""
    opted = Policy(scope="project:p1", idle_auto_classes=(ReclaimClass.INTERACTIVE,))
    snapshot = CapacitySnapshot(
        gpus=(gpu(0, GpuMode.WHOLE, lease("a")), gpu(1, GpuMode.WHOLE, lease("b", in_quota=False)),
              gpu(2, GpuMode.WHOLE, replace(lease("c"), project="p2"))),
        utilisation=(series("a", 10), series("b", 10), series("c", 10)), policies=(Policy(), opted))
    modes = {a.change.lease: (a.change.step, a.mode) for a in of(plan_capacity(snapshot, now=NOW),
                                                                  AdjustmentKind.IDLE_RECLAIM)}
    assert modes == {"a": ("notice", Mode.AUTO), "b": ("notice", Mode.ADVISE), "c": ("notice", Mode.ADVISE)}
    [notice] = [a for a in plan_capacity(snapshot, now=NOW) if a.change.lease == "a"]
    assert "opted in" in notice.reason and "released in 900 s" in notice.reason
    released = CapacitySnapshot((gpu(0, GpuMode.WHOLE, lease("a", noticed_at=NOW - 1000)),),
                                utilisation=(series("a", 10),), policies=(Policy(), opted))
    [release] = of(plan_capacity(released, now=NOW), AdjustmentKind.IDLE_RECLAIM)
    assert (release.change.step, release.mode) == ("release", Mode.AUTO)
    off = CapacitySnapshot(snapshot.gpus[:1], utilisation=snapshot.utilisation[:1],
                           policies=(Policy(), replace(opted, idle_reclaim=Mode.OFF)))
    assert of(plan_capacity(off, now=NOW), AdjustmentKind.IDLE_RECLAIM) == []
    assert opted.idle_mode(ReclaimClass.TRAINING) == Mode.ADVISE
    assert replace(opted, idle_reclaim=Mode.AUTO).idle_mode(ReclaimClass.INTERACTIVE) == Mode.AUTO


def training(name: str, *, resumable=True, in_quota=True, noticed_at=None, project="p1") -> Instance:
    return Instance(name, project, in_quota, WorkloadClass.TRAINING, started_at=0.0, noticed_at=noticed_at,
                    resumable=resumable)


WAITING = (Waiting("r1", "p2", WHOLE),)  # a whole H100 waits: what a suspension frees the GPU for


@pytest.mark.parametrize(
    ("instance", "engine", "queue", "step"),
    [
        (training("t"), 10, WAITING, "notice"),  # resumable, idle 1 h, work waits: notice
        (training("t"), 10, (), None),  # nothing waits: no notice (requeued, it would be placed straight back)
        (training("t"), 10, (Waiting("r1", "p2", DemandShape("A100-80GB", Kind.WHOLE)),), None),  # another model
        (training("t"), 80, WAITING, None),  # busy
        (training("t", noticed_at=NOW - 1900), 10, WAITING, "suspend"),  # 30 min of notice ran out, still idle
        (training("t", noticed_at=NOW - 1900), 10, (), None),  # noticed, but the waiting work left: it stays
        (training("t", noticed_at=NOW - 600), 10, WAITING, None),  # the notice still runs
        (training("t", noticed_at=NOW - 600), 80, WAITING, "cancel"),  # busy again: the notice is withdrawn
        (training("t", resumable=False), 0, WAITING, None),  # no checkpoint / restart never: training is off
        (training("t", in_quota=False, noticed_at=NOW - 400), 10, (), "preempt"),  # over quota: its own rule
        (replace(training("t"), workload_class=WorkloadClass.INFERENCE), 0, WAITING, None),  # inference: off
    ],
)
def test_planner_suspends_idle_resumable_training_only_while_work_waits(instance, engine, queue, step):
    snapshot = CapacitySnapshot(gpus=(gpu(0, GpuMode.WHOLE, instance),), queue=queue,
                                utilisation=(series("t", engine, minutes=70),))
    reclaims = of(plan_capacity(snapshot, now=NOW), AdjustmentKind.IDLE_RECLAIM)
    assert [a.change.step for a in reclaims] == ([step] if step else [])
    for adjustment in reclaims:
        assert adjustment.mode == Mode.ADVISE  # it touches a tenant's lease: advice by default
        figures = dict(adjustment.evidence.figures)
        if instance.in_quota:
            assert figures["class"] == "resumable-training" and figures["window seconds"] == 3600
            assert figures["queued units on the model"] == sum(w.count for w in queue)
    if step == "notice":
        assert "suspended in 1800 s unless it becomes busy" in reclaims[0].reason
    if step == "suspend":
        assert "checkpoint, back to the queue" in reclaims[0].reason and "resumes" in reclaims[0].reason


def test_planner_suspension_needs_the_whole_hour_and_follows_the_rule_and_the_opt_in():
    """The resumable rule (1 h under 5 %, 30 min notice) needs the whole window; a project's rule switched off
    (its opt-out of suspension) suspends nothing; opted in to idle reclaim, the suspension is ``auto``; idle
    reclaim ``off`` is never raised."""
    short = CapacitySnapshot(gpus=(gpu(0, GpuMode.WHOLE, training("t")),), queue=WAITING,
                             utilisation=(series("t", 0, minutes=50),))
    assert of(plan_capacity(short, now=NOW), AdjustmentKind.IDLE_RECLAIM) == []
    base = CapacitySnapshot(gpus=(gpu(0, GpuMode.WHOLE, training("t", noticed_at=NOW - 1900)),), queue=WAITING,
                            utilisation=(series("t", 0, minutes=70),))
    opted_out = Policy(scope="project:p1",
                       idle_rules=((ReclaimClass.RESUMABLE, IdleRule(False, 50, 3600, 1800)),))
    assert of(plan_capacity(replace(base, policies=(Policy(), opted_out)), now=NOW), AdjustmentKind.IDLE_RECLAIM) == []
    opted_in = Policy(scope="project:p1", idle_auto_classes=(ReclaimClass.INTERACTIVE, ReclaimClass.RESUMABLE))
    [suspend] = of(plan_capacity(replace(base, policies=(Policy(), opted_in)), now=NOW), AdjustmentKind.IDLE_RECLAIM)
    assert (suspend.change.step, suspend.mode) == ("suspend", Mode.AUTO) and "opted in" in suspend.reason
    off = replace(opted_in, idle_reclaim=Mode.OFF)
    assert of(plan_capacity(replace(base, policies=(Policy(), off)), now=NOW), AdjustmentKind.IDLE_RECLAIM) == []
    # training reclaim switched on by staff: a lease that cannot resume is released, one that can is suspended
    training_on = Policy(idle_reclaim=Mode.AUTO,
                         idle_rules=((ReclaimClass.TRAINING, IdleRule(True, 50, 3600, 1800)),
                                     (ReclaimClass.RESUMABLE, IdleRule(True, 50, 3600, 1800))))
    both = CapacitySnapshot(gpus=(gpu(0, GpuMode.WHOLE, training("t", noticed_at=NOW - 1900)),
                                  gpu(1, GpuMode.WHOLE, training("u", resumable=False, noticed_at=NOW - 1900))),
                            queue=WAITING, utilisation=(series("t", 0, minutes=70), series("u", 0, minutes=70)),
                            policies=(training_on,))
    steps = {a.change.lease: a.change.step for a in of(plan_capacity(both, now=NOW), AdjustmentKind.IDLE_RECLAIM)}
    assert steps == {"t": "suspend", "u": "release"}


# -- 4. right-sizing and quota advice ---------------------------------------------------------------------


def test_planner_right_sizes_a_whole_gpu_to_the_smallest_profile_that_fits_with_its_saving():
    # 25 hours at 10 % engine activity and 8 GiB of framebuffer on a whole H100 priced 7000/h
    util = Utilisation("a", NOW - 25 * 3600, 3600, (100,) * 25, (8000,) * 25)
    snapshot = CapacitySnapshot(gpus=(gpu(0, GpuMode.WHOLE, lease("a", klass=WorkloadClass.TRAINING)),),
                                utilisation=(util,), prices=(Price(H100, 7000),))
    advice = of(plan_capacity(snapshot, now=NOW), AdjustmentKind.RIGHT_SIZE)
    assert len(advice) == 1
    change = advice[0].change
    # needs 120 milli and 9600 MiB: 1g.10gb (142 milli, 9984 MiB) at 7000 * 142 // 1000 = 994 per hour
    assert (change.profile, change.size_after) == ("1g.10gb", 142)
    assert advice[0].expected_gain.money_minor == (7000 - 994) * 25
    assert advice[0].mode == Mode.ADVISE


def test_planner_right_sizing_prefers_a_profile_price_from_the_price_book():
    util = Utilisation("a", NOW - 25 * 3600, 3600, (100,) * 25, (15000,) * 25)
    prices = (Price(H100, 7000), Price(H100, 900, profile="2g.20gb"))  # under 1g.20gb pro rata (994)
    snapshot = CapacitySnapshot(gpus=(gpu(0, GpuMode.WHOLE, lease("a")),), utilisation=(util,), prices=prices)
    advice = of(plan_capacity(snapshot, now=NOW), AdjustmentKind.RIGHT_SIZE)
    assert advice[0].change.profile == "2g.20gb"
    assert advice[0].expected_gain.money_minor == (7000 - 900) * 25


def test_planner_right_sizing_needs_a_day_of_evidence():
    util = Utilisation("a", NOW - 3600, 3600, (100,), (8000,))
    snapshot = CapacitySnapshot(gpus=(gpu(0, GpuMode.WHOLE, lease("a")),), utilisation=(util,),
                                prices=(Price(H100, 7000),))
    assert of(plan_capacity(snapshot, now=NOW), AdjustmentKind.RIGHT_SIZE) == []


@pytest.mark.parametrize(
    ("deserved", "use", "after"),
    [(8000, 2000, 2000), (2000, 3500, 4000), (4000, 3000, None)],
)
def test_planner_quota_advice_compares_deserved_with_p95_use(deserved, use, after):
    samples = (use,) * 100
    snapshot = CapacitySnapshot(gpus=(), quotas=(QuotaSpec("p1", "t", H100, deserved, 16000),),
                                quota_use=(QuotaUse("p1", H100, NOW - 100 * 3600, 3600, samples),))
    advice = of(plan_capacity(snapshot, now=NOW), AdjustmentKind.QUOTA_ADVICE)
    assert [a.change.size_after for a in advice] == ([after] if after is not None else [])


def test_planner_kind_off_proposes_nothing():
    off = Policy(mode_switch=Mode.OFF, mig_layout=Mode.OFF, warm_pool=Mode.OFF, idle_reclaim=Mode.OFF,
                 right_size=Mode.OFF, quota_advice=Mode.OFF)
    snapshot = CapacitySnapshot(gpus=(gpu(0, GpuMode.WHOLE, lease("a")), gpu(1)),
                                queue=(Waiting("r", "p1", MIG3),), utilisation=(series("a", 0),),
                                history=History(NOW - 3600, NOW, (Arrivals(MIG1, 500),)), policies=(off,))
    assert plan_capacity(snapshot, now=NOW) == []
