"""``python manage.py seed_prices``: the demo's general price list (USD, EUR), once.

Run by ``make run`` after ``seed_demo``; does nothing when a general book already exists in a currency.
Prices per hour are illustrative list prices, in the range public clouds charged in 2026. They are consistent:
per model, a shape with no less memory and no less compute (MIG profiles, the whole GPU) never costs less, and a
GPU-hour of shares never costs more than the whole GPU-hour (tests/billing/test_price_book_seed.py checks every
book this command makes, through the rate table invoices use).
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal

from django.core.management.base import BaseCommand

from billing import services
from billing.models import PriceBook
from gpus.catalogue import MODELS

CURRENCIES = (("USD", Decimal(1)), ("EUR", Decimal("0.92")))  # (currency, factor from the USD list)

LIST = [
    {"tier": "H100-80GB", "per_hour": "4.20"},
    # below 1g.20gb and 1g.10gb+me (4.20 × 1/7 = 0.60 each, from the whole-GPU rate): an instance with less
    # memory, or without the media engines, never costs more (it was 0.70, above the 1g.20gb's 0.60)
    {"tier": "H100-80GB", "kind": "mig", "mig_profile": "1g.10gb", "per_hour": "0.55"},
    {"tier": "H200-141GB", "per_hour": "5.60"},
    {"tier": "A100-80GB", "per_hour": "2.90"},
    {"tier": "A100-40GB", "per_hour": "2.10"},
    {"tier": "L4", "per_hour": "0.80"},
    # a GPU-hour of time-sliced shares: below the exclusive GPU-hour (it was 0.96, above the L4's 0.80)
    {"tier": "L4", "kind": "share", "per_hour": "0.72"},
    {"tier": "T4", "per_hour": "0.35"},
]


def book_rates(rates: list[dict], factor: Decimal) -> list[dict]:
    """The list's rates times ``factor``, to the cent (``Decimal``, never ``float``)."""
    return [{**rate, "per_hour": str((Decimal(rate["per_hour"]) * factor).quantize(Decimal("0.01"),
                                                                                   rounding=ROUND_HALF_UP))}
            for rate in rates]


class Command(BaseCommand):
    help = "Create the demo's general price list (USD and EUR) unless one exists."

    def handle(self, *args, **options):
        codes = {m.code for m in MODELS}
        rates = [rate for rate in LIST if rate["tier"] in codes]
        for currency, factor in CURRENCIES:
            if PriceBook.objects.filter(tenant__isnull=True, currency=currency).exists():
                continue
            services.price_book_create(
                name=f"List prices {currency}", currency=currency, effective_from=datetime(2026, 1, 1, tzinfo=UTC),
                rates=book_rates(rates, factor),
                over_quota_multiplier="0.6", interactive_multiplier="1.25", energy_per_kwh=None)
            self.stdout.write(f"price list {currency}: {len(rates)} rates")
