"""Quotas (docs/architecture.md §3): deserved is guaranteed and non-preemptible, over-quota work borrows idle capacity
preemptibly, ``limit`` (project and tenant) is never exceeded, weight 0 never borrows."""

from dataclasses import replace

import pytest

from broker.scheduler import DecisionMode, GpuMode, plan
from tests.scheduler.builders import (
    H100,
    L4,
    by_request,
    held,
    invariant_problems,
    mig,
    quota,
    share,
    snapshot,
    tenant_quota,
    whole,
)

FOUR_H100 = ("n1", H100, 4, GpuMode.WHOLE)


@pytest.mark.parametrize(
    ("deserved", "limit", "count", "mode", "preemptible"),
    [
        (2000, 4000, 1, DecisionMode.PLACED, False),  # well within deserved
        (2000, 4000, 2, DecisionMode.PLACED, False),  # exactly deserved
        (2000, 4000, 3, DecisionMode.PLACED, True),  # beyond deserved, within limit: borrowed
        (2000, 4000, 4, DecisionMode.PLACED, True),  # exactly the limit
        (0, 4000, 1, DecisionMode.PLACED, True),  # nothing deserved, all borrowed
        (2000, 2000, 3, DecisionMode.WAITING, None),  # beyond the limit
    ],
)
def test_quota_request_mode_follows_deserved_and_limit(deserved, limit, count, mode, preemptible):
    snap = snapshot(FOUR_H100, quotas=[quota("a", H100, deserved, limit)])
    requests = [whole("r", "a", count)]
    [decision] = plan(snap, requests, now=0)
    assert decision.mode == mode, decision.reason
    if preemptible is not None:
        assert decision.allocation.preemptible is preemptible
        assert decision.allocation.tier == H100
        assert decision.allocation.milli == count * 1000
    assert invariant_problems(snap, requests, [decision]) == []


def test_quota_counts_existing_use_towards_deserved():
    # 1 of 2 deserved GPUs already held: the next one is in quota, the one after that borrowed
    snap = snapshot(
        FOUR_H100, quotas=[quota("a", H100, 2000, 4000)], allocations=[held("old", "a", "n1-g0", preemptible=False)]
    )
    requests = [whole("r1", "a", submitted_at=1), whole("r2", "a", submitted_at=2)]
    decisions = by_request(plan(snap, requests, now=10))
    assert decisions["r1"].allocation.preemptible is False
    assert decisions["r2"].allocation.preemptible is True
    assert invariant_problems(snap, requests, list(decisions.values())) == []


def test_quota_mig_and_shares_count_in_gpu_units():
    # a 3g slice counts 3/7 GPU (428 milli, rounded down so a full layout never exceeds 1000) and a
    # 250-milli share 0.25 GPU against the tier
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), ("n2", H100, 1, GpuMode.SHARED), quotas=[quota("a", H100, 700, 1000)])
    requests = [
        mig("m", "a", "3g.40gb", submitted_at=1),
        share("s", "a", 250, 10_000, submitted_at=2),
        share("s2", "a", 250, 10_000, submitted_at=3),
        share("s3", "a", 400, 10_000, submitted_at=4),
    ]
    decisions = by_request(plan(snap, requests, now=0))
    assert decisions["m"].allocation.milli == 428
    assert decisions["m"].allocation.preemptible is False
    assert decisions["s"].allocation.milli == 250
    assert decisions["s"].allocation.preemptible is False  # 678 <= 700
    assert decisions["s2"].allocation.preemptible is True  # 928 > 700, <= 1000
    assert decisions["s3"].mode == DecisionMode.WAITING  # 1328 > limit 1000
    assert "1000" in decisions["s3"].reason and "400" in decisions["s3"].reason


def test_quota_over_quota_takes_only_idle_capacity():
    # b holds every GPU over quota; a's over-quota request does not preempt it, it waits
    snap = snapshot(
        ("n1", H100, 2, GpuMode.WHOLE),
        quotas=[quota("a", H100, 0, 4000), quota("b", H100, 0, 4000)],
        allocations=[held("b1", "b", "n1-g0"), held("b2", "b", "n1-g1")],
    )
    requests = [whole("r", "a")]
    [decision] = plan(snap, requests, now=100)
    assert decision.mode == DecisionMode.WAITING
    assert decision.victims == ()
    assert "over quota" in decision.reason and H100 in decision.reason
    assert "no idle capacity" in decision.reason


def test_quota_beyond_limit_waits_naming_tier_and_figures():
    snap = snapshot(
        FOUR_H100, quotas=[quota("a", H100, 1000, 2000)], allocations=[held("old", "a", "n1-g0", preemptible=False)]
    )
    [decision] = plan(snap, [whole("r", "a", 2)], now=0)
    assert decision.mode == DecisionMode.WAITING
    assert decision.reason.startswith("waiting: ")
    assert H100 in decision.reason
    assert "limit" in decision.reason
    # the figures: what is in use, the limit, and what the request needs
    for figure in ("1000", "2000"):
        assert figure in decision.reason
    assert "1000/2000" in decision.reason and "needs 2000" in decision.reason


