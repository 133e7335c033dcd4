"""The endpoints the test server answers, and each one's documented parameters, as data.

Tables follow Stripe's API reference (links beside each endpoint) for the API version the pinned SDK sends
(``stripe==16.1.0``, ``Stripe-Version: 2026-10-28.endive``), cross-checked with the parameter types the SDK
itself ships (``stripe/params/_*_params.py``). A parameter Stripe documents but this server does not model
is listed as :class:`Unsupported`: it is refused with a message saying so, never silently accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tests.stripe_server.params import (
    Boolean,
    Currency,
    DecimalNumber,
    Enum,
    Hash,
    HashList,
    Id,
    Integer,
    Metadata,
    Param,
    String,
    StringList,
    Timestamp,
    Unsupported,
)


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str  # "{id}" stands for one path segment
    name: str  # the handler in state.StripeState
    doc: str
    params: dict[str, Param]
    pattern: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "pattern", re.compile("^" + self.path.replace("{id}", "(?P<id>[^/]+)") + "$"))


EXPAND = StringList(choices=())

ENDPOINTS: tuple[Endpoint, ...] = (
    # https://docs.stripe.com/api/customers/create
    Endpoint("POST", "/v1/customers", "customer_create", "https://docs.stripe.com/api/customers/create", {
        "address": Unsupported(),
        "balance": Integer(),
        "business_name": String(max_length=150, emptyable=True),
        "cash_balance": Unsupported(),
        "description": String(),
        "email": String(max_length=512, pattern=r"[^@\s]+@[^@\s]+"),
        "expand": EXPAND,
        "individual_name": String(max_length=150, emptyable=True),
        "invoice_prefix": String(max_length=12, pattern=r"[A-Z0-9]{3,12}"),
        "invoice_settings": Unsupported(),
        "metadata": Metadata(),
        "name": String(max_length=256),
        "next_invoice_sequence": Integer(minimum=1),
        "payment_method": Unsupported(),
        "phone": String(max_length=20),
        "preferred_locales": StringList(),
        "shipping": Unsupported(),
        "source": Unsupported(),
        "tax": Unsupported(),
        "tax_exempt": Enum("exempt", "none", "reverse"),
        "tax_id_data": Unsupported(),
        "test_clock": Unsupported(),
        "validate": Boolean(),
    }),
    # https://docs.stripe.com/api/customers/retrieve
    Endpoint("GET", "/v1/customers/{id}", "customer_retrieve", "https://docs.stripe.com/api/customers/retrieve",
             {"expand": EXPAND}),
    # https://docs.stripe.com/api/invoices/create
    Endpoint("POST", "/v1/invoices", "invoice_create", "https://docs.stripe.com/api/invoices/create", {
        "account_tax_ids": Unsupported(),
        "application_fee_amount": Unsupported(),
        "auto_advance": Boolean(),
        "automatic_tax": Unsupported(),
        "automatically_finalizes_at": Timestamp(),
        "collection_method": Enum("charge_automatically", "send_invoice"),
        "currency": Currency(),
        "custom_fields": Unsupported(),
        # Stripe requires one of customer / customer_account; customer_account is not modelled here.
        "customer": Id("cus", required=True),
        "customer_account": Unsupported(),
        "days_until_due": Integer(minimum=0, maximum=3650),
        "default_payment_method": Unsupported(),
        "default_source": Unsupported(),
        "default_tax_rates": Unsupported(),
        "description": String(max_length=1500),
        "discounts": Unsupported(),
        "due_date": Timestamp(),
        "effective_at": Timestamp(),
        "expand": StringList(choices=("customer",)),
        "footer": String(max_length=5000),
        "from_invoice": Unsupported(),
        "issuer": Unsupported(),
        "metadata": Metadata(),
        "number": String(max_length=26),
        "on_behalf_of": Unsupported(),
        "payment_settings": Unsupported(),
        "pending_invoice_items_behavior": Enum("exclude", "include"),
        "rendering": Unsupported(),
        "shipping_cost": Unsupported(),
        "shipping_details": Unsupported(),
        "statement_descriptor": String(max_length=22),
        "subscription": Unsupported(),
        "transfer_data": Unsupported(),
    }),
    # https://docs.stripe.com/api/invoices/retrieve
    Endpoint("GET", "/v1/invoices/{id}", "invoice_retrieve", "https://docs.stripe.com/api/invoices/retrieve",
             {"expand": StringList(choices=("customer",))}),
    # https://docs.stripe.com/api/invoices/finalize
    Endpoint("POST", "/v1/invoices/{id}/finalize", "invoice_finalize", "https://docs.stripe.com/api/invoices/finalize",
             {"auto_advance": Boolean(), "expand": StringList(choices=("customer",))}),
    # https://docs.stripe.com/api/invoices/send
    Endpoint("POST", "/v1/invoices/{id}/send", "invoice_send", "https://docs.stripe.com/api/invoices/send",
             {"expand": StringList(choices=("customer",))}),
    # https://docs.stripe.com/api/invoices/void
    Endpoint("POST", "/v1/invoices/{id}/void", "invoice_void", "https://docs.stripe.com/api/invoices/void",
             {"expand": StringList(choices=("customer",))}),
    # https://docs.stripe.com/api/invoices/pay
    Endpoint("POST", "/v1/invoices/{id}/pay", "invoice_pay", "https://docs.stripe.com/api/invoices/pay", {
        "expand": StringList(choices=("customer",)),
        "forgive": Boolean(),
        "mandate": Unsupported(),
        "off_session": Boolean(),
        "paid_out_of_band": Boolean(),
        "payment_method": Unsupported(),
        "source": Unsupported(),
    }),
    # https://docs.stripe.com/api/invoiceitems/create
    Endpoint("POST", "/v1/invoiceitems", "invoiceitem_create", "https://docs.stripe.com/api/invoiceitems/create", {
        # "Passing in a negative amount will reduce the amount_due on the invoice." Required here because
        # its alternatives (price_data, pricing, unit_amount_decimal) are not modelled.
        "amount": Integer(),
        "currency": Currency(),
        "customer": Id("cus", required=True),
        "customer_account": Unsupported(),
        "description": String(max_length=5000),
        "discountable": Boolean(),
        "discounts": Unsupported(),
        "expand": EXPAND,
        "invoice": Id("in"),
        "metadata": Metadata(),
        "period": Hash({"start": Timestamp(required=True), "end": Timestamp(required=True)}),
        "price_data": Unsupported(),
        "pricing": Unsupported(),
        "quantity": Unsupported(),
        "quantity_decimal": Unsupported(),
        "subscription": Unsupported(),
        "tax_behavior": Unsupported(),
        "tax_code": Unsupported(),
        # "The tax rates which apply to the invoice item": existing, active txr_ ids (at most 10); Stripe
        # computes each line's tax from them (state.StripeState.line_taxes).
        "tax_rates": StringList(),
        "unit_amount_decimal": Unsupported(),
    }),
    # https://docs.stripe.com/api/invoiceitems/list
    Endpoint("GET", "/v1/invoiceitems", "invoiceitem_list", "https://docs.stripe.com/api/invoiceitems/list", {
        "created": Unsupported(),
        "customer": Id("cus"),
        "customer_account": Unsupported(),
        "ending_before": String(),
        "expand": EXPAND,
        "invoice": Id("in"),
        "limit": Integer(minimum=1, maximum=100),
        "pending": Boolean(),
        "starting_after": String(),
    }),
    # https://docs.stripe.com/api/invoiceitems/retrieve
    Endpoint("GET", "/v1/invoiceitems/{id}", "invoiceitem_retrieve",
             "https://docs.stripe.com/api/invoiceitems/retrieve", {"expand": EXPAND}),
)

TAX_TYPES = ("admissions_tax", "amusement_tax", "attendance_tax", "communications_tax", "digital_excise_tax",
             "entertainment_tax", "get_fund", "gross_receipts_tax", "gst", "hospitality_tax", "hst", "igst", "jct",
             "lease_tax", "luxury_tax", "mass_transit_parking_tax", "nhil", "parking_tax", "pst", "qst",
             "resort_tax", "retail_delivery_fee", "rst", "sales_tax", "service_tax", "tourism_tax",
             "utility_users_tax", "vat")
LIST_PAGE = {"ending_before": String(), "expand": EXPAND, "limit": Integer(minimum=1, maximum=100),
             "starting_after": String()}

ENDPOINTS += (
    # https://docs.stripe.com/api/tax_rates/create
    Endpoint("POST", "/v1/tax_rates", "tax_rate_create", "https://docs.stripe.com/api/tax_rates/create", {
        "active": Boolean(),
        "country": String(max_length=2, pattern=r"[A-Z]{2}"),
        "description": String(max_length=500),
        "display_name": String(max_length=50, required=True),
        "expand": EXPAND,
        "inclusive": Boolean(required=True),
        "jurisdiction": String(max_length=50),
        "metadata": Metadata(),
        "percentage": DecimalNumber(minimum=0, maximum=100, places=4, required=True),
        "state": String(max_length=2, pattern=r"[A-Z]{2}"),
        "tax_type": Enum(*TAX_TYPES),
    }),
    # https://docs.stripe.com/api/tax_rates/retrieve
    Endpoint("GET", "/v1/tax_rates/{id}", "tax_rate_retrieve", "https://docs.stripe.com/api/tax_rates/retrieve",
             {"expand": EXPAND}),
    # https://docs.stripe.com/api/customer_balance_transactions/create ("amount: negative is a credit")
    Endpoint("POST", "/v1/customers/{id}/balance_transactions", "balance_transaction_create",
             "https://docs.stripe.com/api/customer_balance_transactions/create", {
                 "amount": Integer(required=True),
                 "currency": Currency(required=True),
                 "description": String(max_length=350),
                 "expand": EXPAND,
                 "metadata": Metadata(),
             }),
    # https://docs.stripe.com/api/customer_balance_transactions/list
    Endpoint("GET", "/v1/customers/{id}/balance_transactions", "balance_transaction_list",
             "https://docs.stripe.com/api/customer_balance_transactions/list", {
                 **LIST_PAGE, "created": Unsupported(), "invoice": Id("in"),
             }),
    # https://docs.stripe.com/api/credit_notes/create
    Endpoint("POST", "/v1/credit_notes", "credit_note_create", "https://docs.stripe.com/api/credit_notes/create", {
        # "One of amount, lines, or shipping_cost must be provided"; amount with lines must equal their sum.
        "amount": Integer(minimum=1),
        "credit_amount": Integer(minimum=0),
        "effective_at": Unsupported(),
        "email_type": Enum("credit_note", "none"),
        "expand": EXPAND,
        "invoice": Id("in", required=True),
        "lines": HashList({
            "amount": Integer(minimum=1),
            "description": String(max_length=500),
            "invoice_line_item": Id("il"),
            "metadata": Metadata(),
            "quantity": Integer(minimum=1),
            "tax_amounts": Unsupported(),
            "tax_rates": Unsupported(),
            "type": Enum("custom_line_item", "invoice_line_item", required=True),
            "unit_amount": Integer(minimum=1),
            "unit_amount_decimal": Unsupported(),
        }),
        "memo": String(max_length=5000),
        "metadata": Metadata(),
        "out_of_band_amount": Integer(minimum=0),
        "reason": Enum("duplicate", "fraudulent", "order_change", "product_unsatisfactory"),
        "refund_amount": Unsupported(),
        "refunds": Unsupported(),
        "shipping_cost": Unsupported(),
    }),
    # https://docs.stripe.com/api/credit_notes/retrieve
    Endpoint("GET", "/v1/credit_notes/{id}", "credit_note_retrieve",
             "https://docs.stripe.com/api/credit_notes/retrieve", {"expand": EXPAND}),
    # https://docs.stripe.com/api/credit_notes/list
    Endpoint("GET", "/v1/credit_notes", "credit_note_list", "https://docs.stripe.com/api/credit_notes/list", {
        **LIST_PAGE, "created": Unsupported(), "customer": Id("cus"), "customer_account": Unsupported(),
        "invoice": Id("in"),
    }),
)


def route(method: str, path: str) -> tuple[Endpoint | None, str | None, bool]:
    """The endpoint for ``method path``, the ``{id}`` in it, and whether the path exists for another method."""
    other_method = False
    for endpoint in ENDPOINTS:
        match = endpoint.pattern.match(path)
        if match:
            if endpoint.method == method:
                return endpoint, match.groupdict().get("id"), False
            other_method = True
    return None, None, other_method
