"""``python manage.py invoice_run --period YYYY-MM [--tenant SLUG] [--draft | --finalize]``.

Builds or recomputes the month's draft invoices and finalizes them once the month is closed (or when
told to with ``--finalize``). Idempotent: run it again, after a crash or not, and nothing is billed twice.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from billing import services
from billing.pricing import format_money
from config.errors import ValidationFailed
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Build, recompute and (once the month is closed) finalize the invoices of one month."

    def add_arguments(self, parser):
        parser.add_argument("--period", required=True, help="the month, YYYY-MM (UTC)")
        parser.add_argument("--tenant", default="", help="only this tenant (slug)")
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--draft", action="store_true", help="never finalize")
        mode.add_argument("--finalize", action="store_true", help="finalize even if the month is not closed")

    def handle(self, *args, **options):
        try:
            period = services.period_parse(options["period"])
        except ValidationFailed as error:
            raise CommandError(f"--period: {error.message}") from None
        tenant = None
        if options["tenant"]:
            tenant = Tenant.objects.filter(slug=options["tenant"]).first()
            if tenant is None:
                raise CommandError(f"--tenant: no tenant {options['tenant']!r}.")
        finalize = True if options["finalize"] else (False if options["draft"] else None)
        result = services.invoice_run(period=period, tenant=tenant, finalize=finalize)
        totals = ", ".join(format_money(v, c) for c, v in sorted(result["total_minor"].items())) or "nothing"
        self.stdout.write(f"{result['period']}: {result['tenants']} tenant(s); {result['finalized']} finalized, "
                          f"{result['drafts']} draft(s), {result['unchanged']} already final; total {totals}")
        if result["open_reason"] and not options["finalize"]:
            self.stdout.write(f"not finalized: {result['open_reason']}")
        for slug, message in sorted(result["errors"].items()):
            self.stderr.write(f"{slug}: {message}")
        if result["errors"]:
            raise CommandError(f"{len(result['errors'])} tenant(s) could not be invoiced")
