"""The leasing flow against real parts: the Django live server (the REST API), a Celery worker process
on the test broker reading the test database, and a fleet of simulated agents enrolled over HTTP
(tests/support/processes.py)."""

from __future__ import annotations

import pytest

from broker import services
from tests.factories import make_world
from tests.support.api import Api
from tests.support.processes import start_fleet, stop_fleet


@pytest.fixture(autouse=True)
def _no_cycle_pending():
    """Each test starts with no schedule cycle pending for its database and queue (the trigger flag lives
    in the broker's Redis, outside the test database)."""
    services.cycle_flag_clear()


@pytest.fixture
def worker(celery_worker, settings):
    """The session's Celery worker (tests/support/celery.py), idle, with leases as short as a test can wait for."""
    settings.LEASE_MIN_DURATION_SECONDS = 1
    settings.LEASE_PREEMPTION_NOTICE_SECONDS = 2
    settings.LEASE_MIN_RUNTIME_SECONDS = 0
    return celery_worker


@pytest.fixture
def fleet(live_server, tmp_path, transactional_db):
    """Two simulated nodes (one of 2 x H100 in MIG mode, one of 2 x A100 whole) enrolled with the broker."""
    process = start_fleet(live_server.url, tmp_path / "fleet", 2, "h100-80gb:2:mig", "a100-80gb:2:whole")
    yield process
    stop_fleet(process)


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
    stop_fleet(process)


@pytest.fixture
def world(transactional_db):
    return make_world()


@pytest.fixture
def api(live_server, world):
    return lambda who="member": Api(live_server.url, world.tokens[who])
