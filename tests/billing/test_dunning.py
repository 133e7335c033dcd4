"""Dunning (issue 33 item 7): a failed payment at Stripe (a signed webhook from the Stripe test server) opens a
case; reminders go out on the schedule of the tenant's dunning terms; after the grace period the tenant's new
lease requests are refused (402 problem+json, ``payment_overdue``) while running leases keep running; Stripe's
``invoice.paid`` records the payment, resolves the case and admits requests again; every step audited and
notified."""

import time
from datetime import timedelta

import pytest
from django.test import Client

from billing.choices import DunningState, InvoiceStatus
from billing.models import DunningCase, Payment
from billing.selectors.balances import invoice_balance
from billing.services import stripe_sync
from billing.services.credit_notes import credit_note_issue
from billing.services.dunning import dunning_advance, dunning_start, dunning_terms_set
from broker.models import Lease
from core.errors import ValidationFailed
from notifications.models import Notification
from tenants.models import AuditEvent
from tests.billing.test_corrections import NOW, draft
from tests.billing.test_stripe_sync import make_invoice
from tests.billing.test_stripe_sync import stripe_server as stripe_server
from tests.factories import make_world
from tests.stripe_server import build_event, post_signed

WEBHOOK = "/api/v1/billing/stripe/webhook"
LEASE = {"project": "vision", "gpu": {"kind": "mig", "profile": "1g.10gb"}}


@pytest.fixture
def world(db):
    return make_world()


def test_a_failed_payment_reminds_restricts_and_payment_restores(world, stripe_server):
    dunning_terms_set(tenant=world.acme, reminder_days=[1, 3], grace_days=5)
    invoice = make_invoice(world.acme)
    stripe_id = stripe_sync.invoice_push(invoice_id=invoice.pk)
    body = {**stripe_server.invoice(stripe_id), "attempt_count": 1}
    created = int(time.time())
    answer = post_signed(Client(), WEBHOOK, build_event("invoice.payment_failed", body, created=created),
                         stripe_server.webhook_secret).json()
    assert answer["outcome"] == "applied: payment error recorded, dunning started"
    case = DunningCase.objects.get(invoice=invoice)
    assert case.state == DunningState.OPEN and case.reminder_days == [1, 3]
    start = case.started_at
    running = world.client("member").post("/api/v1/leases", LEASE, format="json")
    assert running.status_code in (201, 202), running.content

    # day 1 and day 3: one reminder each, once
    assert dunning_advance(now=start + timedelta(hours=12)) == {"reminders": 0, "restricted": 0, "released_leases": 0}
    assert dunning_advance(now=start + timedelta(days=1, minutes=1))["reminders"] == 1
    assert dunning_advance(now=start + timedelta(days=1, minutes=2))["reminders"] == 0
    assert dunning_advance(now=start + timedelta(days=3, minutes=1))["reminders"] == 1
    reminders = Notification.objects.filter(tenant=world.acme, kind="dunning.reminder").order_by("pk")
    assert [n.payload["data"]["reminder"] for n in reminders] == [1, 2]
    assert reminders[0].payload["data"]["balance_due_minor"] == invoice.total_minor
    # still within the grace period: requests are admitted
    assert world.client("member").post("/api/v1/leases", LEASE, format="json").status_code in (201, 202)

    # past the grace period: new requests refused by name, the running lease untouched
    assert dunning_advance(now=start + timedelta(days=5, minutes=1))["restricted"] == 1
    refused = world.client("member").post("/api/v1/leases", LEASE, format="json")
    assert refused.status_code == 402 and refused["Content-Type"].startswith("application/problem+json")
    assert refused.json()["code"] == "payment_overdue" and invoice.number in refused.json()["detail"]
    assert Lease.objects.get(pk=running.json()["id"]).state not in ("released", "releasing")
    assert world.client("outsider").post("/api/v1/leases", {**LEASE, "project": "secret"},
                                         format="json").status_code in (201, 202)  # the other tenant is not dunned

    # paid at Stripe: the payment is recorded, the case resolved, requests admitted again
    paid = post_signed(Client(), WEBHOOK, build_event("invoice.paid", {**body, "amount_paid": invoice.total_minor},
                                                      created=created + 10), stripe_server.webhook_secret).json()
    assert paid["outcome"] == "applied: finalized → paid"
    assert Payment.objects.get(invoice=invoice).amount_minor == invoice.total_minor
    assert invoice_balance(invoice=invoice)["balance_due_minor"] == 0
    case.refresh_from_db()
    assert case.state == DunningState.RESOLVED and case.resolved_at is not None
    assert world.client("member").post("/api/v1/leases", LEASE, format="json").status_code in (201, 202)
    assert list(AuditEvent.objects.filter(tenant=world.acme, action__startswith="billing.dunning_")
                .order_by("pk").values_list("action", flat=True)) == [
        "billing.dunning_terms_set", "billing.dunning_start", "billing.dunning_reminder", "billing.dunning_reminder",
        "billing.dunning_restrict", "billing.dunning_resolve"]
    assert {n.kind for n in Notification.objects.filter(tenant=world.acme)} >= {
        "dunning.reminder", "dunning.restricted", "dunning.resolved"}


def test_terms_can_release_running_leases_and_a_credit_note_settles(world, settings):
    settings.BILLING_DUNNING_GRACE_DAYS = 2
    invoice = draft(world.acme, [900])
    from billing import services as billing

    invoice = billing.invoice_finalize(invoice=invoice, now=NOW)
    running = world.client("member").post("/api/v1/leases", LEASE, format="json").json()
    dunning_terms_set(tenant=world.acme, reminder_days=[], grace_days=1, stop_running_leases=True)
    case = dunning_start(invoice=invoice, reason="test", now=NOW)
    assert case.grace_ends_at == NOW + timedelta(days=1) and case.next_reminder_at is None
    done = dunning_advance(now=NOW + timedelta(days=1, seconds=1))
    assert done["restricted"] == 1 and done["released_leases"] == 1
    assert Lease.objects.get(pk=running["id"]).state in ("released", "releasing")
    # crediting the whole balance settles the invoice: resolved
    credit_note_issue(invoice=invoice, reason="order_change", memo="waived", amount_minor=900, now=NOW)
    case.refresh_from_db()
    assert case.state == DunningState.RESOLVED
    assert invoice.status == InvoiceStatus.FINALIZED


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"reminder_days": [1, 1]}, "reminder_days"), ({"reminder_days": "1,3"}, "reminder_days"),
    ({"reminder_days": [400]}, "reminder_days"), ({"grace_days": -1}, "grace_days")])
def test_bad_dunning_terms_name_the_field(world, kwargs, field):
    with pytest.raises(ValidationFailed) as error:
        dunning_terms_set(tenant=world.acme, **{"reminder_days": [1], "grace_days": 3, **kwargs})
    assert error.value.field == field
