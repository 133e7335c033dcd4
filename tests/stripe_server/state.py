"""The objects the test server keeps (customers, invoices, invoice items) and what each endpoint does to them.

Behaviour follows Stripe's documentation: the invoice lifecycle draft → open → paid | void (and which call may
move which status: https://docs.stripe.com/invoicing/integration/workflow-transitions), invoice items only on
draft invoices, totals as the sum of the items, ``$0`` invoices marked paid on finalization, ``send`` only for
``collection_method=send_invoice`` and a customer with an email, and an event for each change
(``invoice.finalized``, ``invoice.sent``, ``invoice.paid``, ``invoice.payment_failed``, ``invoice.voided``, …).

Since issue 33 also: tax rates (``txr_``) on invoice items, each line's tax computed per rate and rounded per
line (https://docs.stripe.com/invoicing/taxes/tax-rates; exclusive rates add to the total, inclusive ones are
inside the amount); the customer's balance (``cbtxn_``: a negative balance is a credit, applied to the next
invoice at its finalization, https://docs.stripe.com/invoicing/customer/balance: ``starting_balance``,
``ending_balance`` and ``amount_due`` follow); credit notes (``cn_``,
https://docs.stripe.com/invoicing/integration/programmatic-credit-notes): on open invoices (pre-payment, at most
``amount_remaining``, which they reduce; an invoice credited to zero is paid) or paid ones (post-payment: the
note's total must be split into ``credit_amount`` (to the customer's balance) and ``out_of_band_amount``).
Responses are Stripe-shaped JSON objects (``id``, ``object``, ``created``, ``livemode``, ``metadata``, …).
"""

from __future__ import annotations

import copy
import itertools
import random
import string
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal
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


def round_minor(value: Decimal) -> int:
    """Half away from zero to a whole minor unit (a negative line's tax mirrors a positive one's)."""
    rounded = abs(value).quantize(Decimal(1), rounding=ROUND_HALF_UP)
    return int(rounded if value >= 0 else -rounded)


def page(objects: list[dict[str, Any]], params: dict[str, Any], known: dict[str, Any], kind: str,
         url: str) -> dict[str, Any]:
    """Newest first (``objects`` already ordered so), ``limit`` (default 10), ``starting_after``, ``ending_before``."""
    if "starting_after" in params and "ending_before" in params:
        raise state_error("You may only specify one of these parameters: ending_before, starting_after.",
                          param="starting_after")
    limit = params.get("limit", 10)
    ids = [o["id"] for o in objects]
    if "starting_after" in params:
        cursor = params["starting_after"]
        if cursor not in known:
            raise no_such(kind, cursor, param="starting_after")
        start = ids.index(cursor) + 1 if cursor in ids else len(ids)
        chosen, has_more = objects[start:start + limit], start + limit < len(objects)
    elif "ending_before" in params:
        cursor = params["ending_before"]
        if cursor not in known:
            raise no_such(kind, cursor, param="ending_before")
        end = ids.index(cursor) if cursor in ids else 0
        chosen, has_more = objects[max(0, end - limit):end], end - limit > 0
    else:
        chosen, has_more = objects[:limit], limit < len(objects)
    return {"object": "list", "data": chosen, "has_more": has_more, "url": url}


