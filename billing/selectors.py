"""Readers of billing data: the price book in force, price quotes, usage summaries, invoices.

Tenant-facing reads go through ``tenants.access.restrict`` like every other selector.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Q, QuerySet
from django.utils import timezone

from billing.models import Invoice, PriceBook, SloEvaluation
from billing.pricing import RateTable
from gpus.catalogue import MODELS
from gpus.mig import UnknownProfile, profile_get
from tenants.access import Actor, restrict
from tenants.models import Tenant

_MODELS = {m.code: m for m in MODELS}


def _table(book: PriceBook) -> RateTable:
    rates = {(r.tier, r.kind, r.mig_profile): r.per_hour for r in book.rates.all()}
    return RateTable(rates=rates, over_quota_multiplier=book.over_quota_multiplier,
                     interactive_multiplier=book.interactive_multiplier, energy_per_kwh=book.energy_per_kwh)


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


def book_at(books: list[tuple[datetime, PriceBook, RateTable]], at: datetime) -> tuple[PriceBook, RateTable] | None:
    found = None
    for moment, book, table in books:
        if moment <= at:
            found = (book, table)
    return found


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
    if not isinstance(gpu, dict) or gpu.get("kind") not in ("whole", "mig", "share"):
        return None
    books = price_books_for(tenant=tenant, start=at, end=at + timedelta(seconds=1))
    if not books:
        return None
    book, table = books[-1][1], books[-1][2]
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


def slo_evaluation_list(*, actor: Actor) -> QuerySet[SloEvaluation]:
    return restrict(SloEvaluation.objects.all(), actor)
