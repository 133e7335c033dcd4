"""The objects the test server keeps (customers, invoices, invoice items) and what each endpoint does to them.

Behaviour follows Stripe's documentation: the invoice lifecycle draft → open → paid | void (and which call may
move which status: https://docs.stripe.com/invoicing/integration/workflow-transitions), invoice items only on
draft invoices, totals as the sum of the items, ``$0`` invoices marked paid on finalization, ``send`` only for
``collection_method=send_invoice`` and a customer with an email, and an event for each change
(``invoice.finalized``, ``invoice.sent``, ``invoice.paid``, ``invoice.payment_failed``, ``invoice.voided``, …).
Responses are Stripe-shaped JSON objects (``id``, ``object``, ``created``, ``livemode``, ``metadata``, …).
"""

from __future__ import annotations

import copy
import itertools
import random
import string
from collections.abc import Callable
from typing import Any

from tests.stripe_server.params import ApiError, missing

API_VERSION = "2026-10-28.endive"  # what stripe==16.1.0 sends; events carry it as api_version
_ALPHABET = string.ascii_letters + string.digits


def no_such(kind: str, object_id: str, *, param: str | None = None) -> ApiError:
    """An unknown id: 404 when it is the object of the URL, 400 when a body parameter names it."""
    return ApiError(404 if param is None else 400, f"No such {kind}: '{object_id}'", code="resource_missing",
                    param=param or "id")


def state_error(message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, code=code, param=param)


