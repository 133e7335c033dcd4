"""FOCUS export (issue 33): invoices as FinOps FOCUS 1.2 cost and usage rows, CSV or Parquet.

One row per charge: every line of the invoice (usage, energy, discount, committed minimum, SLO credit,
correction) is one row, so the rows' ``BilledCost`` add up to the invoice's total, to the cent, in its currency
(a test reads the files back and checks it). The mapping (docs/billing.md, "FOCUS export"):

- usage and energy lines: ``ChargeCategory`` Usage, ``ChargeFrequency`` Usage-Based; a usage line's
  ``ConsumedQuantity`` is its whole-GPU-equivalent hours (``GPU-Hours``), its ``PricingQuantity`` and
  ``PricingUnit`` the line's own (MIG instance-hours, GPU-hours, kWh);
- the committed-use minimum's shortfall: Purchase, Recurring; the discount and the SLO credit: Credit; a correction
  of an earlier month: Adjustment with ``ChargeClass`` Correction;
- ``BillingAccount*`` is the tenant, ``SubAccount*`` the project (when the line has one), ``Resource*`` the project
  too (a line aggregates the project's leases; the per-lease figures are the usage CloudEvents);
- the tenant's price book is its contract: ``ListCost`` = ``ContractedCost`` = ``EffectiveCost`` = ``BilledCost``
  (no amortised commitment exists to make them differ); discounts and credits are rows of their own.

Nothing here writes: an export is a read of finalized (or draft) invoices.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from decimal import Decimal

from billing.choices import LineKind
from billing.core.periods import period_bounds
from billing.core.pricing import from_minor
from billing.models import Invoice, InvoiceLine

FOCUS_VERSION = "1.2"
PROVIDER = "gpubroker"

# the FOCUS 1.2 columns (the specification's order: alphabetical), then this provider's own (x_ prefix)
FOCUS_COLUMNS = [
    "AvailabilityZone", "BilledCost", "BillingAccountId", "BillingAccountName", "BillingAccountType",
    "BillingCurrency", "BillingPeriodEnd", "BillingPeriodStart", "ChargeCategory", "ChargeClass",
    "ChargeDescription", "ChargeFrequency", "ChargePeriodEnd", "ChargePeriodStart", "CommitmentDiscountCategory",
    "CommitmentDiscountId", "CommitmentDiscountName", "CommitmentDiscountStatus", "CommitmentDiscountType",
    "ConsumedQuantity", "ConsumedUnit", "ContractedCost", "ContractedUnitPrice", "EffectiveCost", "InvoiceId",
    "InvoiceIssuerName", "ListCost", "ListUnitPrice", "PricingCategory", "PricingCurrency", "PricingQuantity",
    "PricingUnit", "ProviderName", "PublisherName", "RegionId", "RegionName", "ResourceId", "ResourceName",
    "ResourceType", "ServiceCategory", "ServiceName", "ServiceSubcategory", "SkuId", "SkuPriceId", "SubAccountId",
    "SubAccountName", "SubAccountType", "Tags",
    "x_GpuHours", "x_InvoiceLinePosition", "x_InvoiceStatus", "x_WorkloadClass",
]
DECIMAL_COLUMNS = frozenset({"BilledCost", "ConsumedQuantity", "ContractedCost", "ContractedUnitPrice",
                             "EffectiveCost", "ListCost", "ListUnitPrice", "PricingQuantity", "x_GpuHours"})
TIME_COLUMNS = frozenset({"BillingPeriodEnd", "BillingPeriodStart", "ChargePeriodEnd", "ChargePeriodStart"})

_CATEGORY = {
    LineKind.USAGE: ("Usage", None, "Usage-Based"),
    LineKind.ENERGY: ("Usage", None, "Usage-Based"),
    LineKind.COMMIT: ("Purchase", None, "Recurring"),
    LineKind.DISCOUNT: ("Credit", None, "Usage-Based"),
    LineKind.SLO_CREDIT: ("Credit", None, "One-Time"),
    LineKind.CORRECTION: ("Adjustment", "Correction", "One-Time"),
}


def _sku(line: InvoiceLine) -> str | None:
    if line.kind == LineKind.USAGE:
        what = line.mig_profile or ("gpu" if line.unit.lower().startswith("gpu") else line.unit.replace(" ", "-"))
        return "/".join(p for p in (line.tier, what, line.workload_class, "over-quota" if line.over_quota else "",
                                    "profiling" if line.profiling else "") if p)
    return {LineKind.ENERGY: "energy-kwh", LineKind.COMMIT: "committed-minimum"}.get(line.kind)


def focus_rows(invoice: Invoice) -> list[dict]:
    """The invoice's FOCUS rows, one per line, in line order (values: ``Decimal``, aware ``datetime``, ``str`` or
    None)."""
    tenant = invoice.tenant
    start, end = period_bounds(invoice.period)
    invoice_id = invoice.number or f"draft-{invoice.pk}"
    rows = []
    for line in invoice.lines.select_related("project").order_by("position"):
        category, charge_class, frequency = _CATEGORY.get(line.kind, ("Adjustment", None, "One-Time"))
        cost = from_minor(line.amount_minor, invoice.currency)
        project = line.project
        consumed = line.gpu_hours if line.kind == LineKind.USAGE else (
            line.quantity if line.kind == LineKind.ENERGY else None)
        sku = _sku(line)
        book = (line.evidence or {}).get("price_book_id")
        tags = {"gpubroker/line-kind": line.kind}
        if project is not None:
            tags["gpubroker/project"] = project.slug
        if line.workload_class:
            tags["gpubroker/workload-class"] = line.workload_class
        priced = line.kind in (LineKind.USAGE, LineKind.ENERGY, LineKind.COMMIT)
        rows.append({
            "AvailabilityZone": None, "BilledCost": cost, "BillingAccountId": tenant.slug,
            "BillingAccountName": tenant.name, "BillingAccountType": "Tenant", "BillingCurrency": invoice.currency,
            "BillingPeriodEnd": end, "BillingPeriodStart": start, "ChargeCategory": category,
            "ChargeClass": charge_class, "ChargeDescription": line.description, "ChargeFrequency": frequency,
            "ChargePeriodEnd": end, "ChargePeriodStart": start, "CommitmentDiscountCategory": None,
            "CommitmentDiscountId": None, "CommitmentDiscountName": None, "CommitmentDiscountStatus": None,
            "CommitmentDiscountType": None, "ConsumedQuantity": consumed,
            "ConsumedUnit": {LineKind.USAGE: "GPU-Hours", LineKind.ENERGY: "kWh"}.get(line.kind),
            "ContractedCost": cost, "ContractedUnitPrice": line.unit_price if priced else None,
            "EffectiveCost": cost, "InvoiceId": invoice_id, "InvoiceIssuerName": PROVIDER, "ListCost": cost,
            "ListUnitPrice": line.unit_price if priced else None,
            "PricingCategory": ("Dynamic" if line.over_quota else "Standard") if priced else None,
            "PricingCurrency": invoice.currency, "PricingQuantity": line.quantity if priced else None,
            "PricingUnit": line.unit if priced else None, "ProviderName": PROVIDER, "PublisherName": PROVIDER,
            "RegionId": None, "RegionName": None,
            "ResourceId": f"{tenant.slug}/{project.slug}" if project is not None else None,
            "ResourceName": project.name if project is not None else None,
            "ResourceType": "Project" if project is not None else None,
            "ServiceCategory": "Compute", "ServiceName": "GPU leasing" if line.kind != LineKind.ENERGY
            else "Energy pass-through", "ServiceSubcategory": "Other (Compute)", "SkuId": sku,
            "SkuPriceId": f"{book}:{sku}" if book and sku else None,
            "SubAccountId": f"{tenant.slug}/{project.slug}" if project is not None else None,
            "SubAccountName": project.name if project is not None else None,
            "SubAccountType": "Project" if project is not None else None,
            "Tags": json.dumps(tags, sort_keys=True, separators=(",", ":")),
            "x_GpuHours": line.gpu_hours if line.kind == LineKind.USAGE else None,
            "x_InvoiceLinePosition": str(line.position), "x_InvoiceStatus": invoice.status,
            "x_WorkloadClass": line.workload_class or None,
        })
    return rows


def focus_rows_many(invoices) -> list[dict]:
    """The rows of several invoices (the staff's export of a month: every tenant's), invoice by invoice."""
    rows: list[dict] = []
    for invoice in invoices:
        rows += focus_rows(invoice)
    return rows


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value)


def focus_csv(rows: list[dict]) -> str:
    """FOCUS rows as CSV (UTF-8, a header of the column names; null is an empty field; times ISO 8601 UTC)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FOCUS_COLUMNS)
    for row in rows:
        writer.writerow([_text(row[name]) for name in FOCUS_COLUMNS])
    return out.getvalue()


def focus_parquet(rows: list[dict]) -> bytes:
    """FOCUS rows as Parquet (pyarrow): costs, prices and quantities ``decimal128(28, 9)`` (exact), times
    ``timestamp[us, UTC]``, the rest strings; null stays null."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def kind(name: str):
        if name in DECIMAL_COLUMNS:
            return pa.decimal128(28, 9)
        if name in TIME_COLUMNS:
            return pa.timestamp("us", tz="UTC")
        return pa.string()

    schema = pa.schema([(name, kind(name)) for name in FOCUS_COLUMNS],
                       metadata={"focus_version": FOCUS_VERSION, "provider": PROVIDER})
    columns = {name: [None if row[name] is None else (Decimal(row[name]) if name in DECIMAL_COLUMNS else row[name])
                      for row in rows] for name in FOCUS_COLUMNS}
    table = pa.table(columns, schema=schema)
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()
