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


# --- issue 33: tax rates, the customer's balance, credit notes ------------------------------------------------


def _sdk_fields(module: str, name: str) -> set[str]:
    """The parameter names the pinned SDK's TypedDict for a request declares (less ``RequestOptions``)."""
    import importlib

    typed = getattr(importlib.import_module(f"stripe.params.{module}"), name)
    options = set(importlib.import_module("stripe._request_options").RequestOptions.__annotations__)
    return set(typed.__annotations__) - options


@pytest.mark.parametrize(("method", "path", "module", "name"), [
    ("POST", "/v1/tax_rates", "_tax_rate_create_params", "TaxRateCreateParams"),
    ("GET", "/v1/tax_rates/{id}", "_tax_rate_retrieve_params", "TaxRateRetrieveParams"),
    ("POST", "/v1/credit_notes", "_credit_note_create_params", "CreditNoteCreateParams"),
    ("GET", "/v1/credit_notes", "_credit_note_list_params", "CreditNoteListParams"),
    ("GET", "/v1/credit_notes/{id}", "_credit_note_retrieve_params", "CreditNoteRetrieveParams"),
    ("POST", "/v1/customers/{id}/balance_transactions", "_customer_balance_transaction_create_params",
     "CustomerBalanceTransactionCreateParams"),
    ("GET", "/v1/customers/{id}/balance_transactions", "_customer_balance_transaction_list_params",
     "CustomerBalanceTransactionListParams"),
    ("POST", "/v1/invoiceitems", "_invoice_item_create_params", "InvoiceItemCreateParams"),
])
def test_stripe_server_new_endpoints_list_exactly_the_sdk_parameters(method, path, module, name):
    from tests.stripe_server.spec import ENDPOINTS

    endpoint = next(e for e in ENDPOINTS if (e.method, e.path) == (method, path))
    assert set(endpoint.params) == _sdk_fields(module, name)
    if path == "/v1/credit_notes" and method == "POST":
        assert set(endpoint.params["lines"].fields) == _sdk_fields(module, "CreditNoteCreateParamsLine")


def test_stripe_server_tax_rates_tax_each_line_and_the_total(server):
    client = sdk(server)
    vat = client.v1.tax_rates.create(params={"display_name": "VAT", "percentage": 19.0, "inclusive": False,
                                             "jurisdiction": "DE", "country": "DE", "metadata": {"tax_rate_id": "3"}})
    assert (vat.id[:4], vat.percentage, vat.inclusive, vat.jurisdiction, vat.active) == ("txr_", 19.0, False, "DE",
                                                                                         True)
    assert server.calls("POST", "/v1/tax_rates")[0].params["percentage"] == "19.0"
    assert client.v1.tax_rates.retrieve(vat.id).display_name == "VAT"
    cus = customer(client)
    invoice = draft(client, cus.id)
    for amount in (1003, 1003, -205):  # 190.57 → 191, 191, -38.95 → -39: rounded per line
        client.v1.invoice_items.create(params={"customer": cus.id, "invoice": invoice.id, "amount": amount,
                                               "tax_rates": [vat.id]})
    invoice = client.v1.invoices.retrieve(invoice.id)
    assert (invoice.subtotal, invoice.total, invoice.total_excluding_tax) == (1801, 1801 + 343, 1801)
    assert [(t.amount, t.taxable_amount, t.tax_behavior) for t in invoice.total_taxes] == [(343, 1801, "exclusive")]
    assert [line.taxes[0].amount for line in invoice.lines.data] == [191, 191, -39]
    # wrong shapes and unknown or inactive rates are refused, naming the field
    assert refused(lambda: client.v1.tax_rates.create(params={"display_name": "VAT", "percentage": 19.12345,
                                                              "inclusive": False})).param == "percentage"
    assert refused(lambda: client.v1.tax_rates.create(params={"display_name": "VAT", "percentage": 101,
                                                              "inclusive": False})).param == "percentage"
    assert refused(lambda: client.v1.tax_rates.create(params={"display_name": "VAT",
                                                              "percentage": 19})).code == "parameter_missing"
    off = client.v1.tax_rates.create(params={"display_name": "Old", "percentage": 5, "inclusive": False,
                                             "active": False})
    for rate_id, code in (("txr_nope", "resource_missing"), (off.id, None)):
        error = refused(lambda rate_id=rate_id: client.v1.invoice_items.create(params={
            "customer": cus.id, "invoice": invoice.id, "amount": 100, "tax_rates": [rate_id]}))
        assert (error.http_status, error.param, error.code) == (400, "tax_rates[0]", code)


def test_stripe_server_inclusive_rate_is_inside_the_total(server):
    client = sdk(server)
    vat = client.v1.tax_rates.create(params={"display_name": "VAT", "percentage": 20, "inclusive": True})
    cus = customer(client)
    invoice = draft(client, cus.id)
    client.v1.invoice_items.create(params={"customer": cus.id, "invoice": invoice.id, "amount": 1200,
                                           "tax_rates": [vat.id]})
    invoice = client.v1.invoices.retrieve(invoice.id)
    assert (invoice.subtotal, invoice.total, invoice.total_excluding_tax) == (1200, 1200, 1000)
    assert invoice.total_taxes[0].amount == 200 and invoice.total_taxes[0].tax_behavior == "inclusive"


