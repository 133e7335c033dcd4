"""Reservations for lease groups (``broker.scheduler.reserve``, issue 32 item 2): the oldest in-quota group that
cannot start holds the GPUs where all its members fit together first; younger work goes there only if it ends by
then, and the reservation is released when the group is placed."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.scheduler import DecisionMode, GpuMode, Snapshot
from broker.scheduler.estimate import estimated_starts
from broker.scheduler.plan import Scheduler
from tests.scheduler.builders import L4, by_request, held, invariant_problems, outcome, quota, snapshot, whole
from tests.scheduler.test_reserve import crowded_scenarios, timed_scenarios


def _small(request_id: str, duration: int, submitted_at: float):
    return replace(whole(request_id, "small", models=(L4,), submitted_at=submitted_at), duration_seconds=duration)


def _member(request_id: str, submitted_at: float, group: str = "train", project: str = "big"):
    request = whole(request_id, project, 8, models=(L4,), submitted_at=submitted_at)
    return replace(request, group=group, duration_seconds=3600)


def _fleet():
    """n1: four GPUs held until t=100, four free; n2: six held until t=100, two free; n3: seven held until t=1000, one
    free. All in quota (``other``), so nothing is reclaimable."""
    running = [held(f"a{i}", "other", f"n1-g{i}", tier=L4, preemptible=False) for i in range(4)]
    running += [held(f"b{i}", "other", f"n2-g{i}", tier=L4, preemptible=False) for i in range(6)]
    running += [held(f"c{i}", "other", f"n3-g{i}", tier=L4, preemptible=False) for i in range(7)]
    snap = snapshot(("n1", L4, 8, GpuMode.WHOLE), ("n2", L4, 8, GpuMode.WHOLE), ("n3", L4, 8, GpuMode.WHOLE),
                    allocations=running, quotas=[quota("big", L4, 16000, 24000), quota("small", L4, 8000, 24000),
                                                 quota("other", L4, 17000, 24000)])
    ends = {f"a{i}": 100.0 for i in range(4)} | {f"b{i}": 100.0 for i in range(6)} | {f"c{i}": 1000.0 for i in range(7)}
    return replace(snap, ends_at=ends)


def _queue():
    # a group of two 8-GPU members (the whole of n1 and n2 once their leases end at t=100), then younger 1-GPU
    # work: three long leases and one that ends (t=10 + 50) before the reservation's start
    return [_member("m0", 1), _member("m1", 2), _small("long1", 10_000, 3), _small("long2", 10_000, 4),
            _small("long3", 10_000, 5), _small("short", 50, 6)]


def test_group_reserves_where_all_members_fit_and_starts_when_the_running_leases_end():
    snap, queue = _fleet(), _queue()
    scheduler = Scheduler(snap, reservations=True)
    decisions = by_request(scheduler.schedule(queue, now=10.0))
    [reservation] = scheduler.reserved
    assert (reservation.group, reservation.members, reservation.start) == ("train", ("m0", "m1"), 100.0)
    assert reservation.request == "m0" and reservation.requests == ("m0", "m1")
    assert set(reservation.nodes) == {"n1", "n2"} and len(reservation.gpus) == 16
    for member in ("m0", "m1"):  # every member waits and names the group's reservation
        assert decisions[member].mode == DecisionMode.WAITING
        assert ("group train reserved 16 L4 GPUs on nodes n1, n2 from 1970-01-01 00:01:40 UTC (in 90 s, when the "
                "running leases there end)") in decisions[member].reason
    # long work goes to n3's free GPU, never onto n1 or n2; the others wait naming the group's reservation
    assert decisions["long1"].allocation.node == "n3"
    for late in ("long2", "long3"):
        assert decisions[late].mode == DecisionMode.WAITING
        assert "16 L4 GPUs on n1, n2 are held for an older lease group from 1970-01-01 00:01:40 UTC (it would end " \
               "after that)" in decisions[late].reason
    # the short lease ends (t=60) before the start: it backfills onto the reserved GPUs
    assert decisions["short"].allocation.node in {"n1", "n2"}
    assert "backfilled: ends by the start of the reservation on n1 (90 s from now)" in decisions["short"].reason
    # every member's estimated start is the reservation's time
    estimates = estimated_starts(scheduler, queue, list(decisions.values()), now=10.0)
    assert estimates["m0"] == estimates["m1"] == 100.0
    # nothing stays closed after the cycle
    assert not any(state.gpu.closed for state in scheduler.cluster.gpus.values())
    # at t=100 the work on n1 and n2 has ended (a*, b* at their expiry, the short lease at 60): the group starts
    # there, together, and holds no reservation any more
    left = [a for a in outcome(snap, list(decisions.values())).allocations.values()
            if not a.id.startswith(("a", "b")) and a.id != "short"]
    later_scheduler = Scheduler(replace(snap, allocations=tuple(left)), reservations=True)
    later = by_request(later_scheduler.schedule([queue[0], queue[1], queue[3], queue[4]], now=100.0))
    assert {later[m].mode for m in ("m0", "m1")} == {DecisionMode.PLACED}
    assert {later[m].allocation.node for m in ("m0", "m1")} == {"n1", "n2"}
    assert later_scheduler.reserved == ()


def test_without_reservations_small_work_takes_the_freed_gpus_and_the_group_keeps_waiting():
    snap, queue = _fleet(), _queue()
    decisions = by_request(Scheduler(snap).schedule(queue, now=10.0))
    assert all("reserved" not in decisions[m].reason for m in ("m0", "m1"))
    assert {decisions[r].allocation.node for r in ("long2", "long3")} <= {"n1", "n2"}
    left = [a for a in outcome(snap, list(decisions.values())).allocations.values()
            if not a.id.startswith(("a", "b")) and a.id != "short"]
    later = by_request(Scheduler(replace(snap, allocations=tuple(left))).schedule(queue[:2], now=100.0))
    assert later["m0"].mode == DecisionMode.WAITING  # long2 and long3 hold GPUs of n1 / n2 until t=10,000 and more


def test_group_reservation_is_released_when_the_group_reclaims_in_the_cycle():
    # n1 and n2 are held by over-quota work (borrowed, past the minimum runtime) that ends at t=500: the group does
    # not fit now, reserves from the first known end, and in the cycle reclaims: the reservation is released there
    running = [held(f"o{n}{i}", "borrower", f"n{n}-g{i}", tier=L4, preemptible=True) for n in (1, 2) for i in range(8)]
    snap = replace(snapshot(("n1", L4, 8, GpuMode.WHOLE), ("n2", L4, 8, GpuMode.WHOLE), allocations=running,
                            quotas=[quota("big", L4, 16000, 16000), quota("borrower", L4, 0, 16000)]),
                   ends_at={f"o{n}{i}": 500.0 for n in (1, 2) for i in range(8)})
    scheduler = Scheduler(snap, reservations=True)
    decisions = by_request(scheduler.schedule([_member("m0", 1), _member("m1", 2)], now=10.0))
    assert {decisions[m].mode for m in ("m0", "m1")} == {DecisionMode.PREEMPT}
    assert scheduler.reserved == ()
    assert not any(state.gpu.closed for state in scheduler.cluster.gpus.values())


def test_groups_and_single_requests_share_the_reservation_budget_in_submission_order():
    snap = _fleet()
    single = replace(whole("gang", "small", 8, models=(L4,), submitted_at=0.5), duration_seconds=60)
    queue = [*_queue(), single]
    # the single gang is older: with one reservation at most, it holds one and the group none
    one = Scheduler(snap, reservations=True, reservation_limit=1)
    one.schedule(queue, now=10.0)
    assert [r.request for r in one.reserved] == ["gang"]
    # with two, the group reserves after it, on GPUs the gang does not count on
    two = Scheduler(snap, reservations=True, reservation_limit=2)
    decisions = by_request(two.schedule(queue, now=10.0))
    first, second = two.reserved
    assert (first.request, first.start) == ("gang", 100.0) and (second.group, second.start) == ("train", 1000.0)
    assert set(first.gpus).isdisjoint(second.gpus)
    assert "group train reserved 16 L4 GPUs" in decisions["m1"].reason
    # a group younger than the minimum wait reserves nothing
    young = Scheduler(snap, reservations=True, reserve_after_seconds=600)
    young.schedule(queue, now=10.0)
    assert young.reserved == ()


def test_an_aged_group_names_its_reservation_too():
    snap = replace(_fleet(), group_reserve_after_seconds=5.0)
    scheduler = Scheduler(snap, reservations=True)
    decisions = by_request(scheduler.schedule(_queue(), now=10.0))
    assert [r.group for r in scheduler.reserved] == ["train"]
    for member in ("m0", "m1"):
        assert "the group reserves L4 against younger requests" in decisions[member].reason
        assert "group train reserved 16 L4 GPUs on nodes n1, n2" in decisions[member].reason
    assert not any(state.gpu.closed for state in scheduler.cluster.gpus.values())


def test_a_group_over_its_guarantee_reserves_nothing():
    snap = replace(_fleet(), quotas=(quota("big", L4, 8000, 24000), quota("small", L4, 8000, 24000),
                                     quota("other", L4, 17000, 24000)))
    scheduler = Scheduler(snap, reservations=True)
    scheduler.schedule(_queue(), now=10.0)
    assert scheduler.reserved == ()


# -- properties -------------------------------------------------------------------------------------------------


@st.composite
def grouped_scenarios(draw):
    """A reservation scenario of ``test_reserve`` whose queue has some requests joined in lease groups."""
    snap, requests = draw(st.one_of(timed_scenarios(), crowded_scenarios(), crowded_scenarios()))
    names = ["", "g0", "g0", "g1"]
    requests = [replace(r, group=draw(st.sampled_from(names))) for r in requests]
    return snap, requests


def _group_holds_at_its_start(snap, requests, decisions, reservation, now):
    """At the reservation's start, with everything that ends by then gone, the group's members all fit on the
    reserved nodes together (capacity: quotas are not checked, as for a request alone)."""
    members = [r for r in requests if r.id in reservation.members]
    by_id = by_request(decisions)
    assert all(by_id[m.id].mode == DecisionMode.WAITING for m in members)
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
    alone = by_request(Scheduler(there).schedule(
        [replace(m, shape=replace(m.shape, models=reservation.tiers)) for m in members], now=reservation.start))
    # placed together, or reclaiming over-quota work for some members while the others wait to start with them
    assert any(alone[m.id].mode != DecisionMode.WAITING for m in members), (reservation, alone)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=grouped_scenarios())
def test_group_reservations_are_never_delayed_and_leave_nothing_closed(scenario):
    snap, requests = scenario
    now = 20.0
    scheduler = Scheduler(snap, reservations=True)
    decisions = scheduler.schedule(requests, now=now)
    assert invariant_problems(snap, requests, decisions) == []
    # no GPU stays closed and the working state holds exactly the decisions' allocations
    assert not any(state.gpu.closed for state in scheduler.cluster.gpus.values())
    assert set(scheduler.cluster.allocations) == set(outcome(snap, decisions).allocations)
    reserved = set()
    for reservation in scheduler.reserved:  # on GPUs no other one counts on; nothing placed delays it
        assert reserved.isdisjoint(reservation.gpus)
        reserved.update(reservation.gpus)
        if reservation.group:
            _group_holds_at_its_start(snap, requests, decisions, reservation, now)
    # a group's reservation is in its members' reasons, and an in-quota group placed this cycle holds none
    by_id = by_request(decisions)
    for reservation in scheduler.reserved:
        for member in reservation.requests:
            assert by_id[member].mode == DecisionMode.WAITING
            if reservation.group:
                assert f"group {reservation.group} reserved" in by_id[member].reason


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=grouped_scenarios())
def test_group_reservations_without_known_ends_change_no_decision(scenario):
    snap, requests = scenario
    snap = replace(snap, ends_at={})
    requests = [replace(r, duration_seconds=0) for r in requests]
    off = Scheduler(snap).schedule(requests, now=20.0)
    on = Scheduler(snap, reservations=True)
    assert on.schedule(requests, now=20.0) == off
    assert on.reserved == ()


def test_a_group_without_a_reservation_is_estimated_to_start_when_its_last_member_fits():
    # reservations off: the replay tries each member on its own; n1 frees at t=100 and n3 at t=1000, so one member
    # fits at 100 and the other only at 1000 (n2 stays busy): the group starts together, at 1000
    snap = _fleet()
    snap = replace(snap, ends_at={**snap.ends_at, **{f"b{i}": 5000.0 for i in range(6)}})
    queue = [_member("m0", 1), _member("m1", 2)]
    scheduler = Scheduler(snap, reservations=False)
    decisions = scheduler.schedule(queue, now=10.0)
    assert all(decision.mode == DecisionMode.WAITING for decision in decisions)
    estimates = estimated_starts(scheduler, queue, decisions, now=10.0)
    assert estimates == {"m0": 1000.0, "m1": 1000.0}
    # a member that never fits before the known expiries run out leaves the whole group without an estimate: only
    # n1's leases end (t=100), and the member placed there first has no end of its own
    never = replace(snap, ends_at={f"a{i}": 100.0 for i in range(4)})
    queue = [replace(_member("m0", 1), duration_seconds=0), _member("m1", 2)]
    scheduler = Scheduler(never, reservations=False)
    decisions = scheduler.schedule(queue, now=10.0)
    estimates = estimated_starts(scheduler, queue, decisions, now=10.0)
    assert estimates == {"m0": None, "m1": None}
