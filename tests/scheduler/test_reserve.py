"""Reservations and conservative backfill from lease durations (``broker.scheduler.reserve``, issue 32 item 2): the
oldest in-quota request that cannot start holds the GPUs where it will fit first; younger work goes there only if it
ends by then."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.scheduler import DecisionMode, GpuMode, Snapshot
from broker.scheduler.estimate import estimated_starts
from broker.scheduler.plan import Scheduler
from tests.scheduler.builders import L4, by_request, held, invariant_problems, outcome, quota, snapshot, whole
from tests.scheduler.test_properties import scenarios


def _small(request_id: str, duration: int, submitted_at: float):
    return replace(whole(request_id, "small", models=(L4,), submitted_at=submitted_at), duration_seconds=duration)


def _fleet():
    """n1: four GPUs held by in-quota work until t=100, four free; n2: six held until t=1000, two free."""
    running = [held(f"a{i}", "other", f"n1-g{i}", tier=L4, preemptible=False) for i in range(4)]
    running += [held(f"b{i}", "other", f"n2-g{i}", tier=L4, preemptible=False) for i in range(6)]
    snap = snapshot(("n1", L4, 8, GpuMode.WHOLE), ("n2", L4, 8, GpuMode.WHOLE), allocations=running,
                    quotas=[quota("big", L4, 8000, 16000), quota("small", L4, 8000, 16000),
                            quota("other", L4, 10000, 16000)])
    ends = {f"a{i}": 100.0 for i in range(4)} | {f"b{i}": 1000.0 for i in range(6)}
    return replace(snap, ends_at=ends)


def _queue():
    gang = replace(whole("gang", "big", 8, models=(L4,), submitted_at=1), duration_seconds=3600)
    # younger 1-GPU work: three long leases and one that ends (t=10 + 50) before the gang's reservation at t=100
    return [gang, _small("long1", 10_000, 2), _small("long2", 10_000, 3), _small("long3", 10_000, 4),
            _small("short", 50, 5)]


def test_reserve_gang_waits_behind_small_work_then_starts_when_the_running_leases_end():
    snap, queue = _fleet(), _queue()
    scheduler = Scheduler(snap, reservations=True)
    decisions = by_request(scheduler.schedule(queue, now=10.0))
    gang = decisions["gang"]
    assert gang.mode == DecisionMode.WAITING
    assert "reserved 8 L4 GPUs on node n1 from 1970-01-01 00:01:40 UTC (in 90 s" in gang.reason
    assert scheduler.reservation is not None and scheduler.reservation.start == 100.0
    # long work goes to n2 (two free GPUs), never onto n1; the third long lease waits; the short one backfills n1
    assert {decisions[r].allocation.node for r in ("long1", "long2")} == {"n2"}
    assert decisions["long3"].mode == DecisionMode.WAITING
    assert decisions["long3"].reason == ("waiting: no node has 1 free L4 GPU; 8 L4 GPUs on n1 are held for an older "
                                         "request from 1970-01-01 00:01:40 UTC (it would end after that)")
    assert decisions["short"].allocation.node == "n1"
    assert "backfilled: ends by the start of the reservation on n1 (90 s from now)" in decisions["short"].reason
    # the gang's estimated start is the reservation's time
    assert estimated_starts(scheduler, queue, list(decisions.values()), now=10.0)["gang"] == 100.0
    # at t=100 the work on n1 has ended (a0-a3 at their expiry, the short lease at 60): the gang starts there
    left = [a for a in outcome(snap, list(decisions.values())).allocations.values()
            if a.id not in {"a0", "a1", "a2", "a3", "short"}]
    later = by_request(Scheduler(replace(snap, allocations=tuple(left)), reservations=True).schedule(
        [queue[0], queue[3]], now=100.0))
    assert later["gang"].mode == DecisionMode.PLACED and later["gang"].allocation.node == "n1"


def test_reserve_off_lets_small_work_take_the_freed_node_and_the_gang_keeps_waiting():
    snap, queue = _fleet(), _queue()
    decisions = by_request(Scheduler(snap).schedule(queue, now=10.0))
    assert "reserved" not in decisions["gang"].reason
    assert decisions["long3"].mode == DecisionMode.PLACED and decisions["long3"].allocation.node == "n1"
    left = [a for a in outcome(snap, list(decisions.values())).allocations.values()
            if a.id not in {"a0", "a1", "a2", "a3", "short"}]
    later = by_request(Scheduler(replace(snap, allocations=tuple(left))).schedule([queue[0]], now=100.0))
    assert later["gang"].mode == DecisionMode.WAITING  # long3 holds a GPU of n1 until t=10,010


def test_reserve_over_quota_borrowing_keeps_the_gpus_the_reservation_does_not_need():
    # n1: g0-g1 held in quota until t=100, g2 without a known end, five free. A 6-GPU gang reserves six of the seven
    # GPUs free at t=100; the seventh stays open to over-quota work of no known end, the six do not
    running = [held("a0", "other", "n1-g0", tier=L4, preemptible=False),
               held("a1", "other", "n1-g1", tier=L4, preemptible=False),
               held("forever", "other", "n1-g2", tier=L4, preemptible=False)]
    snap = replace(snapshot(("n1", L4, 8, GpuMode.WHOLE), allocations=running,
                            quotas=[quota("big", L4, 6000, 8000), quota("other", L4, 3000, 8000),
                                    quota("borrower", L4, 0, 8000)]),
                   ends_at={"a0": 100.0, "a1": 100.0})
    gang = whole("gang", "big", 6, models=(L4,), submitted_at=1)
    borrowers = [whole(f"o{i}", "borrower", models=(L4,), submitted_at=2 + i) for i in range(5)]
    scheduler = Scheduler(snap, reservations=True)
    decisions = by_request(scheduler.schedule([gang, *borrowers], now=10.0))
    assert "reserved 6 L4 GPUs on node n1" in decisions["gang"].reason
    reserved = set(scheduler.reservation.gpus)
    placed = [decisions[b.id].allocation for b in borrowers if decisions[b.id].mode == DecisionMode.PLACED]
    assert len(placed) == 1 and placed[0].preemptible and placed[0].units[0].gpu not in reserved
    # without reservations the borrowers take all five free GPUs
    off = by_request(Scheduler(snap).schedule([gang, *borrowers], now=10.0))
    assert sum(off[b.id].mode == DecisionMode.PLACED for b in borrowers) == 5


def test_reserve_only_after_the_minimum_wait_and_the_oldest_first():
    snap, queue = _fleet(), _queue()
    young = Scheduler(snap, reservations=True, reserve_after_seconds=600)
    assert "reserved" not in by_request(young.schedule(queue, now=10.0))["gang"].reason and not young.reserved
    # two 8-GPU gangs: the older reserves n1 (free from t=100), the younger n2 (t=1000), on other GPUs
    second = replace(whole("gang2", "big", 8, models=(L4,), submitted_at=1.5), duration_seconds=60)
    scheduler = Scheduler(snap, reservations=True)
    decisions = by_request(scheduler.schedule([*queue, second], now=10.0))
    assert [(r.request, r.node, r.start) for r in scheduler.reserved] == [("gang", "n1", 100.0),
                                                                           ("gang2", "n2", 1000.0)]
    assert "reserved 8 L4 GPUs on node n2" in decisions["gang2"].reason
    # one reservation at most: the younger gang holds nothing
    one = Scheduler(snap, reservations=True, reservation_limit=1)
    one.schedule([*queue, second], now=10.0)
    assert [r.request for r in one.reserved] == ["gang"]


@st.composite
def timed_scenarios(draw):
    """A scenario of ``test_properties`` run for one cycle; the second cycle's snapshot has what it placed running,
    some of it with a known end, and the second cycle's requests some with durations."""
    snap, first, second, _ = draw(scenarios())
    running = tuple(outcome(snap, Scheduler(snap).schedule(first, now=0.0)).allocations.values())
    ends = {a.id: float(draw(st.sampled_from([30, 60, 100, 400]))) for a in running if draw(st.booleans())}
    second = [replace(r, duration_seconds=draw(st.sampled_from([0, 5, 20, 50, 500]))) for r in second]
    return replace(snap, allocations=running, ends_at=ends), second


