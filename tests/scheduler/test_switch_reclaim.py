"""Reclaim across modes (``Scheduler._switch_for``, docs/scheduling.md): an in-quota request of one unit that fits
nowhere in its mode, and reclaims nothing there, has a GPU of another mode emptied of over-quota work (or an idle
one) and switched to its mode (``DecisionMode.SWITCH``); later requests wait for that GPU while its room lasts."""

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.scheduler import Allocation, DecisionMode, GpuMode, Unit, plan
from broker.scheduler.plan import Scheduler
from tests.scheduler.builders import (
    H100,
    by_request,
    decision_problems,
    held,
    invariant_problems,
    mig,
    quota,
    share,
    snapshot,
    whole,
)

QUOTAS = [quota("a", H100, 0, 64000), quota("b", H100, 4000, 4000)]
ON = frozenset({(H100, GpuMode.MIG), (H100, GpuMode.WHOLE), (H100, GpuMode.SHARED)})


def _mig_instance(allocation_id: str, project: str, gpu_id: str, start: int, *, preemptible=True,
                  started_at=0.0) -> Allocation:
    node = gpu_id.rsplit("-g", 1)[0]
    return Allocation(allocation_id, project, "acme", H100, node, (Unit(gpu_id, 142, 10240, "1g.10gb", start),),
                      preemptible, started_at)


def _full_mig_fleet(allocations=(), *, whole_gpus=2, switch_modes=ON, quotas=QUOTAS, min_runtime=0.0):
    """n1: ``whole_gpus`` whole GPUs; n2: one MIG GPU with all 7 1g slots held in quota by project c."""
    held_mig = [_mig_instance(f"c{i}", "c", "n2-g0", i, preemptible=False) for i in range(7)]
    snap = snapshot(("n1", H100, whole_gpus, GpuMode.WHOLE), ("n2", H100, 1, GpuMode.MIG),
                    quotas=[*quotas, quota("c", H100, 1000, 1000)], allocations=[*held_mig, *allocations],
                    min_runtime_seconds=min_runtime)
    return replace(snap, switch_modes=switch_modes)


def test_an_in_quota_mig_request_empties_a_whole_gpu_of_over_quota_work_and_has_it_switched():
    snap = _full_mig_fleet([held("a0", "a", "n1-g0", started_at=0), held("a1", "a", "n1-g1", started_at=5)])
    requests = [mig("r", "b", "1g.10gb")]
    [decision] = plan(snap, requests, now=100)
    assert decision.mode == DecisionMode.SWITCH
    assert decision.victims == ("a1",)  # the youngest of the over-quota project
    assert decision.switch == ("n1-g1", "mig")
    assert decision.allocation is None
    assert "GPU 1 on n1 (whole mode) is emptied of over-quota work: a1 (a), and switched to MIG mode" in decision.reason
    assert invariant_problems(snap, requests, [decision]) == []


def test_off_without_switch_modes_the_request_waits_as_before():
    snap = _full_mig_fleet([held("a0", "a", "n1-g0"), held("a1", "a", "n1-g1")], switch_modes=frozenset())
    [decision] = plan(snap, [mig("r", "b", "1g.10gb")], now=100)
    assert decision.mode == DecisionMode.WAITING
    assert "no 1g.10gb slot free" in decision.reason
    # only the modes named: whole switching on does not switch for a MIG request
    snap = replace(snap, switch_modes=frozenset({(H100, GpuMode.WHOLE)}))
    [decision] = plan(snap, [mig("r", "b", "1g.10gb")], now=100)
    assert decision.mode == DecisionMode.WAITING


def test_an_idle_gpu_of_another_mode_is_taken_before_any_victim():
    snap = _full_mig_fleet([held("a0", "a", "n1-g0")])  # n1-g1 idle whole
    [decision] = plan(snap, [mig("r", "b", "1g.10gb")], now=100)
    assert decision.mode == DecisionMode.SWITCH
    assert decision.victims == ()
    assert decision.switch == ("n1-g1", "mig")
    assert "is idle and switched to MIG mode" in decision.reason


def test_over_quota_and_interactive_beyond_guarantee_never_switch():
    snap = _full_mig_fleet([held("a0", "a", "n1-g0"), held("a1", "a", "n1-g1")])
    # a deserves nothing: its request is over quota and finds no idle capacity; nothing is emptied for it
    [decision] = plan(snap, [mig("r", "a", "1g.10gb")], now=100)
    assert decision.mode == DecisionMode.WAITING
    assert decision.victims == ()


