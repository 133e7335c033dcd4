"""pytest plugin: before Django loads, point the tests at a real PostgreSQL and Celery broker.

Loaded from ``pyproject.toml`` (``-p infra.pytest_services``), so plain ``pytest`` works as well as
``make test``. Uses ``DATABASE_URL`` / ``CELERY_BROKER_URL`` when they answer, else starts embedded ones
(``infra/services.py``) and stops them at the end.

Under pytest-xdist each worker (gw0, gw1, ...) inherits the controller's choice, with what must not be shared
made its own: pytest-django gives it a test database of its own (``test_<name>_gw0``); the Redis broker URL's
database number is the controller's plus the worker's index (``redis://…/3`` → gw0 on db 3, gw1 on db 4), so a
Celery worker started by gw0 never consumes gw1's tasks and the cycle flags, snapshot caches and throttle counters
kept in that Redis (the cache follows the broker) stay apart; and the cache's key prefix names the worker.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit, urlunsplit

import pytest

from infra import services

_started: list[services.Service] = []


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    # The shared cache (Redis) is one per broker database: each xdist worker counts throttles under keys of
    # its own, and its cache.clear() between tests deletes only those.
    os.environ["CACHE_KEY_PREFIX"] = f"test-{worker or 'main'}"
    if worker:
        # the controller already chose and exported the services; the broker's namespace is this worker's own
        broker_url = worker_broker_url(os.environ["CELERY_BROKER_URL"], worker)
        os.environ["CELERY_BROKER_URL"] = broker_url
        os.environ["CELERY_RESULT_BACKEND"] = services.result_backend_for(broker_url)
        return
    database = services.ensure_postgres()
    broker = services.ensure_broker(redis_db=1)
    os.environ["DATABASE_URL"] = database.url
    os.environ["CELERY_BROKER_URL"] = broker.url
    os.environ["CELERY_RESULT_BACKEND"] = services.result_backend_for(broker.url)
    os.environ.setdefault("SECRET_KEY", "test-secret-key-not-for-production")
    os.environ.setdefault("HTTPS", "0")  # the test client and the live servers speak plain HTTP
    os.environ["RUNTIME_ENV_FILE"] = os.devnull  # never pick up what a running `make run` chose
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DATABASE_CONN_MAX_AGE", "0")  # threads of live_server must not hold connections
    os.environ.setdefault("LOG_FORMAT", "text")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    # the capacity planner runs when a test asks for it, as its timer (beat) does not run: not on a cycle's wait
    os.environ.setdefault("CAPACITY_PLAN_ON_WAIT_SECONDS", "0")
    os.environ.setdefault("NODE_ADDRESS_NETWORKS", services.LOCAL_NODE_ADDRESS_NETWORKS)  # simulated nodes: 127.0.0.1
    _started.extend([database, broker])
    services.say(f"tests use PostgreSQL ({database.how}) and broker {broker.url.split('://')[0]} ({broker.how})")


REDIS_DATABASES = 16  # Redis's default ``databases``


def worker_broker_url(url: str, worker: str) -> str:
    """The broker URL of xdist worker ``worker`` (``gw<n>``): a Redis URL's database number plus n (an error past
    Redis's 16 databases: pass a lower one in ``CELERY_BROKER_URL`` or fewer workers). Other brokers are shared:
    every worker process started by the tests consumes a queue named after its own pid and start time."""
    numbered = re.fullmatch(r"gw(\d+)", worker)
    index = int(numbered.group(1)) if numbered else 0
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or index == 0:
        return url
    base = int(parts.path.strip("/") or 0)
    number = base + index
    if number >= REDIS_DATABASES:
        raise pytest.UsageError(f"xdist worker {worker} would use Redis database {number} ({url} + {index}); Redis "
                                f"has {REDIS_DATABASES}: use a lower database in CELERY_BROKER_URL or fewer workers")
    return urlunsplit(parts._replace(path=f"/{number}"))


def pytest_unconfigure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for service in _started:
        service.shutdown()
    _started.clear()
