"""``python manage.py billing_terms_set TENANT --discount-pct 10 --monthly-commit-minor 500000 [--period 2026-12]``:
a tenant's billing terms from a month on, through ``billing.services.billing_terms_set`` (validated, audited)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from billing import services
from core.errors import ApplicationError
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Set a tenant's discount and committed monthly minimum from a month on (this month by default); audited."

    def add_arguments(self, parser):
        parser.add_argument("tenant", help="the tenant's slug")
        parser.add_argument("--discount-pct", default="0", help="0-100, two decimals")
        parser.add_argument("--monthly-commit-minor", type=int, default=0,
                            help="committed monthly minimum in minor units of the tenant's currency")
        parser.add_argument("--period", default=None, help="YYYY-MM: the first month they apply to")

    def handle(self, *args, tenant, discount_pct, monthly_commit_minor, period, **options):
        target = Tenant.objects.filter(slug=tenant).first()
        if target is None:
            raise CommandError("tenant: no such tenant")
        try:
            terms = services.billing_terms_set(tenant=target, discount_pct=discount_pct,
                                               monthly_commit_minor=monthly_commit_minor, period=period)
        except ApplicationError as error:
            raise CommandError(f"{error.field}: {error.message}") from None
        self.stdout.write(f"{target.slug}: {terms.discount_pct} % discount, commitment {terms.monthly_commit_minor} "
                          f"minor units of {target.currency} a month, from {terms.effective_from.date().isoformat()}")
