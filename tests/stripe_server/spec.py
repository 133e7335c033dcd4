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
    Enum,
    Hash,
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
        "tax_rates": Unsupported(),
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
