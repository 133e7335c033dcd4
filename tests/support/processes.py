"""Real processes the flow tests run against: Celery workers on the test broker reading the test database, and
fleets of simulated agents (``agent.fleet``) enrolled with the live server over HTTP. Started and stopped with
``core.processes`` (own process group, stopped by PID)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

from core import processes
from core.processes import ROOT, free_port, wait_http, wait_until

__all__ = ["ROOT", "free_port", "start_fleet", "start_fleet_node", "start_workers", "stop_workers",
           "test_database_url", "wait_http", "wait_until", "worker_command", "worker_env"]

# What a test's workers run with: leases as short as a test can wait for (settings of the same names are set in
# the test process by the fixtures that use them)
WORKER_ENV = {"LEASE_MIN_DURATION_SECONDS": "1", "LEASE_PREEMPTION_NOTICE_SECONDS": "2",
              "LEASE_MIN_RUNTIME_SECONDS": "0", "AGENT_TIMEOUT_SECONDS": "2"}


def test_database_url() -> str:
    """``DATABASE_URL`` pointing at pytest-django's test database (``test_<name>``, ``_gw0`` under xdist)."""
    from django.db import connection

    parts = urllib.parse.urlsplit(os.environ["DATABASE_URL"])
    return urllib.parse.urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"]))


test_database_url.__test__ = False  # a helper, not a test


def venv_path() -> str:
    """``PATH`` with the project's virtual environment first, as ``make run`` gives its children: a workload's
    ``python`` (docs/leasing.md's example) is the project's Python, not whatever the machine has, if any."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def worker_env(queue: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": test_database_url(), "CELERY_TASK_DEFAULT_QUEUE": queue, **WORKER_ENV,
            **extra}


def worker_command(queue: str, hostname: str, *, concurrency: int = 2) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool", "prefork", "--concurrency",
            str(concurrency), "--queues", queue, "--hostname", hostname, "--loglevel", "WARNING", "--without-gossip",
            "--without-mingle", "--without-heartbeat"]


def start_workers(count: int = 1, **extra: str) -> list[subprocess.Popen]:
    """``count`` real Celery worker processes (prefork, 2 children each) on a queue of their own,
    reading and writing the test database; ``extra``: more environment (settings) for them."""
    from config.celery import app

    queue = f"lease-test-{os.getpid()}-{time.monotonic_ns()}"
    app.conf.task_default_queue = queue
    env = worker_env(queue, **extra)
    return [processes.start(worker_command(queue, f"w{number}-{queue}@%h"), cwd=ROOT, env=env)
            for number in range(count)]


def stop_workers(workers: list[subprocess.Popen]) -> None:
    """Warm shutdown (SIGTERM: running tasks finish), SIGKILL after 20 s; the test process sends to the default
    queue again."""
    from config.celery import app

    app.conf.task_default_queue = "celery"
    processes.stop_all(workers, timeout=20)


def _fleet(broker_url: str, state_dir, nodes: int, shapes, extra) -> tuple[subprocess.Popen, int]:
    from broker import services
    from broker.models import Node

    token = services.enrollment_token_create(uses=nodes)
    port = free_port()
    command = [sys.executable, "-m", "agent.fleet", "--nodes", str(nodes), "--listen", f"127.0.0.1:{port}",
               "--state-dir", str(state_dir), "--broker-url", broker_url, "--log-level", "WARNING"]
    for shape in shapes:
        command += ["--shape", shape]
    command += list(extra)
    process = processes.start(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env={**os.environ, "GPUB_ENROLLMENT_TOKEN": token, "PATH": venv_path()})
    wait_http(f"http://127.0.0.1:{port}/healthz", process)
    wait_until(lambda: Node.objects.count() == nodes, timeout=60)
    return process, port


def start_fleet(broker_url: str, state_dir, nodes: int, *shapes: str, extra: tuple = ()) -> subprocess.Popen:
    """Simulated nodes enrolled with the broker at ``broker_url`` (a token good for ``nodes`` uses);
    ``extra``: more ``agent.fleet`` flags (``--workload-root``)."""
    return _fleet(broker_url, state_dir, nodes, shapes, extra)[0]


def start_fleet_node(broker_url: str, state_dir, shapes: tuple[str, ...], *extra: str) -> tuple[subprocess.Popen, int]:
    """One simulated node of ``shapes`` (``agent.fleet`` flags in ``extra``) → (the fleet process, its port)."""
    return _fleet(broker_url, state_dir, 1, shapes, extra)


def stop_fleet(process: subprocess.Popen) -> None:
    processes.stop(process, timeout=30)
