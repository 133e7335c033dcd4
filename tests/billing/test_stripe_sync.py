"""Finalized invoices reach Stripe (the Stripe test server, through the official SDK) exactly once whatever
fails on the way, and Stripe's signed webhooks move our invoices forward only: finalized → paid | void."""

import time
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
import stripe
from django.test import Client

from billing import tasks
from billing.choices import InvoiceStatus, LineKind, StripeState
from billing.models import BillingAccount, Invoice, InvoiceLine, StripeEvent
from billing.services import stripe_sync
from core.errors import Conflict
from tests.factories import make_tenant
from tests.stripe_server import StripeTestServer, build_event, deliver, post_signed, signature_header
from tests.stripe_server.webhooks import encode

WEBHOOK = "/api/v1/billing/stripe/webhook"
ITEMS = "/v1/invoiceitems"
LINES = [("H100-80GB vision training, 100 GPU-hours", 120000, LineKind.USAGE),
         ("A100-80GB 1g.10gb inference, 60.1 GPU-hours", 30050, LineKind.USAGE),
         ("SLO credit: availability 99.20 % < 99.50 % (10 %)", -5000, LineKind.SLO_CREDIT)]


@pytest.fixture
def stripe_server(settings):
    with StripeTestServer() as server:
        settings.STRIPE_API_KEY = server.api_key
        settings.STRIPE_API_BASE = server.url
        settings.STRIPE_WEBHOOK_SECRET = server.webhook_secret
        settings.STRIPE_TIMEOUT_SECONDS = 1.0
        settings.STRIPE_NETWORK_RETRIES = 0
        settings.STRIPE_DAYS_UNTIL_DUE = 30
        settings.STRIPE_IDEMPOTENCY_PREFIX = "gpub"
        yield server


@pytest.fixture
def tenant(db):
    return make_tenant("acme")


def make_invoice(tenant, *, period=date(2026, 1, 1), lines=LINES) -> Invoice:
    """A draft with lines, then finalized + numbered in one update (the trigger allows that from draft)."""
    now = datetime(2026, 2, 1, 7, tzinfo=UTC)
    subtotal = sum(amount for _, amount, kind in lines if kind != LineKind.SLO_CREDIT)
    credit = sum(amount for _, amount, kind in lines if kind == LineKind.SLO_CREDIT)
    invoice = Invoice.objects.create(tenant=tenant, period=period, currency="USD", subtotal_minor=subtotal,
                                     credit_minor=credit, total_minor=subtotal + credit, computed_at=now)
    InvoiceLine.objects.bulk_create([
        InvoiceLine(invoice=invoice, position=position, kind=kind, description=description, unit="GPU-hour",
                    quantity=Decimal(1), unit_price=Decimal(amount), amount_minor=amount)
        for position, (description, amount, kind) in enumerate(lines, 1)])
    Invoice.objects.filter(pk=invoice.pk).update(status=InvoiceStatus.FINALIZED, finalized_at=now,
                                                 number=f"GPUB-{period:%Y%m}-{invoice.pk:06d}")
    invoice.refresh_from_db()
    return invoice


def frozen(invoice: Invoice) -> tuple:
    """What must never change once finalized: status, number, amounts and lines."""
    invoice = Invoice.objects.get(pk=invoice.pk)
    return (invoice.status, invoice.number, invoice.subtotal_minor, invoice.credit_minor, invoice.total_minor,
            invoice.finalized_at, list(invoice.lines.order_by("position").values_list("position", "amount_minor",
                                                                                        "description")))


def item_line_ids(server: StripeTestServer, stripe_invoice_id: str) -> list[str]:
    return [line["metadata"]["invoice_line_id"] for line in server.invoice(stripe_invoice_id)["lines"]["data"]]


# --- push -----------------------------------------------------------------------------------------------------


def test_stripe_sync_push_sends_customer_invoice_items_finalize_and_send(stripe_server, tenant):
    invoice = make_invoice(tenant)
    before = frozen(invoice)
    stripe_id = stripe_sync.invoice_push(invoice_id=invoice.pk)

    assert [(r.method, r.path) for r in stripe_server.requests] == [
        ("POST", "/v1/customers"), ("POST", "/v1/invoices"), ("GET", ITEMS), ("POST", ITEMS), ("POST", ITEMS),
        ("POST", ITEMS), ("GET", f"/v1/invoices/{stripe_id}"), ("POST", f"/v1/invoices/{stripe_id}/finalize"),
        ("POST", f"/v1/invoices/{stripe_id}/send")]
    assert all(r.status == 200 for r in stripe_server.requests)
    customer, create, *items = stripe_server.calls("POST")[:5]
    finalize, send = stripe_server.calls("POST")[-2:]
    assert customer.idempotency_key == f"gpub:tenant:{tenant.pk}:customer"
    assert customer.params == {"name": "Acme", "email": "billing@acme.example",
                               "metadata": {"tenant_id": str(tenant.pk), "tenant_slug": "acme"}}
    customer_id = BillingAccount.objects.get(tenant=tenant).stripe_customer_id
    assert create.idempotency_key == f"gpub:invoice:{invoice.pk}:create"
    params = dict(create.params)
    assert params.pop("description") == f"GPU capacity January 2026 ({invoice.number})"
    assert params == {
        "customer": customer_id, "currency": "usd", "collection_method": "send_invoice", "days_until_due": "30",
        "auto_advance": "false", "pending_invoice_items_behavior": "exclude",
        "metadata": {"invoice_id": str(invoice.pk), "invoice_number": invoice.number, "tenant_id": str(tenant.pk),
                     "period_start": "2026-01-01", "period_end": "2026-02-01"}}
    lines = list(invoice.lines.order_by("position"))
    assert [r.idempotency_key for r in items] == [f"gpub:invoice:{invoice.pk}:line:{line.pk}" for line in lines]
    assert [(r.params["amount"], r.params["description"], r.params["invoice"], r.params["metadata"]["invoice_line_id"])
            for r in items] == [(str(line.amount_minor), line.description, stripe_id, str(line.pk)) for line in lines]
    assert (finalize.idempotency_key, send.idempotency_key) == (f"gpub:invoice:{invoice.pk}:finalize",
                                                                f"gpub:invoice:{invoice.pk}:send")

    at_stripe = stripe_server.invoice(stripe_id)
    assert (at_stripe["status"], at_stripe["total"], at_stripe["amount_due"], at_stripe["customer"]) == (
        "open", 145050, 145050, customer_id)
    assert [line["amount"] for line in at_stripe["lines"]["data"]] == [120000, 30050, -5000]
    assert stripe_server.state.emails_sent == [stripe_id]
    invoice.refresh_from_db()
    assert (invoice.stripe_invoice_id, invoice.stripe_state, invoice.stripe_error, invoice.stripe_attempts) == (
        stripe_id, StripeState.SENT, "", 1)
    assert frozen(invoice) == before


