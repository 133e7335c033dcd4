"""Readers of billing data (nothing here writes), one module per question:

- ``prices``: the price book in force, list prices, a request's price, offers with prices, books and terms lists;
- ``usage``: usage summaries, this month's spend and its forecast;
- ``budgets``: spend caps with their spend and forecast (the budgets page);
- ``invoices``: a tenant's invoices; ``documents``: an invoice as CSV or PDF;
- ``quotes``: the quote before a lease (leasing's preview with billing's price and budget verdict);
- ``reports``: the platform staff's billing report.

Tenant-facing reads go through ``tenants.access.restrict`` like every other selector.
"""

from __future__ import annotations

from billing.selectors.budgets import (
    Budget,
    budget_list,
    spend_cap_get,
    spend_cap_list,
)
from billing.selectors.invoices import (
    invoice_get,
    invoice_list,
)
from billing.selectors.prices import (
    Quote,
    billing_terms_in_force,
    billing_terms_list,
    book_rate_table,
    list_prices,
    offer_prices,
    price_book_get,
    price_book_list,
    price_book_states,
    price_books_for,
    price_quote,
    whole_list_prices,
)
from billing.selectors.usage import (
    _lease_gpu,
    spend_forecast,
    spend_minor,
    usage_query_check,
    usage_summary,
)

__all__ = [
    "Budget", "Quote", "_lease_gpu", "billing_terms_in_force", "billing_terms_list", "book_rate_table", "budget_list",
    "invoice_get", "invoice_list", "list_prices", "offer_prices", "price_book_get", "price_book_list",
    "price_book_states", "price_books_for", "price_quote", "spend_cap_get", "spend_cap_list", "spend_forecast",
    "spend_minor", "usage_query_check", "usage_summary", "whole_list_prices",
]
