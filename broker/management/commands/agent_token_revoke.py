from django.core.management.base import BaseCommand, CommandError

from broker import services
from core.errors import ApplicationError


class Command(BaseCommand):
    help = ("Revoke a node-agent enrollment token by its prefix (the 8 hex characters after gpub_enroll_): "
            "its remaining uses are taken away at once. Audited as node.enrollment_token_revoke.")

    def add_arguments(self, parser):
        parser.add_argument("prefix")
        parser.add_argument("--reason", default="", help="recorded in the audit log")

    def handle(self, *args, prefix, reason, **options):
        try:
            taken = services.enrollment_token_revoke(prefix=prefix, reason=reason or "management command")
        except ApplicationError as error:
            raise CommandError(f"{error.field}: {error.message}") from None
        self.stdout.write(f"enrollment token {prefix}: {taken} use(s) revoked" if taken
                          else f"enrollment token {prefix} had no use left")
