"""``Scheduler.covered``: whether a request is covered by its project's guarantee counting the project's own requests
ahead of it (what billing samples time to GPU by: docs/billing.md, "SLO evaluation")."""

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.scheduler import DecisionMode, GpuMode
from broker.scheduler.plan import Scheduler
from tests.scheduler.builders import H100, L4, held, mig, quota, snapshot, tenant_quota, whole

FOUR_H100 = ("n1", H100, 4, GpuMode.WHOLE)
EIGHT_H100 = ("n1", H100, 8, GpuMode.WHOLE)


def covered(snap, requests):
    return Scheduler(snap).covered(requests)


def test_a_sweep_beyond_the_guarantee_is_covered_only_up_to_it():
    # 8 GPUs guaranteed, 16 one-GPU jobs at once: the first 8 in the project's order are covered, the rest wait
    # behind the project's own work
    snap = snapshot(EIGHT_H100, quotas=[quota("a", H100, 8000, 16000)])
    requests = [whole(f"r{i:02}", "a", submitted_at=i) for i in range(16)]
    result = covered(snap, requests)
    assert [result[r.id] for r in requests] == [True] * 8 + [False] * 8


def test_guaranteed_use_counts_and_borrowed_use_does_not():
    # 2 GPUs held in quota, 1 borrowed: of 4 deserved, 2 more are covered
    snap = snapshot(EIGHT_H100, quotas=[quota("a", H100, 4000, 8000)],
                    allocations=[held("in", "a", ["n1-g0", "n1-g1"], preemptible=False),
                                 held("over", "a", "n1-g2", preemptible=True)])
    requests = [whole("r1", "a", submitted_at=1), whole("r2", "a", submitted_at=2), whole("r3", "a", submitted_at=3)]
    assert covered(snap, requests) == {"r1": True, "r2": True, "r3": False}


def test_the_projects_order_is_priority_then_submission():
    snap = snapshot(FOUR_H100, quotas=[quota("a", H100, 2000, 4000)])
    requests = [whole("early", "a", submitted_at=1), whole("later", "a", submitted_at=2),
                whole("urgent", "a", submitted_at=3, priority=5)]
    assert covered(snap, requests) == {"urgent": True, "early": True, "later": False}


def test_other_projects_queues_do_not_count():
    snap = snapshot(FOUR_H100, quotas=[quota("a", H100, 2000, 4000), quota("b", H100, 2000, 4000)])
    requests = [whole("a1", "a", 2, submitted_at=1), whole("b1", "b", submitted_at=2), whole("b2", "b", submitted_at=3)]
    assert covered(snap, requests) == {"a1": True, "b1": True, "b2": True}


def test_the_tenants_guarantee_bounds_it_too():
    snap = snapshot(FOUR_H100, quotas=[quota("a", H100, 4000, 4000)], tenant_quotas=[tenant_quota("acme", H100, 1000,
                                                                                                  4000)])
    requests = [whole("one", "a"), whole("two", "a", 2, submitted_at=1)]
    assert covered(snap, requests) == {"one": True, "two": False}


def test_no_quota_for_any_tier_it_may_run_on_is_not_covered():
    snap = snapshot(FOUR_H100, ("n2", L4, 4, GpuMode.WHOLE), quotas=[quota("a", L4, 4000, 4000)])
    assert covered(snap, [whole("r", "a")]) == {"r": False}
    assert covered(snap, [whole("r", "a", models=(H100, L4))]) == {"r": True}


def test_mig_requests_count_their_slices():
    # 3/7 of a GPU per 3g slice: two fit a 1000-milli guarantee (2 x 428), a third does not
    snap = snapshot(("n1", H100, 2, GpuMode.MIG), quotas=[quota("a", H100, 1000, 4000)])
    requests = [mig(f"m{i}", "a", "3g.40gb", submitted_at=i) for i in range(3)]
    assert covered(snap, requests) == {"m0": True, "m1": True, "m2": False}


def test_without_quota_enforcement_everything_is_covered():
    from dataclasses import replace

    snap = replace(snapshot(FOUR_H100), enforce_quotas=False)
    assert covered(snap, [whole("r", "a", 4), whole("s", "b", 4)]) == {"r": True, "s": True}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 3), st.integers(-1, 1)), min_size=1, max_size=12),
       st.integers(0, 8))
def test_a_covered_request_is_placed_in_quota_when_it_comes_first(jobs, deserved):
    """A request covered on an empty fleet whose guarantee fits is placed in quota when the project's requests ahead
    of it are all placed first; one that is not covered never is, in this cycle, within the guarantee alone."""
    snap = snapshot(EIGHT_H100, quotas=[quota("a", H100, deserved * 1000, 16000)])
    requests = [whole(f"r{i:02}", "a", count, submitted_at=i + offset, priority=priority)
                for i, (priority, count, offset) in enumerate(jobs)]
    result = covered(snap, requests)
    decisions = {d.request: d for d in Scheduler(snap).schedule(requests, now=100.0)}
    ahead = 0
    for request in sorted(requests, key=lambda r: (-r.priority, r.submitted_at, r.id)):
        need = request.shape.count * 1000
        assert result[request.id] is (ahead + need <= deserved * 1000)
        if result[request.id]:
            # covered and everything ahead of it covered too (a gang of the guarantee's size on 8 GPUs fits)
            decision = decisions[request.id]
            assert decision.mode == DecisionMode.PLACED
            assert decision.allocation.preemptible is False
        ahead += need