def test_victims_must_be_reclaimable_and_confined_to_the_gpu():
    young = [held("a0", "a", "n1-g0", started_at=95), held("a1", "a", "n1-g1", started_at=96)]
    snap = _full_mig_fleet(young, min_runtime=60)  # both within the minimum runtime
    [decision] = plan(snap, [mig("r", "b", "1g.10gb")], now=100)
    assert decision.mode == DecisionMode.WAITING
    # in-quota work is never a victim
    snap = _full_mig_fleet([held("b0", "b", "n1-g0", preemptible=False), held("b1", "b", "n1-g1", preemptible=False)])
    [decision] = plan(snap, [mig("r", "b", "1g.10gb")], now=100)
    assert decision.mode == DecisionMode.WAITING
    # a lease spread over two GPUs is not thrown away for one unit
    snap = _full_mig_fleet([held("a01", "a", ("n1-g0", "n1-g1"))])
    [decision] = plan(snap, [mig("r", "b", "1g.10gb")], now=100)
    assert decision.mode == DecisionMode.WAITING


def test_a_burst_waits_for_the_switched_gpu_while_its_room_lasts_then_switches_another():
    snap = _full_mig_fleet([held("a0", "a", "n1-g0", started_at=0), held("a1", "a", "n1-g1", started_at=5)])
    requests = [mig(f"r{i}", "b", "1g.10gb", submitted_at=i) for i in range(9)]
    decisions = plan(snap, requests, now=100)
    found = by_request(decisions)
    switches = [d for d in decisions if d.mode == DecisionMode.SWITCH]
    assert [d.switch for d in switches] == [("n1-g1", "mig"), ("n1-g0", "mig")]
    assert [d.victims for d in switches] == [("a1",), ("a0",)]
    waiting = [d for d in decisions if d.mode == DecisionMode.WAITING]
    assert len(waiting) == 7  # six fill the first GPU's room (7 slices, one taken), one the second's
    assert sum("waits for GPU 1 on n1" in d.reason for d in waiting) == 6
    assert sum("waits for GPU 0 on n1" in d.reason for d in waiting) == 1
    assert found["r0"].mode == DecisionMode.SWITCH
    assert decision_problems(requests, decisions, snap) == []


def test_a_gpu_the_snapshot_says_is_switching_is_waited_for_not_reclaimed_again():
    snap = _full_mig_fleet([held("a0", "a", "n1-g0")], whole_gpus=2)
    gpus = tuple(replace(g, closed=True) if g.id == "n1-g1" else g for g in snap.gpus)
    snap = replace(snap, gpus=gpus, switching={"n1-g1": "mig"})
    [decision] = plan(snap, [mig("r", "b", "1g.10gb")], now=100)
    assert decision.mode == DecisionMode.WAITING
    assert "waits for GPU 1 on n1, which is being switched to MIG mode" in decision.reason


def test_nothing_else_is_placed_on_the_gpu_being_switched_in_the_same_cycle():
    # b's in-quota MIG request switches n1-g1 (idle); a's over-quota whole request must not take it
    snap = _full_mig_fleet([held("a0", "a", "n1-g0")])
    requests = [mig("r", "b", "1g.10gb"), whole("w", "a")]
    found = by_request(plan(snap, requests, now=100))
    assert found["r"].mode == DecisionMode.SWITCH
    assert found["w"].mode == DecisionMode.WAITING


def test_a_whole_request_empties_a_mig_gpu_held_by_over_quota_instances():
    instances = [_mig_instance(f"a{i}", "a", "n2-g0", i, started_at=i) for i in range(3)]
    snap = snapshot(("n1", H100, 1, GpuMode.WHOLE), ("n2", H100, 1, GpuMode.MIG),
                    quotas=[*QUOTAS, quota("c", H100, 1000, 1000)],
                    allocations=[held("c0", "c", "n1-g0", preemptible=False), *instances])
    snap = replace(snap, switch_modes=ON)
    requests = [whole("r", "b")]
    [decision] = plan(snap, requests, now=100)
    assert decision.mode == DecisionMode.SWITCH
    assert decision.switch == ("n2-g0", "whole")
    assert set(decision.victims) == {"a0", "a1", "a2"}
    assert invariant_problems(snap, requests, [decision]) == []


def test_the_gpu_with_the_least_over_quota_capacity_is_emptied():
    # n1-g0 holds a whole over-quota lease (1000 milli); the shared GPU n3-g0 two shares of 200 milli
    snap = snapshot(("n1", H100, 1, GpuMode.WHOLE), ("n2", H100, 1, GpuMode.MIG), ("n3", H100, 1, GpuMode.SHARED),
                    quotas=[*QUOTAS, quota("c", H100, 1000, 1000)],
                    allocations=[*[_mig_instance(f"c{i}", "c", "n2-g0", i, preemptible=False) for i in range(7)],
                                 held("a0", "a", "n1-g0"),
                                 Allocation("s0", "a", "acme", H100, "n3", (Unit("n3-g0", 200, 8000),), True, 0.0),
                                 Allocation("s1", "a", "acme", H100, "n3", (Unit("n3-g0", 200, 8000),), True, 1.0)])
    snap = replace(snap, switch_modes=ON)
    [decision] = plan(snap, [mig("r", "b", "1g.10gb")], now=100)
    assert decision.mode == DecisionMode.SWITCH
    assert decision.switch == ("n3-g0", "mig")
    assert set(decision.victims) == {"s0", "s1"}


