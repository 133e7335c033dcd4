"""Billing's part in a tenant leaving (``tenants.offboarding``): the metered usage and every invoice (CSV and PDF)
in the export, and, at closure, the final invoice issued: the hour in progress metered, then every month of the
tenant that still has a draft, and the current month, invoiced and finalized (``invoice_run`` with
``finalize=True``: numbered, frozen by the database, sent to Stripe after commit). Invoices, their lines and the
usage are financial records: the closure keeps them."""

from __future__ import annotations

from datetime import date, datetime

from billing.choices import InvoiceStatus
from billing.core.metering import HOUR, hour_floor
from billing.models import AllocationUsage, Invoice
from billing.selectors.documents import invoice_csv, invoice_pdf
from billing.services.invoicing import invoice_run
from billing.services.metering import usage_meter_window
from tenants.models import Tenant
from tenants.offboarding import csv_bytes


def billing_part(tenant: Tenant) -> dict[str, bytes]:
    usage = AllocationUsage.objects.filter(tenant=tenant).select_related("project").order_by("hour_start", "lease_id")
    files = {"usage.csv": csv_bytes(
        ["lease", "project", "hour_start", "seconds", "tier", "kind", "mig_profile", "gpu_milli", "memory_mib",
         "workload_class", "over_quota"],
        ([row.lease_id, row.project.slug, row.hour_start.isoformat(), row.seconds, row.tier, row.kind,
          row.mig_profile, row.gpu_milli, row.memory_mib, row.workload_class, row.over_quota] for row in usage))}
    for invoice in Invoice.objects.filter(tenant=tenant).select_related("tenant").order_by("period"):
        name = invoice.number or f"draft-{tenant.slug}-{invoice.period:%Y-%m}"
        files[f"invoices/{name}.csv"] = invoice_csv(invoice).encode()
        files[f"invoices/{name}.pdf"] = invoice_pdf(invoice)
    return files


def final_invoices_issue(tenant: Tenant, now: datetime) -> dict:
    """Meter the hour in progress, then build and finalize every draft month and the current one."""
    hour = hour_floor(now)
    usage_meter_window(start=hour, end=hour + HOUR, now=now, tenant_id=tenant.pk)
    this_month = date(now.year, now.month, 1)
    periods = set(Invoice.objects.filter(tenant=tenant, status=InvoiceStatus.DRAFT).values_list("period", flat=True))
    before = set(Invoice.objects.filter(tenant=tenant).exclude(status=InvoiceStatus.DRAFT).values_list("pk", flat=True))
    for period in sorted(periods | {this_month}):
        invoice_run(period=period, tenant=tenant, finalize=True, now=now)
    issued = (Invoice.objects.filter(tenant=tenant).exclude(status=InvoiceStatus.DRAFT).exclude(pk__in=before)
              .order_by("period"))
    return {"final_invoices": [invoice.number for invoice in issued]}