def test_stripe_sync_rerun_creates_nothing_new(stripe_server, tenant):
    invoice = make_invoice(tenant)
    stripe_id = stripe_sync.invoice_push(invoice_id=invoice.pk)
    count = len(stripe_server.requests)
    assert stripe_sync.invoice_push(invoice_id=invoice.pk) == stripe_id  # already sent: nothing to do
    assert len(stripe_server.requests) == count

    # as if the worker died before recording "sent" (and before storing the customer): every step again
    Invoice.objects.filter(pk=invoice.pk).update(stripe_state=StripeState.SENDING)
    BillingAccount.objects.all().delete()
    assert stripe_sync.invoice_push(invoice_id=invoice.pk) == stripe_id
    assert len(stripe_server.customers()) == 1 and len(stripe_server.invoices()) == 1
    assert len(stripe_server.state.items) == 3
    assert len(stripe_server.created("/v1/customers")) == 1
    assert stripe_server.calls("POST", "/v1/customers")[-1].replayed
    assert stripe_server.calls("POST", f"/v1/invoices/{stripe_id}/send")[-1].replayed

    # the tenant's next invoice uses the same customer
    second = make_invoice(tenant, period=date(2026, 2, 1))
    stripe_sync.invoice_push(invoice_id=second.pk)
    assert len(stripe_server.customers()) == 1 and len(stripe_server.created("/v1/customers")) == 1


@pytest.mark.parametrize("after", [False, True], ids=["500-before-running", "500-after-running"])
def test_stripe_sync_500_on_an_item_then_rerun_gives_exactly_one_of_each(stripe_server, tenant, after):
    invoice = make_invoice(tenant)
    before = frozen(invoice)
    stripe_server.fail(1, path=f"^{ITEMS}$", method="POST", skip=1, after=after)
    with pytest.raises(stripe.APIError):
        stripe_sync.invoice_push(invoice_id=invoice.pk)
    invoice.refresh_from_db()
    assert (invoice.stripe_state, invoice.stripe_attempts) == (StripeState.FAILED, 1)
    assert invoice.stripe_error.startswith("APIError (HTTP 500") and invoice.stripe_invoice_id
    assert frozen(invoice) == before
    assert stripe_server.invoice(invoice.stripe_invoice_id)["status"] == "draft"

    stripe_sync.invoice_push(invoice_id=invoice.pk)
    invoice.refresh_from_db()
    lines = [str(pk) for pk in invoice.lines.order_by("position").values_list("pk", flat=True)]
    assert item_line_ids(stripe_server, invoice.stripe_invoice_id) == lines  # each line exactly once
    assert stripe_server.invoice(invoice.stripe_invoice_id)["total"] == invoice.total_minor
    assert (invoice.stripe_state, invoice.stripe_attempts, invoice.stripe_error) == (StripeState.SENT, 2, "")
    assert len(stripe_server.invoices()) == 1 and frozen(invoice) == before


def test_stripe_sync_timeout_marks_failed_keeps_invoice_and_rerun_succeeds(stripe_server, tenant):
    invoice = make_invoice(tenant)
    before = frozen(invoice)
    stripe_server.hang(3, path=r"^/v1/invoices/[^/]+/finalize$")  # Stripe finalizes; the answer comes too late
    started = time.monotonic()
    with pytest.raises(stripe.APIConnectionError):
        stripe_sync.invoice_push(invoice_id=invoice.pk)
    assert time.monotonic() - started < 2.5
    invoice.refresh_from_db()
    assert invoice.stripe_state == StripeState.FAILED and invoice.stripe_attempts == 1
    assert invoice.stripe_error.startswith("APIConnectionError")
    assert frozen(invoice) == before

    stripe_sync.invoice_push(invoice_id=invoice.pk)
    invoice.refresh_from_db()
    assert invoice.stripe_state == StripeState.SENT
    assert len(stripe_server.created(r"/v1/invoices/[^/]+/finalize")) == 1
    assert stripe_server.calls("GET", f"/v1/invoices/{invoice.stripe_invoice_id}")  # retrieved, not created again
    assert len(stripe_server.invoices()) == 1 and len(stripe_server.state.items) == 3
    assert stripe_server.invoice(invoice.stripe_invoice_id)["status"] == "open"


def test_stripe_sync_timeout_on_invoice_creation_does_not_create_a_second_invoice(stripe_server, tenant):
    invoice = make_invoice(tenant)
    stripe_server.hang(3, path="^/v1/invoices$", method="POST")  # created at Stripe, id never reached us
    with pytest.raises(stripe.APIConnectionError):
        stripe_sync.invoice_push(invoice_id=invoice.pk)
    invoice.refresh_from_db()
    assert invoice.stripe_invoice_id == "" and invoice.stripe_state == StripeState.FAILED
    stripe_id = stripe_sync.invoice_push(invoice_id=invoice.pk)  # same key: Stripe replays the first answer
    assert [i["id"] for i in stripe_server.invoices()] == [stripe_id]
    assert stripe_server.calls("POST", "/v1/invoices")[-1].replayed


