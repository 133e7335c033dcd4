"""Price books and billing terms (platform staff): validated, audited, never repricing metered usage."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone

from billing.choices import RateKind
from billing.core.metering import HOUR
from billing.models import (
    AllocationUsage,
    BillingTerms,
    PriceBook,
    PriceRate,
)
from billing.services.invoicing import period_parse
from core.errors import Conflict, NotFound, ValidationFailed
from gpus.catalogue import MODELS
from gpus.mig import UnknownProfile, profile_get
from tenants.audit import audit_record
from tenants.models import Tenant

# -- price books, terms, caps ----------------------------------------------------------------------------------
# Who sets what (docs/billing.md, "Who sets what"): platform staff set price books and a tenant's terms (the ops
# pages, the Django admin, the staff API); a tenant's admins set its spend caps (the Budgets page, the API).
# Every change writes its AuditEvent in its transaction. The transactions are not durable (a caller may compose
# them); the Django admin (core.admin.ServiceAdmin) calls each outside any transaction of its own.

MAX_MINOR = 10**15  # a monthly amount in minor units (10 trillion USD): beyond any cap or commitment
BOOK_FIELDS = ("name", "effective_from", "over_quota_multiplier", "interactive_multiplier", "profiling_multiplier",
               "energy_per_kwh", "rates")
# column (max_digits, decimal_places) and whether zero is refused, for each decimal of a book
_BOOK_DECIMALS = {"over_quota_multiplier": (6, 4, True), "interactive_multiplier": (6, 4, True),
                  "profiling_multiplier": (6, 4, True),
                  "energy_per_kwh": (10, 6, False)}
_RATE_DIGITS = (14, 6)


def _decimal_in(value: object, field: str, *, max_digits: int, places: int, positive: bool = False) -> Decimal:
    """``value`` as the ``Decimal`` its column stores exactly: a finite number ≥ 0 (> 0 when ``positive``),
    below 10^(max_digits − places), with at most ``places`` decimals; otherwise an error naming ``field``
    (the database would round the decimals silently and refuse an overflow with a 500)."""
    try:
        number = Decimal(str(value).strip())
    except ArithmeticError:
        raise ValidationFailed(f"{field} must be a decimal number.", field=field) from None
    if not number.is_finite():
        raise ValidationFailed(f"{field} must be a decimal number.", field=field)
    if number < 0 or (positive and number == 0):
        raise ValidationFailed(f"{field} must be a {'positive' if positive else 'non-negative'} number.",
                               field=field)
    limit = Decimal(10) ** (max_digits - places)
    if number >= limit:
        raise ValidationFailed(f"{field} must be below {limit}.", field=field)
    step = Decimal(1).scaleb(-places)
    if number != number.quantize(step):
        raise ValidationFailed(f"{field} has at most {places} decimal places.", field=field)
    return number.quantize(step)


def _rates_clean(rates: object) -> list[PriceRate]:
    """Unsaved rates from ``[{"tier", "kind", "mig_profile", "per_hour"}, ...]``; errors name ``rates[i].x``."""
    if not isinstance(rates, list | tuple) or not rates:
        raise ValidationFailed("A price book needs at least one rate.", field="rates")
    models_known = {m.code for m in MODELS}
    rows, seen = [], set()
    for index, rate in enumerate(rates):
        where = f"rates[{index}]"
        if not isinstance(rate, dict):
            raise ValidationFailed(f"{where} must be an object with tier, kind, mig_profile and per_hour.",
                                   field=where)
        tier, kind, profile = rate.get("tier"), rate.get("kind", RateKind.WHOLE), rate.get("mig_profile") or ""
        if not isinstance(tier, str) or tier not in models_known:
            raise ValidationFailed(f"{where}.tier must be a GPU model code.", field=f"{where}.tier")
        if not isinstance(kind, str) or kind not in RateKind.values:
            raise ValidationFailed(f"{where}.kind must be one of {', '.join(RateKind.values)}.", field=f"{where}.kind")
        if kind == RateKind.MIG:
            try:
                profile = profile_get(tier, str(profile)).name
            except UnknownProfile:
                raise ValidationFailed(f"{where}.mig_profile {profile!r} is not a MIG profile of {tier}.",
                                       field=f"{where}.mig_profile") from None
        elif profile:
            raise ValidationFailed(f"{where}.mig_profile applies only to kind mig.", field=f"{where}.mig_profile")
        if (tier, kind, profile) in seen:
            raise ValidationFailed(f"{where} repeats {tier} {profile or kind}.", field=where)
        seen.add((tier, kind, profile))
        per_hour = _decimal_in(rate.get("per_hour"), f"{where}.per_hour", max_digits=_RATE_DIGITS[0],
                               places=_RATE_DIGITS[1])
        rows.append(PriceRate(tier=tier, kind=kind, mig_profile=profile, per_hour=per_hour))
    return rows


def _book_values(values: dict) -> dict:
    """The clean value of each book field in ``values`` (in its order); the first bad one is refused by name."""
    clean: dict = {}
    for key, value in values.items():
        if key == "name":
            if not isinstance(value, str) or not value.strip():
                raise ValidationFailed("name is required.", field="name")
            if len(value.strip()) > 100:
                raise ValidationFailed("name must be at most 100 characters.", field="name")
            clean[key] = value.strip()
        elif key == "effective_from":
            if not isinstance(value, datetime) or value.tzinfo is None:
                raise ValidationFailed("effective_from must be a date-time with a time zone.", field="effective_from")
            clean[key] = value
        elif key == "energy_per_kwh" and (value is None or value == ""):
            clean[key] = None
        elif key in _BOOK_DECIMALS:
            digits, places, positive = _BOOK_DECIMALS[key]
            clean[key] = _decimal_in(value, key, max_digits=digits, places=places, positive=positive)
        elif key == "rates":
            clean[key] = _rates_clean(value)
        else:
            raise ValidationFailed(f"{key} is not a field of a price book that can change (currency and tenant are "
                                   f"its scope: create a new book for another).", field=key)
    return clean


def _book_scope_taken(*, tenant: Tenant | None, currency: str, effective_from: datetime,
                      exclude: int | None = None) -> None:
    scope = PriceBook.objects.filter(effective_from=effective_from)
    scope = scope.filter(tenant=tenant) if tenant else scope.filter(tenant__isnull=True, currency=currency)
    if scope.exclude(pk=exclude).exists():
        raise ValidationFailed("Another book of this scope starts at that moment.", field="effective_from")


def _book_reprices_metered_usage(*, tenant: Tenant | None, currency: str, effective_from: datetime) -> None:
    """Refuse a start before the end of an hour already metered for a tenant the book would price (its own
    tenant; for a general book, every tenant in its currency): that usage was priced, perhaps invoiced."""
    usage = AllocationUsage.objects.filter(hour_start__gt=effective_from - HOUR)
    usage = usage.filter(tenant=tenant) if tenant else usage.filter(tenant__currency=currency)
    last = usage.order_by("-hour_start").values_list("hour_start", flat=True).first()
    if last is not None:
        scope = f"tenant {tenant.slug}" if tenant else f"tenants billed in {currency}"
        raise ValidationFailed(
            f"A new book cannot reprice usage already metered: {scope} have usage metered up to "
            f"{last + HOUR:%Y-%m-%d %H:%M} UTC; start the book at or after then.", field="effective_from")


def _book_audit_data(book: PriceBook, rates: list[PriceRate] | None) -> dict:
    data = {"name": book.name, "currency": book.currency, "effective_from": book.effective_from.isoformat(),
            "over_quota_multiplier": str(book.over_quota_multiplier),
            "interactive_multiplier": str(book.interactive_multiplier),
            "profiling_multiplier": str(book.profiling_multiplier),
            "energy_per_kwh": None if book.energy_per_kwh is None else str(book.energy_per_kwh)}
    if rates is not None:
        data["rates"] = [{"tier": r.tier, "kind": r.kind, "mig_profile": r.mig_profile, "per_hour": str(r.per_hour)}
                         for r in rates]
    return data


def price_book_create(*, name: str, currency: str, effective_from: datetime, rates: list[dict],
                      tenant: Tenant | None = None, over_quota_multiplier: object = "0.6",
                      interactive_multiplier: object = "1.25", energy_per_kwh: object = None,
                      profiling_multiplier: object = "1", by_user=None) -> PriceBook:
    """A price book with its rates in one transaction, audited; every bad value is refused naming its field
    (``rates[2].per_hour``) and nothing is written. Changing prices means a new book from a date: a book may
    start in the past only while nothing it would price has been metered (usage already priced, perhaps
    invoiced, is never repriced by a new book)."""
    from tenants.choices import CURRENCIES

    values = _book_values({"name": name})
    if not isinstance(currency, str) or currency not in CURRENCIES:
        raise ValidationFailed(f"currency must be one of {', '.join(CURRENCIES)}.", field="currency")
    if tenant is not None and tenant.currency != currency:
        raise ValidationFailed(f"A book for tenant {tenant.slug} must be in its currency {tenant.currency}.",
                               field="currency")
    values |= _book_values({"effective_from": effective_from, "over_quota_multiplier": over_quota_multiplier,
                            "interactive_multiplier": interactive_multiplier, "energy_per_kwh": energy_per_kwh,
                            "profiling_multiplier": profiling_multiplier,
                            "rates": rates})
    rows = values.pop("rates")
    book = PriceBook(currency=currency, tenant=tenant, **values)
    try:
        with transaction.atomic():
            _book_scope_taken(tenant=tenant, currency=currency, effective_from=book.effective_from)
            _book_reprices_metered_usage(tenant=tenant, currency=currency, effective_from=book.effective_from)
            book.save()
            for row in rows:
                row.book = book
            PriceRate.objects.bulk_create(rows)
            audit_record(tenant=tenant, by=by_user, action="price_book.create", target=f"price_book:{book.pk}",
                         data=_book_audit_data(book, rows))
    except IntegrityError:  # a racing create of the same scope and start
        raise ValidationFailed("Another book of this scope starts at that moment.", field="effective_from") from None
    return book


def _book_not_started(book: PriceBook, now: datetime) -> None:
    if book.effective_from <= now:
        raise Conflict(f"Price book {book.name!r} has been in force since {book.effective_from:%Y-%m-%d %H:%M} UTC: "
                       f"usage was priced by it, so it cannot change. Create a new book from a later date.",
                       field="effective_from")


def price_book_update(*, book: PriceBook, changes: dict, by_user=None, now: datetime | None = None) -> PriceBook:
    """Change a book that has not started yet (``effective_from`` after now): name, start, multipliers, energy
    price, and its rates (``rates`` replaces them all). A book in force or past is refused (409 naming
    ``effective_from``): its prices change through a new book from a later date. The new start must be in the
    future too. Currency and tenant are the book's scope and do not change. Audited with the fields changed."""
    now = now or timezone.now()
    clean = _book_values(dict(changes))
    if "effective_from" in clean and clean["effective_from"] <= now:
        raise ValidationFailed("effective_from must be in the future: a book that has started cannot change.",
                               field="effective_from")
    rates = clean.pop("rates", None)
    try:
        with transaction.atomic():
            locked = PriceBook.objects.select_for_update().filter(pk=book.pk).first()
            if locked is None:
                raise NotFound(f"No price book {book.pk}.", field="id")
            _book_not_started(locked, now)
            if "effective_from" in clean:
                _book_scope_taken(tenant=locked.tenant, currency=locked.currency,
                                  effective_from=clean["effective_from"], exclude=locked.pk)
            for key, value in clean.items():
                setattr(locked, key, value)
            if clean:
                locked.save(update_fields=list(clean))
            if rates is not None:
                locked.rates.all().delete()
                for row in rates:
                    row.book = locked
                PriceRate.objects.bulk_create(rates)
            fields = sorted([*clean, *(["rates"] if rates is not None else [])])
            audit_record(tenant=locked.tenant, by=by_user, action="price_book.update",
                         target=f"price_book:{locked.pk}", data={"fields": fields, **_book_audit_data(locked, rates)})
    except IntegrityError:
        raise ValidationFailed("Another book of this scope starts at that moment.", field="effective_from") from None
    return PriceBook.objects.prefetch_related("rates").get(pk=locked.pk)


