"""Which waits a change of the pool could end (``broker.scheduler.pool_wait``, issue 30: the capacity planner runs on
such a wait instead of on its timer). A request left waiting for capacity, not for its quota, whose model has a GPU
idle in another mode: the planner's mode switch or MIG layout would serve it."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.scheduler import Allocation, DecisionMode, GpuMode, Kind, Unit
from broker.scheduler.plan import Scheduler
from broker.scheduler.pool_wait import WANTED_MODE, idle_modes, pool_waits
from broker.scheduler.types import WorkloadClass
from tests.scheduler.builders import H100, L4, mig, quota, share, snapshot, whole

QUOTAS = [quota("p", model, 100_000, 100_000) for model in (H100, L4)]


def waits(snap, requests, now=0.0):
    scheduler = Scheduler(snap)
    decisions = scheduler.schedule(requests, now=now)
    return pool_waits(scheduler, requests, decisions), decisions


def test_a_whole_request_on_an_all_mig_pool_is_a_wait_for_a_whole_gpu():
    found, decisions = waits(snapshot(("n1", H100, 8, GpuMode.MIG), quotas=QUOTAS), [whole("r", "p")])
    assert decisions[0].mode == DecisionMode.WAITING
    assert found == ((H100, GpuMode.WHOLE),)


def test_a_mig_request_on_whole_gpus_is_a_wait_for_a_mig_layout():
    found, _ = waits(snapshot(("n1", H100, 2, GpuMode.WHOLE), quotas=QUOTAS), [mig("m", "p", "3g.40gb")])
    assert found == ((H100, GpuMode.MIG),)


def test_a_share_request_on_whole_gpus_asks_for_a_shared_gpu():
    found, _ = waits(snapshot(("n1", H100, 1, GpuMode.WHOLE), quotas=QUOTAS), [share("s", "p", 250, 10_000)])
    assert found == ((H100, GpuMode.SHARED),)


def test_nothing_when_every_request_is_placed():
    found, decisions = waits(snapshot(("n1", H100, 2, GpuMode.MIG), ("n2", H100, 1, GpuMode.WHOLE), quotas=QUOTAS),
                             [whole("r", "p")])
    assert decisions[0].mode == DecisionMode.PLACED and found == ()


def test_nothing_when_the_gpus_of_the_other_mode_are_busy():
    """The planner switches idle GPUs only (a drain is advice by default): no run for a wait it cannot end."""
    busy = Allocation("x", "p", "acme", H100, "n1", (Unit("n1-g0", 142, 9856, "1g.10gb", 0),), False)
    found, decisions = waits(snapshot(("n1", H100, 1, GpuMode.MIG), quotas=QUOTAS, allocations=[busy]),
                             [whole("r", "p")])
    assert decisions[0].mode == DecisionMode.WAITING and found == ()


def test_nothing_for_a_request_its_quota_holds_back():
    limited = [quota("p", H100, 1000, 1000)]
    held = Allocation("x", "p", "acme", H100, "n0", (Unit("n0-g0", 1000, 81920),), False)
    found, decisions = waits(snapshot(("n0", H100, 1, GpuMode.WHOLE), ("n1", H100, 4, GpuMode.MIG), quotas=limited,
                                      allocations=[held]), [whole("r", "p")])
    assert decisions[0].mode == DecisionMode.WAITING and "limit" in decisions[0].reason
    assert found == ()


def test_nothing_for_interactive_work_beyond_its_guarantee():
    """Interactive work never borrows: a switch would not start it."""
    guaranteed = [quota("p", H100, 0, 8000)]
    request = replace(whole("r", "p"), workload_class=WorkloadClass.INTERACTIVE)
    found, decisions = waits(snapshot(("n1", H100, 2, GpuMode.MIG), quotas=guaranteed), [request])
    assert decisions[0].mode == DecisionMode.WAITING and found == ()
    training = replace(whole("t", "p"), workload_class=WorkloadClass.TRAINING)  # it borrows: a switch serves it
    assert waits(snapshot(("n1", H100, 2, GpuMode.MIG), quotas=guaranteed), [training])[0] == ((H100, GpuMode.WHOLE),)


def test_a_cordoned_node_or_a_closed_gpu_is_not_idle_capacity():
    snap = snapshot(("n1", H100, 2, GpuMode.MIG), quotas=QUOTAS, cordoned=("n1",))
    assert waits(snap, [whole("r", "p")])[0] == ()
    closing = snapshot(("n1", H100, 1, GpuMode.MIG), quotas=QUOTAS)
    closing = replace(closing, gpus=tuple(replace(gpu, closed=True) for gpu in closing.gpus))
    assert waits(closing, [whole("r", "p")])[0] == ()


def test_only_the_model_with_an_idle_gpu_of_another_mode():
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), ("n2", L4, 1, GpuMode.WHOLE), ("n3", L4, 1, GpuMode.WHOLE),
                    quotas=QUOTAS)
    requests = [whole("h", "p", submitted_at=1), whole("l1", "p", models=(L4,), submitted_at=2),
                whole("l2", "p", models=(L4,), submitted_at=3), whole("l3", "p", models=(L4,), submitted_at=4)]
    found, _ = waits(snap, requests)
    assert found == ((H100, GpuMode.WHOLE),)  # the L4s are all whole and busy: nothing to switch there


def _brute_idle(snap_scheduler) -> dict[str, set[GpuMode]]:
    """Every GPU looked at, not one node per class."""
    cluster = snap_scheduler.cluster
    found: dict[str, set[GpuMode]] = {}
    for state in cluster.gpus.values():
        node = cluster.nodes[state.gpu.node]
        if node.node.cordoned or state.gpu.closed:
            continue
        empty = (state.slot_mask == 0 and state.compute_used == 0) if state.gpu.mode == GpuMode.MIG else (
            state.used_milli == 0 and state.units == 0)
        if empty:
            found.setdefault(state.gpu.model, set()).add(state.gpu.mode)
    return found


SHAPES = st.sampled_from([("whole", 1), ("whole", 2), ("mig", "1g.10gb"), ("mig", "3g.40gb"), ("share", 300)])


@settings(max_examples=60, deadline=None)
@given(modes=st.lists(st.sampled_from([GpuMode.WHOLE, GpuMode.MIG, GpuMode.SHARED]), min_size=1, max_size=6),
       asks=st.lists(SHAPES, min_size=1, max_size=10), deserved=st.integers(0, 4000))
def test_a_wait_is_named_exactly_when_a_waiting_request_in_its_quota_has_an_idle_gpu_of_another_mode(
        modes, asks, deserved):
    specs = [(f"n{i}", H100, 2, mode) for i, mode in enumerate(modes)]
    snap = snapshot(*specs, quotas=[quota("p", H100, deserved, 8000)])
    requests = []
    for index, (kind, arg) in enumerate(asks):
        if kind == "whole":
            requests.append(whole(f"r{index}", "p", arg, submitted_at=index))
        elif kind == "mig":
            requests.append(mig(f"r{index}", "p", arg, submitted_at=index))
        else:
            requests.append(share(f"r{index}", "p", arg, 10_000, submitted_at=index))
    scheduler = Scheduler(snap)
    decisions = scheduler.schedule(requests, now=0)
    found = pool_waits(scheduler, requests, decisions)
    idle = _brute_idle(scheduler)
    assert idle_modes(scheduler.cluster) == {model: frozenset(m) for model, m in idle.items()}
    by_id = {r.id: r for r in requests}
    expected = set()
    for decision in decisions:
        if decision.mode != DecisionMode.WAITING:
            continue
        request = by_id[decision.request]
        wanted = WANTED_MODE[request.shape.kind]
        for tier, need in scheduler.tiers_for(request):
            if not idle.get(tier, set()) - {wanted}:
                continue
            refused, _ = scheduler.quota_check(request, tier, need)
            if not refused:
                expected.add((tier, wanted))
    assert set(found) == expected
    assert list(found) == sorted(found, key=lambda pair: (pair[0], pair[1].value))
    assert all(kind in WANTED_MODE for kind in (Kind.WHOLE, Kind.MIG, Kind.SHARE))