def test_stripe_sync_after_idempotency_keys_expired_stored_ids_and_listed_items_prevent_duplicates(
        stripe_server, tenant):
    invoice = make_invoice(tenant)
    stripe_server.fail(1, path=f"^{ITEMS}$", method="POST", skip=1)
    with pytest.raises(stripe.APIError):
        stripe_sync.invoice_push(invoice_id=invoice.pk)
    stripe_server.travel(25 * 3600)  # Stripe has forgotten every key
    stripe_sync.invoice_push(invoice_id=invoice.pk)
    invoice.refresh_from_db()
    assert len(stripe_server.customers()) == 1 and len(stripe_server.invoices()) == 1
    assert len(item_line_ids(stripe_server, invoice.stripe_invoice_id)) == 3
    assert len(set(item_line_ids(stripe_server, invoice.stripe_invoice_id))) == 3
    assert invoice.stripe_state == StripeState.SENT


def test_stripe_sync_refuses_to_finalize_when_stripe_totals_differ(stripe_server, tenant):
    invoice = make_invoice(tenant)
    stripe_server.fail(1, path=r"^/v1/invoices/[^/]+/finalize$")
    with pytest.raises(stripe.APIError):
        stripe_sync.invoice_push(invoice_id=invoice.pk)
    invoice.refresh_from_db()
    customer_id = BillingAccount.objects.get(tenant=tenant).stripe_customer_id
    stripe.StripeClient(stripe_server.api_key, base_addresses={"api": stripe_server.url}).v1.invoice_items.create(
        params={"customer": customer_id, "invoice": invoice.stripe_invoice_id, "amount": 1})  # a stray item
    with pytest.raises(stripe_sync.StripeMismatch):
        stripe_sync.invoice_push(invoice_id=invoice.pk)
    invoice.refresh_from_db()
    assert invoice.stripe_state == StripeState.FAILED and "145051" in invoice.stripe_error
    assert stripe_server.invoice(invoice.stripe_invoice_id)["status"] == "draft"


def test_stripe_sync_disabled_is_a_noop_that_says_why(stripe_server, tenant, settings):
    settings.STRIPE_API_KEY = ""
    invoice = make_invoice(tenant)
    assert stripe_sync.invoice_push(invoice_id=invoice.pk) == ""
    invoice.refresh_from_db()
    assert (invoice.stripe_state, invoice.stripe_attempts, invoice.stripe_error) == (
        StripeState.NOT_SENT, 0, stripe_sync.DISABLED)
    assert tasks.invoices_push_due() == 0
    assert stripe_server.requests == []


def test_stripe_sync_draft_is_not_pushed(stripe_server, tenant):
    draft = Invoice.objects.create(tenant=tenant, period=date(2026, 3, 1), currency="USD",
                                   computed_at=datetime(2026, 3, 2, tzinfo=UTC))
    with pytest.raises(Conflict):
        stripe_sync.invoice_push(invoice_id=draft.pk)
    assert stripe_server.requests == []


def test_stripe_sync_task_retries_stripe_failures_but_not_refusals(stripe_server, tenant, settings):
    invoice = make_invoice(tenant)
    stripe_server.fail(2, path="^/v1/customers$")
    result = tasks.invoice_push_task.apply(args=[invoice.pk])
    invoice.refresh_from_db()
    assert result.successful() and result.get() == invoice.stripe_invoice_id
    assert (invoice.stripe_state, invoice.stripe_attempts) == (StripeState.SENT, 3)

    other = make_invoice(tenant, period=date(2026, 2, 1))
    settings.STRIPE_API_KEY = "sk_test_revoked"
    count = len(stripe_server.requests)
    result = tasks.invoice_push_task.apply(args=[other.pk])
    assert result.failed() and isinstance(result.result, stripe.AuthenticationError)
    assert len(stripe_server.requests) == count + 1  # no retry of a refusal
    other.refresh_from_db()
    assert other.stripe_state == StripeState.FAILED and "Invalid API Key" in other.stripe_error


def test_stripe_sync_periodic_task_repushes_failed_and_unsent_invoices(stripe_server, tenant, monkeypatch):
    sent, failed, unsent = (make_invoice(tenant, period=date(2026, month, 1)) for month in (1, 2, 3))
    stripe_sync.invoice_push(invoice_id=sent.pk)
    Invoice.objects.filter(pk=failed.pk).update(stripe_state=StripeState.FAILED, stripe_attempts=4)
    enqueued = []
    monkeypatch.setattr(tasks.invoice_push_task, "delay", enqueued.append)
    assert tasks.invoices_push_due() == 2
    assert enqueued == [failed.pk, unsent.pk]


# --- webhooks -------------------------------------------------------------------------------------------------


def pushed(server: StripeTestServer, tenant) -> tuple[Invoice, str]:
    invoice = make_invoice(tenant)
    return invoice, stripe_sync.invoice_push(invoice_id=invoice.pk)


def test_stripe_webhook_signed_invoice_paid_marks_the_invoice_paid(stripe_server, tenant):
    invoice, stripe_id = pushed(stripe_server, tenant)
    stripe.StripeClient(stripe_server.api_key, base_addresses={"api": stripe_server.url}).v1.invoices.pay(stripe_id)
    event = stripe_server.last_event("invoice.paid", stripe_id)
    response = post_signed(Client(enforce_csrf_checks=True), WEBHOOK, event, stripe_server.webhook_secret)
    assert response.status_code == 200
    assert response.json() == {"id": event["id"], "type": "invoice.paid", "outcome": "applied: finalized → paid",
                               "replayed": False, "invoice": invoice.pk}
    invoice.refresh_from_db()
    paid_at = event["data"]["object"]["status_transitions"]["paid_at"]
    assert invoice.status == InvoiceStatus.PAID and invoice.paid_at == datetime.fromtimestamp(paid_at, UTC)
    assert invoice.stripe_event_at == datetime.fromtimestamp(event["created"], UTC)
    record = StripeEvent.objects.get()
    assert (record.event_id, record.invoice_id, record.payload["id"]) == (event["id"], invoice.pk, event["id"])


