"""Agents as real processes on loopback, and clients that sign like the broker does."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from agent.protocol import AgentClient

ROOT = Path(__file__).resolve().parents[2]
SECRET = "test-secret-for-node-agent-0123456789"
GPUS = "h100-80gb:2:mig,a100-80gb:1:whole,l4:1:shared"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, process: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode}: {process.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer in {timeout} s")


class AgentProcess:
    """``python -m agent`` with a sim backend; ``kill9`` / ``stop`` / ``start`` keep the state directory."""

    def __init__(self, state_dir: Path, *, node_id: str = "node-1", gpus: str = GPUS, extra: tuple = ()):
        self.state_dir = state_dir
        self.node_id = node_id
        self.gpus = gpus
        self.extra = extra
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> AgentProcess:
        command = [sys.executable, "-m", "agent", "--node-id", self.node_id, "--listen", f"127.0.0.1:{self.port}",
                   "--state-dir", str(self.state_dir), "--gpus", self.gpus, "--secret", SECRET,
                   "--log-level", "WARNING", *self.extra]
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_http(self.url + "/healthz", self.process)
        return self

    def client(self, **kwargs) -> AgentClient:
        return AgentClient(self.url, self.node_id, SECRET, **kwargs)

    def kill9(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> int:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode if self.process else 0


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    """One agent process per test module (starting one takes about a second)."""
    process = AgentProcess(tmp_path_factory.mktemp("agent")).start()
    yield process
    process.stop()


@pytest.fixture
def client(agent):
    """A client of the module's agent, which starts each test with no instances."""
    client = agent.client(retries=0)
    for instance in client.inventory()["instances"]:
        client.destroy(instance["allocation_id"])
    return client


def gpu_of(inventory: dict, model: str, mode: str) -> dict:
    return next(g for g in inventory["gpus"] if g["model"] == model and g["mode"] == mode)


def snapshot_of(client: AgentClient) -> str:
    inventory = client.inventory()
    return json.dumps({"gpus": inventory["gpus"], "instances": inventory["instances"]}, sort_keys=True)
