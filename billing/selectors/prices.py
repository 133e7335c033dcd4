"""Prices as they are read: the price book in force for a tenant, list prices, quotes of a request's price, offers
with prices, and the price books and terms staff pages list."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Q, QuerySet
from django.utils import timezone

from billing.core.pricing import RateTable, format_rate, to_minor
from billing.models import PriceBook
from gpus.catalogue import MODELS
from gpus.mig import UnknownProfile, profile_get
from tenants.models import Tenant

_MODELS = {m.code: m for m in MODELS}


def _table(book: PriceBook) -> RateTable:
    return book_rate_table(book)


def book_rate_table(book: PriceBook) -> RateTable:
    """A price book's rates and multipliers as the rate table invoices and quotes price with."""
    rates = {(r.tier, r.kind, r.mig_profile): r.per_hour for r in book.rates.all()}
    return RateTable(rates=rates, over_quota_multiplier=book.over_quota_multiplier,
                     interactive_multiplier=book.interactive_multiplier, energy_per_kwh=book.energy_per_kwh,
                     profiling_multiplier=book.profiling_multiplier)


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


def list_rate_table(*, at: datetime) -> RateTable | None:
    """The general price book in force at ``at`` in ``LIST_PRICE_CURRENCY`` as a rate table (None: none)."""
    from django.conf import settings

    book = (PriceBook.objects.filter(tenant__isnull=True, currency=settings.LIST_PRICE_CURRENCY,
                                     effective_from__lte=at).prefetch_related("rates")
            .order_by("-effective_from").first())
    return _table(book) if book else None


def whole_list_prices(now: datetime) -> dict[str, int]:
    """Whole-GPU list price per hour per model (minor units) in force at ``now``: what leasing's ``model: auto``
    ranks models by (registered through ``broker.extensions``)."""
    _currency, rates = list_prices(at=now)
    return {tier: minor for tier, kind, _profile, minor in rates if kind == "whole"}


def price_books_for(*, tenant: Tenant, start: datetime, end: datetime) -> list[tuple[datetime, PriceBook, RateTable]]:
    """The books that apply to ``tenant`` at some moment of [start, end), oldest first, as (from, book,
    rates). A tenant's own books take precedence over the general list in its currency from their start."""
    scope = Q(tenant=tenant) | Q(tenant__isnull=True, currency=tenant.currency)
    books = list(PriceBook.objects.filter(scope, effective_from__lt=end).prefetch_related("rates")
                 .order_by("effective_from", "tenant_id"))
    return books_in_force(books, tenant=tenant, start=start, end=end)


def books_in_force(books: list[PriceBook], *, tenant: Tenant, start: datetime, end: datetime,
                   tables: dict[int, RateTable] | None = None) -> list[tuple[datetime, PriceBook, RateTable]]:
    """``price_books_for`` on books already read (any books starting before ``end``, rates prefetched, in
    (effective_from, tenant) order): the invoice run reads every tenant's books in one query. ``tables``
    caches the rate tables by book."""
    books = [b for b in books if b.effective_from < end and (
        b.tenant_id == tenant.pk or (b.tenant_id is None and b.currency == tenant.currency))]
    own = [b for b in books if b.tenant_id is not None]
    general = [b for b in books if b.tenant_id is None]

    def in_force(at: datetime) -> PriceBook | None:
        mine = [b for b in own if b.effective_from <= at]
        if mine:
            return mine[-1]
        shared = [b for b in general if b.effective_from <= at]
        return shared[-1] if shared else None

    def table(book: PriceBook) -> RateTable:
        if tables is None:
            return _table(book)
        if book.pk not in tables:
            tables[book.pk] = _table(book)
        return tables[book.pk]

    moments = sorted({start} | {b.effective_from for b in books if start < b.effective_from < end})
    out: list[tuple[datetime, PriceBook, RateTable]] = []
    for moment in moments:
        book = in_force(moment)
        if book is not None and (not out or out[-1][1].pk != book.pk):
            out.append((moment, book, table(book)))
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
                         description=f"{what} on {tier} at {format_rate(unit_price, book.currency)} per {unit}"
                                     + (f" ({', '.join(notes)})" if notes else ""),
                         tier=tier, book=book.name)
    return best


def offer_prices(*, tenant: Tenant, offers: list[dict], at: datetime | None = None) -> list[dict]:
    """The offers (``broker.selectors.offer_list``) with the tenant's prices per hour in force now: a whole
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
    from core.errors import NotFound

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