@pytest.mark.parametrize("how", ["forged", "stale", "missing", "tampered"])
def test_stripe_webhook_bad_signature_is_refused_and_nothing_written(stripe_server, tenant, how):
    invoice, stripe_id = pushed(stripe_server, tenant)
    event = build_event("invoice.paid", stripe_server.invoice(stripe_id))
    secret = stripe_server.webhook_secret
    if how == "tampered":  # signed for another body
        other = build_event("invoice.paid", {**stripe_server.invoice(stripe_id), "amount_paid": 1})
        response = post_signed(Client(), WEBHOOK, event, secret, signature=signature_header(encode(other), secret))
    else:
        response = post_signed(Client(), WEBHOOK, event, secret, forged=how == "forged",
                               stale_seconds=600 if how == "stale" else 0, signature="" if how == "missing" else None)
    assert response.status_code == 400 and response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert (body["code"], body["field"], body["status"]) == ("invalid_signature", "Stripe-Signature", 400)
    assert StripeEvent.objects.count() == 0
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.FINALIZED and invoice.paid_at is None and invoice.stripe_event_at is None


def test_stripe_webhook_replay_is_recorded_once_and_changes_nothing(stripe_server, tenant):
    invoice, stripe_id = pushed(stripe_server, tenant)
    event = build_event("invoice.paid", {**stripe_server.invoice(stripe_id), "status": "paid"})
    secret = stripe_server.webhook_secret
    first = post_signed(Client(), WEBHOOK, event, secret).json()
    invoice.refresh_from_db()
    state = (invoice.status, invoice.paid_at, invoice.stripe_event_at)
    again = post_signed(Client(), WEBHOOK, event, secret)
    assert again.status_code == 200 and again.json() == {**first, "replayed": True}
    assert StripeEvent.objects.count() == 1
    invoice.refresh_from_db()
    assert (invoice.status, invoice.paid_at, invoice.stripe_event_at) == state
    # the same news under a new event id is recorded, and ignored
    later = post_signed(Client(), WEBHOOK, build_event("invoice.paid", event["data"]["object"]), secret).json()
    assert later["outcome"] == "ignored: the invoice is already paid" and StripeEvent.objects.count() == 2


def test_stripe_webhook_out_of_order_events_are_safe(stripe_server, tenant):
    secret = stripe_server.webhook_secret
    now = int(time.time())

    def send(event_type, invoice_json, created):
        return post_signed(Client(), WEBHOOK, build_event(event_type, invoice_json, created=created), secret).json()

    # paid applied, then a payment failure that happened before it: nothing changes
    paid, paid_id = pushed(stripe_server, tenant)
    body = stripe_server.invoice(paid_id)
    assert send("invoice.paid", body, now)["outcome"] == "applied: finalized → paid"
    assert send("invoice.payment_failed", body, now - 60)["outcome"] == "ignored: the invoice is paid"
    assert send("invoice.voided", body, now + 60)["outcome"].startswith("ignored: the invoice is paid")
    paid.refresh_from_db()
    assert (paid.status, paid.payment_error, paid.voided_at) == (InvoiceStatus.PAID, "", None)

    # void applied, then a late paid: still void
    voided = make_invoice(tenant, period=date(2026, 2, 1))
    voided_id = stripe_sync.invoice_push(invoice_id=voided.pk)
    body = stripe_server.invoice(voided_id)
    assert send("invoice.voided", body, now)["outcome"] == "applied: finalized → void"
    assert send("invoice.paid", body, now + 5)["outcome"].startswith("ignored: the invoice is void")
    voided.refresh_from_db()
    assert (voided.status, voided.paid_at) == (InvoiceStatus.VOID, None) and voided.voided_at is not None

    # payment failures: the newest one is kept, an older one arriving late does not overwrite it; status stays
    failing = make_invoice(tenant, period=date(2026, 3, 1))
    failing_id = stripe_sync.invoice_push(invoice_id=failing.pk)
    body = {**stripe_server.invoice(failing_id), "attempt_count": 2}
    newest = build_event("invoice.payment_failed", body, created=now)
    post_signed(Client(), WEBHOOK, newest, secret)
    assert send("invoice.payment_failed", {**body, "attempt_count": 1}, now - 30)["outcome"] == (
        "ignored: older than the newest Stripe event applied")
    failing.refresh_from_db()
    assert failing.status == InvoiceStatus.FINALIZED and newest["id"] in failing.payment_error
    assert "attempt 2" in failing.payment_error
    assert send("invoice.paid", body, now + 30)["outcome"] == "applied: finalized → paid"
    failing.refresh_from_db()
    assert failing.status == InvoiceStatus.PAID and failing.payment_error == ""


def test_stripe_webhook_matching_bookkeeping_and_unknown_events(stripe_server, tenant):
    secret = stripe_server.webhook_secret
    invoice, stripe_id = pushed(stripe_server, tenant)
    Invoice.objects.filter(pk=invoice.pk).update(stripe_state=StripeState.SENDING)  # died before recording "sent"
    without_metadata = {**stripe_server.invoice(stripe_id), "metadata": {}}  # matched by stripe_invoice_id
    assert post_signed(Client(), WEBHOOK, build_event("invoice.sent", without_metadata), secret).json()[
        "outcome"] == "applied: sent"
    invoice.refresh_from_db()
    assert invoice.stripe_state == StripeState.SENT
    unknown = post_signed(Client(), WEBHOOK, build_event("customer.updated", {"id": "cus_1", "object": "customer"}),
                          secret).json()
    assert unknown["outcome"] == "ignored: event type not handled"
    stranger = {**stripe_server.invoice(stripe_id), "id": "in_someone_else", "metadata": {"invoice_id": "999999"}}
    assert post_signed(Client(), WEBHOOK, build_event("invoice.paid", stranger), secret).json()[
        "outcome"] == "ignored: no matching invoice"
    assert StripeEvent.objects.count() == 3
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.FINALIZED
    malformed = post_signed(Client(), WEBHOOK, {"id": "evt_x", "type": "invoice.paid"}, secret)
    assert malformed.status_code == 400 and malformed.json()["field"] == "created"


