"""The staff invoice page under /ops/billing (issue 33): a credit note issued for the whole invoice or per line,
with a reason and a memo, through ``billing.services.credit_notes`` (audited); refusals shown next to their field
with nothing written; a local void; the credit notes' Stripe state; staff only."""

import pytest
from django.test import Client
from django.utils import timezone

from billing import services as billing
from billing.choices import InvoiceStatus, StripeState
from billing.models import CreditNote, CreditNoteLine, Invoice
from tenants.models import AuditEvent
from tests.billing.test_corrections import draft
from tests.factories import make_user, make_world


@pytest.fixture
def world(db):
    return make_world()


@pytest.fixture
def staff(world) -> Client:
    make_user("root", is_staff=True)
    client = Client()
    assert client.login(username="root", password="pw-root")
    return client


@pytest.fixture
def invoice(world) -> Invoice:
    now = timezone.now()
    return billing.invoice_finalize(invoice=draft(world.acme, [10000, 2550], period=now.date().replace(day=1)),
                                    now=now)


def url(invoice) -> str:
    return f"/ops/billing/invoices/{invoice.pk}"


def test_ops_invoice_page_is_linked_from_ops_billing_and_staff_only(world, staff, invoice):
    assert f'href="{url(invoice)}"' in staff.get("/ops/billing").content.decode()
    page = staff.get(url(invoice)).content.decode()
    assert invoice.number in page and "125.50 USD left to credit" in page and 'data-form="void"' in page
    member = Client()
    assert member.login(username="alice", password="pw-alice")
    assert member.get(url(invoice)).status_code == 403
    assert staff.get("/ops/billing/invoices/999999").status_code == 404


def test_ops_invoice_page_issues_a_whole_invoice_credit_note(world, staff, invoice):
    answer = staff.post(url(invoice), {"scope": "whole", "amount": "12.50", "reason": "duplicate",
                                       "memo": "double-metered hour"}, follow=True)
    assert answer.status_code == 200
    note = CreditNote.objects.get(invoice=invoice)
    assert (note.amount_minor, note.reason, note.memo, note.stripe_state) == (
        1250, "duplicate", "double-metered hour", StripeState.NOT_SENT)
    assert note.issued_by.username == "root"
    page = answer.content.decode()
    assert f"Credit note {note.number} issued for 12.50 USD" in page and "113.00 USD left to credit" in page
    assert AuditEvent.objects.filter(action="billing.credit_note_issue", target=note.number).exists()


def test_ops_invoice_page_issues_a_per_line_credit_note(world, staff, invoice):
    staff.post(url(invoice), {"scope": "lines", "line_1": "", "line_2": "5.50", "amount": "",
                              "reason": "product_unsatisfactory", "memo": "slow node"})
    note = CreditNote.objects.get(invoice=invoice)
    [line] = CreditNoteLine.objects.filter(credit_note=note)
    assert (line.invoice_line.position, line.amount_minor, note.amount_minor) == (2, 550, 550)
    page = staff.get(url(invoice)).content.decode()
    assert "5.50 USD" in page and note.number in page and "Not sent" in page


@pytest.mark.parametrize(("form", "field", "message"), [
    ({"scope": "whole", "amount": "12.5x", "reason": "duplicate", "memo": "m"}, "cn-amount",
     "amount must be an amount in USD"),
    ({"scope": "whole", "amount": "999.00", "reason": "duplicate", "memo": "m"}, "cn-amount", "left to credit"),
    ({"scope": "whole", "amount": "1.00", "reason": "", "memo": "m"}, "cn-reason", "reason must be one of"),
    ({"scope": "whole", "amount": "1.00", "reason": "duplicate", "memo": " "}, "cn-memo", "memo is required"),
    ({"scope": "lines", "line_2": "30.00", "reason": "duplicate", "memo": "m"}, "cn-line_2", "line 2 has"),
    ({"scope": "lines", "line_1": "0", "reason": "duplicate", "memo": "m"}, "cn-line_1", "positive whole number"),
    ({"scope": "lines", "reason": "duplicate", "memo": "m"}, "cn-lines", "at least one line"),
])
def test_ops_invoice_page_shows_refusals_by_field_and_writes_nothing(world, staff, invoice, form, field, message):
    answer = staff.post(url(invoice), form)
    assert answer.status_code == 400
    page = answer.content.decode()
    assert f'id="{field}-e"' in page and message in page.split(f'id="{field}-e">')[1].split("</p>")[0]
    assert not CreditNote.objects.exists()
    assert not AuditEvent.objects.filter(action="billing.credit_note_issue").exists()


def test_ops_invoice_page_voids_the_invoice_with_its_credit_note(world, staff, invoice):
    refused = staff.post(url(invoice), {"action": "void", "void_memo": ""})
    assert refused.status_code == 400 and 'id="void-memo-e"' in refused.content.decode()
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.FINALIZED
    answer = staff.post(url(invoice), {"action": "void", "void_memo": "wrong tenant"}, follow=True)
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.VOID
    note = CreditNote.objects.get(invoice=invoice, voids_invoice=True)
    page = answer.content.decode()
    assert note.number in page and "(void)" in page and 'data-form="void"' not in page
    assert "only a finalized or paid invoice takes a credit note" in page
    assert AuditEvent.objects.filter(action="billing.invoice_void", target=invoice.number).exists()
