"""``python manage.py price_book_create FILE``: a price book from a JSON file, through ``billing.services``.

The file holds the fields of ``POST /api/v1/price-books`` (docs/billing.md): ``name``, ``currency``,
``effective_from`` (ISO 8601), ``rates`` (a list of ``{"tier", "kind", "mig_profile", "per_hour"}``), and optionally
``tenant`` (a slug: a negotiated book), ``over_quota_multiplier``, ``interactive_multiplier``,
``profiling_multiplier`` (the profiling rate), ``energy_per_kwh``.
Every bad value is refused naming its field, nothing is written; the book is audited like one made in the portal.
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_datetime

from billing import services
from core.errors import ApplicationError
from tenants.models import Tenant

FIELDS = {"name", "currency", "effective_from", "rates", "tenant", "over_quota_multiplier", "interactive_multiplier",
          "profiling_multiplier", "energy_per_kwh"}


class Command(BaseCommand):
    help = "Create a price book (general, or a tenant's with \"tenant\": slug) from a JSON file; audited."

    def add_arguments(self, parser):
        parser.add_argument("file", help="a JSON file with the fields of POST /api/v1/price-books ('-' for stdin)")

    def handle(self, *args, file, **options):
        try:
            text = self.stdin.read() if file == "-" else open(file, encoding="utf-8").read()  # noqa: SIM115
            body = json.loads(text)
        except (OSError, ValueError) as error:
            raise CommandError(f"file: {error}") from None
        if not isinstance(body, dict):
            raise CommandError("file: the JSON must be an object")
        unknown = sorted(set(body) - FIELDS)
        if unknown:
            raise CommandError(f"{unknown[0]}: unknown field; known: {', '.join(sorted(FIELDS))}")
        tenant = None
        if body.get("tenant"):
            tenant = Tenant.objects.filter(slug=body.pop("tenant")).first()
            if tenant is None:
                raise CommandError("tenant: no such tenant")
        body.pop("tenant", None)
        start = parse_datetime(str(body.get("effective_from", "")))
        if start is None or start.tzinfo is None:
            raise CommandError("effective_from: an ISO 8601 date-time with its UTC offset, e.g. 2026-12-01T00:00:00Z")
        body["effective_from"] = start
        for name in ("name", "currency", "rates"):
            if name not in body:
                raise CommandError(f"{name}: required")
        try:
            book = services.price_book_create(tenant=tenant, by_user=None, **body)
        except ApplicationError as error:
            raise CommandError(f"{error.field}: {error.message}") from None
        scope = f"tenant {tenant.slug}" if tenant else "general"
        self.stdout.write(f"price book {book.pk} '{book.name}' ({scope}, {book.currency}) from "
                          f"{book.effective_from.isoformat()}: {book.rates.count()} rate(s)")
