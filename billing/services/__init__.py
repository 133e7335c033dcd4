"""The only writers of billing data, one module per thing written:

- ``metering``: usage rows from lease events (every hour recomputed whole and upserted: idempotent);
- ``metering_run``: the hourly run over meter windows (each source, each hour, once);
- ``utilisation``: what each lease did with its capacity, from Prometheus (DCGM);
- ``invoicing``: SLO evaluations, invoice lines, invoices, corrections, finalizing and the monthly run;
- ``prices``: price books and billing terms (platform staff);
- ``budgets``: spend caps and the budget guard that leasing admits requests and renewals with;
- ``stripe_sync``: the Stripe mirror of our invoices and Stripe's webhook events.

Readers are in ``billing.selectors``; the arithmetic (no database) in ``billing.core``. Callers import this package
(``from billing import services``); the names below are its surface.
"""

from __future__ import annotations

from billing.core.periods import period_bounds
from billing.services.budgets import (
    BudgetExceeded,
    budget_admit_renewal,
    budget_admit_request,
    budget_caps_exist,
    budget_check,
    budget_check_renewal,
    spend_cap_create,
    spend_cap_delete,
    spend_cap_update,
)
from billing.services.invoicing import (
    SIX,
    USAGE_SQL,
    invoice_build,
    invoice_finalize,
    invoice_lines_compute,
    invoice_run,
    period_closed,
    period_parse,
    slo_evaluate,
)
from billing.services.metering import (
    usage_meter_window,
)
from billing.services.prices import (
    BOOK_FIELDS,
    MAX_MINOR,
    billing_terms_delete,
    billing_terms_set,
    price_book_create,
    price_book_delete,
    price_book_update,
)

__all__ = [
    "BOOK_FIELDS",
    "MAX_MINOR",
    "SIX",
    "USAGE_SQL",
    "BudgetExceeded",
    "billing_terms_delete",
    "billing_terms_set",
    "budget_admit_renewal",
    "budget_admit_request",
    "budget_caps_exist",
    "budget_check",
    "budget_check_renewal",
    "invoice_build",
    "invoice_finalize",
    "invoice_lines_compute",
    "invoice_run",
    "period_bounds",
    "period_closed",
    "period_parse",
    "price_book_create",
    "price_book_delete",
    "price_book_update",
    "slo_evaluate",
    "spend_cap_create",
    "spend_cap_delete",
    "spend_cap_update",
    "usage_meter_window",
]
