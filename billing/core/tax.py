"""Tax arithmetic (no database): the tax lines of an invoice from its net amount in minor units and the tenant's
rates, each rounded once, half up, to the currency's minor unit (Stripe rounds a tax amount per rate the same
way).

- Exclusive rates add ``round(net × rate)`` each: the invoice's total grows by their sum.
- Inclusive rates are inside the amounts already: rate ``r_i`` of the inclusive rates ``R`` accounts for
  ``round(net × r_i / (1 + ΣR))`` of the net; the total does not change (the tax is stated, not added).
- Reverse charge: no tax is charged; one line at zero carries the legal note.
A net at or below zero is taxed nothing (a credit is not a negative sale here).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

HUNDRED = Decimal(100)


@dataclass(frozen=True)
class Rate:
    """One tax rate: ``percentage`` (0–100, up to 4 places), inclusive or exclusive, in ``jurisdiction``."""

    key: int
    jurisdiction: str
    name: str
    percentage: Decimal
    inclusive: bool


@dataclass(frozen=True)
class TaxLine:
    key: int | None
    description: str
    percentage: Decimal
    inclusive: bool
    base_minor: int  # the net it applies to
    amount_minor: int  # added to the total (exclusive); 0 for inclusive and reverse charge
    included_minor: int  # the part of the net that is this tax (inclusive only)


def _round(value: Decimal) -> int:
    return int(value.quantize(Decimal(1), rounding=ROUND_HALF_UP))


def tax_lines(net_minor: int, rates: list[Rate], *, reverse_charge: bool = False, legal_note: str = ""
              ) -> list[TaxLine]:
    """The tax lines for ``net_minor`` (every line of the invoice but tax), in the rates' order."""
    if reverse_charge:
        return [TaxLine(None, f"Reverse charge: {legal_note}".strip(), Decimal(0), False, max(net_minor, 0), 0, 0)]
    if net_minor <= 0 or not rates:
        return []
    inclusive_sum = sum((r.percentage for r in rates if r.inclusive), Decimal(0)) / HUNDRED
    lines = []
    for rate in rates:
        fraction = rate.percentage / HUNDRED
        label = f"{rate.name} ({rate.jurisdiction}) {rate.percentage.normalize():f} %"
        if rate.inclusive:
            included = _round(Decimal(net_minor) * fraction / (1 + inclusive_sum))
            lines.append(TaxLine(rate.key, f"{label}, included", rate.percentage, True, net_minor, 0, included))
        else:
            lines.append(TaxLine(rate.key, label, rate.percentage, False, net_minor,
                                 _round(Decimal(net_minor) * fraction), 0))
    return lines
