"""The Stripe test server's contract, through the official SDK: it refuses what Stripe refuses (unknown,
missing and ill-typed parameters, unknown ids, invalid state transitions, bad keys), answers like Stripe
(object shapes, totals, idempotent replays and conflicts), and injects the faults tests ask for."""

import time

import pytest
import requests
import stripe

from tests.stripe_server import StripeTestServer, signature_header
from tests.stripe_server.webhooks import encode


@pytest.fixture
def server():
    with StripeTestServer() as running:
        yield running


def sdk(server: StripeTestServer, *, timeout: float = 5.0, api_key: str | None = None) -> stripe.StripeClient:
    return stripe.StripeClient(api_key or server.api_key, base_addresses={"api": server.url}, max_network_retries=0,
                               http_client=stripe.RequestsClient(timeout=timeout))


def customer(client: stripe.StripeClient, **params):
    return client.v1.customers.create(params={"name": "Acme", "email": "billing@acme.example", **params})


def draft(client: stripe.StripeClient, customer_id: str, **params):
    return client.v1.invoices.create(params={"customer": customer_id, "collection_method": "send_invoice",
                                             "days_until_due": 30, "currency": "usd", **params})


def refused(call) -> stripe.StripeError:
    with pytest.raises(stripe.StripeError) as caught:
        call()
    return caught.value


def test_stripe_server_requires_its_test_key_as_bearer(server):
    assert isinstance(refused(lambda: customer(sdk(server, api_key="sk_test_wrong"))), stripe.AuthenticationError)
    answer = requests.post(f"{server.url}/v1/customers", data={"name": "x"}, timeout=5)
    assert answer.status_code == 401 and "did not provide an API key" in answer.json()["error"]["message"]
    basic = requests.post(f"{server.url}/v1/customers", data={"name": "x"}, auth=(server.api_key, ""), timeout=5)
    assert basic.status_code == 200 and basic.json()["id"].startswith("cus_")
    assert len(server.customers()) == 1


def test_stripe_server_unknown_parameter_is_named_and_nothing_created(server):
    error = refused(lambda: customer(sdk(server), colour="red"))
    assert isinstance(error, stripe.InvalidRequestError)
    assert (error.http_status, error.param, error.code) == (400, "colour", "parameter_unknown")
    assert error.user_message == "Received unknown parameter: colour"
    nested = refused(lambda: sdk(server).v1.invoice_items.create(
        params={"customer": "cus_x", "amount": 1, "period": {"start": 1, "end": 2, "middle": 3}}))
    assert nested.param == "period[middle]"
    assert server.customers() == []


def test_stripe_server_missing_required_parameter(server):
    client = sdk(server)
    error = refused(lambda: client.v1.invoices.create(params={"currency": "usd"}))
    assert (error.param, error.code, error.user_message) == ("customer", "parameter_missing",
                                                             "Missing required param: customer.")
    cus = customer(client)
    assert refused(lambda: client.v1.invoice_items.create(params={"customer": cus.id})).param == "amount"
    assert refused(lambda: draft(client, cus.id, days_until_due=None)).param == "days_until_due"


@pytest.mark.parametrize(("params", "param", "code"), [
    ({"amount": "12.5"}, "amount", "parameter_invalid_integer"),
    ({"amount": 100, "currency": "xyz"}, "currency", "parameter_invalid_string"),
    ({"amount": 100, "discountable": "maybe"}, "discountable", "parameter_invalid_boolean"),
    ({"amount": 100, "description": ""}, "description", "parameter_invalid_empty"),
    ({"amount": 100, "metadata": {"k" * 41: "v"}}, "metadata[" + "k" * 41 + "]", "parameter_invalid"),
    ({"amount": 100, "metadata": "flat"}, "metadata", "parameter_invalid_object"),
    ({"amount": 100, "price_data": {"currency": "usd"}}, "price_data", "parameter_not_implemented_by_test_server"),
])
def test_stripe_server_wrong_types_are_refused_naming_the_field(server, params, param, code):
    client = sdk(server)
    cus = customer(client)
    error = refused(lambda: client.v1.invoice_items.create(params={"customer": cus.id, **params}))
    assert (error.http_status, error.param, error.code) == (400, param, code)
    assert server.state.items == {}


def test_stripe_server_enums_and_rules_of_invoice_creation(server):
    client = sdk(server)
    cus = customer(client)
    assert refused(lambda: draft(client, cus.id, collection_method="email")).param == "collection_method"
    error = refused(lambda: client.v1.invoices.create(
        params={"customer": cus.id, "days_until_due": 30}))  # only with send_invoice
    assert error.param == "days_until_due"
    assert refused(lambda: draft(client, "cus_missing")).code == "resource_missing"