def test_the_working_state_after_a_switch_holds_no_victim_and_the_gpu_is_closed():
    snap = _full_mig_fleet([held("a0", "a", "n1-g0"), held("a1", "a", "n1-g1", started_at=5)])
    scheduler = Scheduler(snap)
    [decision] = scheduler.schedule([mig("r", "b", "1g.10gb")], now=100)
    assert decision.victims == ("a1",)
    assert "a1" not in scheduler.cluster.allocations
    assert scheduler.cluster.gpus["n1-g1"].gpu.closed
    assert "a0" in scheduler.cluster.allocations


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.booleans(), st.integers(0, 200)), max_size=6),
       st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["mig", "whole", "share"])), min_size=1,
                max_size=6))
def test_every_switch_keeps_the_invariants(holders, asks):
    """Random holders on four whole GPUs and random requests: every decision keeps the core's invariants (no
    victim twice, victims preemptible and past their minimum runtime, a switched GPU emptied of exactly its
    victims and of another mode) and no placement of the cycle lands on a GPU being switched."""
    allocations = [held(f"h{i}", project, f"n1-g{i}", preemptible=over, started_at=start)
                   for i, (project, over, start) in enumerate(holders[:4])]
    snap = _full_mig_fleet(allocations, whole_gpus=4, min_runtime=50,
                           quotas=[quota("a", H100, 1000, 64000), quota("b", H100, 3000, 64000)])
    requests = []
    for i, (project, kind) in enumerate(asks):
        if kind == "mig":
            requests.append(mig(f"r{i}", project, "1g.10gb", submitted_at=i))
        elif kind == "whole":
            requests.append(whole(f"r{i}", project, submitted_at=i))
        else:
            requests.append(share(f"r{i}", project, 300, 10000, submitted_at=i))
    decisions = plan(snap, requests, now=100)
    assert decision_problems(requests, decisions, snap) == []
    switched = {d.switch[0] for d in decisions if d.mode == DecisionMode.SWITCH}
    for decision in decisions:
        if decision.allocation is not None:
            assert not switched & {unit.gpu for unit in decision.allocation.units}
    for decision in decisions:
        for victim in decision.victims:
            allocation = next(a for a in snap.allocations if a.id == victim)
            assert allocation.preemptible and allocation.started_at + 50 <= 100


def test_the_switched_requests_ask_counts_against_its_guarantee_for_the_rest_of_the_cycle():
    # b deserves one 4g.40gb's worth (1000 milli holds one 571): its second request is over quota, so it neither
    # waits for the switched GPU's room as in-quota work nor empties another GPU
    snap = _full_mig_fleet([held("a0", "a", "n1-g0"), held("a1", "a", "n1-g1", started_at=5)],
                           quotas=[quota("a", H100, 0, 64000), quota("b", H100, 1000, 4000)])
    requests = [mig("r0", "b", "4g.40gb", submitted_at=0), mig("r1", "b", "4g.40gb", submitted_at=1)]
    found = by_request(plan(snap, requests, now=100))
    assert found["r0"].mode == DecisionMode.SWITCH
    assert found["r1"].mode == DecisionMode.WAITING and found["r1"].victims == ()
    assert "waits for GPU" not in found["r1"].reason and "over quota" in found["r1"].reason


def test_a_victim_holding_two_instances_of_the_gpu_counts_whole():
    # project a's one lease holds two 1g instances on the MIG GPU n2-g0 (nothing else there): a whole request of b
    # empties it in one victim
    two = Allocation("a2", "a", "acme", H100, "n2", (Unit("n2-g0", 142, 10240, "1g.10gb", 0),
                                                     Unit("n2-g0", 142, 10240, "1g.10gb", 1)), True, 0.0)
    snap = snapshot(("n1", H100, 1, GpuMode.WHOLE), ("n2", H100, 1, GpuMode.MIG),
                    quotas=[*QUOTAS, quota("c", H100, 1000, 1000)],
                    allocations=[held("c0", "c", "n1-g0", preemptible=False), two])
    snap = replace(snap, switch_modes=ON)
    [decision] = plan(snap, [whole("r", "b")], now=100)
    assert decision.mode == DecisionMode.SWITCH and decision.victims == ("a2",)
