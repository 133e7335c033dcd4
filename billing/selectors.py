"""Readers of billing data: the price book in force, price quotes, usage summaries, invoices.

Tenant-facing reads go through ``tenants.access.restrict`` like every other selector.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Q, QuerySet
from django.utils import timezone

from billing.models import Invoice, PriceBook
from billing.pricing import HOUR_SECONDS, MILLI_HOUR, RateTable, gpu_hours_of, to_minor, units_of
from gpus.catalogue import MODELS
from gpus.mig import UnknownProfile, profile_get
from tenants.access import Actor, restrict
from tenants.models import Tenant

_MODELS = {m.code: m for m in MODELS}


def _table(book: PriceBook) -> RateTable:
    rates = {(r.tier, r.kind, r.mig_profile): r.per_hour for r in book.rates.all()}
    return RateTable(rates=rates, over_quota_multiplier=book.over_quota_multiplier,
                     interactive_multiplier=book.interactive_multiplier, energy_per_kwh=book.energy_per_kwh)


def list_prices(*, at: datetime) -> tuple[str, list[tuple[str, str, str, int]]]:
    """The general price book in force at ``at`` in ``LIST_PRICE_CURRENCY``: (currency, [(tier, kind, MIG
    profile, minor units per hour)]), no rows without a book. What ``model: auto`` ranks models by and what
    the capacity planner prices with; a tenant's own book prices its invoices and its advice."""
    from django.conf import settings

    from billing.models import PriceRate

    currency = settings.LIST_PRICE_CURRENCY
    book = (PriceBook.objects.filter(tenant__isnull=True, currency=currency, effective_from__lte=at)
            .order_by("-effective_from").values_list("pk", flat=True).first())
    if book is None:
        return currency, []
    return currency, [(tier, kind, profile, to_minor(per_hour, currency)) for tier, kind, profile, per_hour in
                      PriceRate.objects.filter(book_id=book).values_list("tier", "kind", "mig_profile", "per_hour")]


def whole_list_prices(now: datetime) -> dict[str, int]:
    """Whole-GPU list price per hour per model (minor units) in force at ``now``: what leasing's ``model: auto``
    ranks models by (registered through ``leasing.extensions``)."""
    _currency, rates = list_prices(at=now)
    return {tier: minor for tier, kind, _profile, minor in rates if kind == "whole"}


def price_books_for(*, tenant: Tenant, start: datetime, end: datetime) -> list[tuple[datetime, PriceBook, RateTable]]:
    """The books that apply to ``tenant`` at some moment of [start, end), oldest first, as (from, book,
    rates). A tenant's own books take precedence over the general list in its currency from their start."""
    scope = Q(tenant=tenant) | Q(tenant__isnull=True, currency=tenant.currency)
    books = list(PriceBook.objects.filter(scope, effective_from__lt=end).prefetch_related("rates")
                 .order_by("effective_from", "tenant_id"))
    own = [b for b in books if b.tenant_id is not None]
    general = [b for b in books if b.tenant_id is None]

    def in_force(at: datetime) -> PriceBook | None:
        mine = [b for b in own if b.effective_from <= at]
        if mine:
            return mine[-1]
        shared = [b for b in general if b.effective_from <= at]
        return shared[-1] if shared else None

    moments = sorted({start} | {b.effective_from for b in books if start < b.effective_from < end})
    out: list[tuple[datetime, PriceBook, RateTable]] = []
    for moment in moments:
        book = in_force(moment)
        if book is not None and (not out or out[-1][1].pk != book.pk):
            out.append((moment, book, _table(book)))
    return out


@dataclass(frozen=True)
class Quote:
    currency: str
    per_hour: Decimal  # major units, for the whole request (count included)
    description: str
    tier: str
    book: str


def price_quote(*, tenant: Tenant, gpu: dict, workload_class: str, over_quota: bool,
                at: datetime | None = None) -> Quote | None:
    """The hourly price of a request as the portal and API preview it: the cheapest model the request
    may run on that has a price, with over-quota and interactive multipliers applied. None when no
    price book applies or the shape is not understood."""
    at = at or timezone.now()
    books = price_books_for(tenant=tenant, start=at, end=at + timedelta(seconds=1))
    if not books:
        return None
    return _quote(books[-1][1], books[-1][2], gpu=gpu, workload_class=workload_class, over_quota=over_quota)