def test_stripe_webhook_without_a_secret_configured_is_503(stripe_server, tenant, settings):
    settings.STRIPE_WEBHOOK_SECRET = ""
    response = post_signed(Client(), WEBHOOK, build_event("invoice.paid", {"object": "invoice"}), "whsec_any")
    assert response.status_code == 503 and StripeEvent.objects.count() == 0


def test_stripe_webhook_over_http_end_to_end(stripe_server, live_server, transactional_db, settings):
    invoice = make_invoice(make_tenant("acme"))
    stripe_id = stripe_sync.invoice_push(invoice_id=invoice.pk)
    client = stripe.StripeClient(stripe_server.api_key, base_addresses={"api": stripe_server.url})
    client.v1.invoices.pay(stripe_id)
    url = live_server.url + WEBHOOK
    status, body = deliver(url, stripe_server.last_event("invoice.paid", stripe_id), stripe_server.webhook_secret,
                           forged=True)
    assert status == 400 and body["code"] == "invalid_signature"
    for event in stripe_server.events:  # every event Stripe emitted, in order, as Stripe would deliver them
        status, body = deliver(url, event, stripe_server.webhook_secret)
        assert status == 200, body
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.PAID and invoice.stripe_state == StripeState.SENT
    assert set(StripeEvent.objects.values_list("type", flat=True)) >= {"invoice.finalized", "invoice.sent",
                                                                       "invoice.paid"}


def test_stripe_webhook_secret_rotation_accepts_the_old_and_new_secret_only(stripe_server, tenant, settings):
    """While Stripe rolls the endpoint's signing secret, STRIPE_WEBHOOK_SECRET lists the new one and the old
    one (docs/security.md): events signed with either are applied, anything else is still refused."""
    invoice, stripe_id = pushed(stripe_server, tenant)
    old = stripe_server.webhook_secret
    settings.STRIPE_WEBHOOK_SECRET = f"whsec_new_secret_of_the_roll, {old}"
    event = build_event("invoice.paid", stripe_server.invoice(stripe_id))
    forged = post_signed(Client(), WEBHOOK, event, "whsec_someone_else")
    assert forged.status_code == 400 and forged.json()["field"] == "Stripe-Signature"
    assert post_signed(Client(), WEBHOOK, event, old).status_code == 200
    settings.STRIPE_WEBHOOK_SECRET = "whsec_new_secret_of_the_roll"
    assert post_signed(Client(), WEBHOOK, event, old).status_code == 400  # the old one is gone after the roll
    assert post_signed(Client(), WEBHOOK, event, "whsec_new_secret_of_the_roll").status_code == 200
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.PAID


# --- issue 33: tax rates, prepaid credit and credit notes at Stripe ---------------------------------------------


TAX_RATES = "/v1/tax_rates"
CREDIT_NOTES = "/v1/credit_notes"


def make_taxed_invoice(tenant, rates, amounts, *, period=date(2026, 1, 1), kinds=None) -> Invoice:
    """A finalized invoice of ``amounts`` with our tax lines for ``rates`` (``billing.core.tax``, as the invoice
    run computes them: each rate rounded once on the net)."""
    from billing.core import tax as taxcore

    now = datetime(2026, 2, 1, 7, tzinfo=UTC)
    kinds = kinds or [LineKind.USAGE] * len(amounts)
    net = sum(amounts)
    tax = taxcore.tax_lines(net, [taxcore.Rate(r.pk, r.jurisdiction, r.name, r.percentage, r.inclusive)
                                  for r in rates])
    subtotal = net + sum(t.amount_minor for t in tax)
    invoice = Invoice.objects.create(tenant=tenant, period=period, currency="USD", subtotal_minor=subtotal,
                                     total_minor=subtotal, computed_at=now)
    lines = [InvoiceLine(invoice=invoice, position=n, kind=kind, description=f"line {n}", unit="GPU-hour",
                         quantity=Decimal(1), unit_price=Decimal(amount), amount_minor=amount)
             for n, (amount, kind) in enumerate(zip(amounts, kinds, strict=True), 1)]
    lines += [InvoiceLine(invoice=invoice, position=len(amounts) + n, kind=LineKind.TAX, description=t.description,
                          unit="percent", quantity=t.percentage, unit_price=Decimal(0), amount_minor=t.amount_minor,
                          evidence={"tax_rate": t.key, "inclusive": t.inclusive, "base_minor": t.base_minor,
                                    "included_minor": t.included_minor, "tax_id": ""})
              for n, t in enumerate(tax, 1)]
    InvoiceLine.objects.bulk_create(lines)
    Invoice.objects.filter(pk=invoice.pk).update(status=InvoiceStatus.FINALIZED, finalized_at=now,
                                                 number=f"GPUB-{period:%Y%m}-{invoice.pk:06d}")
    invoice.refresh_from_db()
    return invoice


def tax_rate(tenant, name="VAT", percentage="19", inclusive=False, jurisdiction="DE"):
    from billing.services.tax import tax_rate_create

    return tax_rate_create(tenant=tenant, jurisdiction=jurisdiction, name=name, percentage=percentage,
                           inclusive=inclusive)