class StripeState:
    """Every object the server holds. Not thread-safe by itself: the server calls it under one lock."""

    def __init__(self, *, clock: Callable[[], int], account_name: str = "GPU broker (Stripe test server)",
                 seed: int | None = None):
        self.clock = clock
        self.account_name = account_name
        self.customers: dict[str, dict[str, Any]] = {}
        self.invoices: dict[str, dict[str, Any]] = {}
        self.items: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.emails_sent: list[str] = []  # invoice ids, one per successful send
        self.declines = 0  # the next N pay calls are declined
        self._random = random.Random(seed)
        self._order = itertools.count(1)

    # --- helpers ----------------------------------------------------------------------------------------------

    def new_id(self, prefix: str, length: int = 14) -> str:
        return f"{prefix}_" + "".join(self._random.choice(_ALPHABET) for _ in range(length))

    def emit(self, event_type: str, obj: dict[str, Any]) -> None:
        self.events.append({
            "id": self.new_id("evt", 24), "object": "event", "api_version": API_VERSION, "created": self.clock(),
            "data": {"object": copy.deepcopy(obj)}, "livemode": False, "pending_webhooks": 1,
            "request": {"id": None, "idempotency_key": None}, "type": event_type,
        })

    def _customer(self, customer_id: str, *, param: str | None = None) -> dict[str, Any]:
        if customer_id not in self.customers:
            raise no_such("customer", customer_id, param=param)
        return self.customers[customer_id]

    def _invoice(self, invoice_id: str, *, param: str | None = None) -> dict[str, Any]:
        if invoice_id not in self.invoices:
            raise no_such("invoice", invoice_id, param=param)
        return self.invoices[invoice_id]

    def _invoice_items(self, invoice: dict[str, Any]) -> list[dict[str, Any]]:
        return [self.items[item_id] for item_id in invoice["_items"]]

    # --- JSON shapes ------------------------------------------------------------------------------------------

    def customer_json(self, customer: dict[str, Any]) -> dict[str, Any]:
        return copy.deepcopy(customer)

    def item_json(self, item: dict[str, Any]) -> dict[str, Any]:
        return {key: copy.deepcopy(value) for key, value in item.items() if not key.startswith("_")}

    def line_json(self, item: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": "il_" + item["id"][3:], "object": "line_item", "amount": item["amount"],
            "currency": item["currency"], "description": item["description"], "discount_amounts": [],
            "discountable": item["discountable"], "discounts": [], "invoice": item["invoice"], "livemode": False,
            "metadata": dict(item["metadata"]),
            "parent": {"type": "invoice_item_details", "subscription_item_details": None,
                       "invoice_item_details": {"invoice_item": item["id"], "proration": False,
                                                "proration_details": {"credited_items": None},
                                                "subscription": None}},
            "period": dict(item["period"]), "pretax_credit_amounts": [], "quantity": 1, "taxes": [],
        }

    def invoice_json(self, invoice: dict[str, Any], expand: list[str] | None = None) -> dict[str, Any]:
        items = self._invoice_items(invoice)
        total = sum(item["amount"] for item in items)
        amount_due = max(total, 0)
        paid = invoice["status"] == "paid"
        body = {key: copy.deepcopy(value) for key, value in invoice.items() if not key.startswith("_")}
        body.update({
            "subtotal": total, "subtotal_excluding_tax": total, "total": total, "total_excluding_tax": total,
            "amount_due": amount_due, "amount_paid": amount_due if paid else 0,
            "amount_remaining": 0 if paid or invoice["status"] == "void" else amount_due,
            "lines": {"object": "list", "data": [self.line_json(item) for item in items], "has_more": False,
                      "total_count": len(items), "url": f"/v1/invoices/{invoice['id']}/lines"},
        })
        if expand and "customer" in expand:
            body["customer"] = self.customer_json(self.customers[invoice["customer"]])
        return body

    # --- customers --------------------------------------------------------------------------------------------

    def customer_create(self, params: dict[str, Any], object_id: str | None) -> tuple[int, dict]:
        customer = {
            "id": self.new_id("cus"), "object": "customer", "address": None, "balance": params.get("balance", 0),
            "created": self.clock(), "currency": None, "default_source": None, "delinquent": False,
            "description": params.get("description"), "email": params.get("email"),
            "invoice_prefix": params.get("invoice_prefix")
            or "".join(self._random.choice(string.ascii_uppercase + string.digits) for _ in range(8)),
            "invoice_settings": {"custom_fields": None, "default_payment_method": None, "footer": None,
                                 "rendering_options": None},
            "livemode": False, "metadata": params.get("metadata", {}), "name": params.get("name"),
            "next_invoice_sequence": params.get("next_invoice_sequence", 1), "phone": params.get("phone"),
            "preferred_locales": params.get("preferred_locales", []), "shipping": None,
            "tax_exempt": params.get("tax_exempt", "none"), "test_clock": None,
        }
        self.customers[customer["id"]] = customer
        self.emit("customer.created", customer)
        return 200, self.customer_json(customer)

    def customer_retrieve(self, params: dict[str, Any], object_id: str | None) -> tuple[int, dict]:
        return 200, self.customer_json(self._customer(object_id or ""))

    # --- invoices ---------------------------------------------------------------------------------------------

    def invoice_create(self, params: dict[str, Any], object_id: str | None) -> tuple[int, dict]:
        customer = self._customer(params["customer"], param="customer")
        method = params.get("collection_method", "charge_automatically")
        if "days_until_due" in params and "due_date" in params:
            raise state_error("You may only specify one of these parameters: days_until_due, due_date.",
                              param="days_until_due")
        if method != "send_invoice" and ("days_until_due" in params or "due_date" in params):
            name = "days_until_due" if "days_until_due" in params else "due_date"
            raise state_error(f"Invalid {name}: it can only be set when collection_method is send_invoice.",
                              param=name)
        if method == "send_invoice" and "days_until_due" not in params and "due_date" not in params:
            raise missing("days_until_due")
        now = self.clock()
        due_date = params.get("due_date")
        if "days_until_due" in params:
            due_date = now + params["days_until_due"] * 86400
        invoice = {
            "id": self.new_id("in"), "object": "invoice", "account_country": "US",
            "account_name": self.account_name, "account_tax_ids": None, "amount_overpaid": 0,
            "amount_shipping": 0, "application": None, "attempt_count": 0, "attempted": False,
            "auto_advance": params.get("auto_advance", False),
            "automatic_tax": {"disabled_reason": None, "enabled": False, "liability": None, "provider": None,
                              "status": None},
            "automatically_finalizes_at": params.get("automatically_finalizes_at"), "billing_reason": "manual",
            "collection_method": method, "created": now, "currency": params.get("currency", "usd"),
            "custom_fields": None, "customer": customer["id"], "customer_address": None,
            "customer_email": customer["email"], "customer_name": customer["name"], "customer_phone": None,
            "customer_shipping": None, "customer_tax_exempt": customer["tax_exempt"], "customer_tax_ids": [],
            "days_until_due": params.get("days_until_due"), "default_payment_method": None, "default_source": None,
            "default_tax_rates": [], "description": params.get("description"), "discounts": [],
            "due_date": due_date, "effective_at": params.get("effective_at"), "ending_balance": None,
            "footer": params.get("footer"), "from_invoice": None, "hosted_invoice_url": None, "invoice_pdf": None,
            "issuer": {"type": "self"}, "last_finalization_error": None, "latest_revision": None,
            "livemode": False, "metadata": params.get("metadata", {}), "next_payment_attempt": None,
            "number": params.get("number"), "on_behalf_of": None, "parent": None,
            "payment_settings": {"default_mandate": None, "payment_method_options": None,
                                 "payment_method_types": None},
            "period_end": now, "period_start": now, "post_payment_credit_notes_amount": 0,
            "pre_payment_credit_notes_amount": 0, "receipt_number": None, "rendering": None,
            "shipping_cost": None, "shipping_details": None, "starting_balance": customer["balance"],
            "statement_descriptor": params.get("statement_descriptor"), "status": "draft",
            "status_transitions": {"finalized_at": None, "marked_uncollectible_at": None, "paid_at": None,
                                   "voided_at": None},
            "test_clock": None, "total_discount_amounts": [], "total_taxes": [], "webhooks_delivered_at": None,
            "_items": [],
        }
        if params.get("pending_invoice_items_behavior", "exclude") == "include":
            for item in sorted(self.items.values(), key=lambda i: i["_order"]):
                if item["customer"] == customer["id"] and item["invoice"] is None:
                    item["invoice"] = invoice["id"]
                    invoice["_items"].append(item["id"])
        self.invoices[invoice["id"]] = invoice
        self.emit("invoice.created", self.invoice_json(invoice))
        return 200, self.invoice_json(invoice, params.get("expand"))

    def invoice_retrieve(self, params: dict[str, Any], object_id: str | None) -> tuple[int, dict]:
        return 200, self.invoice_json(self._invoice(object_id or ""), params.get("expand"))

    def invoice_finalize(self, params: dict[str, Any], object_id: str | None) -> tuple[int, dict]:
        invoice = self._invoice(object_id or "")
        if invoice["status"] != "draft":
            raise state_error(f"This invoice is already finalized, you can't re-finalize a non-draft invoice "
                              f"(invoice {invoice['id']} is {invoice['status']}).", code="invoice_not_editable")
        customer = self.customers[invoice["customer"]]
        now = self.clock()
        if not invoice["number"]:
            invoice["number"] = f"{customer['invoice_prefix']}-{customer['next_invoice_sequence']:04d}"
            customer["next_invoice_sequence"] += 1
        if "auto_advance" in params:
            invoice["auto_advance"] = params["auto_advance"]
        total = sum(item["amount"] for item in self._invoice_items(invoice))
        invoice.update({"status": "open", "hosted_invoice_url": f"https://invoice.stripe.test/i/{invoice['id']}",
                        "invoice_pdf": f"https://pay.stripe.test/invoice/{invoice['id']}/pdf",
                        "ending_balance": invoice["starting_balance"] + min(total, 0), "effective_at": now})
        invoice["status_transitions"]["finalized_at"] = now
        if total < 0:
            customer["balance"] += total  # a negative invoice becomes a credit on the customer's balance
        self.emit("invoice.finalized", self.invoice_json(invoice))
        if max(total, 0) == 0:  # nothing to collect: Stripe marks it paid at once
            invoice["status"] = "paid"
            invoice["status_transitions"]["paid_at"] = now
            self.emit("invoice.paid", self.invoice_json(invoice))
        return 200, self.invoice_json(invoice, params.get("expand"))

    def invoice_send(self, params: dict[str, Any], object_id: str | None) -> tuple[int, dict]:
        invoice = self._invoice(object_id or "")
        if invoice["collection_method"] != "send_invoice":
            raise state_error("You can only manually send an invoice if its collection method is 'send_invoice'.")
        if invoice["status"] == "draft":
            raise state_error(f"Invoice {invoice['id']} is a draft; finalize it before sending it.",
                              code="invoice_not_editable")
        if invoice["status"] == "void":
            raise state_error(f"You can't send invoice {invoice['id']} because it is void.")
        customer = self.customers[invoice["customer"]]
        if not customer["email"]:
            raise state_error(f"Customer {customer['id']} has no email address; add one before sending "
                              "the invoice.", param="customer")
        self.emails_sent.append(invoice["id"])
        self.emit("invoice.sent", self.invoice_json(invoice))
        return 200, self.invoice_json(invoice, params.get("expand"))

    def invoice_void(self, params: dict[str, Any], object_id: str | None) -> tuple[int, dict]:
        invoice = self._invoice(object_id or "")
        status = invoice["status"]
        if status == "draft":
            raise state_error("You can only void invoices that are open or uncollectible; delete a draft "
                              "instead.", code="invoice_not_editable")
        if status in ("paid", "void"):
            raise state_error(f"You can't void invoice {invoice['id']} because it is {status}.",
                              code="invoice_not_editable")
        invoice["status"] = "void"
        invoice["status_transitions"]["voided_at"] = self.clock()
        self.emit("invoice.voided", self.invoice_json(invoice))
        return 200, self.invoice_json(invoice, params.get("expand"))

    def invoice_pay(self, params: dict[str, Any], object_id: str | None) -> tuple[int, dict]:
        invoice = self._invoice(object_id or "")
        status = invoice["status"]
        if status == "draft":
            raise state_error(f"Invoice {invoice['id']} is a draft; finalize it before paying it.",
                              code="invoice_not_editable")
        if status == "paid":
            raise state_error("Invoice is already paid", code="invoice_already_paid")
        if status == "void":
            raise state_error(f"You can't pay invoice {invoice['id']} because it is void.",
                              code="invoice_not_editable")
        invoice["attempted"] = True
        out_of_band = params.get("paid_out_of_band", False) or params.get("forgive", False)
        if self.declines and not out_of_band:
            self.declines -= 1
            invoice["attempt_count"] += 1
            self.emit("invoice.payment_failed", self.invoice_json(invoice))
            raise ApiError(402, "Your card was declined.", type="card_error", code="card_declined")
        if not out_of_band:
            invoice["attempt_count"] += 1
        invoice["status"] = "paid"
        invoice["status_transitions"]["paid_at"] = self.clock()
        self.emit("invoice.paid", self.invoice_json(invoice))
        return 200, self.invoice_json(invoice, params.get("expand"))

    # --- invoice items ----------------------------------------------------------------------------------------

    def invoiceitem_create(self, params: dict[str, Any], object_id: str | None) -> tuple[int, dict]:
        customer = self._customer(params["customer"], param="customer")
        if "amount" not in params:
            raise missing("amount")
        invoice = None
        if "invoice" in params:
            invoice = self._invoice(params["invoice"], param="invoice")
            if invoice["customer"] != customer["id"]:
                raise state_error(f"Invoice {invoice['id']} belongs to customer {invoice['customer']}, not to "
                                  f"{customer['id']}.", param="invoice")
            if invoice["status"] != "draft":
                raise state_error(f"You can only add invoice items to draft invoices; invoice {invoice['id']} "
                                  f"is {invoice['status']}.", param="invoice", code="invoice_not_editable")
            if len(invoice["_items"]) >= 250:
                raise state_error("An invoice can have at most 250 invoice items.", param="invoice")
        currency = params.get("currency") or (invoice["currency"] if invoice else customer["currency"] or "usd")
        if invoice and currency != invoice["currency"]:
            raise state_error(f"The currency of the invoice item ({currency}) must match the currency of the "
                              f"invoice ({invoice['currency']}).", param="currency")
        now = self.clock()
        period = params.get("period", {"start": now, "end": now})
        if period["end"] < period["start"]:
            raise state_error("period[end] must be greater than or equal to period[start].", param="period[end]")
        item = {
            "id": self.new_id("ii"), "object": "invoiceitem", "amount": params["amount"], "currency": currency,
            "customer": customer["id"], "date": now, "description": params.get("description"),
            "discountable": params.get("discountable", params["amount"] >= 0), "discounts": [],
            "invoice": invoice["id"] if invoice else None, "livemode": False,
            "metadata": params.get("metadata", {}), "parent": None, "period": period,
            "pricing": {"price_details": None, "type": "price_details", "unit_amount_decimal": str(params["amount"])},
            "proration": False, "quantity": 1, "tax_rates": [], "test_clock": None,
            "_order": next(self._order),
        }
        self.items[item["id"]] = item
        if invoice:
            invoice["_items"].append(item["id"])
        self.emit("invoiceitem.created", self.item_json(item))
        return 200, self.item_json(item)

    def invoiceitem_retrieve(self, params: dict[str, Any], object_id: str | None) -> tuple[int, dict]:
        if object_id not in self.items:
            raise no_such("invoiceitem", object_id or "")
        return 200, self.item_json(self.items[object_id])

    def invoiceitem_list(self, params: dict[str, Any], object_id: str | None) -> tuple[int, dict]:
        """Newest first, cursor pagination with ``limit`` (default 10), ``starting_after``, ``ending_before``."""
        if "invoice" in params:
            self._invoice(params["invoice"], param="invoice")
        if "customer" in params:
            self._customer(params["customer"], param="customer")
        items = sorted(self.items.values(), key=lambda i: i["_order"], reverse=True)
        if "invoice" in params:
            items = [i for i in items if i["invoice"] == params["invoice"]]
        if "customer" in params:
            items = [i for i in items if i["customer"] == params["customer"]]
        if "pending" in params:
            items = [i for i in items if (i["invoice"] is None) == params["pending"]]
        limit = params.get("limit", 10)
        ids = [i["id"] for i in items]
        if "starting_after" in params and "ending_before" in params:
            raise state_error("You may only specify one of these parameters: ending_before, starting_after.",
                              param="starting_after")
        if "starting_after" in params:
            cursor = params["starting_after"]
            if cursor not in self.items:
                raise no_such("invoiceitem", cursor, param="starting_after")
            start = ids.index(cursor) + 1 if cursor in ids else len(ids)
            page, has_more = items[start:start + limit], start + limit < len(items)
        elif "ending_before" in params:
            cursor = params["ending_before"]
            if cursor not in self.items:
                raise no_such("invoiceitem", cursor, param="ending_before")
            end = ids.index(cursor) if cursor in ids else 0
            page, has_more = items[max(0, end - limit):end], end - limit > 0
        else:
            page, has_more = items[:limit], limit < len(items)
        return 200, {"object": "list", "data": [self.item_json(i) for i in page], "has_more": has_more,
                     "url": "/v1/invoiceitems"}