class StripeState:
    """Every object the server holds. Not thread-safe by itself: the server calls it under one lock."""

    def __init__(self, *, clock: Callable[[], int], account_name: str = "GPU broker (Stripe test server)",
                 seed: int | None = None):
        self.clock = clock
        self.account_name = account_name
        self.customers: dict[str, dict[str, Any]] = {}
        self.invoices: dict[str, dict[str, Any]] = {}
        self.items: dict[str, dict[str, Any]] = {}
        self.tax_rates: dict[str, dict[str, Any]] = {}
        self.balance_transactions: dict[str, dict[str, Any]] = {}
        self.credit_notes: dict[str, dict[str, Any]] = {}
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
        body = {key: copy.deepcopy(value) for key, value in item.items() if not key.startswith("_")}
        body["tax_rates"] = [copy.deepcopy(self.tax_rates[rate_id]) for rate_id in item["tax_rates"]]
        return body

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
            "period": dict(item["period"]), "pretax_credit_amounts": [], "quantity": 1,
            "taxes": self.line_taxes(item["amount"], item["tax_rates"]),
        }

    def line_taxes(self, amount: int, rate_ids: list[str]) -> list[dict[str, Any]]:
        """One line's taxes, one entry per rate, each rounded on its own (as Stripe does per line item): an
        inclusive rate's part of the amount is ``amount × r / (1 + Σ inclusive r)``; every rate is taxed on the
        amount less the inclusive taxes (``taxable_amount``), an exclusive one adding ``taxable × r``."""
        rates = [self.tax_rates[rate_id] for rate_id in rate_ids]
        inclusive_sum = sum((Decimal(str(r["percentage"])) for r in rates if r["inclusive"]), Decimal(0)) / 100
        included = {r["id"]: round_minor(Decimal(amount) * Decimal(str(r["percentage"])) / 100 / (1 + inclusive_sum))
                    for r in rates if r["inclusive"]}
        taxable = amount - sum(included.values())
        taxes = []
        for rate in rates:
            tax = included[rate["id"]] if rate["inclusive"] else round_minor(
                Decimal(taxable) * Decimal(str(rate["percentage"])) / 100)
            taxes.append({"amount": tax, "tax_behavior": "inclusive" if rate["inclusive"] else "exclusive",
                          "tax_rate_details": {"tax_rate": rate["id"]}, "taxability_reason": "standard_rated",
                          "taxable_amount": taxable, "type": "tax_rate_details"})
        return taxes

    def invoice_figures(self, invoice: dict[str, Any]) -> dict[str, Any]:
        """Subtotal (the items), taxes (per rate over the lines), total, and what the balance and credit notes
        take off the amount due."""
        items = self._invoice_items(invoice)
        subtotal = sum(item["amount"] for item in items)
        per_rate: dict[str, dict[str, Any]] = {}
        for item in items:
            for tax in self.line_taxes(item["amount"], item["tax_rates"]):
                rate_id = tax["tax_rate_details"]["tax_rate"]
                entry = per_rate.setdefault(rate_id, {**tax, "amount": 0, "taxable_amount": 0})
                entry["amount"] += tax["amount"]
                entry["taxable_amount"] += tax["taxable_amount"]
        inclusive = sum(t["amount"] for t in per_rate.values() if t["tax_behavior"] == "inclusive")
        exclusive = sum(t["amount"] for t in per_rate.values() if t["tax_behavior"] == "exclusive")
        notes = [self.credit_notes[n] for n in invoice["_credit_notes"]]
        pre = sum(n["total"] for n in notes if n["type"] == "pre_payment")
        post = sum(n["total"] for n in notes if n["type"] == "post_payment")
        total = subtotal + exclusive
        return {"subtotal": subtotal, "subtotal_excluding_tax": subtotal - inclusive, "total": total,
                "total_excluding_tax": subtotal - inclusive, "total_taxes": list(per_rate.values()),
                "amount_due": max(max(total, 0) + invoice["_applied_balance"] - pre, 0),
                "pre_payment_credit_notes_amount": pre, "post_payment_credit_notes_amount": post}

    def invoice_json(self, invoice: dict[str, Any], expand: list[str] | None = None) -> dict[str, Any]:
        items = self._invoice_items(invoice)
        figures = self.invoice_figures(invoice)
        paid = invoice["status"] == "paid"
        body = {key: copy.deepcopy(value) for key, value in invoice.items() if not key.startswith("_")}
        body.update(figures)
        body.update({
            "amount_paid": invoice["_amount_paid"],
            "amount_remaining": 0 if paid or invoice["status"] == "void" else figures["amount_due"],
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
            "_items": [], "_credit_notes": [], "_applied_balance": 0, "_amount_paid": 0,
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
        total = self.invoice_figures(invoice)["total"]
        balance = customer["balance"] if customer["currency"] in (None, invoice["currency"]) else 0
        # the customer's balance is applied at finalization: a credit (negative) up to the total, a debit whole
        applied = -min(-balance, max(total, 0)) if balance < 0 else balance
        if applied:
            customer["balance"] -= applied
            customer["currency"] = customer["currency"] or invoice["currency"]
            self._balance_entry(customer, -applied, "applied_to_invoice", invoice=invoice["id"])
        invoice["_applied_balance"] = applied
        invoice.update({"status": "open", "hosted_invoice_url": f"https://invoice.stripe.test/i/{invoice['id']}",
                        "invoice_pdf": f"https://pay.stripe.test/invoice/{invoice['id']}/pdf",
                        "starting_balance": balance, "ending_balance": balance - applied + min(total, 0),
                        "effective_at": now})
        invoice["status_transitions"]["finalized_at"] = now
        if total < 0:
            customer["balance"] += total  # a negative invoice becomes a credit on the customer's balance
        self.emit("invoice.finalized", self.invoice_json(invoice))
        if self.invoice_figures(invoice)["amount_due"] == 0:  # nothing to collect: Stripe marks it paid at once
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
        invoice["_amount_paid"] = self.invoice_figures(invoice)["amount_due"]
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
        rate_ids = params.get("tax_rates", [])
        if len(rate_ids) > 10 or len(set(rate_ids)) != len(rate_ids):
            raise state_error("An invoice item can have at most 10 tax rates, each once.", param="tax_rates")
        for index, rate_id in enumerate(rate_ids):
            if rate_id not in self.tax_rates:
                raise no_such("tax_rate", rate_id, param=f"tax_rates[{index}]")
            if not self.tax_rates[rate_id]["active"]:
                raise state_error(f"Tax rate {rate_id} is inactive and cannot be applied.",
                                  param=f"tax_rates[{index}]")
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
            "proration": False, "quantity": 1, "tax_rates": list(rate_ids), "test_clock": None,
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

    # --- tax rates --------------------------------------------------------------------------------------------

    def tax_rate_create(self, params: dict[str, Any], object_id: str | None) -> tuple[int, dict]:
        rate = {
            "id": self.new_id("txr"), "object": "tax_rate", "active": params.get("active", True),
            "country": params.get("country"), "created": self.clock(), "description": params.get("description"),
            "display_name": params["display_name"], "effective_percentage": params["percentage"],
            "flat_amount": None, "inclusive": params["inclusive"], "jurisdiction": params.get("jurisdiction"),
            "jurisdiction_level": None, "livemode": False, "metadata": params.get("metadata", {}),
            "percentage": params["percentage"], "rate_type": "percentage", "state": params.get("state"),
            "tax_type": params.get("tax_type"),
        }
        self.tax_rates[rate["id"]] = rate
        self.emit("tax_rate.created", rate)
        return 200, copy.deepcopy(rate)

    def tax_rate_retrieve(self, params: dict[str, Any], object_id: str | None) -> tuple[int, dict]:
        if object_id not in self.tax_rates:
            raise no_such("tax_rate", object_id or "")
        return 200, copy.deepcopy(self.tax_rates[object_id])

    # --- the customer's balance -------------------------------------------------------------------------------

    def _balance_entry(self, customer: dict[str, Any], amount: int, kind: str, *, invoice: str | None = None,
                       credit_note: str | None = None, description: str | None = None,
                       metadata: dict[str, str] | None = None) -> dict[str, Any]:
        """A balance transaction of ``amount`` already applied to ``customer["balance"]`` by the caller."""
        entry = {
            "id": self.new_id("cbtxn"), "object": "customer_balance_transaction", "amount": amount,
            "checkout_session": None, "created": self.clock(), "credit_note": credit_note,
            "currency": customer["currency"], "customer": customer["id"], "description": description,
            "ending_balance": customer["balance"], "invoice": invoice, "livemode": False,
            "metadata": metadata or {}, "type": kind, "_order": next(self._order),
        }
        self.balance_transactions[entry["id"]] = entry
        return entry

    @staticmethod
    def _public(obj: dict[str, Any]) -> dict[str, Any]:
        return {key: copy.deepcopy(value) for key, value in obj.items() if not key.startswith("_")}

    def balance_transaction_create(self, params: dict[str, Any], object_id: str | None) -> tuple[int, dict]:
        """``amount`` negative: a credit the next invoices use up; positive: a debit added to them."""
        customer = self._customer(object_id or "")
        if params["amount"] == 0:
            raise state_error("The amount of a balance transaction cannot be zero.", param="amount")
        if customer["currency"] not in (None, params["currency"]):
            raise state_error(f"The currency {params['currency']} does not match the customer's currency "
                              f"{customer['currency']}.", param="currency")
        customer["currency"] = params["currency"]
        customer["balance"] += params["amount"]
        entry = self._balance_entry(customer, params["amount"], "adjustment",
                                    description=params.get("description"), metadata=params.get("metadata"))
        self.emit("customer.updated", self.customer_json(customer))
        return 200, self._public(entry)

    def balance_transaction_list(self, params: dict[str, Any], object_id: str | None) -> tuple[int, dict]:
        customer = self._customer(object_id or "")
        if "invoice" in params:
            self._invoice(params["invoice"], param="invoice")
        entries = sorted((e for e in self.balance_transactions.values() if e["customer"] == customer["id"]
                          and ("invoice" not in params or e["invoice"] == params["invoice"])),
                         key=lambda e: e["_order"], reverse=True)
        return 200, page([self._public(e) for e in entries], params, self.balance_transactions,
                         "customer_balance_transaction", f"/v1/customers/{customer['id']}/balance_transactions")

    # --- credit notes -----------------------------------------------------------------------------------------

    def _credit_note_lines(self, invoice: dict[str, Any], lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
        credited: dict[str, int] = {}
        for note_id in invoice["_credit_notes"]:
            for line in self.credit_notes[note_id]["lines"]["data"]:
                if line["invoice_line_item"]:
                    credited[line["invoice_line_item"]] = credited.get(line["invoice_line_item"], 0) + line["amount"]
        by_line = {"il_" + item["id"][3:]: item for item in self._invoice_items(invoice)}
        out = []
        for index, line in enumerate(lines):
            where = f"lines[{index}]"
            if line["type"] == "custom_line_item":
                for name in ("invoice_line_item", "amount"):
                    if name in line:
                        raise state_error(f"{where}[{name}] can only be set when {where}[type] is invoice_line_item.",
                                          param=f"{where}[{name}]")
                for name in ("unit_amount", "description"):
                    if name not in line:
                        raise missing(f"{where}[{name}]")
                amount, taxes, item_line = line["unit_amount"] * line.get("quantity", 1), [], None
            else:
                if "unit_amount" in line:
                    raise state_error(f"{where}[unit_amount] can only be set when {where}[type] is custom_line_item.",
                                      param=f"{where}[unit_amount]")
                if "invoice_line_item" not in line:
                    raise missing(f"{where}[invoice_line_item]")
                item_line = line["invoice_line_item"]
                if item_line not in by_line:
                    raise no_such("invoice line item", item_line, param=f"{where}[invoice_line_item]")
                if ("amount" in line) == ("quantity" in line):
                    raise state_error(f"Give exactly one of {where}[amount] and {where}[quantity].",
                                      param=f"{where}[amount]")
                item = by_line[item_line]
                amount = line["amount"] if "amount" in line else item["amount"] * line["quantity"]
                room = item["amount"] - credited.get(item_line, 0)
                if amount > room:
                    raise state_error(f"{where}[amount] ({amount}) is more than what is left to credit on line "
                                      f"{item_line} ({max(room, 0)}).", param=f"{where}[amount]")
                credited[item_line] = credited.get(item_line, 0) + amount
                taxes = self.line_taxes(amount, item["tax_rates"])
            exclusive = sum(t["amount"] for t in taxes if t["tax_behavior"] == "exclusive")
            out.append({"id": self.new_id("cnli"), "object": "credit_note_line_item", "amount": amount,
                        "description": line.get("description") or (by_line[item_line]["description"]
                                                                    if item_line else None),
                        "discount_amount": 0, "discount_amounts": [], "invoice_line_item": item_line,
                        "livemode": False, "metadata": line.get("metadata", {}),
                        "pretax_credit_amounts": [], "quantity": line.get("quantity", 1), "taxes": taxes,
                        "type": line["type"], "unit_amount": line.get("unit_amount"),
                        "_total": amount + exclusive})
        return out

    def credit_note_create(self, params: dict[str, Any], object_id: str | None) -> tuple[int, dict]:
        invoice = self._invoice(params["invoice"], param="invoice")
        if invoice["status"] not in ("open", "paid"):
            raise state_error(f"Invoice {invoice['id']} is {invoice['status']}: credit notes can only be issued "
                              f"on open or paid invoices.", param="invoice", code="invoice_not_editable")
        if "lines" not in params and "amount" not in params:
            raise state_error("One of amount, lines, or shipping_cost must be provided.", param="amount")
        lines = self._credit_note_lines(invoice, params.get("lines", []))
        if lines:
            total = sum(line.pop("_total") for line in lines)
            if "amount" in params and params["amount"] != total:
                raise state_error(f"amount ({params['amount']}) must equal the total of the lines ({total}).",
                                  param="amount")
        else:
            total = params["amount"]
        figures = self.invoice_figures(invoice)
        post = params.get("credit_amount", 0) + params.get("out_of_band_amount", 0)
        if invoice["status"] == "open":
            kind = "pre_payment"
            for name in ("credit_amount", "out_of_band_amount"):
                if name in params:
                    raise state_error(f"{name} is for the post-payment part of a credit note; invoice "
                                      f"{invoice['id']} is not paid.", param=name)
            if total > figures["amount_due"]:
                raise state_error(f"The credit note's total ({total}) is more than the invoice's amount remaining "
                                  f"({figures['amount_due']}).", param="amount")
        else:
            kind = "post_payment"
            room = invoice["_amount_paid"] - figures["post_payment_credit_notes_amount"]
            if total > room:
                raise state_error(f"The credit note's total ({total}) is more than what is left to credit on the "
                                  f"paid invoice ({max(room, 0)}).", param="amount")
            if post != total:
                raise state_error(f"The sum of refund_amount, credit_amount and out_of_band_amount ({post}) must "
                                  f"equal the credit note's total ({total}).", param="out_of_band_amount")
        customer = self.customers[invoice["customer"]]
        now = self.clock()
        note = {
            "id": self.new_id("cn"), "object": "credit_note", "amount": total, "amount_shipping": 0,
            "created": now, "currency": invoice["currency"], "customer": customer["id"],
            "customer_balance_transaction": None, "discount_amount": 0, "discount_amounts": [],
            "effective_at": now, "invoice": invoice["id"], "livemode": False, "memo": params.get("memo"),
            "metadata": params.get("metadata", {}),
            "number": f"{invoice['number']}-CN-{len(invoice['_credit_notes']) + 1:02d}",
            "out_of_band_amount": params.get("out_of_band_amount"),
            "pdf": "", "post_payment_amount": total if kind == "post_payment" else 0,
            "pre_payment_amount": total if kind == "pre_payment" else 0, "reason": params.get("reason"),
            "refunds": [], "shipping_cost": None, "status": "issued", "subtotal": sum(li["amount"] for li in lines)
            if lines else total, "total": total, "total_taxes": [t for li in lines for t in li["taxes"]],
            "type": kind, "voided_at": None,
            "lines": {"object": "list", "data": lines, "has_more": False, "url": "/v1/credit_notes/lines"},
        }
        note["pdf"] = f"https://pay.stripe.test/credit_notes/{note['id']}/pdf"
        note["subtotal_excluding_tax"] = note["subtotal"]
        note["total_excluding_tax"] = note["subtotal"]
        if params.get("credit_amount"):
            customer["balance"] -= params["credit_amount"]
            customer["currency"] = customer["currency"] or invoice["currency"]
            entry = self._balance_entry(customer, -params["credit_amount"], "credit_note", credit_note=note["id"],
                                        invoice=invoice["id"])
            note["customer_balance_transaction"] = entry["id"]
        self.credit_notes[note["id"]] = note
        invoice["_credit_notes"].append(note["id"])
        self.emit("credit_note.created", note)
        if kind == "pre_payment" and self.invoice_figures(invoice)["amount_due"] == 0:
            invoice["status"] = "paid"  # credited to zero: nothing left to collect
            invoice["status_transitions"]["paid_at"] = now
            self.emit("invoice.paid", self.invoice_json(invoice))
        return 200, copy.deepcopy(note)

    def credit_note_retrieve(self, params: dict[str, Any], object_id: str | None) -> tuple[int, dict]:
        if object_id not in self.credit_notes:
            raise no_such("credit_note", object_id or "")
        return 200, copy.deepcopy(self.credit_notes[object_id])

    def credit_note_list(self, params: dict[str, Any], object_id: str | None) -> tuple[int, dict]:
        if "invoice" in params:
            self._invoice(params["invoice"], param="invoice")
        if "customer" in params:
            self._customer(params["customer"], param="customer")
        order = {note_id: n for n, note_id in enumerate(self.credit_notes)}
        notes = sorted((n for n in self.credit_notes.values()
                        if params.get("invoice", n["invoice"]) == n["invoice"]
                        and params.get("customer", n["customer"]) == n["customer"]),
                       key=lambda n: order[n["id"]], reverse=True)
        return 200, page([copy.deepcopy(n) for n in notes], params, self.credit_notes, "credit_note",
                         "/v1/credit_notes")