def test_stripe_server_customer_balance_credit_is_applied_at_finalization(server):
    client = sdk(server)
    cus = customer(client)
    credit = client.v1.customers.balance_transactions.create(
        cus.id, params={"amount": -30000, "currency": "usd", "description": "prepaid credit",
                        "metadata": {"invoice_id": "7"}}, options={"idempotency_key": "k-credit"})
    assert (credit.id[:6], credit.amount, credit.ending_balance, credit.type) == ("cbtxn_", -30000, -30000,
                                                                                  "adjustment")
    again = client.v1.customers.balance_transactions.create(
        cus.id, params={"amount": -30000, "currency": "usd", "description": "prepaid credit",
                        "metadata": {"invoice_id": "7"}}, options={"idempotency_key": "k-credit"})
    assert again.id == credit.id and client.v1.customers.retrieve(cus.id).balance == -30000  # replayed, once
    invoice = draft(client, cus.id)
    client.v1.invoice_items.create(params={"customer": cus.id, "invoice": invoice.id, "amount": 100000})
    invoice = client.v1.invoices.finalize_invoice(invoice.id)
    assert (invoice.total, invoice.amount_due, invoice.starting_balance, invoice.ending_balance) == (
        100000, 70000, -30000, 0)
    listed = client.v1.customers.balance_transactions.list(cus.id, params={"limit": 10}).data
    assert [(t.type, t.amount, t.invoice) for t in listed] == [("applied_to_invoice", 30000, invoice.id),
                                                               ("adjustment", -30000, None)]
    assert refused(lambda: client.v1.customers.balance_transactions.create(
        cus.id, params={"amount": -1, "currency": "eur"})).param == "currency"
    assert refused(lambda: client.v1.customers.balance_transactions.create(
        cus.id, params={"currency": "usd"})).code == "parameter_missing"
    assert refused(lambda: client.v1.customers.balance_transactions.create(
        "cus_nope", params={"amount": -1, "currency": "usd"})).http_status == 404


def test_stripe_server_credit_notes_pre_and_post_payment(server):
    client = sdk(server)
    cus = customer(client)
    invoice = draft(client, cus.id)
    item = client.v1.invoice_items.create(params={"customer": cus.id, "invoice": invoice.id, "amount": 10000})
    client.v1.invoice_items.create(params={"customer": cus.id, "invoice": invoice.id, "amount": 5000})
    assert refused(lambda: client.v1.credit_notes.create(params={"invoice": invoice.id, "amount": 100})).code == (
        "invoice_not_editable")  # a draft takes no credit note
    invoice = client.v1.invoices.finalize_invoice(invoice.id)
    line_id = "il_" + item.id[3:]
    note = client.v1.credit_notes.create(params={
        "invoice": invoice.id, "reason": "order_change", "memo": "wrong price", "metadata": {"credit_note_id": "1"},
        "lines": [{"type": "invoice_line_item", "invoice_line_item": line_id, "amount": 2500},
                  {"type": "custom_line_item", "unit_amount": 500, "quantity": 1, "description": "goodwill"}]},
        options={"idempotency_key": "k-cn-1"})
    assert (note.id[:3], note.total, note.type, note.reason, note.memo, note.status) == (
        "cn_", 3000, "pre_payment", "order_change", "wrong price", "issued")
    invoice = client.v1.invoices.retrieve(invoice.id)
    assert (invoice.total, invoice.amount_due, invoice.pre_payment_credit_notes_amount) == (15000, 12000, 3000)
    assert [n.id for n in client.v1.credit_notes.list(params={"invoice": invoice.id}).data] == [note.id]
    assert client.v1.credit_notes.retrieve(note.id).number.endswith("-CN-01")
    # more than the line has left, more than the invoice has left, bad shapes: refused, naming the field
    for params, param in (
            ({"lines": [{"type": "invoice_line_item", "invoice_line_item": line_id, "amount": 7501}]},
             "lines[0][amount]"),
            ({"amount": 12001}, "amount"),
            ({"lines": [{"type": "custom_line_item", "unit_amount": 5}]}, "lines[0][description]"),
            ({"lines": [{"type": "invoice_line_item", "invoice_line_item": "il_nope", "amount": 5}]},
             "lines[0][invoice_line_item]"),
            ({"lines": [{"type": "custom_line_item", "unit_amount": 5, "description": "x", "tax_rates": ["t"]}]},
             "lines[0][tax_rates]"),
            ({"amount": 100, "out_of_band_amount": 100}, "out_of_band_amount"),
            ({}, "amount")):
        error = refused(lambda params=params: client.v1.credit_notes.create(params={"invoice": invoice.id, **params}))
        assert (error.http_status, error.param) == (400, param), (params, error)
    paid = client.v1.invoices.pay(invoice.id, params={"paid_out_of_band": True})
    assert (paid.status, paid.amount_paid) == ("paid", 12000)
    assert refused(lambda: client.v1.credit_notes.create(params={"invoice": invoice.id, "amount": 100})).param == (
        "out_of_band_amount")  # post-payment: say where the money goes
    post = client.v1.credit_notes.create(params={"invoice": invoice.id, "amount": 1000, "out_of_band_amount": 1000})
    assert (post.type, post.total, post.out_of_band_amount) == ("post_payment", 1000, 1000)
    assert client.v1.invoices.retrieve(invoice.id).post_payment_credit_notes_amount == 1000
    assert [e["type"] for e in server.events].count("credit_note.created") == 2


def test_stripe_server_credit_note_to_zero_pays_the_open_invoice(server):
    client = sdk(server)
    cus = customer(client)
    invoice = draft(client, cus.id)
    client.v1.invoice_items.create(params={"customer": cus.id, "invoice": invoice.id, "amount": 4000})
    invoice = client.v1.invoices.finalize_invoice(invoice.id)
    client.v1.credit_notes.create(params={"invoice": invoice.id, "amount": 4000, "reason": "duplicate"})
    invoice = client.v1.invoices.retrieve(invoice.id)
    assert (invoice.status, invoice.amount_due, invoice.amount_paid) == ("paid", 0, 0)
    assert server.last_event("invoice.paid", invoice.id)
