"""Metered usage as tenants read it (summaries by project, model, class), and the month's spend and forecast."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.utils import timezone

from billing.core.pricing import HOUR_SECONDS, MILLI_HOUR, gpu_hours_of, to_minor, units_of
from billing.selectors.prices import _quote, price_books_for
from tenants.access import Actor
from tenants.models import Tenant

# -- usage ------------------------------------------------------------------------------------------------
_GROUP_KEYS = {
    "project": "p.slug",
    "model": "u.tier",
    "day": "to_char(u.hour_start AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
}

_USAGE_SUMMARY_SQL = """
SELECT {key} AS key, u.tier, u.kind, u.mig_profile, u.workload_class, u.over_quota, u.profiling,
       SUM(u.seconds * u.gpu_milli)                                                   AS milli_seconds,
       SUM(CASE WHEN t.engine_active_avg IS NOT NULL THEN u.seconds * u.gpu_milli END) AS measured_ms,
       SUM(u.seconds * u.gpu_milli * t.engine_active_avg)                              AS active_ms,
       SUM(CASE WHEN t.engine_active_avg < %(idle)s THEN u.seconds * u.gpu_milli END)  AS idle_ms
  FROM billing_allocationusage u
  JOIN tenants_project p ON p.id = u.project_id
  LEFT JOIN billing_utilisationusage t ON t.lease_id = u.lease_id AND t.hour_start = u.hour_start
 WHERE u.tenant_id = %(tenant)s AND u.hour_start >= %(start)s AND u.hour_start < %(end)s
 GROUP BY 1, 2, 3, 4, 5, 6, 7
 ORDER BY 1
"""


def usage_query_check(*, start: datetime, end: datetime, group_by: str) -> None:
    """A usage window that ``usage_summary`` accepts, else ``ValidationFailed`` naming the parameter."""
    from core.errors import ValidationFailed

    if group_by not in _GROUP_KEYS:
        raise ValidationFailed(f"group_by must be one of {', '.join(_GROUP_KEYS)}.", field="group_by")
    if end <= start:
        raise ValidationFailed("to must be after from.", field="to")
    if end - start > timedelta(days=400):
        raise ValidationFailed("At most 400 days at a time.", field="to")


def usage_summary(*, actor: Actor, start: datetime, end: datetime, group_by: str) -> dict:
    """Metered usage of the actor's tenant in [start, end) by project, model or UTC day: GPU-hours held,
    engine-active average where measured, idle GPU-hours and the cost at the prices in force."""
    from django.conf import settings
    from django.db import connection

    usage_query_check(start=start, end=end, group_by=group_by)
    tenant = actor.tenant
    books = price_books_for(tenant=tenant, start=start, end=end)
    bounds = [moment for moment, _b, _t in books] + [end]
    groups: dict[str, dict] = {}
    pieces = [(start if i == 0 else m, bounds[i + 1], table) for i, (m, _b, table) in enumerate(books)] or [
        (start, end, None)]
    for piece_start, piece_end, table in pieces:
        with connection.cursor() as cursor:
            cursor.execute(_USAGE_SUMMARY_SQL.format(key=_GROUP_KEYS[group_by]),
                           {"tenant": tenant.pk, "start": piece_start, "end": piece_end,
                            "idle": settings.BILLING_IDLE_ENGINE_ACTIVE})
            names = [c[0] for c in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        for row in rows:
            entry = groups.setdefault(row["key"], {
                "key": row["key"], "gpu_hours": Decimal(0), "measured": Decimal(0), "active": Decimal(0),
                "idle_gpu_hours": Decimal(0), "amount": Decimal(0), "priced": True})
            entry["gpu_hours"] += gpu_hours_of(row["milli_seconds"])
            entry["measured"] += Decimal(row["measured_ms"] or 0)
            entry["active"] += Decimal(row["active_ms"] or 0)
            entry["idle_gpu_hours"] += Decimal(row["idle_ms"] or 0) / MILLI_HOUR
            found = table.unit_price(row["tier"], row["kind"], row["mig_profile"], over_quota=row["over_quota"],
                                     workload_class=row["workload_class"], profiling=row["profiling"]) \
                if table else None
            if found is None:
                entry["priced"] = False
            else:
                units = units_of(row["kind"], row["tier"], row["mig_profile"], row["milli_seconds"])
                entry["amount"] += units * found[0]
    out = []
    for entry in groups.values():
        measured = entry.pop("measured")
        active = entry.pop("active")
        amount = entry.pop("amount")
        priced = entry.pop("priced")
        entry["gpu_hours"] = entry["gpu_hours"].quantize(Decimal("0.000001"))
        entry["idle_gpu_hours"] = entry["idle_gpu_hours"].quantize(Decimal("0.000001")) if measured else None
        entry["engine_active_avg"] = (active / measured).quantize(Decimal("0.0001")) if measured else None
        entry["amount_minor"] = to_minor(amount, tenant.currency) if priced else None
        out.append(entry)
    return {"from": start, "to": end, "group_by": group_by, "currency": tenant.currency, "groups": out}


_SPEND_SQL = """
SELECT u.tier, u.kind, u.mig_profile, u.workload_class, u.over_quota, u.profiling, SUM(u.seconds * u.gpu_milli)
  FROM billing_allocationusage u
 WHERE u.tenant_id = %(tenant)s AND u.hour_start >= %(start)s AND u.hour_start < %(end)s {project}
 GROUP BY 1, 2, 3, 4, 5, 6