def test_stripe_server_unknown_ids_and_routes_are_404(server):
    client = sdk(server)
    error = refused(lambda: client.v1.invoices.retrieve("in_missing"))
    assert (error.http_status, error.code, error.param) == (404, "resource_missing", "id")
    assert error.user_message == "No such invoice: 'in_missing'"
    assert refused(lambda: client.v1.customers.retrieve("cus_missing")).http_status == 404
    assert refused(lambda: client.v1.invoices.finalize_invoice("in_missing")).http_status == 404
    cus = customer(client)
    error = refused(lambda: client.v1.invoice_items.create(params={"customer": cus.id, "amount": 1,
                                                                    "invoice": "in_missing"}))
    assert (error.http_status, error.code, error.param) == (400, "resource_missing", "invoice")
    answer = requests.get(f"{server.url}/v1/charges", headers={"Authorization": f"Bearer {server.api_key}"},
                          timeout=5)
    assert answer.status_code == 404
    assert "Unrecognized request URL (GET: /v1/charges)" in answer.json()["error"]["message"]


def test_stripe_server_invoice_totals_lines_and_lifecycle(server):
    client = sdk(server)
    cus = customer(client, metadata={"tenant_slug": "acme"})
    assert cus.metadata.to_dict() == {"tenant_slug": "acme"} and cus.object == "customer"
    invoice = draft(client, cus.id, auto_advance=False, metadata={"invoice_id": "7"})
    assert (invoice.status, invoice.total, invoice.amount_due, invoice.number) == ("draft", 0, 0, None)
    for amount in (120000, 30050, -5000):
        item = client.v1.invoice_items.create(params={"customer": cus.id, "invoice": invoice.id, "amount": amount,
                                                      "description": f"line {amount}"})
        assert item.id.startswith("ii_") and item.invoice == invoice.id and item.discountable is (amount > 0)
    invoice = client.v1.invoices.finalize_invoice(invoice.id)
    assert (invoice.status, invoice.subtotal, invoice.total, invoice.amount_due) == ("open", 145050, 145050, 145050)
    assert [line.amount for line in invoice.lines.data] == [120000, 30050, -5000]
    assert invoice.number.endswith("-0001") and invoice.status_transitions.finalized_at
    assert (invoice.customer, invoice.currency, invoice.metadata["invoice_id"]) == (cus.id, "usd", "7")
    client.v1.invoices.send_invoice(invoice.id)
    paid = client.v1.invoices.pay(invoice.id)
    assert (paid.status, paid.amount_paid, paid.amount_remaining) == ("paid", 145050, 0)
    assert [e["type"] for e in server.events if e["type"].startswith("invoice.")] == [
        "invoice.created", "invoice.finalized", "invoice.sent", "invoice.paid"]
    assert server.last_event("invoice.paid", invoice.id)["data"]["object"]["status"] == "paid"
    empty = client.v1.invoices.finalize_invoice(draft(client, cus.id).id)
    assert empty.status == "paid"  # nothing to collect: paid on finalization, as at Stripe


def test_stripe_server_refuses_invalid_state_transitions(server):
    client = sdk(server)
    cus = customer(client)
    invoice = draft(client, cus.id)
    client.v1.invoice_items.create(params={"customer": cus.id, "invoice": invoice.id, "amount": 500})
    assert refused(lambda: client.v1.invoices.void_invoice(invoice.id)).http_status == 400  # drafts are deleted
    assert refused(lambda: client.v1.invoices.pay(invoice.id)).code == "invoice_not_editable"
    client.v1.invoices.finalize_invoice(invoice.id)
    error = refused(lambda: client.v1.invoice_items.create(params={"customer": cus.id, "invoice": invoice.id,
                                                                    "amount": 1}))
    assert (error.http_status, error.code, error.param) == (400, "invoice_not_editable", "invoice")
    assert "re-finalize" in refused(lambda: client.v1.invoices.finalize_invoice(invoice.id)).user_message
    client.v1.invoices.void_invoice(invoice.id)
    assert refused(lambda: client.v1.invoices.finalize_invoice(invoice.id)).code == "invoice_not_editable"
    assert refused(lambda: client.v1.invoices.pay(invoice.id)).http_status == 400
    assert refused(lambda: client.v1.invoices.send_invoice(invoice.id)).http_status == 400
    assert server.invoice(invoice.id)["total"] == 500
    other = draft(client, cus.id, currency="eur")
    error = refused(lambda: client.v1.invoice_items.create(params={"customer": cus.id, "invoice": other.id,
                                                                    "amount": 1, "currency": "usd"}))
    assert error.param == "currency"
    charged = client.v1.invoices.create(params={"customer": cus.id})
    client.v1.invoice_items.create(params={"customer": cus.id, "invoice": charged.id, "amount": 5})
    client.v1.invoices.finalize_invoice(charged.id)
    assert "send_invoice" in refused(lambda: client.v1.invoices.send_invoice(charged.id)).user_message