def price_book_delete(*, book: PriceBook, by_user=None, now: datetime | None = None) -> None:
    """Delete a book that has not started yet (with its rates), audited; one in force or past is refused (409)."""
    now = now or timezone.now()
    with transaction.atomic():
        locked = PriceBook.objects.select_for_update().filter(pk=book.pk).first()
        if locked is None:
            raise NotFound(f"No price book {book.pk}.", field="id")
        _book_not_started(locked, now)
        audit_record(tenant=locked.tenant, by=by_user, action="price_book.delete", target=f"price_book:{locked.pk}",
                     data=_book_audit_data(locked, list(locked.rates.all())))
        locked.delete()


# -- billing terms (platform staff) -----------------------------------------------------------------------------
def _month_start(period: object, now: datetime) -> date:
    """The month ``period`` names (``YYYY-MM``, a first-of-month date; None: this month), refused by name
    when it is not this month or later: earlier months are invoiced at the terms they had."""
    if period is None or period == "":
        month = now.date().replace(day=1)
    elif isinstance(period, date) and not isinstance(period, datetime):
        if period.day != 1:
            raise ValidationFailed("period must be the first day of a month.", field="period")
        month = period
    else:
        month = period_parse(period)
    current = now.date().replace(day=1)
    if month < current:
        raise ValidationFailed(f"period must be this month ({current:%Y-%m}) or later: earlier months are invoiced "
                               f"at the terms they had.", field="period")
    return month


