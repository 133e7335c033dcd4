"""The leasing flow against real parts: the Django live server (the REST API), a Celery worker process
on the test broker reading the test database, and a fleet of simulated agents enrolled over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from django.db import connection

from broker import services
from broker.models import Node
from tests.agent.conftest import ROOT, free_port, wait_http
from tests.factories import make_world


def wait_until(predicate, timeout: float = 30.0, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"not true within {timeout} s")


def _test_database_url() -> str:
    parts = urllib.parse.urlsplit(os.environ["DATABASE_URL"])
    return urllib.parse.urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"]))


def start_workers(count: int = 1):
    """``count`` real Celery worker processes (prefork, 2 children each) on a queue of their own,
    reading and writing the test database."""
    from config.celery import app

    queue = f"lease-test-{os.getpid()}-{time.monotonic_ns()}"
    app.conf.task_default_queue = queue
    env = {**os.environ, "DATABASE_URL": _test_database_url(), "CELERY_TASK_DEFAULT_QUEUE": queue,
           "LEASE_MIN_DURATION_SECONDS": "1", "LEASE_PREEMPTION_NOTICE_SECONDS": "2",
           "LEASE_MIN_RUNTIME_SECONDS": "0", "AGENT_TIMEOUT_SECONDS": "2"}
    return [subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool", "prefork", "--concurrency", "2",
         "--queues", queue, "--hostname", f"w{number}-{queue}@%h", "--loglevel", "WARNING", "--without-gossip",
         "--without-mingle", "--without-heartbeat"], cwd=ROOT, env=env) for number in range(count)]


def stop_workers(processes) -> None:
    from config.celery import app

    app.conf.task_default_queue = "celery"
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(autouse=True)
def _no_cycle_pending():
    """Each test starts with no schedule cycle pending for its database and queue (the trigger flag lives
    in the broker's Redis, outside the test database)."""
    services.cycle_flag_clear()


@pytest.fixture
def worker(transactional_db, settings):
    settings.LEASE_MIN_DURATION_SECONDS = 1
    settings.LEASE_PREEMPTION_NOTICE_SECONDS = 2
    settings.LEASE_MIN_RUNTIME_SECONDS = 0
    processes = start_workers(1)
    yield processes[0]
    stop_workers(processes)


def start_fleet(broker_url: str, state_dir, nodes: int, *shapes: str, extra: tuple = ()) -> subprocess.Popen:
    """Simulated nodes enrolled with the broker at ``broker_url`` (a token good for ``nodes`` uses);
    ``extra``: more ``agent.fleet`` flags (``--workload-root``)."""
    token = services.enrollment_token_create(uses=nodes)
    port = free_port()
    command = [sys.executable, "-m", "agent.fleet", "--nodes", str(nodes), "--listen", f"127.0.0.1:{port}",
               "--state-dir", str(state_dir), "--broker-url", broker_url, "--log-level", "WARNING"]
    for shape in shapes:
        command += ["--shape", shape]
    command += list(extra)
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env={**os.environ, "GPUB_ENROLLMENT_TOKEN": token})
    wait_http(f"http://127.0.0.1:{port}/healthz", process)
    wait_until(lambda: Node.objects.count() == nodes, timeout=60)
    return process


@pytest.fixture
def fleet(live_server, tmp_path, transactional_db):
    """Two simulated nodes (one of 2 x H100 in MIG mode, one of 2 x A100 whole) enrolled with the broker."""
    process = start_fleet(live_server.url, tmp_path / "fleet", 2, "h100-80gb:2:mig", "a100-80gb:2:whole")
    yield process
    process.terminate()
    process.wait(30)


@pytest.fixture
def shared(tmp_path, settings):
    """The workload root the agents and the broker agree on (per-tenant roots are derived under it)."""
    root = tmp_path / "shared"
    root.mkdir()
    settings.WORKLOAD_ALLOWED_ROOTS = [str(root)]
    return root


@pytest.fixture
def workload_fleet(live_server, tmp_path, transactional_db, shared):
    """Two nodes of one A100 each; their agents run workloads under the shared root."""
    process = start_fleet(live_server.url, tmp_path / "fleet", 2, "a100-80gb:1:whole",
                          extra=("--workload-root", str(shared), "--restart-backoff", "0.2"))
    yield process
    process.terminate()
    process.wait(30)


class Api:
    """The REST API over real HTTP, as a tenant's script would call it."""

    def __init__(self, base: str, token: str):
        self.base = base.rstrip("/") + "/api/v1"
        self.token = token

    def call(self, method: str, path: str, body: dict | None = None, headers: dict | None = None):
        request = urllib.request.Request(
            self.base + path, method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")


@pytest.fixture
def world(transactional_db):
    return make_world()


@pytest.fixture
def api(live_server, world):
    return lambda who="member": Api(live_server.url, world.tokens[who])
