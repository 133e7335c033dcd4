"""Time to GPU is sampled only for leases the project's guarantee covered when requested (``Lease.guarantee_covered``,
recorded by the schedule cycle): a tenant's own sweep, waiting behind its own project's queue, earns no credit."""

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from billing import services as billing
from billing.core import slo
from tenants import services as tenant_services
from tests.billing.test_slo_deterministic import lease_with
from tests.factories import make_project, make_tenant

T0 = datetime(2026, 1, 10, 9, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_measure_leaves_out_leases_not_covered_and_counts_them():
    def history(lease_id, wait, covered):
        return slo.LeaseHistory(lease_id=lease_id, requested_at=at(0), over_quota=False, ends_at=None, covered=covered,
                                events=[(at(0), "", "requested", "user:a"), (at(wait), "provisioning", "active", "w")])

    figures = slo.measure([history(1, 20, True), history(2, 40, None), history(3, 7200, False)],
                          start=at(-60), end=at(10_000), notice_seconds=30)
    assert figures.ttg_samples == [20, 40]  # unknown (placed before the cycle recorded it) is sampled as before
    assert figures.not_covered == [3]


@pytest.fixture
def sweep(db):
    """A project sends 10 jobs at once on a guarantee of 2: 2 start in 20 s, 8 wait hours for their own project's
    jobs (each placed in quota when its turn came)."""
    tenant = make_tenant("acme")
    project = make_project(tenant, "vision")
    tenant_services.slo_contract_create(
        tenant=tenant, name="gold", effective_from=datetime(2025, 1, 1, tzinfo=UTC), effective_to=None,
        time_to_gpu_p95_seconds=60, availability_target_pct=Decimal("99.9"), preemption_notice_seconds=30,
        credit_steps=[{"metric": "time_to_gpu_p95", "threshold": "120", "credit_pct": "10"}])
    leases = []
    for index in range(10):
        wait = 20 if index < 2 else 3600 * (index // 2)
        lease = lease_with(tenant, project, at(index), [(at(index + wait), "active", "broker"),
                                                         (at(index + wait + 3000), "releasing", "user:max")],
                           ends_at=at(index + wait + 3600), finished=at(index + wait + 3000))
        lease.guarantee_covered = index < 2
        lease.save(update_fields=["guarantee_covered"])
        leases.append(lease)
    return tenant, leases


def test_a_tenants_own_sweep_earns_no_time_to_gpu_credit(sweep):
    tenant, leases = sweep
    evaluation = billing.slo_evaluate(tenant=tenant, period=date(2026, 1, 1), now=datetime(2026, 2, 2, tzinfo=UTC))
    assert evaluation.in_quota_requests == 2
    assert evaluation.time_to_gpu_p95_seconds == Decimal("20.000")
    assert evaluation.credit_pct == 0
    assert evaluation.evidence["not_covered"] == {"leases": 8, "ids": [lease.pk for lease in leases[2:]]}


def test_before_the_cycle_recorded_coverage_every_in_quota_lease_is_sampled(sweep):
    from broker.models import Lease

    tenant, leases = sweep
    Lease.objects.filter(pk__in=[lease.pk for lease in leases]).update(guarantee_covered=None)
    evaluation = billing.slo_evaluate(tenant=tenant, period=date(2026, 1, 1), now=datetime(2026, 2, 2, tzinfo=UTC))
    assert evaluation.in_quota_requests == 10
    assert evaluation.time_to_gpu_p95_seconds > 3600
    assert evaluation.credit_pct == 10
    assert evaluation.evidence["not_covered"] == {"leases": 0, "ids": []}


def test_the_staff_report_says_how_many_were_left_out(sweep, client):
    from tests.factories import make_user
    from tests.portal.test_pages import login, text

    tenant, _leases = sweep
    billing.slo_evaluate(tenant=tenant, period=date(2026, 1, 1), now=datetime(2026, 2, 2, tzinfo=UTC))
    make_user("root", is_staff=True)
    body = text(login(client, "root").get("/ops/billing", {"month": "2026-01"}))
    assert "20.000 s (60 s) · 2 req. (8 more behind their own project's queue, not sampled)" in body
