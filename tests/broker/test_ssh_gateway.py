"""SSH to a lease through the broker (issue 29, docs/leasing.md "SSH"), end to end: the gateway
(``manage.py ssh_gateway``, its own process, asyncssh) checks the member's registered key, then relays the session to
the lease's node agent (``agent.fleet``, real processes) over its signed shell WebSocket; the shell runs as the
workload's own tenant user, in its working directory, with its devices.

A registered key of a member opens a shell, runs a command (its exit status is ssh's, stdin flows in), and gets a
terminal when it asks; an unregistered key, another tenant's member's key and a viewer's key are each refused
(``Permission denied``) and say nothing about the lease; a released lease's member is told why; closing the session
ends what it started; the real OpenSSH client works the same; each session is audited."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import asyncssh
import pytest

from core import processes
from tenants.access import Actor
from tenants.choices import Role
from tenants.models import AuditEvent, SshKey
from tenants.ssh_keys import ssh_key_add
from tests.factories import make_quota
from tests.support.api import Api
from tests.support.processes import free_port, test_database_url

# the workload: says which user it runs as and where, then waits
WORKLOAD = "import os, time; print('uid', os.getuid(), 'cwd', os.getcwd(), flush=True); time.sleep(600)"


def _gateway(settings, tmp_path: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = {**os.environ, "DATABASE_URL": test_database_url(), "SECRET_KEY": settings.SECRET_KEY,
           "LOG_LEVEL": "WARNING", "DATABASE_CONN_MAX_AGE": "0"}
    process = processes.start([sys.executable, "manage.py", "ssh_gateway", "--listen", f"127.0.0.1:{port}",
                               "--host-key", str(tmp_path / "gateway" / "host_key")], env=env,
                              stdout=subprocess.DEVNULL)
    processes.wait_port("127.0.0.1", port, process, timeout=60)
    return process, port


def _ssh(port: int, lease_id: int, key, command: str | None, **options):
    """Run ``command`` over SSH with ``key``: (exit status, stdout, stderr), or the exception that refused it."""
    async def run():
        try:
            async with asyncssh.connect("127.0.0.1", port, username=f"lease-{lease_id}", client_keys=[key],
                                        known_hosts=None, agent_path=None, preferred_auth="publickey") as conn:
                result = await asyncio.wait_for(conn.run(command, **options), 60)
                return result.exit_status, result.stdout, result.stderr
        except (asyncssh.PermissionDenied, asyncssh.DisconnectError) as error:
            return error

    return asyncio.run(run())


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_ssh_to_a_lease_with_a_members_key_and_every_refusal(worker, workload_fleet, world, shared, settings,
                                                            live_server, tmp_path):
    make_quota(world.project, "A100-80GB", deserved=1000, limit=2000, tenant_deserved=1000, tenant_limit=4000)
    gateway, port = _gateway(settings, tmp_path)
    try:
        member = Api(live_server.url, world.tokens["member"])
        status, lease = member.call("POST", "/leases", {
            "project": "vision", "gpu": {"kind": "whole", "model": "A100-80GB"}, "duration_seconds": 600,
            "workload": {"command": [sys.executable, "-c", WORKLOAD]}})
        assert status == 201, lease

        def running():
            _, log = member.call("GET", f"/leases/{lease['id']}/logs")
            return log.get("data", "") if "uid" in log.get("data", "") else None

        started = processes.wait_until(running, timeout=90, step=0.3, what="the workload running")
        words = started.split()
        workload_uid, workload_cwd = words[words.index("uid") + 1], words[words.index("cwd") + 1]

        # the member registers a key through the API; the answer never holds more than the public half
        key = asyncssh.generate_private_key("ssh-ed25519")
        public = key.export_public_key().decode().strip() + " max@laptop"
        status, added = member.call("POST", "/ssh-keys", {"name": "laptop", "public_key": public})
        assert status == 201, added
        assert added["fingerprint"] == key.get_fingerprint("sha256") and added["algorithm"] == "ssh-ed25519"
        assert "PRIVATE" not in str(added)

        # a command: as the workload's user, where it runs, with its GPU; its exit status is ssh's
        code, out, err = _ssh(port, lease["id"], key, 'id -u; pwd; echo "gpu=$CUDA_VISIBLE_DEVICES"; exit 3')
        assert code == 3, (out, err)
        uid, cwd, gpu = out.split()
        assert uid == workload_uid and cwd == workload_cwd and gpu.startswith("gpu=") and gpu != "gpu="
        if os.geteuid() == 0:  # the agent isolates workloads (isolation "auto" as root): never root over ssh
            assert uid != "0"
        # stdin flows in; stderr comes back apart from stdout without a terminal
        assert _ssh(port, lease["id"], key, "cat; echo oops >&2", input="hello\n") == (0, "hello\n", "oops\n")
        # a terminal when asked for one, of the size asked for
        code, out, _ = _ssh(port, lease["id"], key, "tty; stty size", term_type="xterm", term_size=(100, 30))
        assert code == 0 and out.splitlines()[0].startswith("/dev/pts/") and out.splitlines()[1] == "30 100"

        # closing the session ends what it started
        marker = "301.25"

        async def leave_running():
            async with asyncssh.connect("127.0.0.1", port, username=f"lease-{lease['id']}", client_keys=[key],
                                        known_hosts=None, agent_path=None) as conn:
                process = await conn.create_process(f"sleep {marker}")
                await asyncio.sleep(1.5)
                assert _processes_with(f"sleep\x00{marker}"), "the command did not start"
                process.close()

        asyncio.run(leave_running())
        processes.wait_until(lambda: not _processes_with(f"sleep\x00{marker}"), timeout=15,
                             what="the session's command ended")

        # refused alike, saying nothing: a key nobody registered, another tenant's member, a viewer, a bad name
        stranger = asyncssh.generate_private_key("ssh-ed25519")
        assert isinstance(_ssh(port, lease["id"], stranger, "true"), asyncssh.PermissionDenied)
        outsider_key = asyncssh.generate_private_key("ssh-ed25519")
        status, _ = Api(live_server.url, world.tokens["outsider"]).call(
            "POST", "/ssh-keys", {"name": "bob", "public_key": outsider_key.export_public_key().decode()})
        assert status == 201
        assert isinstance(_ssh(port, lease["id"], outsider_key, "true"), asyncssh.PermissionDenied)
        viewer_key = asyncssh.generate_private_key("ssh-ed25519")
        ssh_key_add(actor=Actor(user=world.viewer, tenant=world.acme, role=Role.VIEWER), name="vic",
                    public_key=viewer_key.export_public_key().decode())
        assert isinstance(_ssh(port, lease["id"], viewer_key, "true"), asyncssh.PermissionDenied)
        assert isinstance(_ssh(port, 999999, key, "true"), asyncssh.PermissionDenied)

        # the real OpenSSH client, as docs/leasing.md shows it
        ssh = shutil.which("ssh")
        if ssh is None:
            assert os.environ.get("CI") != "true", "CI needs the OpenSSH client (Debian's openssh-client)"
            pytest.skip("no ssh client here")
        key_file = tmp_path / "id_ed25519"
        key.write_private_key(str(key_file))
        key_file.chmod(0o600)
        answer = subprocess.run(
            [ssh, "-i", str(key_file), "-p", str(port), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
             f"lease-{lease['id']}@127.0.0.1", "echo from-openssh; exit 7"],
            capture_output=True, text=True, timeout=60, env={**os.environ, "SSH_AUTH_SOCK": ""})
        assert answer.returncode == 7 and answer.stdout == "from-openssh\n", answer.stderr

        # each session audited with the key; the key's last use shown to its owner
        sessions = AuditEvent.objects.filter(tenant=world.acme, action="lease.ssh", target=str(lease["id"]))
        assert sessions.count() >= 5
        assert sessions.first().data["fingerprint"] == key.get_fingerprint("sha256")
        assert SshKey.objects.get(fingerprint=key.get_fingerprint("sha256")).last_used_at is not None

        # a released lease: its member is let in and told why, status 1
        assert member.call("DELETE", f"/leases/{lease['id']}")[0] in (200, 202)
        processes.wait_until(lambda: member.call("GET", f"/leases/{lease['id']}")[1]["state"] == "released",
                             timeout=60, what="the lease released")
        time.sleep(0.5)
        code, _out, err = _ssh(port, lease["id"], key, "true")
        assert code == 1 and "released" in err, err
    finally:
        processes.stop(gateway)
