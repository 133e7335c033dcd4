"""``manage.py retention_apply [--dry-run]``: apply the retention policy now (what the daily task does) and
print, per kind of data, its age limit and the rows removed (or, with ``--dry-run``, that would be)."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand

from tenants import retention


class Command(BaseCommand):
    help = "Purge data older than the retention policy allows (RETENTION_*_DAYS); idempotent."

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="count what would be removed; remove nothing")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args, dry_run: bool = False, json: bool = False, **options):
        report = retention.retention_apply(dry_run=dry_run)
        if json:
            self.stdout.write(_dumps(report))
            return
        verb = "would remove" if dry_run else "removed"
        for row in retention.retention_policy():
            if row["action"] == "kept":
                self.stdout.write(f"{row['kind']}: kept {row['days']} days ({row['setting']}), never purged")
            else:
                self.stdout.write(f"{row['kind']}: older than {row['days']} days, {verb} "
                                  f"{report['removed'].get(row['kind'], 0)}")


def _dumps(report: dict) -> str:
    return json.dumps(report, sort_keys=True)
