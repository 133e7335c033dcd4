from django.core.management.base import BaseCommand, CommandError

from broker import services
from broker.models import Node


class Command(BaseCommand):
    help = ("Let the next token enrollment of an enrolled node id through once (an agent that lost its "
            "secret). Audited as node.reenroll_approve.")

    def add_arguments(self, parser):
        parser.add_argument("node_id")
        parser.add_argument("--reason", default="", help="recorded in the audit log")

    def handle(self, *args, node_id, reason, **options):
        node = Node.objects.filter(node_id=node_id).first()
        if node is None:
            raise CommandError(f"node_id: no node {node_id!r} is enrolled")
        services.node_reenroll_approve(node=node, reason=reason or "management command")
        self.stdout.write(f"{node_id}: its next enrollment with a valid token is accepted (once)")