def test_quota_tenant_limit_bounds_the_sum_of_projects():
    # each project may use 3 GPUs, the tenant only 4 in all
    snap = snapshot(
        ("n1", H100, 8, GpuMode.WHOLE),
        quotas=[quota("a", H100, 3000, 3000), quota("b", H100, 3000, 3000)],
        tenant_quotas=[tenant_quota("acme", H100, 4000, 4000)],
    )
    requests = [
        whole("ra", "a", 3, submitted_at=1),
        whole("rb", "b", 2, submitted_at=2),
        whole("rb1", "b", 1, submitted_at=3),
    ]
    decisions = by_request(plan(snap, requests, now=0))
    assert decisions["ra"].mode == DecisionMode.PLACED
    assert decisions["rb"].mode == DecisionMode.WAITING
    assert "tenant" in decisions["rb"].reason and H100 in decisions["rb"].reason
    assert "3000/4000" in decisions["rb"].reason
    assert decisions["rb1"].mode == DecisionMode.PLACED
    assert invariant_problems(snap, requests, list(decisions.values())) == []


def test_quota_tenant_deserved_makes_project_work_over_quota():
    # the project deserves 3 but the tenant only 2: the third GPU is borrowed (preemptible)
    snap = snapshot(
        FOUR_H100, quotas=[quota("a", H100, 3000, 4000)], tenant_quotas=[tenant_quota("acme", H100, 2000, 4000)]
    )
    requests = [whole("r1", "a", 2, submitted_at=1), whole("r2", "a", 1, submitted_at=2)]
    decisions = by_request(plan(snap, requests, now=0))
    assert decisions["r1"].allocation.preemptible is False
    assert decisions["r2"].allocation.preemptible is True
    assert invariant_problems(snap, requests, list(decisions.values())) == []


def test_quota_weight_zero_never_borrows():
    snap = snapshot(FOUR_H100, quotas=[quota("a", H100, 1000, 4000, weight=0)])
    requests = [whole("r1", "a", submitted_at=1), whole("r2", "a", submitted_at=2)]
    decisions = by_request(plan(snap, requests, now=0))
    assert decisions["r1"].mode == DecisionMode.PLACED
    assert decisions["r1"].allocation.preemptible is False
    assert decisions["r2"].mode == DecisionMode.WAITING
    assert "weight 0" in decisions["r2"].reason and H100 in decisions["r2"].reason


@pytest.mark.parametrize("quotas", [[], [quota("a", L4, 4000, 4000)], [quota("b", H100, 4000, 4000)]])
def test_quota_missing_for_tier_waits_with_reason(quotas):
    snap = snapshot(FOUR_H100, ("n2", L4, 2, GpuMode.WHOLE), quotas=quotas)
    [decision] = plan(snap, [whole("r", "a")], now=0)
    assert decision.mode == DecisionMode.WAITING
    assert decision.reason == f"waiting: project a has no quota for {H100}"


def test_quota_auto_uses_a_tier_with_quota():
    # auto: L4 is cheaper but the project has quota only for H100
    snap = snapshot(
        FOUR_H100, ("n2", L4, 2, GpuMode.WHOLE), quotas=[quota("a", H100, 4000, 4000)], prices={H100: 400, L4: 80}
    )
    [decision] = plan(snap, [whole("r", "a", models=())], now=0)
    assert decision.mode == DecisionMode.PLACED
    assert decision.allocation.tier == H100


def test_quota_not_enforced_places_without_quota():
    snap = replace(snapshot(FOUR_H100), enforce_quotas=False)
    [decision] = plan(snap, [whole("r", "a", 2)], now=0)
    assert decision.mode == DecisionMode.PLACED


@pytest.mark.parametrize(("profiles"), [["1g.10gb"] * 7, ["2g.20gb"] * 3 + ["1g.10gb"]])
def test_quota_one_full_mig_gpu_fits_a_one_gpu_quota(profiles):
    snap = snapshot(("n1", H100, 1, GpuMode.MIG), quotas=[quota("a", H100, 1000, 1000)])
    requests = [mig(f"r{i}", "a", profile, submitted_at=i) for i, profile in enumerate(profiles)]
    decisions = plan(snap, requests, now=0)
    assert [d.mode for d in decisions] == [DecisionMode.PLACED] * len(profiles)
    assert all(not d.allocation.preemptible for d in decisions)


def test_interactive_work_never_borrows_training_does():
    """Run:ai's split: interactive work is never preemptible, so it runs only within its deserved quota and
    otherwise waits (saying why); training borrows idle capacity over quota, preemptible."""
    from broker.scheduler.types import WorkloadClass

    snap = snapshot(FOUR_H100, quotas=[quota("a", H100, 1000, 4000)],
                    allocations=[held("old", "a", "n1-g0", preemptible=False)])
    interactive = replace(whole("i", "a"), workload_class=WorkloadClass.INTERACTIVE)
    training = whole("t", "a")
    decisions = by_request(plan(snap, [interactive, training], now=10))
    assert decisions["i"].mode == DecisionMode.WAITING
    assert "interactive work runs only within the guaranteed quota" in decisions["i"].reason
    assert decisions["t"].mode == DecisionMode.PLACED and decisions["t"].allocation.preemptible is True
    # within its deserved quota, interactive work is placed (not preemptible)
    roomy = snapshot(FOUR_H100, quotas=[quota("a", H100, 2000, 4000)],
                     allocations=[held("old", "a", "n1-g0", preemptible=False)])
    [placed] = plan(roomy, [interactive], now=10)
    assert placed.mode == DecisionMode.PLACED and placed.allocation.preemptible is False