def billing_terms_set(*, tenant: Tenant, discount_pct: object, monthly_commit_minor: object,
                      period: object = None, by_user=None, now: datetime | None = None) -> BillingTerms:
    """A tenant's terms from the first instant (UTC) of ``period`` — a month, this one by default — replacing
    terms that start then: a discount (0–100 %, two decimals) on the usage of every invoice from that month, and
    a committed monthly minimum in minor units of the tenant's currency (a shortfall becomes a line of its own).
    Months before this one cannot change: their invoices were computed with the terms they had (a change would
    come back as a correction). Audited."""
    now = now or timezone.now()
    month = _month_start(period, now)
    discount = _decimal_in(discount_pct, "discount_pct", max_digits=5, places=2)
    if discount > 100:
        raise ValidationFailed("discount_pct must be at most 100.", field="discount_pct")
    commit = monthly_commit_minor
    if isinstance(commit, bool) or not isinstance(commit, int) or not 0 <= commit <= MAX_MINOR:
        raise ValidationFailed(f"monthly_commit_minor must be a whole number of minor units ({tenant.currency}) from "
                               f"0 to {MAX_MINOR}.", field="monthly_commit_minor")
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    try:
        with transaction.atomic():
            terms, created = BillingTerms.objects.update_or_create(
                tenant=tenant, effective_from=start,
                defaults={"discount_pct": discount, "monthly_commit_minor": commit})
            audit_record(tenant=tenant, by=by_user, action="billing_terms.set",
                         target=f"billing_terms:{tenant.slug}/{month:%Y-%m}",
                         data={"period": f"{month:%Y-%m}", "created": created, "discount_pct": str(discount),
                               "monthly_commit_minor": commit, "currency": tenant.currency})
    except IntegrityError:  # a racing first save of the same month
        raise Conflict("The terms of that month were saved at the same moment; try again.", field="period") from None
    return terms


def billing_terms_delete(*, terms: BillingTerms, by_user=None, now: datetime | None = None) -> None:
    """Remove terms that start this month or later (the earlier terms apply again from then), audited."""
    now = now or timezone.now()
    if terms.effective_from.date() < now.date().replace(day=1):
        raise Conflict(f"The terms from {terms.effective_from:%Y-%m} applied to invoices of past months; they stay. "
                       f"Set new terms from this month instead.", field="period")
    with transaction.atomic():
        audit_record(tenant=terms.tenant, by=by_user, action="billing_terms.delete",
                     target=f"billing_terms:{terms.tenant.slug}/{terms.effective_from:%Y-%m}",
                     data={"discount_pct": str(terms.discount_pct), "monthly_commit_minor": terms.monthly_commit_minor})
        BillingTerms.objects.filter(pk=terms.pk).delete()