"""


def spend_minor(*, tenant: Tenant, start: datetime, end: datetime,
                project_id: int | None = None) -> tuple[int, datetime]:
    """Metered charges of the tenant (or one project) in [start, end) at the prices in force, before
    discounts and credits, and the end of the metered time (the latest metered hour's end)."""
    from django.db import connection

    from billing.models import AllocationUsage

    amount = Decimal(0)
    books = price_books_for(tenant=tenant, start=start, end=end)
    bounds = [moment for moment, _b, _t in books] + [end]
    for index, (moment, _book, table) in enumerate(books):
        params = {"tenant": tenant.pk, "start": moment, "end": bounds[index + 1], "project": project_id}
        sql = _SPEND_SQL.format(project="AND u.project_id = %(project)s" if project_id else "")
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            for tier, kind, profile, workload_class, over_quota, profiling, milli_seconds in cursor.fetchall():
                found = table.unit_price(tier, kind, profile, over_quota=over_quota, workload_class=workload_class,
                                         profiling=profiling)
                if found is not None:
                    amount += units_of(kind, tier, profile, milli_seconds) * found[0]
    scope = AllocationUsage.objects.filter(tenant=tenant, hour_start__gte=start, hour_start__lt=end)
    if project_id:
        scope = scope.filter(project_id=project_id)
    last = scope.order_by("-hour_start").values_list("hour_start", flat=True).first()
    return to_minor(amount, tenant.currency), (last + timedelta(hours=1)) if last else start


def _lease_gpu(lease) -> dict:
    model = lease.tier or (lease.models_allowed[0] if lease.models_allowed else "auto")
    gpu = {"kind": lease.kind, "count": lease.count, "model": model}
    if lease.kind == "mig":
        gpu["profile"] = lease.profile
    if lease.kind == "share":
        gpu["milli"] = lease.milli
    return gpu


def spend_forecast(*, tenant: Tenant, project_id: int | None = None, now: datetime | None = None) -> tuple[int, int]:
    """(charges metered this month, what the live leases will cost from the end of metering until their
    end or the month's), in minor units, at current prices, before discounts and credits."""
    from broker.choices import FINAL_STATES
    from broker.models import Lease

    now = now or timezone.now()
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (start + timedelta(days=32)).replace(day=1)
    spent, metered_until = spend_minor(tenant=tenant, start=start, end=end, project_id=project_id)
    # an hour metered while in progress (``invoice_run --through-now``) is metered up to then, not to its end
    metered_until = min(metered_until, now)
    books = price_books_for(tenant=tenant, start=now, end=now + timedelta(seconds=1))
    if not books:
        return spent, 0
    book, table = books[-1][1], books[-1][2]
    live = Lease.objects.filter(tenant=tenant).exclude(state__in=FINAL_STATES)
    if project_id:
        live = live.filter(project_id=project_id)
    running = Decimal(0)
    for lease in live:
        price = _quote(book, table, gpu=_lease_gpu(lease), workload_class=lease.workload_class,
                       over_quota=lease.over_quota)
        if price is None:
            continue
        since = max(metered_until, lease.active_at or now)
        until = min(end, lease.ends_at or (now + timedelta(seconds=lease.duration_seconds)))
        if until > since:
            running += price.per_hour * Decimal((until - since).total_seconds()) / HOUR_SECONDS
    return spent, to_minor(running, tenant.currency)
