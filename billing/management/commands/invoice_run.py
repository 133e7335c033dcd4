"""``python manage.py invoice_run --period YYYY-MM [--tenant SLUG] [--draft | --finalize] [--through-now]``.

Builds or recomputes the month's draft invoices and finalizes them once the month is closed (or when
told to with ``--finalize``). Idempotent: run it again, after a crash or not, and nothing is billed twice.

It meters the month's complete hours first; the hour in progress is metered once it has ended (the
``billing.meter_pending`` task), so a lease of the last minutes is on no invoice yet. ``--through-now``
also meters that hour up to now, for a draft that shows it (docs/tour.md's walk-through); the meter recomputes
the whole hour after it ends (the spend forecast of budget caps counts running leases from then on, never
from the end of that hour). A preview for a draft: refused with ``--finalize``.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from billing import services
from billing.core.metering import HOUR, hour_floor
from billing.core.pricing import format_money
from core.errors import ValidationFailed
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Build, recompute and (once the month is closed) finalize the invoices of one month."

    def add_arguments(self, parser):
        parser.add_argument("--period", required=True, help="the month, YYYY-MM (UTC)")
        parser.add_argument("--tenant", default="", help="only this tenant (slug)")
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--draft", action="store_true", help="never finalize")
        mode.add_argument("--finalize", action="store_true", help="finalize even if the month is not closed")
        parser.add_argument("--through-now", action="store_true",
                            help="also meter the hour in progress up to now (a preview for a draft; the meter "
                                 "meters that hour again once it has ended)")

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
        if options["through_now"] and options["finalize"]:
            raise CommandError("--through-now: the hour in progress is not metered for good yet; use it with "
                               "--draft (or alone), never with --finalize.")
        now = timezone.now()
        if options["through_now"]:
            self._meter_hour_in_progress(period=period, now=now)
        finalize = True if options["finalize"] else (False if options["draft"] else None)
        result = services.invoice_run(period=period, tenant=tenant, finalize=finalize, now=now)
        totals = ", ".join(format_money(v, c) for c, v in sorted(result["total_minor"].items())) or "nothing"
        self.stdout.write(f"{result['period']}: {result['tenants']} tenant(s); {result['finalized']} finalized, "
                          f"{result['drafts']} draft(s), {result['unchanged']} already final; total {totals}")
        if result["open_reason"] and not options["finalize"]:
            self.stdout.write(f"not finalized: {result['open_reason']}")
        for slug, message in sorted(result["errors"].items()):
            self.stderr.write(f"{slug}: {message}")
        if result["errors"]:
            raise CommandError(f"{len(result['errors'])} tenant(s) could not be invoiced")

    def _meter_hour_in_progress(self, *, period, now) -> None:
        """Allocation metering of the current hour up to ``now`` when it lies in ``period`` (the service
        upserts whole hours, so the meter's later run over the ended hour replaces these rows)."""
        hour = hour_floor(now)
        start, end = services.period_bounds(period)
        if start <= hour < end:
            rows = services.usage_meter_window(start=hour, end=hour + HOUR, now=now)
            self.stdout.write(f"metered {hour:%Y-%m-%d %H}:00 up to {now:%H:%M:%S} UTC: {rows} lease-hour(s)")
