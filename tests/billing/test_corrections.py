"""Corrections after finalisation and prepaid credits (issue 33 items 1, 2, 5): credit notes whole or per line,
a local void with its credit note, payments and refunds, credit grants drawn at finalisation in priority order,
the expiring-credit notice; every row immutable in the database; balance due = total − credit notes − credits
drawn − payments + refunds after any sequence of corrections, in every currency."""

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing import services as billing
from billing.choices import InvoiceStatus, LineKind
from billing.models import (
    BillingTerms,
    CreditDraw,
    CreditGrant,
    CreditNote,
    CreditNoteLine,
    Invoice,
    InvoiceLine,
    Payment,
    Refund,
)
from billing.selectors.balances import credit_balance, invoice_balance
from billing.services.credit_notes import credit_note_issue, invoice_void, payment_record, refund_record
from billing.services.credits import credit_expiry_notify, credit_grant_create
from core.errors import Conflict, ValidationFailed
from notifications.models import Notification
from tenants.models import AuditEvent
from tests.factories import make_tenant, make_world

JANUARY = date(2026, 1, 1)
NOW = datetime(2026, 2, 2, 12, tzinfo=UTC)


def draft(tenant, amounts, *, period=JANUARY):
    """A draft invoice of ``amounts`` (one usage line each), as invoice_build leaves one (test data)."""
    invoice = Invoice.objects.create(tenant=tenant, period=period, currency=tenant.currency, computed_at=NOW,
                                     subtotal_minor=sum(amounts), total_minor=sum(amounts))
    InvoiceLine.objects.bulk_create([
        InvoiceLine(invoice=invoice, position=n, kind=LineKind.USAGE, description=f"usage {n}", unit="GPU-hour",
                    quantity=Decimal(1), unit_price=Decimal(0), amount_minor=amount)
        for n, amount in enumerate(amounts, start=1)])
    return invoice


@pytest.fixture
def world(db):
    return make_world()


def test_credit_notes_whole_and_per_line_follow_the_balance(world):
    invoice = billing.invoice_finalize(invoice=draft(world.acme, [1000, 250]), now=NOW)
    note = credit_note_issue(invoice=invoice, reason="duplicate", memo="double-metered hour",
                             lines=[{"position": 2, "amount_minor": 100}], by_user=world.owner, now=NOW)
    assert note.number == f"{invoice.number}-CN01" and note.amount_minor == 100
    whole = credit_note_issue(invoice=invoice, reason="product_unsatisfactory", memo="slow node",
                              amount_minor=300, now=NOW)
    assert whole.number.endswith("CN02")
    assert invoice_balance(invoice=invoice)["balance_due_minor"] == 1250 - 400
    assert AuditEvent.objects.filter(action="billing.credit_note_issue", tenant=world.acme).count() == 2
    # the invoice itself is untouched
    invoice.refresh_from_db()
    assert invoice.total_minor == 1250 and invoice.status == InvoiceStatus.FINALIZED


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"lines": [{"position": 2, "amount_minor": 251}]}, "lines[0].amount_minor"),
    ({"lines": [{"position": 9, "amount_minor": 1}]}, "lines[0].position"),
    ({"lines": [{"position": 1, "amount_minor": 1}, {"position": 1, "amount_minor": 1}]}, "lines[1].position"),
    ({"lines": [{"position": 1, "amount_minor": 0}]}, "lines[0].amount_minor"),
    ({"lines": []}, "lines"),
    ({"amount_minor": 1251}, "amount_minor"),
    ({"amount_minor": "12"}, "amount_minor"),
    ({"amount_minor": 10, "lines": [{"position": 1, "amount_minor": 1}]}, "lines"),
    ({"amount_minor": 10, "reason": "because"}, "reason"),
    ({"amount_minor": 10, "memo": "  "}, "memo"),
])
def test_a_bad_credit_note_names_the_field_and_writes_nothing(world, kwargs, field):
    invoice = billing.invoice_finalize(invoice=draft(world.acme, [1000, 250]), now=NOW)
    values = {"reason": "duplicate", "memo": "m", **kwargs}
    with pytest.raises(ValidationFailed) as error:
        credit_note_issue(invoice=invoice, now=NOW, **values)
    assert error.value.field == field
    assert not CreditNote.objects.exists() and not CreditNoteLine.objects.exists()


