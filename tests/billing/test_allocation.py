"""Cost allocation (issue 33): lease labels validated against the tenant's keys, carried into usage rows at metering,
and the month's charges broken down by label, by requesting user and by project — adding up to the invoice's usage
lines to the cent — in the API (JSON and CSV); FOCUS exports of the invoice (CSV and Parquet) read back and checked
against it."""

import csv
import io
from decimal import Decimal

import pyarrow.parquet as pq
import pytest
import time_machine
from rest_framework.test import APIClient

from billing import services as billing
from billing.choices import LineKind
from billing.models import AllocationUsage, BillingTerms, Invoice
from billing.selectors.allocation import usage_breakdown
from billing.services import focus
from broker import services
from broker.models import Allocation, Lease
from core.errors import PermissionDenied, ValidationFailed
from tenants import services as tenant_services
from tenants.access import Actor
from tenants.choices import Role
from tests.billing.test_invoicing import AFTER, JANUARY, end_lease, t
from tests.billing.test_invoicing import world as world  # the fixture, shared
from tests.factories import make_user


def labelled_lease(world, user, role, labels, *, gpu, requested, active, released, duration_seconds=7200):
    actor = Actor(user=user, tenant=world.acme, role=role)
    with time_machine.travel(requested, tick=False):
        lease, _ = services.lease_request(actor=actor, project="vision", gpu=gpu, duration_seconds=duration_seconds,
                                          labels=labels)
        services.schedule_cycle()
    for allocation in Allocation.objects.filter(lease=lease):
        with time_machine.travel(active, tick=False):
            services.allocation_ready(allocation=allocation, instance={"device_uuid": "X"}, now=active)
    return end_lease(lease, released)


def three_leases(world):
    mig = {"kind": "mig", "profile": "1g.10gb", "model": "H100-80GB"}
    a = labelled_lease(world, world.member, Role.MEMBER, {"team": "vision", "cost-center": "cc-1"}, gpu=mig,
                       requested=t(1, 10), active=t(1, 10, 1), released=t(1, 11, 21, 7))
    b = labelled_lease(world, world.admin, Role.ADMIN, {"team": "nlp"}, gpu=mig,
                       requested=t(1, 10, 2), active=t(1, 10, 3), released=t(1, 10, 40, 13))
    c = labelled_lease(world, world.member, Role.MEMBER, {}, gpu=mig,
                       requested=t(1, 10, 4), active=t(1, 10, 5), released=t(1, 10, 17, 59))
    return a, b, c


def test_labels_refused_unless_the_tenant_allows_the_key(world):
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    gpu = {"kind": "mig", "profile": "1g.10gb"}
    with pytest.raises(ValidationFailed) as refused:
        services.lease_request(actor=actor, project="vision", gpu=gpu, labels={"owner": "max"})
    assert refused.value.field == "labels.owner" and "team" in refused.value.message
    with pytest.raises(ValidationFailed) as bad_value:
        services.lease_request(actor=actor, project="vision", gpu=gpu, labels={"team": "no;semicolons"})
    assert bad_value.value.field == "labels.team"
    assert not Lease.objects.exists()  # nothing half-written
    with pytest.raises(PermissionDenied):
        tenant_services.tenant_label_keys_set(actor=actor, keys=["owner"])
    admin = Actor(user=world.admin, tenant=world.acme, role=Role.ADMIN)
    with pytest.raises(ValidationFailed) as bad_key:
        tenant_services.tenant_label_keys_set(actor=admin, keys=["Owner!"])
    assert bad_key.value.field == "keys"
    tenant_services.tenant_label_keys_set(actor=admin, keys=["owner", "team"])
    world.acme.refresh_from_db()
    lease, _ = services.lease_request(actor=Actor(user=world.member, tenant=world.acme, role=Role.MEMBER),
                                      project="vision", gpu=gpu, labels={"owner": "max"})
    assert Lease.objects.get(pk=lease.pk).labels == {"owner": "max"}