@st.composite
def crowded_scenarios(draw):
    """Whole-GPU nodes mostly held by work that ends at drawn times (some never, some of it borrowed), and a queue of
    gangs and single GPUs of three projects, in and over quota, with drawn durations: reservations are common."""
    sizes = draw(st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=4))
    specs = [(f"n{i}", L4, size, GpuMode.WHOLE) for i, size in enumerate(sizes)]
    running, ends = [], {}
    for node, _, size, _ in specs:
        for index in range(size):
            if draw(st.integers(0, 9)):  # nine in ten GPUs busy
                allocation = held(f"r-{node}-{index}", draw(st.sampled_from(["p0", "p1", "p2"])), f"{node}-g{index}",
                                  tier=L4, preemptible=draw(st.booleans()), started_at=draw(st.sampled_from([0, 15])))
                running.append(allocation)
                end = draw(st.sampled_from([None, 25, 40, 80, 300]))
                if end is not None:
                    ends[allocation.id] = float(end)
    total = sum(sizes) * 1000
    quotas = [quota(p, L4, draw(st.sampled_from([0, total // 2, total, total])), 2 * total) for p in ("p0", "p1", "p2")]
    # in-quota use must stay within deserved: what the snapshot holds in quota is counted against it
    used = {p: sum(a.milli for a in running if a.project == p and not a.preemptible) for p in ("p0", "p1", "p2")}
    quotas = [replace(q, deserved_milli=max(q.deserved_milli, used[q.project])) for q in quotas]
    snap = replace(snapshot(*specs, allocations=running, quotas=quotas,
                            min_runtime_seconds=draw(st.sampled_from([0.0, 10.0]))), ends_at=ends)
    requests = []
    for index in range(draw(st.integers(1, 10))):
        request = whole(f"q{index}", draw(st.sampled_from(["p0", "p1", "p2"])), draw(st.sampled_from([1, 1, 2, 4, 8])),
                        models=(L4,), submitted_at=draw(st.integers(0, 5)), gang=draw(st.booleans()))
        requests.append(replace(request, duration_seconds=draw(st.sampled_from([0, 10, 30, 70, 1000]))))
    return snap, requests


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=st.one_of(timed_scenarios(), crowded_scenarios()))
def test_reserve_backfill_never_delays_the_reservation(scenario):
    snap, requests = scenario
    now = 20.0
    scheduler = Scheduler(snap, reservations=True)
    decisions = scheduler.schedule(requests, now=now)
    assert invariant_problems(snap, requests, decisions) == []
    reserved = set()
    for reservation in scheduler.reserved:  # up to four, on GPUs no other one counts on
        assert reserved.isdisjoint(reservation.gpus)
        reserved.update(reservation.gpus)
        _holds_at_its_start(snap, requests, decisions, reservation, now)


def _holds_at_its_start(snap, requests, decisions, reservation, now):
    holder = next(r for r in requests if r.id == reservation.request)
    assert by_request(decisions)[holder.id].mode == DecisionMode.WAITING
    # at the reservation's start: everything that ends by then (the snapshot's expiries, this cycle's placements
    # after their duration) has left; on the reserved nodes alone the holder starts (placed, or reclaiming
    # over-quota work). Capacity is what a reservation holds: quotas are not checked here (the holder's own project
    # may have used its guarantee meanwhile, which is the project's order, not a delay by backfill)
    durations = {r.id: r.duration_seconds for r in requests}
    left = []
    for allocation in outcome(snap, decisions).allocations.values():
        end = snap.ends_at.get(allocation.id)
        if end is None and allocation.started_at == now and durations.get(allocation.id):
            end = now + durations[allocation.id]
        if end is None or end > reservation.start:
            left.append(allocation)
    nodes = set(reservation.nodes)
    gpus = {gpu.id for gpu in snap.gpus if gpu.node in nodes}
    there = Snapshot(tuple(n for n in snap.nodes if n.id in nodes), tuple(g for g in snap.gpus if g.id in gpus),
                     tuple(a for a in left if {u.gpu for u in a.units} <= gpus), snap.quotas, snap.tenant_quotas,
                     snap.prices, enforce_quotas=False, min_runtime_seconds=snap.min_runtime_seconds)
    alone = Scheduler(there).schedule([replace(holder, shape=replace(holder.shape, models=(reservation.tier,)))],
                                      now=reservation.start)
    assert alone[0].mode != DecisionMode.WAITING, (reservation, alone[0].reason)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=st.one_of(timed_scenarios(), crowded_scenarios()))
def test_reserve_without_known_ends_changes_no_decision(scenario):
    snap, requests = scenario
    snap = replace(snap, ends_at={})
    requests = [replace(r, duration_seconds=0) for r in requests]
    off = Scheduler(snap).schedule(requests, now=20.0)
    on = Scheduler(snap, reservations=True)
    assert on.schedule(requests, now=20.0) == off
    assert on.reservation is None


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=st.one_of(timed_scenarios(), crowded_scenarios()))
def test_reserve_leaves_the_working_state_as_the_decisions_say(scenario):
    # the reserved GPUs are open again after the cycle, and the state holds exactly the decisions' allocations
    snap, requests = scenario
    scheduler = Scheduler(snap, reservations=True)
    decisions = scheduler.schedule(requests, now=20.0)
    assert not any(state.gpu.closed for state in scheduler.cluster.gpus.values())
    assert set(scheduler.cluster.allocations) == set(outcome(snap, decisions).allocations)
