"""The agent against the real broker (issue 13, item 1): a restarted agent reuses its stored secret; one
that lost its state is refused (409), says in its log that staff approval is needed, keeps trying, and
enrolls once staff approved; the token never appears on its command line."""

import os
import subprocess
import sys

import pytest

from broker import services
from broker.models import Node
from tests.support.processes import ROOT, free_port, wait_http, wait_until


def _agent(state_dir, log, url: str, token: str = "") -> subprocess.Popen:
    port = free_port()
    env = {**os.environ, "GPUB_ENROLLMENT_TOKEN": token}
    command = [sys.executable, "-m", "agent", "--node-id", "gpu-7", "--listen", f"127.0.0.1:{port}",
               "--state-dir", str(state_dir), "--gpus", "h100-80gb:1:whole", "--broker-url", url]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)
    wait_http(f"http://127.0.0.1:{port}/healthz", process)
    assert token == "" or token not in " ".join(process.args)
    return process


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    process.wait(20)


@pytest.mark.slow
def test_agent_restart_reuses_its_secret_and_lost_state_waits_for_staff(live_server, transactional_db, tmp_path,
                                                                          settings):
    settings.AGENT_HEARTBEAT_SECONDS = 1
    log = open(tmp_path / "agent.log", "w+")  # noqa: SIM115
    agent = _agent(tmp_path / "a", log, live_server.url, services.enrollment_token_create())
    try:
        node = wait_until(lambda: Node.objects.filter(node_id="gpu-7").first())
        secret = node.secret
    finally:
        _stop(agent)
    # restarted with its state (and no token at all): heartbeats with the stored secret, no enrollment
    agent = _agent(tmp_path / "a", log, live_server.url)
    try:
        beat = Node.objects.get(node_id="gpu-7").last_heartbeat_at
        wait_until(lambda: Node.objects.get(node_id="gpu-7").last_heartbeat_at > beat)
        assert Node.objects.get(node_id="gpu-7").secret == secret
    finally:
        _stop(agent)
    # state lost, a new token: refused until staff approve, then enrolled with a new secret
    token = services.enrollment_token_create()
    agent = _agent(tmp_path / "b", log, live_server.url, token)
    try:
        wait_until(lambda: "staff approval is needed" in (tmp_path / "agent.log").read_text(), timeout=30)
        assert Node.objects.get(node_id="gpu-7").secret == secret
        services.node_reenroll_approve(node=Node.objects.get(node_id="gpu-7"), reason="test")
        wait_until(lambda: Node.objects.get(node_id="gpu-7").secret != secret, timeout=60)
        node = Node.objects.get(node_id="gpu-7")
        wait_until(lambda: (tmp_path / "b" / "secret").exists())
        assert (tmp_path / "b" / "secret").read_text() == node.secret
    finally:
        _stop(agent)
        log.close()
