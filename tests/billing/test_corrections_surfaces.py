"""Corrections and prepaid credit in the portal and the admin: the tenant's dashboard shows its credit balance,
``/ops/billing`` lists the month's credit notes, payments, refunds and open balances, and the admin adds grants,
credit notes and payments through the services (refusals as messages, nothing saved) and never changes them."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from billing import services as billing
from billing.models import CreditGrant, CreditNote
from billing.services.credit_notes import credit_note_issue, payment_record
from billing.services.credits import credit_grant_create
from tenants.models import AuditEvent
from tests.billing.test_corrections import draft
from tests.factories import make_user, make_world


@pytest.fixture
def world(db):
    return make_world()


def portal(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password=f"pw-{username}")
    return client


def test_the_dashboard_shows_the_prepaid_credit_balance(world):
    assert 'data-credit="USD"' not in portal("max").get("/").content.decode()
    credit_grant_create(tenant=world.acme, amount_minor=123456, reason="prepaid",
                        expires_at=timezone.now() + timedelta(days=40))
    page = portal("max").get("/").content.decode()
    assert 'data-credit="USD"' in page and "1,234.56 USD" in page
    assert "Prepaid credit" not in portal("bob").get("/").content.decode()  # the other tenant's dashboard


def test_ops_billing_lists_corrections_and_open_balances(world):
    now = timezone.now()
    period = now.date().replace(day=1)
    invoice = billing.invoice_finalize(invoice=draft(world.acme, [1000], period=period), now=now)
    credit_note_issue(invoice=invoice, reason="duplicate", memo="twice metered", amount_minor=250, now=now)
    payment_record(invoice=invoice, amount_minor=500, reference="wire-77", now=now)
    make_user("root", is_staff=True)
    page = portal("root").get("/ops/billing").content.decode()
    assert f"{invoice.number}-CN01" in page and "twice metered" in page and "wire-77" in page
    assert "2.50 USD" in page  # balance due 10.00 − 2.50 − 5.00
    assert portal("alice").get("/ops/billing").status_code == 403
    # the tenant's invoice list shows the same balance due
    mine = portal("alice").get("/invoices/").content.decode()
    assert f'data-balance="{invoice.pk}">2.50 USD' in mine


def test_admin_adds_grants_and_credit_notes_through_the_services(world, admin_client):
    refused = admin_client.post("/admin/billing/creditgrant/add/", {
        "tenant": world.acme.pk, "amount_minor": "100", "priority": "0", "reason": "",
        "expires_at_0": "", "expires_at_1": ""}, follow=True)
    assert not CreditGrant.objects.exists()
    assert refused.status_code == 200
    admin_client.post("/admin/billing/creditgrant/add/", {
        "tenant": world.acme.pk, "amount_minor": "700", "priority": "2", "reason": "goodwill",
        "expires_at_0": "", "expires_at_1": ""}, follow=True)
    grant = CreditGrant.objects.get()
    assert grant.amount_minor == 700 and AuditEvent.objects.filter(action="billing.credit_grant_create").exists()
    change = admin_client.get(f"/admin/billing/creditgrant/{grant.pk}/change/").content.decode()
    assert 'name="_save"' not in change and "/delete/" not in change

    invoice = billing.invoice_finalize(invoice=draft(world.acme, [1000]))
    response = admin_client.post("/admin/billing/creditnote/add/", {
        "invoice": invoice.pk, "reason": "duplicate", "memo": "admin credit", "amount_minor": "5000"}, follow=True)
    assert any("amount_minor" in str(m) for m in response.context["messages"]) and not CreditNote.objects.exists()
    admin_client.post("/admin/billing/creditnote/add/", {
        "invoice": invoice.pk, "reason": "duplicate", "memo": "admin credit", "amount_minor": "100"}, follow=True)
    # the grant (700) was drawn at finalisation: 1000 − 700 − 100
    note = CreditNote.objects.get()
    assert note.amount_minor == 100 and note.lines.get().amount_minor == 100
    assert admin_client.get(f"/admin/billing/creditnote/{note.pk}/change/").status_code == 200