def test_labels_reach_the_usage_rows_and_the_breakdowns_add_up_to_the_invoice(world):
    a, _b, c = three_leases(world)
    BillingTerms.objects.create(tenant=world.acme, effective_from=t(1, 0), discount_pct=Decimal(10))
    billing.invoice_run(period=JANUARY, now=AFTER)
    rows = {(row.lease_id, row.hour_start): row.labels for row in AllocationUsage.objects.all()}
    assert rows[(a.pk, t(1, 11))] == {"cost-center": "cc-1", "team": "vision"}
    assert rows[(c.pk, t(1, 10))] == {}
    invoice = Invoice.objects.get(tenant=world.acme, period=JANUARY)
    usage_minor = sum(line.amount_minor for line in invoice.lines.all() if line.kind == LineKind.USAGE)
    by_team = usage_breakdown(tenant=world.acme, period=JANUARY, by="label:team")
    amounts = {g["name"]: g["amount_minor"] for g in by_team["groups"]}
    assert set(amounts) == {"vision", "nlp", "(unlabelled)"}
    assert sum(amounts.values()) == by_team["total_minor"] == usage_minor
    # the shares follow the GPU time: a held 80 min 7 s, b 37 min 13 s, c 12 min 59 s of one same-priced slice
    assert amounts["vision"] > amounts["nlp"] > amounts["(unlabelled)"] > 0
    by_user = usage_breakdown(tenant=world.acme, period=JANUARY, by="user")
    users = {g["name"]: g["amount_minor"] for g in by_user["groups"]}
    assert set(users) == {"max", "ann"} and sum(users.values()) == usage_minor
    assert abs(users["ann"] - amounts["nlp"]) <= 1  # a largest-remainder cent may fall differently

    client = world.client("viewer")
    answer = client.get("/api/v1/usage/breakdown", {"period": "2026-01", "by": "label:cost-center"})
    assert answer.status_code == 200, answer.content
    assert {g["name"] for g in answer.json()["groups"]} == {"cc-1", "(unlabelled)"}
    assert answer.json()["total_minor"] == usage_minor
    answer = client.get(f"/api/v1/invoices/{invoice.pk}/breakdown.csv", {"by": "user"})
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(answer.content.decode())))
    assert {row["name"] for row in table} >= {"max", "ann", "usage total", "invoice total"}
    total = next(row for row in table if row["name"] == "invoice total")
    assert Decimal(total["amount"]) == Decimal(invoice.total_minor) / 100
    bad = client.get("/api/v1/usage/breakdown", {"by": "colour"})
    assert bad.status_code == 400 and bad.json()["field"] == "by"
    assert world.client("outsider").get(f"/api/v1/invoices/{invoice.pk}/breakdown").status_code == 404


def test_focus_export_reads_back_to_the_invoice_total(world):
    three_leases(world)
    BillingTerms.objects.create(tenant=world.acme, effective_from=t(1, 0), discount_pct=Decimal("7.5"),
                                monthly_commit_minor=100_000)
    billing.invoice_run(period=JANUARY, now=AFTER)
    invoice = Invoice.objects.get(tenant=world.acme, period=JANUARY)
    assert {line.kind for line in invoice.lines.all()} == {LineKind.USAGE, LineKind.DISCOUNT, LineKind.COMMIT}
    client = world.client("member")
    answer = client.get(f"/api/v1/invoices/{invoice.pk}/focus.csv")
    assert answer.status_code == 200, answer.content
    rows = list(csv.DictReader(io.StringIO(answer.content.decode())))
    assert list(rows[0]) == focus.FOCUS_COLUMNS
    assert len(rows) == invoice.lines.count()  # one row per charge
    assert sum(Decimal(row["BilledCost"]) for row in rows) == Decimal(invoice.total_minor) / 100
    assert {row["ChargeCategory"] for row in rows} == {"Usage", "Credit", "Purchase"}
    usage = next(row for row in rows if row["ChargeCategory"] == "Usage")
    assert usage["BillingCurrency"] == "USD" and usage["BillingPeriodStart"] == "2026-01-01T00:00:00Z"
    assert usage["SubAccountId"] == "acme/vision" and usage["ConsumedUnit"] == "GPU-Hours"
    answer = client.get(f"/api/v1/invoices/{invoice.pk}/focus.parquet")
    assert answer.status_code == 200 and answer["Content-Type"] == "application/vnd.apache.parquet"
    table = pq.read_table(io.BytesIO(answer.content))
    assert table.column_names == focus.FOCUS_COLUMNS
    assert sum(table.column("BilledCost").to_pylist()) == Decimal(invoice.total_minor) / 100
    assert world.client("outsider").get(f"/api/v1/invoices/{invoice.pk}/focus.csv").status_code == 404
    assert client.get("/api/v1/billing/focus.csv", {"period": "2026-01", "status": "all"}).status_code == 403


def test_staff_focus_export_holds_every_tenants_invoice(world):
    three_leases(world)
    billing.invoice_run(period=JANUARY, now=AFTER)
    make_user("root", is_staff=True)
    client = APIClient()
    assert client.login(username="root", password="pw-root")
    answer = client.get("/api/v1/billing/focus.csv", {"period": "2026-01"})
    assert answer.status_code == 200, answer.content
    rows = list(csv.DictReader(io.StringIO(answer.content.decode())))
    invoice = Invoice.objects.get(tenant=world.acme, period=JANUARY)
    assert {row["BillingAccountId"] for row in rows} == {"acme"}
    assert sum(Decimal(row["BilledCost"]) for row in rows) == Decimal(invoice.total_minor) / 100
    assert client.get("/api/v1/billing/focus.csv", {"period": "2026-13"}).json()["field"] == "period"
