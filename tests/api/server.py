"""A real API server process (gunicorn) on 127.0.0.1 for the tests that need one over HTTP.

It serves the test database (pass ``database_url``) or, to test an outage, a port where nothing listens.
Data a test writes must be committed (``transactional_db``) for the server to see it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from core import processes
from tests.support.processes import ROOT, free_port, test_database_url

__all__ = ["ROOT", "api_server", "free_port", "production_web_server", "test_database_url"]


@contextlib.contextmanager
def api_server(database_url: str, **environment: str) -> Iterator[str]:
    """Start gunicorn serving the project; yield its base URL; stop it (by its own PID) afterwards."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url, "DJANGO_DEBUG": "0", "DATABASE_CONN_MAX_AGE": "0",
           "RUNTIME_ENV_FILE": os.devnull, "SECRET_KEY": os.environ.get("SECRET_KEY", "test-secret"),
           "ALLOWED_HOSTS": "127.0.0.1", "LOG_LEVEL": "WARNING", "LOG_FORMAT": "text", **environment}
    gunicorn = Path(sys.executable).parent / "gunicorn"
    process = processes.start(
        [str(gunicorn), "config.wsgi:application", "--config", "python:config.gunicorn",  # as deployed
         "--bind", f"127.0.0.1:{port}", "--workers", "2",
         "--timeout", "60", "--graceful-timeout", "2", "--log-level", "warning"],
        cwd=ROOT, env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        processes.wait_http(url + "/healthz", process, timeout=30, step=0.1)
        yield url
    finally:
        processes.stop(process, timeout=10)


@contextlib.contextmanager
def production_web_server(database_url: str, **environment: str) -> Iterator[str]:
    """gunicorn exactly as make run and the image start it (``infra.run.web_command``: gthread, the same workers,
    threads and ``config.gunicorn`` hooks), serving ``database_url``; yields its base URL. Stopped by its own
    process group (its workers with it)."""
    from infra import run

    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url, "LOG_LEVEL": "WARNING", **environment}
    process = processes.start(run.web_command(port=port), env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    site = f"http://127.0.0.1:{port}"
    try:
        processes.wait_http(site + "/healthz", process, timeout=30, step=0.2)
        yield site
    finally:
        processes.stop(process, timeout=15, whole_group=True)
