"""Admin billing reports (platform staff only; never shown to tenants): revenue, allocated vs used
GPU-hours and the idle cost, over-quota share, SLO attainment and the idlest leases of a period.

Figures come from invoice lines (what tenants are charged) and, for the idlest leases, from metered
usage joined with utilisation. Void invoices are left out; drafts are included and flagged.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import date
from decimal import Decimal

from django.conf import settings
from django.db import connection

from billing.choices import InvoiceStatus, LineKind
from billing.core.periods import period_bounds
from billing.core.pricing import format_money
from billing.models import InvoiceLine, SloEvaluation


@dataclass
class Row:
    key: tuple
    currency: str
    amount_minor: int = 0
    gpu_hours: Decimal = Decimal(0)
    used_gpu_hours: Decimal = Decimal(0)
    measured_gpu_hours: Decimal = Decimal(0)
    idle_gpu_hours: Decimal = Decimal(0)
    idle_cost_minor: Decimal = Decimal(0)
    over_quota_gpu_hours: Decimal = Decimal(0)
    drafts: int = 0
    # by project: a tenant-wide line that belongs to no project (an SLO credit, a discount, a committed-use
    # minimum, a correction) is its own row named by its kind, never a project row ("—") (issue 29)
    adjustment: str = ""

    @property
    def amount(self) -> str:
        return format_money(self.amount_minor, self.currency)

    @property
    def idle_cost(self) -> str:
        return format_money(round(self.idle_cost_minor), self.currency)

    @property
    def used_pct(self) -> float | None:
        return None if not self.measured_gpu_hours else float(self.used_gpu_hours / self.measured_gpu_hours * 100)

    @property
    def over_quota_pct(self) -> float | None:
        return None if not self.gpu_hours else float(self.over_quota_gpu_hours / self.gpu_hours * 100)


GROUPS = {
    "tenant": lambda line: (line.invoice.tenant.slug,),
    "project": lambda line: (line.invoice.tenant.slug, line.project.slug if line.project else "—"),
    "model": lambda line: (line.tier or "—",),
    "month": lambda line: (f"{line.invoice.period:%Y-%m}",),
}


def revenue(*, start: date, end: date, group_by: str = "tenant") -> list[Row]:
    """Charges per tenant / project / model / month for invoices of months in [start, end), with the
    allocated, used and idle GPU-hours of their usage lines and the idle cost (the share of a line's
    amount that paid for idle hours)."""
    if group_by not in GROUPS:
        raise ValueError(group_by)
    lines = (InvoiceLine.objects.filter(invoice__period__gte=start, invoice__period__lt=end)
             .exclude(invoice__status=InvoiceStatus.VOID).select_related("invoice__tenant", "project"))
    rows: dict[tuple, Row] = {}
    for line in lines.iterator(chunk_size=5000):
        if group_by == "model" and line.kind != LineKind.USAGE:
            continue
        key, adjustment = GROUPS[group_by](line), ""
        if group_by == "project" and line.project is None:
            key, adjustment = (line.invoice.tenant.slug, ""), line.get_kind_display()
        row = rows.setdefault((key, adjustment, line.invoice.currency),
                              Row(key=key, currency=line.invoice.currency, adjustment=adjustment))
        row.amount_minor += line.amount_minor
        row.drafts += line.invoice.status == InvoiceStatus.DRAFT
        if line.kind != LineKind.USAGE:
            continue
        row.gpu_hours += line.gpu_hours
        if line.over_quota:
            row.over_quota_gpu_hours += line.gpu_hours
        if line.engine_active_avg is not None:
            row.measured_gpu_hours += line.gpu_hours
            row.used_gpu_hours += line.gpu_hours * line.engine_active_avg
        if line.idle_gpu_hours and line.gpu_hours:
            row.idle_gpu_hours += line.idle_gpu_hours
            row.idle_cost_minor += Decimal(line.amount_minor) * line.idle_gpu_hours / line.gpu_hours
    return sorted(rows.values(), key=lambda r: (bool(r.adjustment), -r.amount_minor, r.key, r.adjustment))


def slo_attainment(*, period: date) -> list[SloEvaluation]:
    return list(SloEvaluation.objects.filter(period=period).select_related("tenant", "contract")
                .order_by("-credit_pct", "tenant__slug"))


_IDLE_SQL = """
SELECT u.lease_id, tn.slug, p.slug, u.tier, MAX(u.mig_profile),
       SUM(u.seconds * u.gpu_milli) / 3600000.0                                           AS gpu_hours,
       SUM(CASE WHEN t.engine_active_avg < %(idle)s THEN u.seconds * u.gpu_milli END) / 3600000.0 AS idle_hours,
       SUM(u.seconds * u.gpu_milli * t.engine_active_avg)
         / NULLIF(SUM(CASE WHEN t.engine_active_avg IS NOT NULL THEN u.seconds * u.gpu_milli END), 0) AS active
  FROM billing_allocationusage u
  JOIN billing_utilisationusage t ON t.lease_id = u.lease_id AND t.hour_start = u.hour_start
  JOIN tenants_tenant tn ON tn.id = u.tenant_id
  JOIN tenants_project p ON p.id = u.project_id
 WHERE u.hour_start >= %(start)s AND u.hour_start < %(end)s
 GROUP BY 1, 2, 3, 4
HAVING SUM(CASE WHEN t.engine_active_avg < %(idle)s THEN u.seconds * u.gpu_milli END) > 0
 ORDER BY idle_hours DESC
 LIMIT %(limit)s
"""


def top_idle_leases(*, period: date, limit: int = 20) -> list[dict]:
    start, end = period_bounds(period)
    with connection.cursor() as cursor:
        cursor.execute(_IDLE_SQL, {"start": start, "end": end, "idle": settings.BILLING_IDLE_ENGINE_ACTIVE,
                                   "limit": limit})
        names = ["lease_id", "tenant", "project", "model", "profile", "gpu_hours", "idle_gpu_hours", "active"]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def monthly_series(rows: list[Row]) -> dict[str, list[tuple[str, int]]]:
    """Per currency, (month, amount) in order — for the revenue chart."""
    out: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: r.key):
        out[row.currency].append((row.key[0], row.amount_minor))
    return dict(out)
