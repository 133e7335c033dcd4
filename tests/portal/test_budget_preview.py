"""The portal's request preview and renew form show the budget outcome (issue 13, item 11): a request a
``refuse`` cap would turn away is previewed as refused, not "Fits now"; a ``warn`` cap shows the warning;
renewing past a ``refuse`` cap shows the 402 message next to the form and changes nothing."""

from datetime import UTC, datetime

from django.utils import timezone

from billing import services as billing
from billing.models import SpendCap
from broker import services as broker
from broker.models import Allocation, Lease
from tests.portal.test_pages import field_error, fleet_node, lease_for, login, text

PREVIEW = {"project": "vision", "gpu.kind": "whole", "gpu.model": "H100-80GB", "duration_seconds": "7200"}


def prices():
    billing.price_book_create(name="list", currency="USD", effective_from=datetime(2025, 1, 1, tzinfo=UTC),
                              rates=[{"tier": "H100-80GB", "per_hour": "4.00"}])


def test_budget_preview_refuse_cap_says_refused_not_fits_now(world, client):
    prices()
    fleet_node(mode="whole")
    login(client, "max")
    assert "Fits now" in text(client.get("/leases/preview", PREVIEW))  # no cap yet
    SpendCap.objects.create(tenant=world.acme, monthly_minor=100)  # 1.00 USD; the request costs 8.00
    body = text(client.get("/leases/preview", PREVIEW))
    assert "Fits now" not in body
    assert "Refused: over the monthly spend cap" in body and "The monthly spend cap of tenant acme is 1.00 USD" in body
    # the request itself is refused the same way, and nothing is written
    response = client.post("/leases/new", {**PREVIEW, "gpu.count": "1", "gpu.gang": "true",
                                           "workload_class": "training", "priority": "0"})
    assert response.status_code == 402 and not Lease.objects.exists()  # refused by the budget, as the API says
    assert "The monthly spend cap of tenant acme is 1.00 USD" in text(response)


def test_budget_preview_warn_cap_shows_the_warning(world, client):
    prices()
    fleet_node(mode="whole")
    SpendCap.objects.create(tenant=world.acme, project=world.project, monthly_minor=100, action="warn")
    body = text(login(client, "max").get("/leases/preview", PREVIEW))
    assert "Warning: over the monthly spend cap" in body and "project vision is 1.00 USD" in body
    assert "Fits now" in body  # a warning does not stop it


def test_budget_portal_renew_over_a_refuse_cap_shows_402_and_changes_nothing(world, client):
    prices()
    fleet_node(mode="whole")
    lease = lease_for(world, kind="whole", model="H100-80GB")
    broker.schedule_cycle()
    now = timezone.now()
    for allocation in Allocation.objects.filter(lease=lease):
        broker.allocation_ready(allocation=allocation, instance={"device_uuid": "X"}, now=now)
    lease.refresh_from_db()
    assert lease.state == "active"
    SpendCap.objects.create(tenant=world.acme, monthly_minor=1)  # 0.01 USD: any renewal breaks it
    response = login(client, "max").post(f"/leases/{lease.pk}/renew", {"duration_seconds": "7200"})
    assert response.status_code == 402
    assert "The monthly spend cap of tenant acme is 0.01 USD" in field_error(response, "renew")
    assert Lease.objects.get(pk=lease.pk).ends_at == lease.ends_at
    # another tenant's lease stays invisible
    login(client, "bob")
    assert client.post(f"/leases/{lease.pk}/renew", {"duration_seconds": "600"}).status_code == 404
