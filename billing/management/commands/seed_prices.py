"""``python manage.py seed_prices``: the demo's general price list (USD, EUR), once.

Run by ``make run`` after ``seed_demo``; does nothing when a general book already exists in a currency.
Prices per hour are illustrative list prices, in the range public clouds charged in 2026.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.core.management.base import BaseCommand

from billing import services
from billing.models import PriceBook
from gpus.catalogue import MODELS

LIST = [
    {"tier": "H100-80GB", "per_hour": "4.20"},
    {"tier": "H100-80GB", "kind": "mig", "mig_profile": "1g.10gb", "per_hour": "0.70"},
    {"tier": "H200-141GB", "per_hour": "5.60"},
    {"tier": "A100-80GB", "per_hour": "2.90"},
    {"tier": "A100-40GB", "per_hour": "2.10"},
    {"tier": "L4", "per_hour": "0.80"},
    {"tier": "L4", "kind": "share", "per_hour": "0.96"},
    {"tier": "T4", "per_hour": "0.35"},
]


class Command(BaseCommand):
    help = "Create the demo's general price list (USD and EUR) unless one exists."

    def handle(self, *args, **options):
        codes = {m.code for m in MODELS}
        rates = [rate for rate in LIST if rate["tier"] in codes]
        for currency, factor in (("USD", 1), ("EUR", 0.92)):
            if PriceBook.objects.filter(tenant__isnull=True, currency=currency).exists():
                continue
            services.price_book_create(
                name=f"List prices {currency}", currency=currency, effective_from=datetime(2026, 1, 1, tzinfo=UTC),
                rates=[{**rate, "per_hour": f"{float(rate['per_hour']) * factor:.2f}"} for rate in rates],
                over_quota_multiplier="0.6", interactive_multiplier="1.25", energy_per_kwh=None)
            self.stdout.write(f"price list {currency}: {len(rates)} rates")
