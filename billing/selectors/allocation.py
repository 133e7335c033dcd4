"""Cost allocation (issue 33): a month's usage charges broken down by a lease label (``label:team``), by the user
who requested the lease (``user``) or by project — the showback and chargeback a platform team runs inside a
tenant.

Each invoice usage line (project × model/profile × class × over-quota × price-book piece) is priced exactly as
``invoice_lines_compute`` prices it (one rounding per line), then its minor units are shared among the breakdown's
keys in proportion to their GPU-milli-seconds, by largest remainder (ties by key). So the breakdown's amounts add
up, to the cent, to the usage lines of the month's invoice computed from the same usage rows; discounts, energy,
commitments, SLO credits and corrections are not allocated (listed beside, as the invoice has them).
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from datetime import date
from decimal import Decimal

from django.db import connection

from billing.core.periods import period_bounds
from billing.core.pricing import MILLI_HOUR, from_minor, to_minor, units_of
from billing.selectors.prices import price_books_for
from core.errors import ValidationFailed
from tenants.models import Tenant

UNLABELLED = ""  # the key of usage whose lease has no value for the label

_BREAKDOWN_SQL = """
SELECT u.project_id, u.tier, u.kind, u.mig_profile, u.workload_class, u.over_quota, u.profiling,
       {dimension} AS dimension, SUM(u.seconds * u.gpu_milli) AS milli_seconds
  FROM billing_allocationusage u
  {join}
 WHERE u.tenant_id = %(tenant)s AND u.hour_start >= %(start)s AND u.hour_start < %(end)s
 GROUP BY 1, 2, 3, 4, 5, 6, 7, 8
