"""The portal's cost allocation and spend alert pages (issue 33): labels typed on the lease form (a key the tenant does
not allow is shown under the field, nothing written), the breakdown page and its CSV, the label keys form (admins),
the invoice's FOCUS download, the spend alert rules page and this month's alerts on the dashboard."""

import csv
import io
from decimal import Decimal

from django.test import Client

from billing import services as billing
from billing.models import Invoice
from billing.services import alerts
from broker import services as broker
from broker.models import Lease
from tenants.access import Actor
from tenants.choices import Role
from tests.billing.test_allocation import three_leases
from tests.billing.test_invoicing import AFTER, JANUARY
from tests.billing.test_invoicing import world as world  # the fixture, shared (a node, a price book)
from tests.portal.test_pages import login, text


def test_lease_form_takes_labels_and_names_a_refused_key(world):
    client = login(Client(), "max")
    form = {"project": "vision", "gpu.kind": "mig", "gpu.profile": "1g.10gb", "gpu.gang": "true",
            "workload_class": "training", "priority": "0", "duration_seconds": "3600", "idempotency_key": "k1"}
    refused = client.post("/leases/new", {**form, "labels": "owner=max"})
    assert refused.status_code == 400 and "is not allowed in this tenant" in text(refused)
    assert 'id="err-labels"' in refused.content.decode() and not Lease.objects.exists()
    made = client.post("/leases/new", {**form, "idempotency_key": "k2", "labels": "team=vision, cost-center=cc-9"})
    assert made.status_code == 302
    assert Lease.objects.get().labels == {"cost-center": "cc-9", "team": "vision"}


def test_breakdown_page_csv_label_keys_and_focus_download(world):
    three_leases(world)
    billing.invoice_run(period=JANUARY, now=AFTER)
    viewer = login(Client(), "vic")
    page = viewer.get("/usage/breakdown", {"month": "2026-01", "by": "label:team"})
    assert page.status_code == 200
    body = text(page)
    assert "vision" in body and "nlp" in body and "(unlabelled)" in body
    download = viewer.get("/usage/breakdown", {"month": "2026-01", "by": "user", "format": "csv"})
    rows = list(csv.DictReader(io.StringIO(download.content.decode())))
    assert {row["name"] for row in rows} == {"max", "ann", "usage total"}
    assert viewer.post("/usage/breakdown", {"label_keys": "owner"}).status_code == 403
    admin = login(Client(), "ann")
    refused = admin.post("/usage/breakdown", {"label_keys": "Bad Key"})
    assert refused.status_code == 400 and "is not a label key" in text(refused)
    assert admin.post("/usage/breakdown", {"label_keys": "owner, team"}).status_code == 302
    world.acme.refresh_from_db()
    assert world.acme.label_keys == ["owner", "team"]
    invoice = Invoice.objects.get(tenant=world.acme, period=JANUARY)
    assert "FOCUS CSV" in text(viewer.get(f"/invoices/{invoice.pk}"))
    focus = viewer.get(f"/invoices/{invoice.pk}/focus.csv")
    rows = list(csv.DictReader(io.StringIO(focus.content.decode())))
    assert sum(Decimal(row["BilledCost"]) for row in rows) == Decimal(invoice.total_minor) / 100
    assert login(Client(), "bob").get(f"/invoices/{invoice.pk}/focus.csv").status_code == 404


def test_spend_alert_rules_page_and_dashboard_alerts(world):
    admin = login(Client(), "ann")
    refused = admin.post("/settings/spend-alerts", {"project": "", "thresholds_pct": "50, 80", "budget": ""})
    assert refused.status_code == 400 and "give a budget_minor" in text(refused)
    assert admin.post("/settings/spend-alerts", {"project": "vision", "thresholds_pct": "100", "budget": "0.01",
                                                 "forecast": "on"}).status_code == 302
    page = text(admin.get("/settings/spend-alerts"))
    assert "project vision" in page and "100 %" in page
    assert login(Client(), "vic").post("/settings/spend-alerts", {"budget": "5"}).status_code == 403
    # a queued lease's hour is in this month's forecast: 100 % of a 0.01 USD budget
    member = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    broker.lease_request(actor=member, project="vision", gpu={"kind": "mig", "profile": "1g.10gb"})
    [alert] = alerts.spend_alerts_evaluate()
    assert alert.basis == "forecast" and alert.threshold_pct == 100
    dashboard = text(login(Client(), "max").get("/"))
    assert "Spend alerts this month" in dashboard and "reached 100% of its budget of 0.01 USD" in dashboard