def test_stripe_sync_items_carry_stripe_tax_rates_and_the_total_equals_ours_to_the_cent(stripe_server, tenant):
    vat = tax_rate(tenant)
    # per line Stripe rounds 190.57 → 191, 191, -38.95 → -39 (343); we round once on the net: 342.19 → 342
    invoice = make_taxed_invoice(tenant, [vat], [1003, 1003, -205],
                                 kinds=[LineKind.USAGE, LineKind.USAGE, LineKind.SLO_CREDIT])
    assert invoice.total_minor == 1801 + 342
    before = frozen(invoice)
    stripe_id = stripe_sync.invoice_push(invoice_id=invoice.pk)

    [create] = stripe_server.calls("POST", TAX_RATES)
    vat.refresh_from_db()
    assert create.idempotency_key == f"gpub:tax_rate:{vat.pk}:create"
    assert create.params == {"display_name": "VAT", "percentage": "19.0", "inclusive": "false", "jurisdiction": "DE",
                             "country": "DE", "metadata": {"tax_rate_id": str(vat.pk), "tenant_id": str(tenant.pk)}}
    assert vat.stripe_tax_rate_id == create.response["id"]
    items = stripe_server.created(ITEMS)
    tax_line = invoice.lines.get(kind=LineKind.TAX)
    assert str(tax_line.pk) not in [r.params["metadata"].get("invoice_line_id") for r in items]  # Stripe computes it
    assert [r.params.get("tax_rates") for r in items] == [{"0": vat.stripe_tax_rate_id}] * 3 + [None]
    rounding = items[-1]
    assert (rounding.params["amount"], rounding.params["metadata"]["kind"], rounding.idempotency_key) == (
        "-1", "tax_rounding", f"gpub:invoice:{invoice.pk}:tax_rounding")
    at_stripe = stripe_server.invoice(stripe_id)
    assert (at_stripe["status"], at_stripe["total"]) == ("open", invoice.total_minor)
    assert [(t["amount"], t["tax_behavior"]) for t in at_stripe["total_taxes"]] == [(343, "exclusive")]
    invoice.refresh_from_db()
    assert (invoice.stripe_state, invoice.stripe_error) == (StripeState.SENT, "") and frozen(invoice) == before

    # the next invoice reuses the stored Stripe tax rate
    stripe_sync.invoice_push(invoice_id=make_taxed_invoice(tenant, [vat], [5000], period=date(2026, 2, 1)).pk)
    assert len(stripe_server.calls("POST", TAX_RATES)) == 1


def test_stripe_sync_taxed_push_crashing_anywhere_then_rerun_creates_each_thing_once(stripe_server, tenant):
    vat = tax_rate(tenant)
    invoice = make_taxed_invoice(tenant, [vat], [1003, 1003, -205])
    stripe_server.hang(3, path=f"^{TAX_RATES}$", method="POST", after=True)  # created; the answer is lost
    with pytest.raises(stripe.APIConnectionError):
        stripe_sync.invoice_push(invoice_id=invoice.pk)
    vat.refresh_from_db()
    assert vat.stripe_tax_rate_id == "" and len(stripe_server.state.tax_rates) == 1
    stripe_server.fail(1, path=r"^/v1/invoices/[^/]+/finalize$")  # then a crash after the rounding item
    with pytest.raises(stripe.APIError):
        stripe_sync.invoice_push(invoice_id=invoice.pk)
    stripe_server.travel(25 * 3600)  # keys forgotten: the stored ids and the listed items keep it to one of each
    stripe_id = stripe_sync.invoice_push(invoice_id=invoice.pk)
    assert len(stripe_server.state.tax_rates) == 1 and len(stripe_server.created(TAX_RATES)) == 1
    kinds = [line["metadata"]["kind"] for line in stripe_server.invoice(stripe_id)["lines"]["data"]]
    assert kinds == ["usage", "usage", "usage", "tax_rounding"]
    assert stripe_server.invoice(stripe_id)["total"] == invoice.total_minor
    invoice.refresh_from_db()
    assert (invoice.stripe_state, invoice.stripe_attempts) == (StripeState.SENT, 3)


def test_stripe_sync_tax_totals_equal_stripe_for_many_invoices(stripe_server, tenant):
    import random

    rng = random.Random(33)
    vat, state = tax_rate(tenant, percentage="19"), tax_rate(tenant, name="State", percentage="8.875",
                                                            jurisdiction="US-NY")
    for month in range(1, 13):
        amounts = [rng.randint(1, 99999) for _ in range(rng.randint(1, 9))] + [-rng.randint(1, 999)]
        rates = [vat] if month % 2 else [vat, state]
        invoice = make_taxed_invoice(tenant, rates, amounts, period=date(2025, month, 1))
        stripe_id = stripe_sync.invoice_push(invoice_id=invoice.pk)
        at_stripe = stripe_server.invoice(stripe_id)
        assert at_stripe["total"] == invoice.total_minor, (amounts, rates)
        ours = sum(invoice.lines.filter(kind=LineKind.TAX).values_list("amount_minor", flat=True))
        rounding = sum(line["amount"] for line in at_stripe["lines"]["data"]
                       if line["metadata"].get("kind") == "tax_rounding")
        assert sum(t["amount"] for t in at_stripe["total_taxes"]) + rounding == ours
    assert len(stripe_server.created(TAX_RATES)) == 2
    assert stripe_server.calls("POST", TAX_RATES)[1].params["country"] == "US"


