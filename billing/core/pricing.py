"""Price arithmetic: pure functions over ``Decimal`` (no database).

A usage row becomes a *quantity* in the unit its rate is quoted in — GPU-hours for whole GPUs,
instance-hours for a MIG profile, GPU-hour equivalents for shares (1000 milli for an hour) — times a
*unit price* = base rate × the multipliers that apply (over-quota, interactive). Amounts are rounded to
the currency's minor unit once per invoice line (``to_minor``), never per hour.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from gpus.mig import profile_get

HOUR_SECONDS = Decimal(3600)
RATE_PLACES = Decimal("0.000001")
# ISO 4217 minor-unit exponents that differ from 2 (among the currencies tenants may choose)
_EXPONENT = {"JPY": 0}


def minor_exponent(currency: str) -> int:
    return _EXPONENT.get(currency, 2)


def to_minor(amount: Decimal, currency: str) -> int:
    """Major units → integer minor units, rounded half-up (the one rounding of a line)."""
    return int((amount * (Decimal(10) ** minor_exponent(currency))).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def from_minor(amount: int, currency: str) -> Decimal:
    return Decimal(amount).scaleb(-minor_exponent(currency))


def format_money(amount_minor: int, currency: str) -> str:
    """An amount in minor units as people read it: ``"1,234.50 USD"``, ``"1,235 JPY"`` (the currency's own
    number of decimals, thousands grouped, the code after the number). The one way money is written for people:
    portal pages (the ``money`` template filter), invoices' PDF and CSV, e-mails, messages."""
    places = minor_exponent(currency)
    value = from_minor(amount_minor, currency)
    return f"{value:,.{places}f} {currency}"


def format_rate(amount: Decimal, currency: str) -> str:
    """A price that is not an amount charged (a rate per hour, a unit price) in major units: at least the
    currency's decimals, at most the six a rate keeps, no trailing zeros beyond the currency's:
    ``Decimal("0.700000")`` → ``"0.70 USD"``, ``Decimal("0.123456")`` → ``"0.123456 USD"``, ``4.2`` →
    ``"4.20 USD"``, 150 JPY → ``"150 JPY"`` (the ``rate`` template filter)."""
    places = minor_exponent(currency)
    value = Decimal(amount).quantize(RATE_PLACES, rounding=ROUND_HALF_UP)
    text = f"{value:,.6f}".rstrip("0")
    whole, _, fraction = text.partition(".")
    fraction = fraction.ljust(places, "0")
    return f"{whole}.{fraction} {currency}" if fraction else f"{whole} {currency}"


@dataclass(frozen=True)
class RateTable:
    """One price book's rates: ``rates[(tier, kind, profile)]`` per hour, and its multipliers."""

    rates: dict[tuple[str, str, str], Decimal]
    over_quota_multiplier: Decimal
    interactive_multiplier: Decimal
    energy_per_kwh: Decimal | None = None
    profiling_multiplier: Decimal = Decimal(1)  # a profiling lease's usage: base × this (the profiling rate)

    def base(self, tier: str, kind: str, profile: str = "") -> tuple[Decimal, str] | None:
        """(base price per unit-hour, unit name) for a shape, or None when this book has no price for it.
        A MIG profile without its own rate costs the whole-GPU rate × compute slices / 7; shares without
        their own rate cost the whole-GPU rate per 1000 milli."""
        whole = self.rates.get((tier, "whole", ""))
        if kind == "mig":
            own = self.rates.get((tier, "mig", profile))
            if own is not None:
                return own, f"{profile} instance-hour"
            if whole is None:
                return None
            slices = profile_get(tier, profile).compute_slices
            return (whole * slices / 7).quantize(RATE_PLACES, rounding=ROUND_HALF_UP), f"{profile} instance-hour"
        if kind == "share":
            own = self.rates.get((tier, "share", ""))
            rate = own if own is not None else whole
            return (rate, "shared GPU-hour") if rate is not None else None
        return (whole, "GPU-hour") if whole is not None else None

    def unit_price(self, tier: str, kind: str, profile: str, *, over_quota: bool,
                   workload_class: str, profiling: bool = False) -> tuple[Decimal, str] | None:
        found = self.base(tier, kind, profile)
        if found is None:
            return None
        price, unit = found
        if over_quota:
            price *= self.over_quota_multiplier
        if workload_class == "interactive":
            price *= self.interactive_multiplier
        if profiling:
            price *= self.profiling_multiplier
        return price.quantize(RATE_PLACES, rounding=ROUND_HALF_UP), unit


MILLI_HOUR = Decimal(3600 * 1000)


def gpu_hours_of(milli_seconds) -> Decimal:
    """Σ seconds × milli → whole-GPU-hours."""
    return Decimal(milli_seconds) / MILLI_HOUR


def units_of(kind: str, tier: str, profile: str, milli_seconds) -> Decimal:
    """Σ seconds × milli of rows of one shape → unit-hours of its rate: instance-hours for MIG (÷ the
    profile's milli), else GPU-hours (whole GPUs and share equivalents)."""
    if kind == "mig":
        return Decimal(milli_seconds) / Decimal(profile_get(tier, profile).gpu_milli) / HOUR_SECONDS
    return Decimal(milli_seconds) / MILLI_HOUR
