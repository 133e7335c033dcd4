"""Corrections and prepaid credit over HTTP: staff issue credit notes, void, record payments and refunds and
grant credit; the tenant reads its credit notes (JSON, CSV, PDF), its credit balance and each invoice's balance
due; the other tenant sees none of it; bad input is problem+json naming the field and writes nothing."""

import csv
import io
from datetime import UTC, datetime

import pytest
from rest_framework.test import APIClient

from billing import services as billing
from billing.models import CreditGrant, CreditNote, Payment
from tenants.models import AuditEvent
from tests.billing.test_corrections import NOW, draft
from tests.factories import make_user, make_world


@pytest.fixture
def world(db):
    return make_world()


@pytest.fixture
def staff(world):
    make_user("root", is_staff=True)
    client = APIClient()
    assert client.login(username="root", password="pw-root")
    return client


def problem(answer, status, field):
    assert answer.status_code == status, answer.content
    assert answer["Content-Type"].startswith("application/problem+json")
    assert answer.json()["field"] == field


def test_credit_note_void_payment_refund_and_balance_over_http(world, staff):
    invoice = billing.invoice_finalize(invoice=draft(world.acme, [1000, 500]), now=NOW)
    answer = staff.post(f"/api/v1/billing/invoices/{invoice.pk}/credit-notes",
                        {"reason": "duplicate", "memo": "double hour", "lines": [{"position": 2, "amount_minor": 200}]},
                        format="json")
    assert answer.status_code == 201, answer.content
    note = answer.json()
    assert note["number"] == f"{invoice.number}-CN01" and note["amount"] == "2.00"
    assert note["lines"] == [{"position": 2, "description": "Credit of line 2: usage 2", "amount_minor": 200}]
    paid = staff.post(f"/api/v1/billing/invoices/{invoice.pk}/payments", {"amount_minor": 1300, "reference": "wire"},
                      format="json")
    assert paid.status_code == 201, paid.content
    refund = staff.post(f"/api/v1/billing/payments/{paid.json()['id']}/refunds",
                        {"amount_minor": 100, "reason": "goodwill"}, format="json")
    assert refund.status_code == 201, refund.content
    balance = staff.get(f"/api/v1/billing/invoices/{invoice.pk}").json()
    assert balance["balance_due_minor"] == 1500 - 200 - 1300 + 100 == 100
    # the tenant reads the same balance on its invoice, and its credit notes
    viewer = world.client("viewer")
    mine = viewer.get(f"/api/v1/invoices/{invoice.pk}").json()
    assert (mine["credit_notes_minor"], mine["payments_minor"], mine["refunds_minor"], mine["balance_due_minor"]) == (
        200, 1300, 100, 100)
    listed = viewer.get("/api/v1/credit-notes").json()["results"]
    assert [n["number"] for n in listed] == [note["number"]]
    rows = list(csv.DictReader(io.StringIO(viewer.get(f"/api/v1/credit-notes/{note['id']}.csv").content.decode())))
    assert [(r["invoice_line_position"], r["amount"]) for r in rows] == [("2", "2.00"), ("", "2.00")]
    pdf = viewer.get(f"/api/v1/credit-notes/{note['id']}.pdf")
    assert pdf.status_code == 200 and pdf.content.startswith(b"%PDF")
    # the other tenant: 404 on the note, nothing listed
    outsider = world.client("outsider")
    assert outsider.get(f"/api/v1/credit-notes/{note['id']}").status_code == 404
    assert outsider.get(f"/api/v1/credit-notes/{note['id']}.csv").status_code == 404
    assert outsider.get("/api/v1/credit-notes").json()["results"] == []
    # a tenant member is no staff
    assert world.client("owner").post(f"/api/v1/billing/invoices/{invoice.pk}/credit-notes",
                                      {"reason": "duplicate", "memo": "m", "amount_minor": 1},
                                      format="json").status_code == 403


def test_void_over_http_issues_the_credit_note(world, staff):
    invoice = billing.invoice_finalize(invoice=draft(world.acme, [800]), now=NOW)
    answer = staff.post(f"/api/v1/billing/invoices/{invoice.pk}/void", {"memo": "billed the wrong tenant"},
                        format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["status"] == "void" and answer.json()["balance_due_minor"] == 0
    assert CreditNote.objects.get(invoice=invoice).voids_invoice
    problem(staff.post(f"/api/v1/billing/invoices/{invoice.pk}/void", {"memo": "again"}, format="json"), 409,
            "invoice")


@pytest.mark.parametrize(("path", "body", "status", "field"), [
    ("credit-notes", {"reason": "duplicate", "memo": "m", "amount_minor": 10**6}, 400, "amount_minor"),
    ("credit-notes", {"reason": "nope", "memo": "m", "amount_minor": 1}, 400, "reason"),
    ("credit-notes", {"reason": "duplicate", "memo": "m", "lines": [{"position": 7, "amount_minor": 1}]}, 400,
     "lines[0].position"),
    ("credit-notes", {"reason": "duplicate", "memo": "m"}, 400, "lines"),
    ("payments", {"amount_minor": -5}, 400, "amount_minor"),
    ("void", {}, 400, "memo"),
])
def test_bad_corrections_are_problems_naming_the_field(world, staff, path, body, status, field):
    invoice = billing.invoice_finalize(invoice=draft(world.acme, [1000]), now=NOW)
    before = AuditEvent.objects.count()
    problem(staff.post(f"/api/v1/billing/invoices/{invoice.pk}/{path}", body, format="json"), status, field)
    assert not CreditNote.objects.exists() and not Payment.objects.exists()
    assert AuditEvent.objects.count() == before
    problem(staff.post(f"/api/v1/billing/invoices/999999/{path}", body, format="json"), 404, "id")


def test_credit_grants_over_http_and_the_tenant_balance(world, staff):
    answer = staff.post("/api/v1/tenants/acme/credit-grants",
                        {"amount_minor": 5000, "reason": "prepaid Q1", "priority": 1,
                         "expires_at": "2099-01-01T00:00:00Z"}, format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["available_minor"] == {"USD": 5000}
    problem(staff.post("/api/v1/tenants/acme/credit-grants", {"amount_minor": 5, "reason": "x", "currency": "EUR"},
                       format="json"), 400, "currency")
    problem(staff.post("/api/v1/tenants/acme/credit-grants", {"amount_minor": 0, "reason": "x"}, format="json"),
            400, "amount_minor")
    assert CreditGrant.objects.count() == 1
    invoice = billing.invoice_finalize(invoice=draft(world.acme, [1200]),
                                       now=datetime(2026, 2, 2, tzinfo=UTC).replace(year=2098))
    mine = world.client("viewer").get("/api/v1/credits").json()
    assert mine["available_minor"] == {"USD": 3800}
    assert [(g["amount_minor"], g["remaining_minor"], g["usable"]) for g in mine["grants"]] == [(5000, 3800, True)]
    assert world.client("viewer").get(f"/api/v1/invoices/{invoice.pk}").json()["balance_due_minor"] == 0
    assert world.client("outsider").get("/api/v1/credits").json() == {"available_minor": {}, "grants": []}