def test_a_draft_takes_no_credit_note(world):
    invoice = draft(world.acme, [500])
    with pytest.raises(Conflict):
        credit_note_issue(invoice=invoice, reason="duplicate", memo="m", amount_minor=1, now=NOW)


def test_the_database_keeps_credit_notes_immutable_and_within_the_invoice(world):
    invoice = billing.invoice_finalize(invoice=draft(world.acme, [1000]), now=NOW)
    note = credit_note_issue(invoice=invoice, reason="duplicate", memo="m", amount_minor=600, now=NOW)
    for attempt in (lambda: CreditNote.objects.filter(pk=note.pk).update(amount_minor=1),
                    lambda: CreditNote.objects.filter(pk=note.pk).delete(),
                    lambda: CreditNoteLine.objects.filter(credit_note=note).update(amount_minor=1),
                    lambda: CreditNote.objects.create(  # beyond the invoice's total, whatever code tries
                        tenant=world.acme, invoice=invoice, number="X-1", currency="USD", reason="duplicate",
                        memo="m", amount_minor=500, issued_at=NOW)):
        with pytest.raises(IntegrityError), transaction.atomic():
            attempt()
    # a note whose lines do not add up to it fails at commit (deferred check)
    with pytest.raises(IntegrityError), transaction.atomic():
        CreditNote.objects.create(tenant=world.acme, invoice=invoice, number="X-2", currency="USD",
                                  reason="duplicate", memo="m", amount_minor=5, issued_at=NOW)
        with transaction.get_connection().cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    # the Stripe bookkeeping stays writable
    CreditNote.objects.filter(pk=note.pk).update(stripe_error="x")


def test_a_void_issues_the_matching_credit_note(world):
    invoice = billing.invoice_finalize(invoice=draft(world.acme, [1000, 300]), now=NOW)
    credit_note_issue(invoice=invoice, reason="duplicate", memo="m", amount_minor=200, now=NOW)
    voided = invoice_void(invoice=invoice, memo="wrong tenant", by_user=world.owner, now=NOW)
    assert voided.status == InvoiceStatus.VOID and voided.voided_at == NOW
    void_note = CreditNote.objects.get(invoice=invoice, voids_invoice=True)
    assert void_note.amount_minor == 1100 and void_note.reason == "order_change"
    assert invoice_balance(invoice=invoice)["balance_due_minor"] == 0
    assert AuditEvent.objects.filter(action="billing.invoice_void", target=invoice.number).exists()
    with pytest.raises(Conflict):
        invoice_void(invoice=invoice, memo="again", now=NOW)


def test_a_paid_invoice_is_credited_and_refunded_not_voided(world):
    invoice = billing.invoice_finalize(invoice=draft(world.acme, [1000]), now=NOW)
    payment = payment_record(invoice=invoice, amount_minor=1000, reference="bank 42", now=NOW)
    Invoice.objects.filter(pk=invoice.pk).update(status=InvoiceStatus.PAID, paid_at=NOW)
    with pytest.raises(Conflict):
        invoice_void(invoice=invoice, memo="m", now=NOW)
    credit_note_issue(invoice=invoice, reason="product_unsatisfactory", memo="m", amount_minor=300, now=NOW)
    assert invoice_balance(invoice=invoice)["balance_due_minor"] == -300  # owed to the tenant
    refund_record(payment=payment, amount_minor=300, reason="credit note refunded", now=NOW)
    assert invoice_balance(invoice=invoice)["balance_due_minor"] == 0
    with pytest.raises(ValidationFailed) as error:
        refund_record(payment=payment, amount_minor=701, reason="too much", now=NOW)
    assert error.value.field == "amount_minor" and Refund.objects.count() == 1
    for attempt in (lambda: Payment.objects.filter(pk=payment.pk).delete(),
                    lambda: Refund.objects.update(amount_minor=1)):
        with pytest.raises(IntegrityError), transaction.atomic():
            attempt()


