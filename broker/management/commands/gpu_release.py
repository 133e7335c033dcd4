from django.core.management.base import BaseCommand, CommandError

from broker import services
from broker.models import Gpu
from core.errors import ApplicationError


class Command(BaseCommand):
    help = ("Release a GPU from the node that enrolled it, so that another node may claim it (hardware "
            "moved). Refused while a lease holds it. Audited as gpu.release.")

    def add_arguments(self, parser):
        parser.add_argument("uuid")
        parser.add_argument("--reason", default="", help="recorded in the audit log")

    def handle(self, *args, uuid, reason, **options):
        gpu = Gpu.objects.filter(uuid=uuid).first()
        if gpu is None:
            raise CommandError(f"uuid: no GPU {uuid!r} is known")
        try:
            services.gpu_release(gpu=gpu, reason=reason or "management command")
        except ApplicationError as error:
            raise CommandError(f"{error.field}: {error.message}") from None
        self.stdout.write(f"{uuid}: released from its node; the next node that reports it may claim it")
