import asyncio
import contextlib
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = ("Run the SSH gateway (broker/ssh_gateway.py): `ssh -p PORT lease-<id>@HOST` opens a shell or runs a "
            "command beside a lease's running workload, for a member's registered SSH key. Listens on --listen "
            "(default SSH_GATEWAY_LISTEN); SSH_GATEWAY_ADDRESS is the address tenants are told; the host key is "
            "SSH_GATEWAY_HOST_KEY (made on first start).")

    def add_arguments(self, parser):
        parser.add_argument("--listen", default=settings.SSH_GATEWAY_LISTEN, metavar="HOST:PORT")
        parser.add_argument("--host-key", default=settings.SSH_GATEWAY_HOST_KEY, metavar="PATH")
        parser.add_argument("--threads", type=int, default=8, help="threads checking keys (database reads)")

    def handle(self, *args, listen, host_key, threads, **options):
        from broker.ssh_gateway import serve

        host, _, port = listen.rpartition(":")
        if not host or not port.isdigit():
            raise CommandError(f"--listen must be HOST:PORT, got {listen!r}")

        async def run():
            acceptor = await serve(host=host.strip("[]"), port=int(port), key_path=Path(host_key), threads=threads)
            self.stdout.write(f"ssh gateway on {listen}: ssh -p {port} lease-<id>@{host.strip('[]')}", ending="\n")
            self.stdout.flush()
            try:
                await acceptor.wait_closed()
            finally:
                await acceptor.gateway.close()

        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run())