def test_credit_grants_are_drawn_at_finalisation_in_priority_order(world):
    late = credit_grant_create(tenant=world.acme, amount_minor=500, reason="promo", priority=5, now=NOW)
    first = credit_grant_create(tenant=world.acme, amount_minor=300, reason="prepaid", priority=0,
                                expires_at=NOW + timedelta(days=30), now=NOW - timedelta(days=1))
    expired = credit_grant_create(tenant=world.acme, amount_minor=900, reason="old", priority=0,
                                  expires_at=NOW - timedelta(hours=1), now=NOW - timedelta(days=10))
    invoice = billing.invoice_finalize(invoice=draft(world.acme, [700]), now=NOW)
    draws = {d.grant_id: d.amount_minor for d in CreditDraw.objects.filter(invoice=invoice)}
    assert draws == {first.pk: 300, late.pk: 400}
    assert expired.pk not in draws
    assert invoice_balance(invoice=invoice) == {
        "total_minor": 700, "credit_notes_minor": 0, "credits_drawn_minor": 700, "payments_minor": 0,
        "refunds_minor": 0, "balance_due_minor": 0}
    balance = credit_balance(tenant=world.acme, now=NOW)
    assert balance["available_minor"] == {"USD": 100}
    # the next invoice draws what is left; a grant never goes below zero (the database checks it too)
    february = billing.invoice_finalize(invoice=draft(world.acme, [250], period=date(2026, 2, 1)), now=NOW)
    assert invoice_balance(invoice=february)["balance_due_minor"] == 150
    with pytest.raises(IntegrityError), transaction.atomic():
        CreditDraw.objects.create(grant=late, invoice=february, amount_minor=1, drawn_at=NOW)
    with pytest.raises(IntegrityError), transaction.atomic():
        CreditGrant.objects.filter(pk=late.pk).update(amount_minor=10**6)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"amount_minor": 0}, "amount_minor"), ({"currency": "EUR"}, "currency"), ({"priority": -1}, "priority"),
    ({"expires_at": NOW - timedelta(seconds=1)}, "expires_at"), ({"reason": ""}, "reason")])
def test_a_bad_grant_names_the_field(world, kwargs, field):
    values = {"amount_minor": 100, "reason": "r", **kwargs}
    with pytest.raises(ValidationFailed) as error:
        credit_grant_create(tenant=world.acme, now=NOW, **values)
    assert error.value.field == field and not CreditGrant.objects.exists()


def test_the_invoice_run_draws_credits_and_keeps_the_commitment_shortfall(world):
    BillingTerms.objects.create(tenant=world.acme, effective_from=datetime(2026, 1, 1, tzinfo=UTC),
                                monthly_commit_minor=5000)
    credit_grant_create(tenant=world.acme, amount_minor=3000, reason="prepaid", now=datetime(2025, 12, 1, tzinfo=UTC))
    result = billing.invoice_run(period=JANUARY, finalize=True, meter=False, now=NOW)
    assert result["finalized"] == 1
    invoice = Invoice.objects.get(tenant=world.acme, period=JANUARY)
    assert [line.kind for line in invoice.lines.all()] == [LineKind.COMMIT]
    assert invoice.total_minor == 5000
    assert invoice_balance(invoice=invoice)["credits_drawn_minor"] == 3000
    assert invoice_balance(invoice=invoice)["balance_due_minor"] == 2000


