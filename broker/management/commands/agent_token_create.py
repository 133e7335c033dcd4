from django.core.management.base import BaseCommand, CommandError

from broker import services
from core.errors import ApplicationError


class Command(BaseCommand):
    help = "Print a node-agent enrollment token (only its hash is stored)."

    def add_arguments(self, parser):
        parser.add_argument("--uses", type=int, default=1, help="how many nodes may enroll with it")
        parser.add_argument("--pool", default="default")
        parser.add_argument("--ttl-seconds", type=int, default=3600, help="valid this long (default one hour)")

    def handle(self, *args, uses, pool, ttl_seconds, **options):
        try:
            token = services.enrollment_token_create(uses=uses, pool=pool, ttl_seconds=ttl_seconds)
        except ApplicationError as error:
            raise CommandError(f"{error.field}: {error.message}") from None
        self.stdout.write(token)
