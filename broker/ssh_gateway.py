"""The SSH gateway: a shell, a command, or a file copy through ``ssh``'s standard streams, beside a lease's running
workload, with the tenant member's own SSH key (docs/leasing.md, "SSH"). ``manage.py ssh_gateway`` runs it (an
asyncssh server; ``infra/run.py`` starts it beside the web server)::

    ssh -p 2222 lease-42@broker.example.com            # a login shell on the lease's node
    ssh -p 2222 lease-42@broker.example.com nvidia-smi # one command; its exit status is ssh's

The user name names the lease (``lease-<id>``). Only public-key authentication is offered: the key must be one a
user registered (``tenants.ssh_keys``), and that user must be able to use the lease as the portal would let them
(``broker.selectors.lease_shell_target``: a member of the lease's tenant, within their project limit; a viewer is
refused). Any other key, an unknown lease or another tenant's lease are the same refusal (``Permission denied
(publickey)``): the gateway says nothing about what exists. A member whose lease has no running workload is let in
and told why, then the session ends with status 1.

The session is relayed to the node's agent over a WebSocket the broker signs with the node's secret
(``agent.server.workload_shell``): the process runs as the workload's own tenant user, in its cgroup and file-system
view, with its devices and environment, so SSH gives no more than the workload already has; it ends (with its process
group) when the SSH session does. Each session is audited (``lease.ssh``) with the key's fingerprint and the command.
The gateway holds no tenant secret: its host key (``SSH_GATEWAY_HOST_KEY``, made on first start) and the nodes'
secrets it reads from the database per session.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import re
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import aiohttp
import asyncssh
from yarl import URL

from agent.protocol import sign

logger = logging.getLogger("broker.ssh_gateway")
USERNAME = re.compile(r"^lease-(\d{1,18})$")
STDIN, STDOUT, STDERR = 0, 1, 2  # the agent's shell frames (agent.server.workload_shell)
MAX_COMMAND = 8192


def authorize(*, username: str, fingerprint: str) -> dict | None:
    """Whether this key may open ``username``'s lease: None (refused: unknown key, lease or tenant, or a lease the
    key's user cannot use), else ``{"target": …}`` or ``{"error": "why no shell opens now"}`` with the ids to audit.
    Synchronous (Django's ORM): the server calls it in a worker thread."""
    from django.db import close_old_connections

    from broker.models import Lease
    from broker.selectors import lease_shell_target
    from core.errors import ApplicationError, NotFound, PermissionDenied
    from tenants.access import Actor, project_scope
    from tenants.choices import Role
    from tenants.models import Membership
    from tenants.ssh_keys import ssh_key_for_fingerprint

    close_old_connections()
    try:
        match = USERNAME.match(username or "")
        key = ssh_key_for_fingerprint(fingerprint) if match else None
        if key is None:
            return None
        lease_id = int(match.group(1))
        tenant_id = Lease.objects.filter(pk=lease_id).values_list("tenant_id", flat=True).first()
        membership = (Membership.objects.select_related("tenant").filter(user=key.user, tenant_id=tenant_id).first()
                      if tenant_id is not None else None)
        if membership is None:
            return None
        actor = Actor(user=key.user, tenant=membership.tenant, role=Role(membership.role),
                      project_ids=project_scope(token_project_ids=None, member_project_ids=membership.project_ids))
        found = {"key_id": key.pk, "user_id": key.user.pk, "tenant_id": membership.tenant_id, "lease_id": lease_id}
        try:
            return {**found, "target": lease_shell_target(actor=actor, lease_id=lease_id)}
        except (NotFound, PermissionDenied):
            return None
        except ApplicationError as error:
            return {**found, "error": error.message}
    finally:
        close_old_connections()


def session_record(*, found: dict, command: str, remote: str) -> None:
    """The audit row of one session (``lease.ssh``) and the key's last use."""
    from django.contrib.auth import get_user_model
    from django.db import close_old_connections

    from tenants.audit import audit_record
    from tenants.models import SshKey, Tenant
    from tenants.ssh_keys import ssh_key_mark_used

    close_old_connections()
    try:
        key = SshKey.objects.filter(pk=found["key_id"]).first()
        audit_record(tenant=Tenant.objects.get(pk=found["tenant_id"]),
                     by=get_user_model().objects.get(pk=found["user_id"]), action="lease.ssh",
                     target=str(found["lease_id"]),
                     data={"fingerprint": key.fingerprint if key else None, "command": command[:500],
                           "from": remote, "opened": "target" in found})
        if key is not None:
            ssh_key_mark_used(key=key)
    finally:
        close_old_connections()


class GatewayServer(asyncssh.SSHServer):
    """One client connection: public-key authentication only, decided by ``authorize``."""

    def __init__(self, gateway: Gateway):
        self.gateway = gateway
        self.found: dict | None = None
        self.remote = ""

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        peer = conn.get_extra_info("peername") or ("", 0)
        self.remote = str(peer[0])

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    async def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        # asyncssh calls this for every key offered, queried or signed, and checks the signature right after the
        # call for that key: what a session uses is the answer for the key that signed. Forget the last key's
        # answer first, so a refused key can never leave an earlier (unsigned) key's answer behind.
        self.found = None
        fingerprint = key.get_fingerprint("sha256")
        found = await asyncio.get_running_loop().run_in_executor(
            self.gateway.pool, lambda: authorize(username=username, fingerprint=fingerprint))
        if found is None:
            logger.info("ssh refused: %s for %s from %s", fingerprint, username, self.remote)
            return False
        self.found = found
        return True


class Gateway:
    def __init__(self, *, threads: int = 8):
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ssh-auth")
        self.http: aiohttp.ClientSession | None = None

    async def session(self, process: asyncssh.SSHServerProcess) -> None:
        owner: GatewayServer = process.get_extra_info("connection").get_owner()
        found, command = owner.found or {}, process.command or ""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.pool, lambda: session_record(found=found, command=command,
                                                                     remote=owner.remote))
        if "target" not in found:
            process.stderr.write((found.get("error") or "No shell for this lease.").encode() + b"\r\n")
            process.exit(1)
            return
        if len(command) > MAX_COMMAND:
            process.stderr.write(f"A command is at most {MAX_COMMAND} characters.\r\n".encode())
            process.exit(2)
            return
        code = await self.relay(process, found["target"], command)
        process.exit(code)

    async def relay(self, process: asyncssh.SSHServerProcess, target: dict, command: str) -> int:
        """Pipe the SSH session to the agent's shell WebSocket and back; the remote exit status."""
        agent = target["agent_url"].rstrip("/")
        path = f"/v1/workloads/{target['agent_workload_id']}/shell"
        params = {"command": command}
        terminal = process.get_terminal_type()
        if terminal:
            cols, rows, *_ = process.get_terminal_size()
            params.update({"pty": "1", "cols": str(cols or 80), "rows": str(rows or 24), "term": terminal})
        query = urlencode(params)
        headers = sign(target["secret"], target["node_id"], "GET", urlsplit(agent).path + path, b"", query=query)
        url = "ws" + agent[len("http"):] + path + "?" + query
        if self.http is None:
            self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, connect=5, sock_read=None))
        try:
            socket = await self.http.ws_connect(URL(url, encoded=True), headers=headers, autoping=True,
                                                max_msg_size=8 * 1024 * 1024)  # the query exactly as signed
        except aiohttp.WSServerHandshakeError as error:
            process.stderr.write(f"The lease's node refused the shell ({error.status}).\r\n".encode())
            return 1
        except (aiohttp.ClientError, OSError) as error:
            logger.warning("lease %s: node %s does not answer: %s", target["lease_id"], target["node_id"], error)
            process.stderr.write(f"The lease's node {target['node_id']} does not answer.\r\n".encode())
            return 1
        code = 255  # the node went away without an exit status

        async def upstream() -> None:
            while True:
                try:
                    data = await process.stdin.read(65536)
                except asyncssh.TerminalSizeChanged as change:
                    await socket.send_str(json.dumps({"type": "resize", "cols": change.width,
                                                      "rows": change.height}))
                    continue
                except (asyncssh.BreakReceived, asyncssh.SignalReceived):
                    continue
                if not data:
                    await socket.send_str(json.dumps({"type": "eof"}))
                    return
                await socket.send_bytes(bytes([STDIN]) + data)

        async def downstream() -> None:
            nonlocal code
            async for message in socket:
                if message.type == aiohttp.WSMsgType.BINARY and message.data:
                    channel, data = message.data[0], message.data[1:]
                    (process.stderr if channel == STDERR else process.stdout).write(data)
                elif message.type == aiohttp.WSMsgType.TEXT:
                    try:
                        control = json.loads(message.data)
                    except ValueError:
                        continue
                    if isinstance(control, dict) and control.get("type") == "exit":
                        code = int(control.get("code") or 0)
                        return
                else:
                    return

        async with socket:  # closing it (the client went away, or the node's exit came) ends the node's process
            reading = asyncio.ensure_future(upstream())
            relaying = asyncio.ensure_future(downstream())
            gone = asyncio.ensure_future(process.channel.wait_closed())  # the client closed or lost the session
            try:
                await asyncio.wait([relaying, gone], return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (reading, relaying, gone):
                    task.cancel()
                await asyncio.gather(reading, relaying, gone, return_exceptions=True)
        return code

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()
        self.pool.shutdown(wait=False)


def host_key(path: Path) -> asyncssh.SSHKey:
    """The gateway's host key, made (ed25519, 0600) on first start so clients can pin it."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        key = asyncssh.generate_private_key("ssh-ed25519")
        key.write_private_key(str(path))
        path.chmod(0o600)
    return asyncssh.read_private_key(str(path))


async def serve(*, host: str, port: int, key_path: Path, threads: int = 8) -> asyncssh.SSHAcceptor:
    """Start the gateway (Django must be set up); returns the acceptor (``close()`` stops it)."""
    gateway = Gateway(threads=threads)
    acceptor = await asyncssh.create_server(
        lambda: GatewayServer(gateway), host, port, server_host_keys=[host_key(key_path)],
        process_factory=gateway.session, encoding=None, allow_scp=False, sftp_factory=None,
        agent_forwarding=False, x11_forwarding=False, allow_pty=True, login_timeout=30, keepalive_interval=30)
    acceptor.gateway = gateway
    return acceptor