def test_an_expiring_grant_is_announced_once_through_the_outbox(world, settings):
    settings.BILLING_CREDIT_EXPIRY_NOTICE_DAYS = 7
    soon = credit_grant_create(tenant=world.acme, amount_minor=800, reason="promo",
                               expires_at=NOW + timedelta(days=3), now=NOW - timedelta(days=20))
    credit_grant_create(tenant=world.acme, amount_minor=800, reason="later", expires_at=NOW + timedelta(days=30),
                        now=NOW - timedelta(days=20))
    assert credit_expiry_notify(now=NOW) == 1
    assert credit_expiry_notify(now=NOW) == 0
    notification = Notification.objects.get(kind="credit.expiring", tenant=world.acme)
    assert notification.payload["data"]["grant"] == soon.pk
    assert notification.payload["data"]["remaining_minor"] == 800
    assert AuditEvent.objects.filter(action="billing.credit_expiring").count() == 1


# -- property: the balance follows any sequence of corrections, in every currency ----------------------------
OPS = st.lists(st.one_of(
    st.tuples(st.just("whole"), st.integers(1, 5000)),
    st.tuples(st.just("line"), st.integers(1, 4), st.integers(1, 3000)),
    st.tuples(st.just("pay"), st.integers(1, 6000)),
    st.tuples(st.just("refund"), st.integers(0, 5), st.integers(1, 3000)),
), max_size=12)


@pytest.fixture
def tenants(db):
    return {currency: make_tenant(f"t-{currency.lower()}", currency=currency) for currency in ("USD", "EUR", "JPY")}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(currency=st.sampled_from(["USD", "EUR", "JPY"]), amounts=st.lists(st.integers(1, 4000), min_size=1,
                                                                               max_size=4),
       grants=st.lists(st.integers(1, 3000), max_size=3), ops=OPS)
def test_property_balance_due_after_any_sequence_of_corrections(tenants, currency, amounts, grants, ops):
    tenant = tenants[currency]
    with transaction.atomic():
        for n, grant in enumerate(grants):
            credit_grant_create(tenant=tenant, amount_minor=grant, reason="g", priority=n % 2,
                                now=NOW - timedelta(days=1))
        invoice = billing.invoice_finalize(invoice=draft(tenant, amounts), now=NOW)
        total = sum(amounts)
        drawn = min(total, sum(grants))
        credited, paid, refunded, payments = 0, 0, 0, []
        line_credits = [0] * len(amounts)
        for op in ops:
            rows = (CreditNote.objects.count(), Payment.objects.count(), Refund.objects.count())
            try:
                if op[0] == "whole":
                    credit_note_issue(invoice=invoice, reason="duplicate", memo="m", amount_minor=op[1], now=NOW)
                    credited += op[1]
                elif op[0] == "line":
                    credit_note_issue(invoice=invoice, reason="duplicate", memo="m", now=NOW,
                                      lines=[{"position": op[1], "amount_minor": op[2]}])
                    credited += op[2]
                    line_credits[op[1] - 1] += op[2]
                elif op[0] == "pay":
                    payments.append([payment_record(invoice=invoice, amount_minor=op[1], now=NOW), 0])
                    paid += op[1]
                elif payments:
                    payment = payments[op[1] % len(payments)]
                    refund_record(payment=payment[0], amount_minor=op[2], reason="r", now=NOW)
                    payment[1] += op[2]
                    refunded += op[2]
            except ValidationFailed:
                # refused: nothing written
                assert rows == (CreditNote.objects.count(), Payment.objects.count(), Refund.objects.count())
            assert credited <= total and all(c <= a for c, a in zip(line_credits, amounts, strict=True))
            assert all(p[1] <= p[0].amount_minor for p in payments)
            balance = invoice_balance(invoice=invoice)
            assert balance["balance_due_minor"] == total - credited - drawn - paid + refunded
            assert balance["credit_notes_minor"] == credited and balance["credits_drawn_minor"] == drawn
        transaction.set_rollback(True)
