"""The profiling rate: staff set a price book's ``profiling_multiplier`` (API, admin, ops portal); the usage of a
profiling lease (auto-tiering's profiler measuring a workload) is metered as such and billed at base × that
multiplier on a line of its own that says so; other leases of the same shape keep the base rate."""

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
import time_machine

from billing import services as billing
from billing.models import AllocationUsage, Invoice, PriceBook
from billing.selectors.usage import spend_minor
from broker import services
from broker.choices import LeaseState
from broker.models import Allocation, Lease
from tenants.access import Actor
from tenants.choices import Role
from tests.billing.test_money_surfaces import book_form, future, portal
from tests.billing.test_money_surfaces import staff as staff  # the fixture
from tests.factories import make_world


def t(day, hour, minute=0):
    return datetime(2026, 1, day, hour, minute, tzinfo=UTC)


@pytest.fixture
def world(db):
    world = make_world()
    token = services.enrollment_token_create()
    services.node_enroll(node_id="n1", token=token, address="http://127.0.0.1:9/n/n1", inventory={"gpus": [
        {"index": 0, "uuid": "GPU-h100-0", "model": "H100-80GB", "mode": "whole", "memory_mib": 81559}]})
    billing.price_book_create(name="list 2026", currency="USD", effective_from=datetime(2025, 1, 1, tzinfo=UTC),
                              rates=[{"tier": "H100-80GB", "per_hour": "4.00"}], profiling_multiplier="0.5")
    return world


def _run(world, *, profiling: bool, start, end) -> Lease:
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    with time_machine.travel(start, tick=False):
        lease, _ = services.lease_request(actor=actor, project="vision", gpu={"kind": "whole", "model": "H100-80GB"},
                                          profiling=profiling)
        services.schedule_cycle()
    for allocation in Allocation.objects.filter(lease=lease):
        with time_machine.travel(start, tick=False):
            services.allocation_ready(allocation=allocation, instance={"device_uuid": "X"}, now=start)
    with time_machine.travel(end, tick=False):
        services.lease_release(lease=lease, actor="user:max", now=end)
        services.allocations_free(lease=Lease.objects.get(pk=lease.pk), now=end, to=LeaseState.RELEASED,
                                  reason="released")
    return Lease.objects.get(pk=lease.pk)


def test_profiling_usage_is_billed_at_the_profiling_rate_on_its_own_line(world):
    profiled = _run(world, profiling=True, start=t(1, 10), end=t(1, 10, 30))
    plain = _run(world, profiling=False, start=t(1, 11), end=t(1, 12))
    assert profiled.profiling and not plain.profiling
    billing.invoice_run(period=date(2026, 1, 1), now=datetime(2026, 2, 2, 12, tzinfo=UTC))
    usage = {row.lease_id: row.profiling for row in AllocationUsage.objects.all()}
    assert usage == {profiled.pk: True, plain.pk: False}
    invoice = Invoice.objects.get(tenant=world.acme)
    lines = list(invoice.lines.filter(kind="usage").order_by("position"))
    assert len(lines) == 2
    rate = next(line for line in lines if line.profiling)
    base = next(line for line in lines if not line.profiling)
    # 4.00 × 0.5 = 2.00 per GPU-hour × 0.5 h = 100 cents; the plain hour at 4.00 = 400 cents
    assert (rate.unit_price, rate.quantity, rate.amount_minor) == (Decimal("2"), Decimal("0.5"), 100)
    assert (base.unit_price, base.quantity, base.amount_minor) == (Decimal("4"), Decimal("1"), 400)
    assert "profiling rate × 0.5" in rate.description and "profiling" not in base.description
    # the invoice API says which line it is
    client = world.client("admin")
    shown = client.get(f"/api/v1/invoices/{invoice.pk}").json()
    flags = sorted((line["profiling"], line["amount_minor"]) for line in shown["lines"] if line["kind"] == "usage")
    assert flags == [(False, 400), (True, 100)]
    # spend (caps, forecasts) prices the same way
    assert spend_minor(tenant=world.acme, start=t(1, 0), end=t(2, 0))[0] == 500


def test_staff_set_the_profiling_rate_in_the_api_and_the_ops_pages_and_bad_values_name_the_field(world, staff):
    api = staff["client"]
    body = {"name": "list 2030", "currency": "USD", "effective_from": future(30).isoformat(),
            "rates": [{"tier": "H100-80GB", "per_hour": "4.00"}], "profiling_multiplier": "0.25"}
    made = api.post("/api/v1/price-books", body, format="json")
    assert made.status_code == 201, made.json()
    assert made.json()["profiling_multiplier"] == "0.2500"
    assert PriceBook.objects.get(pk=made.json()["id"]).profiling_multiplier == Decimal("0.25")
    for bad in ("0", "-1", "x", "123456"):
        answer = api.post("/api/v1/price-books", {**body, "effective_from": future(40).isoformat(),
                                                   "profiling_multiplier": bad}, format="json")
        assert answer.status_code == 400 and answer.json()["field"] == "profiling_multiplier", (bad, answer.json())
    changed = api.patch(f"/api/v1/price-books/{made.json()['id']}", {"profiling_multiplier": "0.75"}, format="json")
    assert changed.status_code == 200 and changed.json()["profiling_multiplier"] == "0.7500"
    # the ops pages: the form shows the field and a new book takes it; a bad one is refused naming it
    root = portal("root")
    assert "Profiling multiplier" in root.get("/ops/price-books").content.decode()
    refused = root.post("/ops/price-books", book_form(profiling_multiplier="0"))
    assert refused.status_code == 400 and "profiling_multiplier" in refused.content.decode()
    created = root.post("/ops/price-books", book_form(profiling_multiplier="0.4",
                                                      effective_from=f"{future(50):%Y-%m-%dT%H:%M}"))
    assert created.status_code == 302, created.content.decode()[:500]
    assert PriceBook.objects.get(name="List 2027").profiling_multiplier == Decimal("0.4")
    # a book made without it bills profiling at the base rate
    default = billing.price_book_create(name="plain", currency="EUR", effective_from=future(60),
                                        rates=[{"tier": "H100-80GB", "per_hour": "3.00"}])
    assert default.profiling_multiplier == Decimal(1)
