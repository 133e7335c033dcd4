from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = ("Run the interactive proxy (broker/interactive_proxy.py): a lease's workload port, HTTP and WebSocket, "
            "at /leases/<id>/port/ for its tenant's token or portal session. Listens on --listen (default "
            "INTERACTIVE_PROXY_LISTEN); INTERACTIVE_PROXY_URL is the address tenants are told.")

    def add_arguments(self, parser):
        parser.add_argument("--listen", default=settings.INTERACTIVE_PROXY_LISTEN, metavar="HOST:PORT")
        parser.add_argument("--threads", type=int, default=8, help="threads checking credentials (database reads)")

    def handle(self, *args, listen, threads, **options):
        from aiohttp import web

        from broker.interactive_proxy import proxy_app

        host, _, port = listen.rpartition(":")
        if not host or not port.isdigit():
            raise CommandError(f"--listen must be HOST:PORT, got {listen!r}")
        self.stdout.write(f"interactive proxy on http://{listen}/leases/<id>/port/", ending="\n")
        self.stdout.flush()
        web.run_app(proxy_app(threads=threads), host=host.strip("[]"), port=int(port), print=None,
                    handle_signals=True, access_log=None)
