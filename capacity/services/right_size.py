"""Right-sizing is advice: nothing is applied (accepting it records it). What this kind needs of the service is
its price: the planner priced it from the general price book; the tenant's own book prices it here."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.utils import timezone

from broker.choices import GpuKind
from capacity.choices import AdjustmentKind
from capacity.models import Adjustment


def price_for_tenant(row: Adjustment) -> None:
    """Right-sizing priced from the lease's tenant's own price book (the planner priced it from the general
    one): (current unit price − suggested unit price) × hours of evidence × units, in the tenant's currency;
    ``priced_with`` names the book. Left as the planner priced it where the tenant has no book or either
    shape no price."""
    if row.kind != AdjustmentKind.RIGHT_SIZE or row.lease is None:
        return
    from billing.core.pricing import to_minor
    from billing.selectors import price_books_for

    lease = row.lease
    end = datetime.fromtimestamp(row.evidence["end"], tz=timezone.get_current_timezone())
    start = datetime.fromtimestamp(row.evidence["start"], tz=timezone.get_current_timezone())
    books = price_books_for(tenant=lease.tenant, start=end - timedelta(microseconds=1), end=end)
    if not books:
        return
    table = books[-1][2]
    held = lease.allocations.order_by("pk").first()
    if held is None:
        return
    current = table.unit_price(held.tier, held.kind, held.mig_profile, over_quota=held.preemptible,
                               workload_class=lease.workload_class)
    model = row.change.get("model") or held.tier
    profile = row.change.get("profile", "")
    suggested = table.unit_price(model, GpuKind.MIG if profile else GpuKind.WHOLE, profile,
                                 over_quota=held.preemptible, workload_class=lease.workload_class)
    if current is None or suggested is None:
        return
    hours = Decimal(int((end - start).total_seconds())) / 3600
    saving = (current[0] - suggested[0]) * hours * lease.count
    row.currency = lease.tenant.currency
    row.gain_money_minor = to_minor(saving, row.currency)
    row.priced_with = books[-1][1].name
    row.evidence = {**row.evidence, "priced_with": books[-1][1].name, "current_per_hour": str(current[0]),
                    "suggested_per_hour": str(suggested[0])}
