"""The capacity loop against real parts: the live server, a real Celery worker, simulated agents enrolled
over HTTP (with a cold-create latency, so a warm bind and a cold start differ as on real GPUs), a real
Prometheus scraping them. The planner runs in the test process (``capacity.services.plan_run``), as the
periodic task would."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from broker import services
from broker.models import Node
from tests.agent.conftest import ROOT, free_port, wait_http
from tests.billing.conftest import prometheus_server  # noqa: F401 (a fixture these tests use)
from tests.broker.conftest import Api, start_workers, stop_workers, wait_until
from tests.factories import make_world


def start_fleet(broker_url: str, state_dir, shapes: tuple[str, ...], *extra: str) -> tuple[subprocess.Popen, int]:
    token = services.enrollment_token_create(uses=1)
    port = free_port()
    command = [sys.executable, "-m", "agent.fleet", "--nodes", "1", "--listen", f"127.0.0.1:{port}",
               "--state-dir", str(state_dir), "--broker-url", broker_url, "--log-level", "WARNING", *extra]
    for shape in shapes:
        command += ["--shape", shape]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env={**os.environ, "GPUB_ENROLLMENT_TOKEN": token})
    wait_http(f"http://127.0.0.1:{port}/healthz", process)
    wait_until(lambda: Node.objects.count() == 1, timeout=60)
    return process, port


@pytest.fixture(autouse=True)
def _no_cycle_pending():
    services.cycle_flag_clear()


@pytest.fixture
def world(transactional_db):
    return make_world()


@pytest.fixture
def loop(live_server, tmp_path, world, settings):
    """``loop(shapes, *agent flags)`` → (fleet process, its state dir); a worker runs throughout."""
    settings.LEASE_MIN_DURATION_SECONDS = 1
    settings.LEASE_MIN_RUNTIME_SECONDS = 0
    workers = start_workers(1)
    fleets: list[subprocess.Popen] = []

    def make(shapes: tuple[str, ...], *extra: str):
        state = tmp_path / f"fleet-{len(fleets)}"
        process, _ = start_fleet(live_server.url, state, shapes, *extra)
        fleets.append(process)
        return process, state

    yield make
    stop_workers(workers)
    for process in fleets:
        process.terminate()
        process.wait(30)


@pytest.fixture
def api(live_server, world):
    return lambda who="member": Api(live_server.url, world.tokens[who])