def test_stripe_sync_inclusive_rate_keeps_the_total_and_mixed_rates_push_tax_lines(stripe_server, tenant):
    inclusive = tax_rate(tenant, percentage="20", inclusive=True)
    invoice = make_taxed_invoice(tenant, [inclusive], [12000, 3001])
    stripe_id = stripe_sync.invoice_push(invoice_id=invoice.pk)
    at_stripe = stripe_server.invoice(stripe_id)
    assert at_stripe["total"] == invoice.total_minor == 15001
    assert [t["tax_behavior"] for t in at_stripe["total_taxes"]] == ["inclusive"]
    assert all(line["metadata"]["kind"] == "usage" for line in at_stripe["lines"]["data"])

    # an inclusive and an exclusive rate together: Stripe would tax the net less the inclusive tax, we tax the
    # whole net; the tax lines go as items (no Stripe tax rates) and the total is still ours
    exclusive = tax_rate(tenant, name="Levy", percentage="5")
    mixed = make_taxed_invoice(tenant, [inclusive, exclusive], [12000, 3001], period=date(2026, 2, 1))
    stripe_id = stripe_sync.invoice_push(invoice_id=mixed.pk)
    at_stripe = stripe_server.invoice(stripe_id)
    assert at_stripe["total"] == mixed.total_minor and at_stripe["total_taxes"] == []
    assert [line["metadata"]["kind"] for line in at_stripe["lines"]["data"]] == ["usage", "usage", "tax", "tax"]


def grant_and_draw(tenant, invoice, amount):
    from billing.models import CreditDraw, CreditGrant

    grant = CreditGrant.objects.create(tenant=tenant, currency="USD", amount_minor=amount + 1000, reason="prepaid",
                                       granted_at=datetime(2026, 1, 1, tzinfo=UTC))
    return CreditDraw.objects.create(grant=grant, invoice=invoice, amount_minor=amount,
                                     drawn_at=datetime(2026, 2, 1, 7, tzinfo=UTC))


def test_stripe_sync_prepaid_credit_is_a_balance_transaction_stripe_applies(stripe_server, tenant):
    invoice = make_invoice(tenant)
    draw = grant_and_draw(tenant, invoice, 45050)
    stripe_server.fail(1, path=r"^/v1/invoices/[^/]+/finalize$")  # crash after the credit, before finalizing
    with pytest.raises(stripe.APIError):
        stripe_sync.invoice_push(invoice_id=invoice.pk)
    invoice.refresh_from_db()
    [credit] = stripe_server.created(r"/v1/customers/[^/]+/balance_transactions")
    assert credit.idempotency_key == f"gpub:invoice:{invoice.pk}:credit"
    assert (credit.params["amount"], credit.params["currency"], credit.params["metadata"]["invoice_id"],
            credit.params["metadata"]["credit_grants"]) == ("-45050", "usd", str(invoice.pk), str(draw.grant_id))
    assert invoice.stripe_balance_transaction_id == credit.response["id"]

    stripe_server.travel(25 * 3600)  # keys forgotten; the stored id keeps it to one
    Invoice.objects.filter(pk=invoice.pk).update(stripe_balance_transaction_id="")  # and without it, the list
    stripe_id = stripe_sync.invoice_push(invoice_id=invoice.pk)
    at_stripe = stripe_server.invoice(stripe_id)
    assert (at_stripe["total"], at_stripe["amount_due"], at_stripe["starting_balance"]) == (145050, 100000, -45050)
    assert len(stripe_server.created(r"/v1/customers/[^/]+/balance_transactions")) == 1
    invoice.refresh_from_db()
    assert (invoice.stripe_state, invoice.stripe_error) == (StripeState.SENT, "")
    assert invoice.stripe_balance_transaction_id == credit.response["id"]


def test_stripe_sync_credit_covering_the_whole_invoice_is_paid_at_stripe(stripe_server, tenant):
    invoice = make_invoice(tenant)
    grant_and_draw(tenant, invoice, invoice.total_minor)
    stripe_id = stripe_sync.invoice_push(invoice_id=invoice.pk)
    at_stripe = stripe_server.invoice(stripe_id)
    assert (at_stripe["status"], at_stripe["total"], at_stripe["amount_due"]) == ("paid", 145050, 0)
    assert stripe_server.calls("POST", f"/v1/invoices/{stripe_id}/send") == []
    invoice.refresh_from_db()
    assert invoice.stripe_state == StripeState.SENT
    stripe_sync.stripe_event_apply(payload=stripe_server.last_event("invoice.paid", stripe_id))
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.PAID and not invoice.payments.exists()  # nothing collected


def test_stripe_sync_credit_note_waits_for_its_invoice_then_is_pushed_after_it(stripe_server, tenant, monkeypatch):
    from billing.models import CreditNote
    from billing.services.credit_notes import credit_note_issue

    invoice = make_invoice(tenant)
    line = invoice.lines.get(position=1)
    note = credit_note_issue(invoice=invoice, reason="product_unsatisfactory", memo="node lost for 2 h",
                             lines=[{"position": 1, "amount_minor": 2400}, {"position": 2, "amount_minor": 50}])
    assert stripe_sync.credit_note_push(credit_note_id=note.pk) == ""
    note.refresh_from_db()
    assert (note.stripe_state, note.stripe_error) == (StripeState.NOT_SENT,
                                                      stripe_sync.WAITING.format(number=invoice.number))
    assert stripe_server.requests == [] and stripe_sync.credit_note_ids_push_due() == []

    enqueued = []
    monkeypatch.setattr(tasks.credit_note_push_task, "delay", enqueued.append)
    assert tasks.invoice_push_task.apply(args=[invoice.pk]).successful()
    assert enqueued == [note.pk]  # the invoice in Stripe, its waiting note follows
    invoice.refresh_from_db()
    stripe_id = stripe_sync.credit_note_push(credit_note_id=note.pk)

    [create] = stripe_server.calls("POST", CREDIT_NOTES)
    assert create.idempotency_key == f"gpub:credit_note:{note.pk}:create"
    lines = list(note.lines.order_by("pk"))
    assert create.params == {
        "invoice": invoice.stripe_invoice_id, "reason": "product_unsatisfactory", "memo": "node lost for 2 h",
        "metadata": {"credit_note_id": str(note.pk), "credit_note_number": note.number,
                     "invoice_id": str(invoice.pk), "invoice_number": invoice.number, "tenant_id": str(tenant.pk)},
        "lines": {str(n): {"type": "custom_line_item", "unit_amount": str(cl.amount_minor), "quantity": "1",
                           "description": cl.description,
                           "metadata": {"credit_note_line_id": str(cl.pk), "invoice_line_id": str(cl.invoice_line_id)}}
                  for n, cl in enumerate(lines)}}
    assert lines[0].invoice_line_id == line.pk
    at_stripe = stripe_server.state.credit_notes[stripe_id]
    assert (at_stripe["total"], at_stripe["type"]) == (2450, "pre_payment")
    assert stripe_server.invoice(invoice.stripe_invoice_id)["amount_due"] == invoice.total_minor - 2450
    note = CreditNote.objects.get(pk=note.pk)
    assert (note.stripe_credit_note_id, note.stripe_state, note.stripe_attempts, note.stripe_error) == (
        stripe_id, StripeState.SENT, 1, "")
    assert stripe_sync.credit_note_push(credit_note_id=note.pk) == stripe_id  # sent: nothing more
    assert len(stripe_server.calls("POST", CREDIT_NOTES)) == 1