def _quote(book: PriceBook, table: RateTable, *, gpu: dict, workload_class: str, over_quota: bool) -> Quote | None:
    if not isinstance(gpu, dict) or gpu.get("kind") not in ("whole", "mig", "share"):
        return None
    kind = gpu["kind"]
    count = gpu.get("count", 1) if isinstance(gpu.get("count", 1), int) else 1
    model = gpu.get("model", "auto")
    candidates = [model] if isinstance(model, str) and model != "auto" else sorted(_MODELS)
    memory_need = gpu.get("memory_mib", 0) if kind == "whole" else 0
    best: Quote | None = None
    for tier in candidates:
        spec = _MODELS.get(tier)
        if spec is None or (memory_need and spec.memory_mib < memory_need):
            continue
        profile = ""
        if kind == "mig":
            try:
                profile = profile_get(tier, str(gpu.get("profile", ""))).name
            except (UnknownProfile, KeyError):
                continue
        found = table.unit_price(tier, kind, profile, over_quota=over_quota, workload_class=workload_class)
        if found is None:
            continue
        unit_price, unit = found
        amount = unit_price * count
        if kind == "share":
            milli = gpu.get("milli", 0) if isinstance(gpu.get("milli", 0), int) else 0
            amount = unit_price * Decimal(milli) / 1000 * count
        if best is None or amount < best.per_hour:
            what = f"{count} × {profile or tier}" if kind != "share" else f"{gpu.get('milli', 0)} milli of a {tier}"
            notes = [n for n, on in (("over-quota rate", over_quota),
                                     ("interactive rate", workload_class == "interactive")) if on]
            best = Quote(currency=book.currency, per_hour=amount.quantize(Decimal("0.0001")),
                         description=f"{what} on {tier} at {unit_price} {book.currency} per {unit}"
                                     + (f" ({', '.join(notes)})" if notes else ""),
                         tier=tier, book=book.name)
    return best


def invoice_list(*, actor: Actor) -> QuerySet[Invoice]:
    return restrict(Invoice.objects.all(), actor).order_by("-period")


def invoice_get(*, actor: Actor, invoice_id: int) -> Invoice:
    from config.errors import NotFound

    invoice = restrict(Invoice.objects.all(), actor).prefetch_related("lines__project").filter(pk=invoice_id).first()
    if invoice is None:
        raise NotFound(f"No invoice {invoice_id} in this tenant.", field="id")
    return invoice


# -- usage ------------------------------------------------------------------------------------------------
_GROUP_KEYS = {
    "project": "p.slug",
    "model": "u.tier",
    "day": "to_char(u.hour_start AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
}

_USAGE_SUMMARY_SQL = """
SELECT {key} AS key, u.tier, u.kind, u.mig_profile, u.workload_class, u.over_quota,
       SUM(u.seconds * u.gpu_milli)                                                   AS milli_seconds,
       SUM(CASE WHEN t.engine_active_avg IS NOT NULL THEN u.seconds * u.gpu_milli END) AS measured_ms,
       SUM(u.seconds * u.gpu_milli * t.engine_active_avg)                              AS active_ms,
       SUM(CASE WHEN t.engine_active_avg < %(idle)s THEN u.seconds * u.gpu_milli END)  AS idle_ms
  FROM billing_allocationusage u
  JOIN tenants_project p ON p.id = u.project_id
  LEFT JOIN billing_utilisationusage t ON t.lease_id = u.lease_id AND t.hour_start = u.hour_start
 WHERE u.tenant_id = %(tenant)s AND u.hour_start >= %(start)s AND u.hour_start < %(end)s
 GROUP BY 1, 2, 3, 4, 5, 6
 ORDER BY 1
"""


def usage_summary(*, actor: Actor, start: datetime, end: datetime, group_by: str) -> dict:
    """Metered usage of the actor's tenant in [start, end) by project, model or UTC day: GPU-hours held,
    engine-active average where measured, idle GPU-hours and the cost at the prices in force."""
    from django.conf import settings
    from django.db import connection

    from config.errors import ValidationFailed

    if group_by not in _GROUP_KEYS:
        raise ValidationFailed(f"group_by must be one of {', '.join(_GROUP_KEYS)}.", field="group_by")
    if end <= start:
        raise ValidationFailed("to must be after from.", field="to")
    if end - start > timedelta(days=400):
        raise ValidationFailed("At most 400 days at a time.", field="to")
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
                                     workload_class=row["workload_class"]) if table else None
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
SELECT u.tier, u.kind, u.mig_profile, u.workload_class, u.over_quota, SUM(u.seconds * u.gpu_milli)
  FROM billing_allocationusage u
 WHERE u.tenant_id = %(tenant)s AND u.hour_start >= %(start)s AND u.hour_start < %(end)s {project}
 GROUP BY 1, 2, 3, 4, 5
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
            for tier, kind, profile, workload_class, over_quota, milli_seconds in cursor.fetchall():
                found = table.unit_price(tier, kind, profile, over_quota=over_quota, workload_class=workload_class)
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
    from leasing.choices import FINAL_STATES
    from leasing.models import Lease

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


def offer_prices(*, tenant: Tenant, offers: list[dict], at: datetime | None = None) -> list[dict]:
    """The offers (``leasing.selectors.offer_list``) with the tenant's prices per hour in force now: a whole
    GPU, each MIG profile (per instance) and a whole GPU's worth of shares; in-quota, non-interactive rates
    (over-quota and interactive multipliers are in ``multipliers``)."""
    at = at or timezone.now()
    books = price_books_for(tenant=tenant, start=at, end=at + timedelta(seconds=1))
    if not books:
        return offers
    _moment, book, table = books[-1]

    def price(tier: str, kind: str, profile: str = "") -> str | None:
        found = table.base(tier, kind, profile)
        return None if found is None else str(found[0])

    for offer in offers:
        offer["currency"] = book.currency
        offer["price_per_gpu_hour"] = price(offer["model"], "whole")
        offer["share"]["price_per_gpu_hour"] = price(offer["model"], "share")
        for entry in offer["mig"]:
            entry["price_per_hour"] = price(offer["model"], "mig", entry["profile"])
        offer["multipliers"] = {"over_quota": str(book.over_quota_multiplier),
                                "interactive": str(book.interactive_multiplier)}
    return offers


