"""A real API server process (gunicorn) on 127.0.0.1 for the tests that need one over HTTP.

It serves the test database (pass ``database_url``) or, to test an outage, a port where nothing listens.
Data a test writes must be committed (``transactional_db``) for the server to see it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from core import processes
from tests.support.processes import ROOT, free_port, test_database_url

__all__ = ["ROOT", "api_server", "free_port", "test_database_url"]


@contextlib.contextmanager
def api_server(database_url: str, **environment: str) -> Iterator[str]:
    """Start gunicorn serving the project; yield its base URL; stop it (by its own PID) afterwards."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url, "DJANGO_DEBUG": "0", "DATABASE_CONN_MAX_AGE": "0",
           "RUNTIME_ENV_FILE": os.devnull, "SECRET_KEY": os.environ.get("SECRET_KEY", "test-secret"),
           "ALLOWED_HOSTS": "127.0.0.1", "LOG_LEVEL": "WARNING", "LOG_FORMAT": "text", **environment}
    gunicorn = Path(sys.executable).parent / "gunicorn"
    process = processes.start(
        [str(gunicorn), "config.wsgi:application", "--bind", f"127.0.0.1:{port}", "--workers", "2",
         "--timeout", "60", "--graceful-timeout", "2", "--log-level", "warning"],
        cwd=ROOT, env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {process.returncode} before answering")
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("gunicorn did not answer /healthz within 30 s")
            time.sleep(0.1)
        yield url
    finally:
        processes.stop(process, timeout=10)