def test_stripe_server_idempotent_replay_returns_the_stored_response(server):
    client = sdk(server)
    first = client.v1.customers.create(params={"name": "Acme", "metadata": {"tenant_id": "1"}},
                                       options={"idempotency_key": "tenant-1"})
    again = client.v1.customers.create(params={"name": "Acme", "metadata": {"tenant_id": "1"}},
                                       options={"idempotency_key": "tenant-1"})
    assert again.id == first.id and len(server.customers()) == 1
    assert again.last_response.headers["Idempotent-Replayed"] == "true"
    assert server.requests[-1].replayed and server.requests[-1].idempotency_key == "tenant-1"
    assert len(server.created("/v1/customers")) == 1


def test_stripe_server_idempotency_key_with_other_params_or_endpoint_is_an_error(server):
    client = sdk(server)
    cus = client.v1.customers.create(params={"name": "Acme"}, options={"idempotency_key": "k"})
    error = refused(lambda: client.v1.customers.create(params={"name": "Other"}, options={"idempotency_key": "k"}))
    assert isinstance(error, stripe.IdempotencyError) and error.http_status == 400
    assert "same parameters" in error.user_message
    error = refused(lambda: client.v1.invoices.create(params={"customer": cus.id}, options={"idempotency_key": "k"}))
    assert isinstance(error, stripe.IdempotencyError) and "same endpoint" in error.user_message
    assert len(server.customers()) == 1 and server.invoices() == []


def test_stripe_server_validation_errors_are_not_stored_under_the_key(server):
    client = sdk(server)
    refused(lambda: client.v1.customers.create(params={"colour": "red"}, options={"idempotency_key": "k"}))
    created = client.v1.customers.create(params={"name": "Acme"}, options={"idempotency_key": "k"})
    assert created.id.startswith("cus_")


def test_stripe_server_execution_errors_are_stored_and_replayed(server):
    client = sdk(server)
    cus = customer(client)
    invoice = draft(client, cus.id)
    client.v1.invoices.finalize_invoice(invoice.id)
    first = refused(lambda: client.v1.invoice_items.create(
        params={"customer": cus.id, "invoice": invoice.id, "amount": 1}, options={"idempotency_key": "late"}))
    second = refused(lambda: client.v1.invoice_items.create(
        params={"customer": cus.id, "invoice": invoice.id, "amount": 1}, options={"idempotency_key": "late"}))
    assert first.code == second.code == "invoice_not_editable" and server.requests[-1].replayed


def test_stripe_server_idempotency_keys_expire_after_24_hours(server):
    client = sdk(server)
    first = client.v1.customers.create(params={"name": "Acme"}, options={"idempotency_key": "k"})
    server.travel(23 * 3600)
    assert client.v1.customers.create(params={"name": "Acme"}, options={"idempotency_key": "k"}).id == first.id
    server.travel(2 * 3600)
    assert client.v1.customers.create(params={"name": "Acme"}, options={"idempotency_key": "k"}).id != first.id
    assert len(server.customers()) == 2


def test_stripe_server_lists_invoice_items_newest_first_with_cursors(server):
    client = sdk(server)
    cus = customer(client)
    invoice, other = draft(client, cus.id), draft(client, cus.id)
    ids = [client.v1.invoice_items.create(params={"customer": cus.id, "invoice": invoice.id, "amount": n}).id
           for n in range(5)]
    client.v1.invoice_items.create(params={"customer": cus.id, "invoice": other.id, "amount": 99})
    page = client.v1.invoice_items.list(params={"invoice": invoice.id, "limit": 2})
    assert [item.id for item in page.data] == ids[::-1][:2] and page.has_more
    every = client.v1.invoice_items.list(params={"invoice": invoice.id, "limit": 2}).auto_paging_iter()
    assert [item.id for item in every] == ids[::-1]
    after = client.v1.invoice_items.list(params={"invoice": invoice.id, "starting_after": ids[2]})
    assert [item.id for item in after.data] == [ids[1], ids[0]] and not after.has_more
    assert refused(lambda: client.v1.invoice_items.list(params={"limit": 101})).param == "limit"
    assert refused(lambda: client.v1.invoice_items.list(params={"invoice": "in_missing"})).code == "resource_missing"


