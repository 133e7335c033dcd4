"""pytest plugin: before Django loads, point the tests at a real PostgreSQL and Celery broker.

Loaded from ``pyproject.toml`` (``-p infra.pytest_services``), so plain ``pytest`` works as well as
``make test``. Uses ``DATABASE_URL`` / ``CELERY_BROKER_URL`` when they answer, else starts embedded ones
(``infra/services.py``) and stops them at the end. xdist workers inherit the controller's choice.
"""

from __future__ import annotations

import os

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
        return  # the controller already chose and exported the services
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
    os.environ.setdefault("NODE_ADDRESS_NETWORKS", services.LOCAL_NODE_ADDRESS_NETWORKS)  # simulated nodes: 127.0.0.1
    _started.extend([database, broker])
    services.say(f"tests use PostgreSQL ({database.how}) and broker {broker.url.split('://')[0]} ({broker.how})")


def pytest_unconfigure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for service in _started:
        service.shutdown()
    _started.clear()