def test_stripe_sync_credit_note_crash_and_retry_creates_it_once(stripe_server, tenant):
    from billing.models import CreditNote
    from billing.services.credit_notes import credit_note_issue

    invoice, _ = pushed(stripe_server, tenant)
    note = credit_note_issue(invoice=invoice, reason="duplicate", memo="charged twice", amount_minor=10000)
    stripe_server.hang(3, path=f"^{CREDIT_NOTES}$", method="POST", after=True)  # created; the answer is lost
    with pytest.raises(stripe.APIConnectionError):
        stripe_sync.credit_note_push(credit_note_id=note.pk)
    note.refresh_from_db()
    assert (note.stripe_state, note.stripe_attempts, note.stripe_credit_note_id) == (StripeState.FAILED, 1, "")
    assert note.stripe_error.startswith("APIConnectionError")
    assert len(stripe_server.state.credit_notes) == 1

    stripe_id = stripe_sync.credit_note_push(credit_note_id=note.pk)  # found on the invoice by its metadata
    assert list(stripe_server.state.credit_notes) == [stripe_id]
    # keys forgotten and the stored id lost: still found, never created twice
    stripe_server.travel(25 * 3600)
    CreditNote.objects.filter(pk=note.pk).update(stripe_state=StripeState.FAILED, stripe_credit_note_id="")
    assert stripe_sync.credit_note_push(credit_note_id=note.pk) == stripe_id
    assert len(stripe_server.state.credit_notes) == 1 and len(stripe_server.created(CREDIT_NOTES)) == 1
    note.refresh_from_db()
    assert (note.stripe_state, note.stripe_attempts) == (StripeState.SENT, 3)


def test_stripe_sync_credit_note_on_a_paid_invoice_is_out_of_band(stripe_server, tenant):
    from billing.services.credit_notes import credit_note_issue

    invoice, stripe_id = pushed(stripe_server, tenant)
    stripe.StripeClient(stripe_server.api_key, base_addresses={"api": stripe_server.url}).v1.invoices.pay(
        stripe_id, params={"paid_out_of_band": True})
    note = credit_note_issue(invoice=invoice, reason="order_change", memo="price corrected",
                             lines=[{"position": 2, "amount_minor": 30050}])
    stripe_sync.credit_note_push(credit_note_id=note.pk)
    [create] = stripe_server.calls("POST", CREDIT_NOTES)
    assert create.params["out_of_band_amount"] == "30050" and create.status == 200
    assert stripe_server.invoice(stripe_id)["post_payment_credit_notes_amount"] == 30050


def test_stripe_sync_local_void_voids_the_stripe_invoice(stripe_server, tenant):
    from billing.models import CreditNote
    from billing.services.credit_notes import invoice_void

    invoice, stripe_id = pushed(stripe_server, tenant)
    invoice_void(invoice=invoice, memo="issued to the wrong tenant")
    note = CreditNote.objects.get(invoice=invoice, voids_invoice=True)
    assert stripe_sync.credit_note_push(credit_note_id=note.pk) == ""
    assert stripe_server.invoice(stripe_id)["status"] == "void"
    assert stripe_server.calls("POST", f"/v1/invoices/{stripe_id}/void")[0].idempotency_key == (
        f"gpub:invoice:{invoice.pk}:void")
    assert stripe_server.calls("POST", CREDIT_NOTES) == []
    note.refresh_from_db()
    assert note.stripe_state == StripeState.SENT and stripe_id in note.stripe_error
    record, _ = stripe_sync.stripe_event_apply(payload=stripe_server.last_event("invoice.voided", stripe_id))
    assert record.outcome == "ignored: the invoice is already void"


def test_stripe_sync_periodic_task_pushes_credit_notes_whose_invoice_is_in_stripe(stripe_server, tenant, settings,
                                                                                   monkeypatch):
    from billing.services.credit_notes import credit_note_issue

    sent, _ = pushed(stripe_server, tenant)
    waiting = make_invoice(tenant, period=date(2026, 2, 1))
    ready = credit_note_issue(invoice=sent, reason="duplicate", memo="a", amount_minor=100)
    credit_note_issue(invoice=waiting, reason="duplicate", memo="b", amount_minor=100)
    enqueued = []
    monkeypatch.setattr(tasks.credit_note_push_task, "delay", enqueued.append)
    assert tasks.credit_notes_push_due() == 1 and enqueued == [ready.pk]
    settings.STRIPE_API_KEY = ""
    assert tasks.credit_notes_push_due() == 0
    assert stripe_sync.credit_note_push(credit_note_id=ready.pk) == ""
    ready.refresh_from_db()
    assert ready.stripe_state == StripeState.NOT_SENT and "disabled" in ready.stripe_error
