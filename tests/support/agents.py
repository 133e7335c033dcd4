"""Agents as real processes on loopback (``python -m agent``), and what tests read from their inventories."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from agent.protocol import AgentClient
from core import processes
from core.processes import ROOT, free_port, wait_http

SECRET = "test-secret-for-node-agent-0123456789"
GPUS = "h100-80gb:2:mig,a100-80gb:1:whole,l4:1:shared"


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
        self.process = processes.start(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_http(self.url + "/healthz", self.process)
        return self

    def client(self, **kwargs) -> AgentClient:
        return AgentClient(self.url, self.node_id, SECRET, **kwargs)

    def kill9(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> int:
        if self.process is None:
            return 0
        processes.stop(self.process, timeout=20)
        return self.process.returncode


def gpu_of(inventory: dict, model: str, mode: str) -> dict:
    return next(g for g in inventory["gpus"] if g["model"] == model and g["mode"] == mode)


def snapshot_of(client: AgentClient) -> str:
    inventory = client.inventory()
    return json.dumps({"gpus": inventory["gpus"], "instances": inventory["instances"]}, sort_keys=True)