def test_stripe_server_fault_500_runs_nothing_and_then_clears(server):
    client = sdk(server)
    server.fail(1, path="^/v1/customers$", method="POST")
    error = refused(lambda: client.v1.customers.create(params={"name": "Acme"}, options={"idempotency_key": "k"}))
    assert isinstance(error, stripe.APIError) and error.http_status == 500
    assert server.customers() == [] and server.requests[-1].fault == "500"
    assert client.v1.customers.create(params={"name": "Acme"}, options={"idempotency_key": "k"}).id


def test_stripe_server_fault_after_running_loses_only_the_answer(server):
    client = sdk(server)
    server.fail(1, path="^/v1/customers$", after=True)
    assert refused(lambda: client.v1.customers.create(params={"name": "Acme"},
                                                      options={"idempotency_key": "k"})).http_status == 500
    assert len(server.customers()) == 1  # it ran
    again = client.v1.customers.create(params={"name": "Acme"}, options={"idempotency_key": "k"})
    assert again.id == server.customers()[0]["id"] and server.requests[-1].replayed


def test_stripe_server_skip_lets_the_first_matching_requests_through(server):
    client = sdk(server)
    server.fail(1, path="^/v1/customers$", skip=1)
    customer(client)
    assert refused(lambda: customer(client)).http_status == 500
    customer(client)
    assert len(server.customers()) == 2


def test_stripe_server_rate_limit_is_429(server):
    server.rate_limit(1)
    error = refused(lambda: customer(sdk(server)))
    assert isinstance(error, stripe.RateLimitError) and error.http_status == 429


def test_stripe_server_hang_makes_the_sdk_time_out(server):
    client = sdk(server, timeout=0.5)
    server.hang(5, path="^/v1/customers$")
    started = time.monotonic()
    error = refused(lambda: customer(client))
    assert isinstance(error, stripe.APIConnectionError) and error.should_retry
    assert time.monotonic() - started < 3
    assert len(server.customers()) == 1  # it ran; only the answer was late


def test_stripe_server_declined_payment_is_a_card_error_with_its_event(server):
    client = sdk(server)
    cus = customer(client)
    invoice = draft(client, cus.id)
    client.v1.invoice_items.create(params={"customer": cus.id, "invoice": invoice.id, "amount": 700})
    client.v1.invoices.finalize_invoice(invoice.id)
    server.decline_payments(1)
    error = refused(lambda: client.v1.invoices.pay(invoice.id))
    assert isinstance(error, stripe.CardError) and error.code == "card_declined"
    assert server.last_event("invoice.payment_failed", invoice.id)["data"]["object"]["attempt_count"] == 1
    assert client.v1.invoices.pay(invoice.id).status == "paid"


def test_stripe_server_records_method_path_params_and_key(server):
    client = sdk(server)
    client.v1.customers.create(params={"name": "Acme", "metadata": {"tenant_id": "3"}},
                               options={"idempotency_key": "tenant-3"})
    record = server.calls("POST", "/v1/customers")[0]
    assert (record.method, record.path, record.status, record.idempotency_key) == ("POST", "/v1/customers", 200,
                                                                                    "tenant-3")
    assert record.params == {"name": "Acme", "metadata": {"tenant_id": "3"}}
    assert record.headers["content-type"].startswith("application/x-www-form-urlencoded")
    assert record.headers["stripe-version"] == stripe.api_version


def test_stripe_server_webhook_signature_is_the_one_stripe_verifies(server):
    event = {"id": "evt_1", "type": "invoice.paid", "created": int(time.time()), "data": {"object": {}}}
    payload = encode(event)
    secret = server.webhook_secret
    assert stripe.WebhookSignature.verify_header(payload, signature_header(payload, secret), secret, tolerance=300)
    for bad in (signature_header(payload, secret, forged=True), signature_header(payload, secret, stale_seconds=600),
                signature_header(payload + b" ", secret)):
        with pytest.raises(stripe.SignatureVerificationError):
            stripe.WebhookSignature.verify_header(payload, bad, secret, tolerance=300)
