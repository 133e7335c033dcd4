"""A tenant's invoices, as its members may see them, each with its balance due (``billing.selectors.balances``)."""

from __future__ import annotations

from django.db.models import QuerySet

from billing.models import Invoice
from billing.selectors.balances import invoices_with_balance
from core.errors import NotFound
from tenants.access import Actor, restrict


def invoice_list(*, actor: Actor) -> QuerySet[Invoice]:
    return invoices_with_balance(restrict(Invoice.objects.all(), actor)).order_by("-period")


def invoice_get(*, actor: Actor, invoice_id: int) -> Invoice:
    invoice = (invoices_with_balance(restrict(Invoice.objects.all(), actor)).prefetch_related("lines__project")
               .filter(pk=invoice_id).first())
    if invoice is None:
        raise NotFound(f"No invoice {invoice_id} in this tenant.", field="id")
    return invoice