# -- price books, terms and caps: what their pages and the API read ------------------------------------------------
def price_book_list() -> QuerySet[PriceBook]:
    """Every price book (platform staff): general lists first, by currency, newest start first."""
    from django.db.models import F

    return (PriceBook.objects.select_related("tenant").prefetch_related("rates")
            .order_by(F("tenant__slug").asc(nulls_first=True), "currency", "-effective_from", "pk"))


def price_book_get(*, pk: int) -> PriceBook:
    from config.errors import NotFound

    book = PriceBook.objects.select_related("tenant").prefetch_related("rates").filter(pk=pk).first()
    if book is None:
        raise NotFound(f"No price book {pk}.", field="id")
    return book


def price_book_states(*, now: datetime | None = None) -> dict[int, str]:
    """Each book's state now: ``upcoming`` (not started: it may still change), ``in_force`` (the newest started
    book of its scope) or ``superseded`` (a later book of its scope has started). One query."""
    now = now or timezone.now()
    states: dict[int, str] = {}
    seen_scopes: set[tuple] = set()
    for pk, tenant_id, currency, start in (PriceBook.objects.order_by("-effective_from", "-pk")
                                           .values_list("pk", "tenant_id", "currency", "effective_from")):
        scope = (tenant_id,) if tenant_id is not None else (None, currency)
        if start > now:
            states[pk] = "upcoming"
        elif scope in seen_scopes:
            states[pk] = "superseded"
        else:
            states[pk] = "in_force"
            seen_scopes.add(scope)
    return states


def billing_terms_list(*, tenant: Tenant) -> QuerySet:
    """A tenant's terms, the latest start first (platform staff)."""
    from billing.models import BillingTerms

    return BillingTerms.objects.filter(tenant=tenant).order_by("-effective_from")


def billing_terms_in_force(*, tenant: Tenant, at: datetime | None = None):
    """The terms that apply to the invoice of the month of ``at`` (the latest starting before that month ends),
    or None — the rule ``invoice_lines_compute`` applies."""
    at = at or timezone.now()
    month_end = (at.replace(day=1, hour=0, minute=0, second=0, microsecond=0) + timedelta(days=32)).replace(day=1)
    return billing_terms_list(tenant=tenant).filter(effective_from__lt=month_end).first()


def spend_cap_list(*, actor: Actor) -> QuerySet:
    """The actor's tenant's spend caps: the tenant-wide one first, then by project."""
    from django.db.models import F

    from billing.models import SpendCap

    return (restrict(SpendCap.objects.select_related("tenant", "project"), actor)
            .order_by(F("project__slug").asc(nulls_first=True)))


def spend_cap_get(*, actor: Actor, pk: int):
    from config.errors import NotFound

    cap = spend_cap_list(actor=actor).filter(pk=pk).first()
    if cap is None:
        raise NotFound(f"No spend cap {pk} in this tenant.", field="id")
    return cap


@dataclass(frozen=True)
class Budget:
    """One scope of the Budgets page: this month's spend (metered, and forecast with the live leases to their
    end) against its cap, if any. Amounts in minor units of the tenant's currency."""

    project: object  # tenants.models.Project, None for the whole tenant
    cap: object  # billing.models.SpendCap or None
    spent_minor: int
    forecast_minor: int

    @property
    def used_pct(self) -> float | None:
        return None if self.cap is None else min(100.0, self.spent_minor * 100 / self.cap.monthly_minor)

    @property
    def forecast_pct(self) -> float | None:
        return None if self.cap is None else min(100.0, self.forecast_minor * 100 / self.cap.monthly_minor)

    @property
    def over(self) -> bool:
        return self.cap is not None and self.forecast_minor > self.cap.monthly_minor


def budget_list(*, actor: Actor, now: datetime | None = None) -> list[Budget]:
    """The tenant-wide budget, then one per project: spend this month at current prices before discounts and
    credits (``spend_forecast``, the budget guard's own figures) and the cap where one is set."""
    from tenants.models import Project

    now = now or timezone.now()
    tenant = actor.tenant
    caps = {cap.project_id: cap for cap in spend_cap_list(actor=actor)}
    out = []
    for project in [None, *restrict(Project.objects.all(), actor).order_by("slug")]:
        project_id = None if project is None else project.pk
        spent, running = spend_forecast(tenant=tenant, project_id=project_id, now=now)
        out.append(Budget(project=project, cap=caps.get(project_id), spent_minor=spent,
                          forecast_minor=spent + running))
    return out
