"""Cohorts, node pools and the minimum runtime per tenant (issue 32 item 7; docs/scheduling.md, "Cohorts, node
pools and minimum runtime"): a cohort member's idle guarantee is lent only within its cohort, up to its lending
limit; capacity no member is guaranteed stays borrowable by all; a project bound to pools is placed only there;
an over-quota lease is not reclaimed within its tenant's minimum runtime. Without them: the same decisions."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from broker.scheduler import DecisionMode, GpuMode, Node, TenantQuotaSpec, plan
from tests.scheduler.builders import H100, by_request, held, invariant_problems, outcome, quota, snapshot, whole
from tests.scheduler.test_properties import PROJECTS, SETTINGS, reclaim_scenarios, scenarios

EIGHT = ("n1", H100, 8, GpuMode.WHOLE)
TWO_POOLS = (("a1", H100, 2, GpuMode.WHOLE), ("b1", H100, 2, GpuMode.WHOLE))


def _same(decisions, other) -> bool:
    """The same choices (mode, where, victims, queue position), whatever the words of the reasons."""
    def key(ds):
        return [(d.request, d.mode, d.allocation, d.victims, d.queue_position, d.warm) for d in ds]
    return key(decisions) == key(other)


def _cohort_snapshot(*, lending=-1, borrowing=-1, allocations=()):
    """8 H100: tenant ``lender`` (cohort c) is guaranteed 4 of them; ``peer`` (cohort c) and ``outsider`` (no cohort)
    are guaranteed nothing and may borrow up to 8. The free pool: the 4 no cohort member is guaranteed."""
    snap = snapshot(
        EIGHT,
        allocations=allocations,
        quotas=[quota("lp", H100, 4000, 8000, tenant="lender"), quota("pp", H100, 0, 8000, tenant="peer"),
                quota("op", H100, 0, 8000, tenant="outsider")],
        tenant_quotas=[TenantQuotaSpec("lender", H100, 4000, 8000, lending_limit_milli=lending),
                       TenantQuotaSpec("peer", H100, 0, 8000, borrowing_limit_milli=borrowing)],
    )
    return replace(snap, cohorts={"lender": "c", "peer": "c"})


def _placed(decisions) -> int:
    return sum(d.allocation.milli for d in decisions if d.mode == DecisionMode.PLACED)


def test_cohorts_member_borrows_peer_idle_guarantee_up_to_the_lending_limit():
    snap = _cohort_snapshot(lending=2000)
    requests = [whole(f"r{i}", "pp", tenant="peer", submitted_at=i) for i in range(8)]
    decisions = by_request(plan(snap, requests, now=0))
    # the 4 GPUs of the free pool, then 2 of the lender's idle 4: 6, not more
    assert _placed(decisions.values()) == 6000
    assert all(d.allocation.preemptible for d in decisions.values() if d.mode == DecisionMode.PLACED)
    waiting = [d for d in decisions.values() if d.mode == DecisionMode.WAITING]
    assert len(waiting) == 2
    assert "cohort c" in waiting[0].reason and "lend at most 2000 milli" in waiting[0].reason
    assert invariant_problems(snap, requests, list(decisions.values())) == []


def test_cohorts_without_a_lending_limit_the_whole_idle_guarantee_is_lent():
    snap = _cohort_snapshot()
    requests = [whole(f"r{i}", "pp", tenant="peer", submitted_at=i) for i in range(8)]
    assert _placed(plan(snap, requests, now=0)) == 8000


def test_cohorts_outsider_cannot_borrow_a_cohorts_idle_guarantee():
    snap = _cohort_snapshot()
    requests = [whole(f"r{i}", "op", tenant="outsider", submitted_at=i) for i in range(6)]
    decisions = plan(snap, requests, now=0)
    assert _placed(decisions) == 4000  # the free pool only
    waiting = [d for d in decisions if d.mode == DecisionMode.WAITING]
    assert len(waiting) == 2
    assert "guaranteed to tenants of a cohort" in waiting[0].reason
    assert "0 milli is borrowable by tenants in no cohort" in waiting[0].reason


def test_cohorts_outsider_and_member_share_the_free_pool():
    # the outsider already holds 3 of the free pool's 4: the member gets 1 from it and 2 lent by the lender
    running = [held(f"o{i}", "op", f"n1-g{i}", tenant="outsider") for i in range(3)]
    snap = _cohort_snapshot(lending=2000, allocations=running)
    requests = [whole(f"r{i}", "pp", tenant="peer", submitted_at=i) for i in range(5)]
    assert _placed(plan(snap, requests, now=0)) == 3000
    # and the outsider may take the last GPU of the free pool only when no member's spill holds it
    assert _placed(plan(snap, [whole("x", "op", tenant="outsider"), whole("y", "op", tenant="outsider")],
                        now=0)) == 1000


def test_cohorts_estimated_start_waits_for_the_free_pool():
    # the outsider's 4 leases hold the free pool until 600 s; a fifth borrower is not estimated to start on the
    # cohort's idle guarantee now, but when the free pool frees
    from broker.scheduler.estimate import estimated_starts
    from broker.scheduler.plan import Scheduler

    running = [held(f"o{i}", "op", f"n1-g{i}", tenant="outsider") for i in range(4)]
    snap = replace(_cohort_snapshot(allocations=running), ends_at={f"o{i}": 600.0 for i in range(4)})
    scheduler = Scheduler(snap)
    request = whole("r", "op", tenant="outsider")
    decisions = scheduler.schedule([request], now=0)
    assert decisions[0].mode == DecisionMode.WAITING
    assert estimated_starts(scheduler, [request], decisions, now=0) == {"r": 600.0}


def test_cohorts_borrowing_limit_caps_use_beyond_the_guarantee():
    snap = _cohort_snapshot(borrowing=1000)
    requests = [whole(f"r{i}", "pp", tenant="peer", submitted_at=i) for i in range(3)]
    decisions = plan(snap, requests, now=0)
    assert _placed(decisions) == 1000
    assert "tenant borrowing limit" in decisions[-1].reason


def test_cohorts_lender_reclaims_what_it_lent():
    # the peer borrowed all 8 (4 of them the lender's guarantee); the lender asks for its 4: reclaim, as today
    running = [held(f"p{i}", "pp", f"n1-g{i}", tenant="peer", started_at=i) for i in range(8)]
    snap = _cohort_snapshot(allocations=running)
    [decision] = plan(snap, [whole("l", "lp", 4, tenant="lender")], now=100)
    assert decision.mode == DecisionMode.PREEMPT
    assert len(decision.victims) == 4
    assert not decision.allocation.preemptible


def test_cohorts_member_within_its_own_guarantee_is_not_limited():
    # the lender's project over its project quota but its tenant within its guarantee: borrowing from itself
    snap = _cohort_snapshot(lending=0)
    snap = replace(snap, quotas=(quota("lp", H100, 1000, 8000, tenant="lender"),
                                 quota("lq", H100, 3000, 8000, tenant="lender"), *snap.quotas[1:]))
    requests = [whole(f"r{i}", "lp", tenant="lender", submitted_at=i) for i in range(8)]
    assert _placed(plan(snap, requests, now=0)) == 8000  # its 4 and the free pool's 4


@SETTINGS
@given(scenario=scenarios())
def test_cohorts_one_cohort_of_every_tenant_without_limits_decides_as_without(scenario):
    snap, first, second, _ = scenario
    cohort = replace(snap, cohorts={tenant: "all" for tenant in set(PROJECTS.values())})
    before = plan(snap, first, now=0.0)
    assert _same(plan(cohort, first, now=0.0), before)
    snap2 = replace(snap, allocations=tuple(outcome(snap, before).allocations.values()))
    cohort2 = replace(snap2, cohorts=cohort.cohorts)
    assert _same(plan(cohort2, second, now=100.0), plan(snap2, second, now=100.0))


@SETTINGS
@given(scenario=scenarios(), lending=st.sampled_from([-1, 0, 1000, 2500]))
def test_cohorts_outsiders_never_hold_a_members_idle_guarantee(scenario, lending):
    # t0 in a cohort, t1 not, on a fresh fleet (in-quota work is placed first in a cycle, borrowing after it): when t1
    # borrowed on a tier, its use and the part of t0's overflow that t0's lending does not cover fit in the capacity
    # that t0 is not guaranteed
    snap, first, _, _ = scenario
    tenant_quotas = tuple(replace(q, lending_limit_milli=lending) for q in snap.tenant_quotas)
    snap = replace(snap, tenant_quotas=tenant_quotas, cohorts={"t0": "c"})
    decisions = plan(snap, first, now=0.0)
    assert invariant_problems(snap, first, decisions) == []
    live = outcome(snap, decisions).allocations.values()
    capacity: dict[str, int] = {}
    for gpu in snap.gpus:
        capacity[gpu.model] = capacity.get(gpu.model, 0) + 1000
    guaranteed = {q.tier: q.deserved_milli for q in snap.tenant_quotas if q.tenant == "t0"}
    for tier in capacity:
        if not any(a.tenant == "t1" and a.tier == tier and a.preemptible for a in live):
            continue
        outsider = sum(a.milli for a in live if a.tenant == "t1" and a.tier == tier)
        member = sum(a.milli for a in live if a.tenant == "t0" and a.tier == tier)
        deserved = guaranteed.get(tier, 0)
        idle = max(deserved - member, 0) if tier in guaranteed else 0
        lend = idle if lending < 0 else min(idle, lending)
        spill = max(max(member - deserved, 0) - lend, 0)
        assert outsider + spill <= max(capacity[tier] - deserved, 0)


# -- pools ----------------------------------------------------------------------------------------------------------
def _pools_snapshot(**kwargs):
    snap = snapshot(*TWO_POOLS, quotas=[quota("a", H100, 2000, 4000), quota("b", H100, 2000, 4000)], **kwargs)
    return replace(snap, nodes=(Node("a1", pool="pa"), Node("b1", pool="pb")), project_pools={"b": ("pb",)})


def test_pools_project_bound_to_a_pool_is_placed_only_there():
    snap = _pools_snapshot()
    decisions = plan(snap, [whole("r1", "b"), whole("r2", "b"), whole("r3", "b")], now=0)
    assert [d.allocation.node for d in decisions[:2]] == ["b1", "b1"]
    assert decisions[2].mode == DecisionMode.WAITING
    assert "no node in pool(s) pb has room" in decisions[2].reason
    # a project bound to no pool goes anywhere
    assert plan(snap, [whole("r", "a", 2)], now=0)[0].allocation.node == "a1"


def test_pools_reclaim_takes_victims_in_the_requests_pools_only():
    running = [held("x1", "a", "a1-g0", started_at=0), held("x2", "a", ["b1-g0", "b1-g1"], started_at=0),
               held("x3", "a", "a1-g1", started_at=0)]
    snap = _pools_snapshot(allocations=running)
    snap = replace(snap, quotas=(quota("a", H100, 0, 4000), quota("b", H100, 2000, 4000)))
    [decision] = plan(snap, [whole("r", "b")], now=100)
    assert decision.mode == DecisionMode.PREEMPT
    assert decision.victims == ("x2",)
    assert decision.allocation.node == "b1"


@SETTINGS
@given(scenario=scenarios(), pools=st.lists(st.sampled_from(["p", "q"]), min_size=4, max_size=4),
       bound=st.dictionaries(st.sampled_from(sorted(PROJECTS)), st.sampled_from([("p",), ("q",), ("p", "q")])))
def test_pools_placements_stay_in_their_projects_pools(scenario, pools, bound):
    snap, first, _, _ = scenario
    nodes = tuple(replace(node, pool=pools[index]) for index, node in enumerate(snap.nodes))
    snap = replace(snap, nodes=nodes, project_pools=bound)
    pool_of = {node.id: node.pool for node in nodes}
    gpu_node = {gpu.id: gpu.node for gpu in snap.gpus}
    decisions = plan(snap, first, now=0.0)
    assert invariant_problems(snap, first, decisions) == []
    for decision in decisions:
        if decision.allocation is not None and decision.allocation.project in bound:
            allowed = bound[decision.allocation.project]
            assert all(pool_of[gpu_node[unit.gpu]] in allowed for unit in decision.allocation.units)


@SETTINGS
@given(scenario=scenarios())
def test_pools_every_node_in_the_projects_pool_decides_as_without(scenario):
    snap, first, _, _ = scenario
    pooled = replace(snap, nodes=tuple(replace(node, pool="p") for node in snap.nodes),
                     project_pools={project: ("p",) for project in PROJECTS})
    assert _same(plan(pooled, first, now=0.0), plan(snap, first, now=0.0))


# -- minimum runtime per tenant (its SLO contract's) -------------------------------------------------------------
def test_min_runtime_per_tenant_protects_its_over_quota_work():
    running = [held("g0", "gold", "n1-g0", tenant="gold-t", started_at=0),
               held("s0", "std", "n1-g1", tenant="std-t", started_at=0)]
    snap = snapshot(("n1", H100, 2, GpuMode.WHOLE), allocations=running, min_runtime_seconds=60,
                    quotas=[quota("gold", H100, 0, 2000, tenant="gold-t"), quota("std", H100, 0, 2000, tenant="std-t"),
                            quota("me", H100, 2000, 2000)])
    snap = replace(snap, min_runtime_by_tenant={"gold-t": 600.0})
    # at 100 s the standard tenant's lease is past the platform's 60 s, the gold one within its 600 s
    first, second = plan(snap, [whole("r1", "me", submitted_at=1), whole("r2", "me", submitted_at=2)], now=100)
    assert first.mode == DecisionMode.PREEMPT and first.victims == ("s0",)
    assert second.mode == DecisionMode.WAITING
    assert "within their minimum runtime" in second.reason and "first reclaimable in 500 s" in second.reason
    # past it, the gold lease is reclaimed too
    [late] = plan(snap, [whole("r", "me", 2)], now=601)
    assert late.mode == DecisionMode.PREEMPT and set(late.victims) == {"g0", "s0"}


def test_min_runtime_per_tenant_is_named_when_placed_over_quota():
    snap = snapshot(("n1", H100, 2, GpuMode.WHOLE), quotas=[quota("gold", H100, 0, 2000, tenant="gold-t")])
    snap = replace(snap, min_runtime_by_tenant={"gold-t": 600.0})
    [decision] = plan(snap, [whole("r", "gold", tenant="gold-t")], now=0)
    assert decision.allocation.preemptible
    assert "minimum runtime of 600 s" in decision.reason


@SETTINGS
@given(scenario=reclaim_scenarios(), late=st.booleans())
def test_min_runtime_per_tenant_equal_to_the_platforms_decides_as_without(scenario, late):
    snap, borrower, claimants, _ = scenario
    first = plan(snap, borrower, now=80.0 if late else 0.0)
    snap2 = replace(snap, allocations=tuple(outcome(snap, first).allocations.values()))
    same = replace(snap2, min_runtime_by_tenant={"t0": snap.min_runtime_seconds, "t1": snap.min_runtime_seconds})
    assert _same(plan(same, claimants, now=100.0), plan(snap2, claimants, now=100.0))
