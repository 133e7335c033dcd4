"""Budget guard: a request whose forecast would take the month's spend over a cap is refused with the
figures (or only warned); metered spend, running leases and the request itself all count."""

from datetime import UTC, datetime

import pytest
import time_machine

from billing import services as billing
from billing.models import SpendCap
from tests.billing.test_invoicing import end_lease, start_lease, t
from tests.billing.test_invoicing import world as world

WHOLE = {"kind": "whole", "model": "H100-80GB"}


def check(world, *, hours, now, gpu=WHOLE):
    return billing.budget_check(tenant=world.acme, project=world.project, gpu=gpu, workload_class="training",
                                duration_seconds=int(hours * 3600), now=now)


def test_no_cap_no_check(world):
    assert check(world, hours=700, now=t(10, 0)) == ""


def test_the_request_alone_over_the_cap_is_refused_with_figures(world):
    SpendCap.objects.create(tenant=world.acme, monthly_minor=1000)  # 10.00 USD
    assert check(world, hours=2, now=t(10, 0)) == ""  # 2 h × 4.00 = 8.00
    with pytest.raises(billing.BudgetExceeded) as caught:
        check(world, hours=3, now=t(10, 0))  # 12.00
    error = caught.value
    assert error.status == 402 and error.field == "project"
    assert error.extra == {"cap_minor": 1000, "spent_minor": 0, "request_minor": 1200, "forecast_minor": 1200,
                           "currency": "USD"}
    assert "forecast 12.00 USD" in error.message and "tenant acme" in error.message
    # the month's end bounds the forecast: 3 h requested 2 h before the month ends → 8.00
    assert check(world, hours=3, now=datetime(2026, 1, 31, 22, tzinfo=UTC)) == ""


def test_metered_spend_and_running_leases_count(world):
    # the 3g.40gb ran 10:55 → 12:10:30 (2.16), within its planned 2 h; metered
    mig = start_lease(world, {"kind": "mig", "profile": "3g.40gb", "model": "H100-80GB"},
                      requested=t(1, 10, 50), active=t(1, 10, 55), duration_seconds=7200)
    end_lease(mig, t(1, 12, 10, 30))
    billing.usage_meter_window(start=t(1, 0), end=t(2, 0), now=t(2, 0))
    # a whole GPU running from 3 Jan 00:00 for 2 h (until 02:00): 8.00 committed at 01:00 → 4.00 left
    with time_machine.travel(t(3, 0), tick=False):
        running = start_lease(world, WHOLE, requested=t(3, 0), active=t(3, 0))
    assert running.duration_seconds == 3600  # the default duration: 1 h
    SpendCap.objects.create(tenant=world.acme, project=world.project, monthly_minor=1000, action="warn")
    # spent 2.16 + running 4.00 (3 Jan 00:00 → 01:00, as metering stops at 1 Jan 13:00) + request 4.00 = 10.16
    warning = check(world, hours=1, now=t(3, 0, 30))
    assert "project vision" in warning and "spent 2.16 USD" in warning and "forecast 10.16 USD" in warning
    SpendCap.objects.filter(project=world.project).update(action="refuse")
    with pytest.raises(billing.BudgetExceeded):
        check(world, hours=1, now=t(3, 0, 30))


def test_the_api_refuses_a_request_over_a_cap_with_the_figures_and_writes_nothing(world):
    from broker.models import Lease

    SpendCap.objects.create(tenant=world.acme, monthly_minor=1000)
    client = world.client("member")
    body = {"project": "vision", "gpu": {"kind": "whole", "model": "H100-80GB"}, "duration_seconds": 3 * 3600}
    answer = client.post("/api/v1/leases", body, format="json")
    assert answer.status_code == 402 and answer["Content-Type"].startswith("application/problem+json")
    problem = answer.json()
    assert problem["code"] == "budget_exceeded" and problem["field"] == "project"
    assert "The monthly spend cap of tenant acme is 10.00 USD" in problem["detail"]
    assert not Lease.objects.exists()
    body["duration_seconds"] = 3600  # 4.00 at the test price: within the cap
    assert client.post("/api/v1/leases", body, format="json").status_code == 201
    SpendCap.objects.update(action="warn")
    body["duration_seconds"] = 3 * 3600
    answer = client.post("/api/v1/leases", body, format="json")
    assert answer.status_code == 201
    reason = Lease.objects.get(pk=answer.json()["id"]).events.get(to_state="requested").reason
    assert reason.startswith("requested; The monthly spend cap of tenant acme")
