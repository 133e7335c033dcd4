"""A real API server process (gunicorn) on 127.0.0.1 for the tests that need one over HTTP.

It serves the test database (pass ``database_url``) or, to test an outage, a port where nothing listens.
Data a test writes must be committed (``transactional_db``) for the server to see it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_database_url() -> str:
    """The URL of the database the tests run against (pytest-django's ``test_…`` database), over TCP or the
    embedded server's Unix socket: the plugin's ``DATABASE_URL`` with the test database's name."""
    parts = urllib.parse.urlsplit(os.environ["DATABASE_URL"])
    return urllib.parse.urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"]))


@contextlib.contextmanager
def api_server(database_url: str, **environment: str) -> Iterator[str]:
    """Start gunicorn serving the project; yield its base URL; stop it (by its own PID) afterwards."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url, "DJANGO_DEBUG": "0", "DATABASE_CONN_MAX_AGE": "0",
           "RUNTIME_ENV_FILE": os.devnull, "SECRET_KEY": os.environ.get("SECRET_KEY", "test-secret"),
           "ALLOWED_HOSTS": "127.0.0.1", "LOG_LEVEL": "WARNING", "LOG_FORMAT": "text", **environment}
    gunicorn = Path(sys.executable).parent / "gunicorn"
    process = subprocess.Popen(
        [str(gunicorn), "config.wsgi:application", "--config", "python:config.gunicorn",  # as deployed
         "--bind", f"127.0.0.1:{port}", "--workers", "2",
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
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextlib.contextmanager
def production_web_server(database_url: str, **environment: str) -> Iterator[str]:
    """gunicorn exactly as make run and the image start it (``infra.run.web_command``: gthread, the same workers,
    threads and ``config.gunicorn`` hooks), serving ``database_url``; yields its base URL. Stopped by its own
    process group (its workers with it)."""
    from infra import run

    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url, "LOG_LEVEL": "WARNING", **environment}
    process = subprocess.Popen(run.web_command(port=port), cwd=ROOT, env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    site = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(site + "/healthz", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("gunicorn did not answer /healthz within 30 s")
            time.sleep(0.2)
        yield site
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
