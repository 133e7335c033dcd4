"""Fixtures used across test directories (a pytest plugin loaded by ``tests/conftest.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.prometheus import PrometheusServer


@pytest.fixture
def prometheus_server(tmp_path):
    """Makes Prometheus servers (``prometheus_server(targets=...)``); every one is stopped at the end."""
    servers: list[PrometheusServer] = []

    def make(*, targets: tuple[str, ...] = (), file_sd: Path | None = None) -> PrometheusServer:
        server = PrometheusServer(tmp_path / f"prometheus-{len(servers)}", targets=targets, file_sd=file_sd)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def celery_worker_session(django_db_setup, django_db_blocker):
    """One real Celery worker process per test session (per xdist worker): prefork with 2 children, on a queue of
    this session, reading the test database. Tests take it through ``celery_worker``, which hands it over idle."""
    from tests.support.celery import SessionWorker

    worker = SessionWorker.start()
    yield worker
    worker.stop()


@pytest.fixture
def celery_worker(celery_worker_session, transactional_db):
    """The session's Celery worker, idle and with nothing queued, for one test; the test process sends to its
    queue. At the end the worker is brought back to idle as a warm shutdown would leave it: nothing more taken
    from the queue, what it held back revoked, the tasks it is running finished (before the database is
    flushed)."""
    celery_worker_session.attach()
    yield celery_worker_session
    celery_worker_session.detach()
