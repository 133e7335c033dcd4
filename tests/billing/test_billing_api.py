"""The tenant billing API: usage grouped by project/model/day, invoices and their PDF/CSV documents,
scoped to the caller's tenant, with errors naming the field."""

import csv
import io
from decimal import Decimal

import pytest

from billing import services as billing
from billing.models import Invoice
from tests.billing.test_invoicing import AFTER, JANUARY, two_leases
from tests.billing.test_invoicing import world as world


@pytest.fixture
def invoiced(world):
    two_leases(world)
    billing.invoice_run(period=JANUARY, now=AFTER)
    return world, Invoice.objects.get(tenant=world.acme)


def test_usage_by_project_model_and_day(invoiced):
    world, _ = invoiced
    client = world.client("viewer")
    answer = client.get("/api/v1/usage", {"from": "2026-01-01", "to": "2026-02-01", "group_by": "project"})
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["currency"] == "USD" and body["group_by"] == "project"
    [vision] = body["groups"]
    # 4530 s × 428 milli + 1800 s × 1000 milli = 0.538567 + 0.5 GPU-hours; cost 216 + 150 cents
    assert vision["key"] == "vision" and Decimal(vision["gpu_hours"]) == Decimal("1.038567")
    assert vision["amount_minor"] == 366 and vision["engine_active_avg"] is None
    by_day = client.get("/api/v1/usage", {"from": "2026-01-01", "to": "2026-02-01", "group_by": "day"}).json()
    assert [g["key"] for g in by_day["groups"]] == ["2026-01-01"]
    by_model = client.get("/api/v1/usage", {"from": "2026-01-01", "to": "2026-02-01", "group_by": "model"}).json()
    assert [g["key"] for g in by_model["groups"]] == ["H100-80GB"]
    # another tenant sees none of it
    other = world.client("outsider").get("/api/v1/usage", {"from": "2026-01-01", "to": "2026-02-01"}).json()
    assert other["groups"] == []


@pytest.mark.parametrize(("query", "field"), [
    ({"group_by": "tenant"}, "group_by"), ({"from": "yesterday"}, "from"),
    ({"from": "2026-02-01", "to": "2026-01-01"}, "to"), ({"from": "2020-01-01", "to": "2026-01-01"}, "to")])
def test_usage_errors_name_the_field(world, query, field):
    answer = world.client("viewer").get("/api/v1/usage", query)
    assert answer.status_code == 400 and answer["Content-Type"].startswith("application/problem+json")
    assert answer.json()["field"] == field


def test_invoices_list_detail_and_documents(invoiced):
    world, invoice = invoiced
    client = world.client("viewer")
    listed = client.get("/api/v1/invoices").json()
    assert [i["number"] for i in listed["results"]] == [invoice.number]
    assert listed["results"][0]["total_minor"] == invoice.total_minor == 366
    detail = client.get(f"/api/v1/invoices/{invoice.pk}").json()
    assert detail["period"] == "2026-01" and detail["status"] == "finalized"
    assert sum(line["amount_minor"] for line in detail["lines"]) == detail["total_minor"]
    assert detail["lines"][0]["unit"] == "3g.40gb instance-hour" and detail["lines"][0]["project"] == "vision"
    pdf = client.get(f"/api/v1/invoices/{invoice.pk}.pdf")
    assert pdf.status_code == 200 and pdf["Content-Type"] == "application/pdf"
    assert pdf.content.startswith(b"%PDF") and invoice.number in pdf["Content-Disposition"]
    text = client.get(f"/api/v1/invoices/{invoice.pk}.csv").content.decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    lines = [r for r in rows if r["position"]]
    assert [r["amount"] for r in lines] == ["2.16", "1.50"]
    assert {r["kind"]: r["amount"] for r in rows if not r["position"]}["total"] == "3.66"


def test_another_tenants_invoice_is_not_found(invoiced):
    world, invoice = invoiced
    client = world.client("outsider")
    for path in (f"/api/v1/invoices/{invoice.pk}", f"/api/v1/invoices/{invoice.pk}.pdf",
                 f"/api/v1/invoices/{invoice.pk}.csv"):
        assert client.get(path).status_code == 404
    assert client.get("/api/v1/invoices").json()["results"] == []


def test_offers_carry_the_tenants_prices(world):
    from broker import services

    token = services.enrollment_token_create()
    services.node_enroll(node_id="n2", token=token, address="http://127.0.0.1:9/n/n2", inventory={"gpus": [
        {"index": 0, "uuid": "GPU-l4-0", "model": "L4", "mode": "shared", "memory_mib": 22491}]})
    offers = {o["model"]: o for o in world.client("viewer").get("/api/v1/offers").json()["offers"]}
    h100 = offers["H100-80GB"]
    assert h100["currency"] == "USD" and h100["price_per_gpu_hour"] == "4.000000"
    assert {m["profile"]: m["price_per_hour"] for m in h100["mig"]}["3g.40gb"] == "1.714286"
    assert h100["multipliers"] == {"over_quota": "0.5000", "interactive": "1.5000"}
    assert offers["L4"]["price_per_gpu_hour"] is None  # no L4 rate in this book
