"""The SLO evaluation of a closed month is the same whenever it runs (issue 13, item 13d): evaluated at two
different ``now``s after the month — with the tenant's leases changing in between, as they do — the
figures and the evidence (the text the credit line and the invoice PDF show) are identical."""

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import transaction

from billing import services as billing
from broker import services as broker
from broker.choices import LeaseState
from broker.models import Lease, LeaseEvent
from tenants import services as tenant_services
from tests.billing.test_invoicing import start_lease
from tests.billing.test_invoicing import world as world
from tests.factories import make_project, make_tenant

JANUARY = date(2026, 1, 1)


def t(day, hour, minute=0, second=0, month=1):
    return datetime(2026, month, day, hour, minute, second, tzinfo=UTC)


def lease_with(tenant, project, requested, events, *, ends_at, state="released", finished=None):
    lease = Lease.objects.create(tenant=tenant, project=project, kind="whole", duration_seconds=3600, state=state,
                                 tier="H100-80GB", requested_at=requested, ends_at=ends_at, finished_at=finished)
    previous = ""
    for at, to_state, actor in [(requested, "requested", "user:max"), *events]:
        LeaseEvent.objects.create(lease=lease, from_state=previous, to_state=to_state, reason=to_state, actor=actor,
                                  at=at)
        previous = to_state
    return lease


@pytest.fixture
def history(db):
    tenant = make_tenant("acme")
    project = make_project(tenant, "vision")
    tenant_services.slo_contract_create(
        tenant=tenant, name="gold", effective_from=datetime(2025, 1, 1, tzinfo=UTC), effective_to=None,
        time_to_gpu_p95_seconds=60, availability_target_pct=Decimal("99.9"), preemption_notice_seconds=30,
        credit_steps=[{"metric": "time_to_gpu_p95", "threshold": "120", "credit_pct": "10"},
                      {"metric": "availability", "threshold": "99.9", "credit_pct": "5"},
                      {"metric": "preemption_notice", "threshold": "100", "credit_pct": "5"}])
    leases = []
    for day in (3, 4, 6, 9):  # lost when their nodes went silent, each two hours before its planned end
        leases.append(lease_with(tenant, project, t(day, 10), [(t(day, 10, 5), "active", "broker"),
                                                               (t(day, 12), "failed", "broker")],
                                 ends_at=t(day, 14), state="failed", finished=t(day, 12)))
    for day in (5, 7):  # preempted with a 10 s notice where 30 s are due
        leases.append(lease_with(tenant, project, t(day, 9), [
            (t(day, 9, 0, 20), "active", "broker"), (t(day, 12), "preempted", "broker"),
            (t(day, 12, 0, 10), "releasing", "broker"), (t(day, 12, 0, 11), "preempted", "broker")],
            ends_at=t(day, 15), finished=t(day, 12, 0, 11)))
    # still holding at the month's end: active since 31 Jan 23:00:30, due to end at 02:00
    leases.append(lease_with(tenant, project, t(31, 23), [(t(31, 23, 0, 30), "active", "broker")],
                             ends_at=t(1, 2, month=2), state="active"))
    return tenant, leases


def evaluation_at(tenant, now):
    evaluation = billing.slo_evaluate(tenant=tenant, period=JANUARY, now=now)
    return {"figures": (evaluation.time_to_gpu_p95_seconds, evaluation.in_quota_requests,
                        evaluation.availability_pct, evaluation.preemption_notice_pct, evaluation.preemptions,
                        evaluation.credit_pct),
            "evidence": evaluation.evidence}


def test_slo_evaluation_of_a_closed_month_does_not_depend_on_when_it_runs(history):
    tenant, leases = history
    first = evaluation_at(tenant, t(2, 12, month=2))
    assert len(first["evidence"]["losses"]) == 4 and len(first["evidence"]["short_notices"]) == 2
    # February goes on: the lease that was running at the month's end is renewed, then released; older
    # rows are touched (every update writes a new row version, which changes the order a plain scan reads)
    last = leases[-1]
    Lease.objects.filter(pk=last.pk).update(ends_at=t(1, 5, month=2))
    LeaseEvent.objects.create(lease=last, from_state="active", to_state="releasing", reason="released",
                              actor="user:max", at=t(1, 4, month=2))
    Lease.objects.filter(pk=last.pk).update(state="released", finished_at=t(1, 4, month=2))
    for lease in leases[:3]:
        Lease.objects.filter(pk=lease.pk).update(reason="seen by the operator")
    second = evaluation_at(tenant, t(15, 9, month=3) + timedelta(seconds=17))
    assert second == first
    # the evidence names the month, not the moment of the run
    assert first["evidence"]["period"] == {"from": "2026-01-01T00:00:00+00:00", "to": "2026-02-01T00:00:00+00:00"}


def test_slo_time_to_gpu_sample_survives_a_later_requeue_and_over_quota_placement(world):
    # an in-quota lease that waited 10 minutes in January: the p95 sample (600 s > 120 s: a 10 % credit)
    lease = start_lease(world, {"kind": "whole", "model": "H100-80GB"}, requested=t(10, 10), active=t(10, 10, 10))
    tenant_services.slo_contract_create(
        tenant=world.acme, name="gold", effective_from=datetime(2025, 1, 1, tzinfo=UTC), effective_to=None,
        time_to_gpu_p95_seconds=60, availability_target_pct=Decimal("99.9"), preemption_notice_seconds=30,
        credit_steps=[{"metric": "time_to_gpu_p95", "threshold": "120", "credit_pct": "10"}])
    first = evaluation_at(world.acme, t(2, 12, month=2))
    assert first["figures"][:2] == (Decimal("600.000"), 1) and first["figures"][-1] == Decimal("10.00")
    # in February its node is drained: the lease is preempted, requeued and placed again, this time over
    # quota: the lease row says over_quota now, but in January it was placed within quota
    with transaction.atomic():
        broker.lease_transition(lease=Lease.objects.get(pk=lease.pk), to=LeaseState.PREEMPTED,
                                 reason="node drained", actor="staff:root", now=t(3, 8, month=2))
    broker.allocations_free(lease=Lease.objects.get(pk=lease.pk), now=t(3, 8, month=2), to=LeaseState.QUEUED,
                             reason="node lost; retrying")
    Lease.objects.filter(pk=lease.pk).update(over_quota=True)
    assert evaluation_at(world.acme, t(15, 9, month=3)) == first
