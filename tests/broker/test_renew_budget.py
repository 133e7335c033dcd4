"""Renewal respects the spend caps (issue 13, item 11): ``POST /leases/{id}/renew`` whose added cost takes
the month's forecast over a ``refuse`` cap answers 402 problem+json with the figures and changes nothing;
under a ``warn`` cap it renews and the warning is in the renewal event."""

import time_machine

from billing.models import SpendCap
from broker.models import Lease
from tests.billing.test_invoicing import start_lease, t
from tests.billing.test_invoicing import world as world

WHOLE = {"kind": "whole", "model": "H100-80GB"}  # 4.00 USD per hour in the test price book


def test_renew_api_over_a_refuse_cap_is_402_with_the_figures_and_writes_nothing(world):
    lease = start_lease(world, WHOLE, requested=t(5, 10), active=t(5, 10))  # runs 10:00 → 11:00 (4.00)
    SpendCap.objects.create(tenant=world.acme, monthly_minor=1000)  # 10.00 USD
    events = lease.events.count()
    client = world.client("member")
    with time_machine.travel(t(5, 10, 30), tick=False):
        # until 13:30: 2.5 h more = 10.00, forecast 4.00 + 10.00 = 14.00 > 10.00
        answer = client.post(f"/api/v1/leases/{lease.pk}/renew", {"duration_seconds": 3 * 3600}, format="json")
    assert answer.status_code == 402, answer.json()
    assert answer["Content-Type"].startswith("application/problem+json")
    problem = answer.json()
    assert problem["code"] == "budget_exceeded" and problem["field"] == "duration_seconds"
    assert problem["cap_minor"] == 1000 and problem["request_minor"] == 1000 and problem["forecast_minor"] == 1400
    assert "this renewal 10.00 USD: forecast 14.00 USD" in problem["detail"]
    lease.refresh_from_db()
    assert lease.ends_at == t(5, 11) and lease.events.count() == events
    with time_machine.travel(t(5, 10, 30), tick=False):  # until 11:30: 2.00 more, forecast 6.00: renewed
        answer = client.post(f"/api/v1/leases/{lease.pk}/renew", {"duration_seconds": 3600}, format="json")
    assert answer.status_code == 200, answer.json()
    assert Lease.objects.get(pk=lease.pk).ends_at == t(5, 11, 30)


def test_renew_api_under_a_warn_cap_renews_with_the_warning_in_the_event(world):
    lease = start_lease(world, WHOLE, requested=t(5, 10), active=t(5, 10))
    SpendCap.objects.create(tenant=world.acme, project=world.project, monthly_minor=1000, action="warn")
    with time_machine.travel(t(5, 10, 30), tick=False):
        answer = world.client("member").post(f"/api/v1/leases/{lease.pk}/renew", {"duration_seconds": 3 * 3600},
                                             format="json")
    assert answer.status_code == 200, answer.json()
    event = lease.events.filter(reason__startswith="renewed").get()
    assert "The monthly spend cap of project vision is 10.00 USD" in event.reason
    assert Lease.objects.get(pk=lease.pk).ends_at == t(5, 13, 30)


def test_renew_api_another_tenants_lease_is_404(world):
    lease = start_lease(world, WHOLE, requested=t(5, 10), active=t(5, 10))
    answer = world.client("outsider").post(f"/api/v1/leases/{lease.pk}/renew", {"duration_seconds": 600},
                                           format="json")
    assert answer.status_code == 404