"""


def breakdown_dimension_check(by: object) -> tuple[str, str]:
    """``by`` → (kind, label key): ``project``, ``user`` or ``label:<key>``; else ``ValidationFailed`` on ``by``."""
    if by in ("project", "user"):
        return str(by), ""
    if isinstance(by, str) and by.startswith("label:") and 0 < len(by) - 6 <= 63:
        return "label", by[6:]
    raise ValidationFailed("by must be project, user or label:<key> (e.g. label:team).", field="by")


def _largest_remainder(total_minor: int, weights: dict[object, Decimal]) -> dict[object, int]:
    """``total_minor`` shared in proportion to ``weights`` (all ≥ 0), in whole minor units adding up to it."""
    weight_sum = sum(weights.values())
    if not weight_sum:
        return {key: 0 for key in weights}
    shares = {key: total_minor * weight / weight_sum for key, weight in weights.items()}
    floors = {key: int(share.to_integral_value(rounding="ROUND_FLOOR")) for key, share in shares.items()}
    left = total_minor - sum(floors.values())
    for key in sorted(weights, key=lambda k: (-(shares[k] - floors[k]), str(k)))[:left]:
        floors[key] += 1
    return floors


def usage_breakdown(*, tenant: Tenant, period: date, by: str) -> dict:
    """The tenant's usage charges of ``period`` (the first day of a month) by ``by`` (``project``, ``user`` or
    ``label:<key>``): one group per key, with its GPU-hours and amount (minor units, the tenant's currency), largest
    first; ``total_minor`` is the sum of the invoice's usage lines. Usage with no price in force is refused as the
    invoice refuses it (``price_book``)."""
    kind, label_key = breakdown_dimension_check(by)
    start, end = period_bounds(period)
    dimension, join = {
        "project": ("u.project_id", ""),
        "user": ("l.created_by_id", "JOIN broker_lease l ON l.id = u.lease_id"),
        "label": ("coalesce(u.labels ->> %(label)s, '')", ""),
    }[kind]
    books = price_books_for(tenant=tenant, start=start, end=end)
    bounds = [moment for moment, _b, _t in books] + [end]
    lines: dict[tuple, dict] = defaultdict(dict)  # invoice line key → {dimension: milli-seconds}
    prices: dict[tuple, Decimal] = {}
    for index, (moment, book, table) in enumerate(books):
        with connection.cursor() as cursor:
            cursor.execute(_BREAKDOWN_SQL.format(dimension=dimension, join=join),
                           {"tenant": tenant.pk, "start": moment, "end": bounds[index + 1], "label": label_key})
            rows = cursor.fetchall()
        for project_id, tier, gpu_kind, profile, workload_class, over_quota, profiling, key, milli_seconds in rows:
            line = (index, project_id, tier, gpu_kind, profile, workload_class, over_quota, profiling)
            if line not in prices:
                found = table.unit_price(tier, gpu_kind, profile, over_quota=over_quota,
                                         workload_class=workload_class, profiling=profiling)
                if found is None:
                    raise ValidationFailed(f"Price book {book.name!r} has no price for {profile or gpu_kind} on "
                                           f"{tier}.", field="price_book")
                prices[line] = found[0]
            key = UNLABELLED if key is None else key
            lines[line][key] = lines[line].get(key, Decimal(0)) + Decimal(milli_seconds)
    amounts: dict[object, int] = defaultdict(int)
    held: dict[object, Decimal] = defaultdict(Decimal)
    for line, by_key in lines.items():
        _index, _project, tier, gpu_kind, profile = line[:5]
        line_minor = to_minor(units_of(gpu_kind, tier, profile, sum(by_key.values())) * prices[line],
                              tenant.currency)
        for key, share in _largest_remainder(line_minor, by_key).items():
            amounts[key] += share
        for key, milli_seconds in by_key.items():
            held[key] += milli_seconds
    names = _names(kind, list(amounts))
    groups = [{"key": "" if key is None else str(key), "name": names.get(key, str(key)),
               "gpu_hours": (held[key] / MILLI_HOUR).quantize(Decimal("0.000001")), "amount_minor": amounts[key]}
              for key in amounts]
    groups.sort(key=lambda g: (-g["amount_minor"], g["name"]))
    return {"period": f"{period:%Y-%m}", "by": by, "currency": tenant.currency, "groups": groups,
            "total_minor": sum(amounts.values())}


def _names(kind: str, keys: list) -> dict:
    if kind == "project":
        from tenants.models import Project

        return dict(Project.objects.filter(pk__in=[k for k in keys if k is not None]).values_list("pk", "slug"))
    if kind == "user":
        from django.contrib.auth import get_user_model

        found = dict(get_user_model().objects.filter(pk__in=[k for k in keys if k is not None])
                     .values_list("pk", "username"))
        return {**found, None: "(deleted user)"}
    return {UNLABELLED: "(unlabelled)"}


def invoice_breakdown(*, invoice, by: str) -> dict:
    """``usage_breakdown`` for the invoice's tenant and month, with the invoice's other lines beside it (energy,
    discount, commitment, SLO credit, corrections: not allocated) so that usage + other = the invoice's total
    while its usage rows are what it was computed from."""
    result = usage_breakdown(tenant=invoice.tenant, period=invoice.period, by=by)
    usage_lines = sum(line.amount_minor for line in invoice.lines.all() if line.kind == "usage")
    result.update(invoice=invoice.number or f"draft-{invoice.pk}", invoice_total_minor=invoice.total_minor,
                  invoice_usage_minor=usage_lines, other_minor=invoice.total_minor - usage_lines)
    return result


BREAKDOWN_CSV_COLUMNS = ["period", "by", "key", "name", "gpu_hours", "amount", "currency"]


def breakdown_csv(breakdown: dict) -> str:
    """A breakdown as CSV: one row per key, then the total (and, for an invoice, its other lines and total)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(BREAKDOWN_CSV_COLUMNS)
    currency = breakdown["currency"]
    for group in breakdown["groups"]:
        writer.writerow([breakdown["period"], breakdown["by"], group["key"], group["name"], group["gpu_hours"],
                         from_minor(group["amount_minor"], currency), currency])
    writer.writerow([breakdown["period"], breakdown["by"], "", "usage total", "",
                     from_minor(breakdown["total_minor"], currency), currency])
    if "invoice_total_minor" in breakdown:
        writer.writerow([breakdown["period"], breakdown["by"], "", "other invoice lines", "",
                         from_minor(breakdown["other_minor"], currency), currency])
        writer.writerow([breakdown["period"], breakdown["by"], "", "invoice total", "",
                         from_minor(breakdown["invoice_total_minor"], currency), currency])
    return out.getvalue()
