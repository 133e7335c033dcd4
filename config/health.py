"""Liveness and readiness probes.

``/healthz`` answers 200 while the process runs (no dependencies). ``/readyz`` answers 200 only when
the database and the Celery broker both answer, else 503 naming the failing part.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET


def _check_database() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # noqa: BLE001 - a probe reports any failure, it does not raise
        return f"{type(exc).__name__}: {exc}".strip()
    return None


def _broker_url() -> str:
    from config.celery import app

    return app.conf.broker_url


def _check_broker() -> str | None:
    from kombu import Connection

    from config.celery import app

    try:
        # A fresh connection each probe: a pooled one could hide a broker that has gone away.
        with Connection(_broker_url(), transport_options=app.conf.broker_transport_options,
                        connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0.2, timeout=3)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}".strip()
    return None


@never_cache
@require_GET
def healthz(request):
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def readyz(request):
    checks = {}
    failing = []
    for name, check in (("database", _check_database), ("broker", _check_broker)):
        started = time.perf_counter()
        error = check()
        checks[name] = {
            "ok": error is None,
            "ms": round((time.perf_counter() - started) * 1000, 1),
            **({"error": error} if error else {}),
        }
        if error:
            failing.append(name)
    broker_scheme = settings.CELERY_BROKER_URL.split("://", 1)[0]
    body = {"status": "ready" if not failing else "unavailable", "failing": failing, "checks": checks,
            "broker": broker_scheme}
    response = JsonResponse(body, status=200 if not failing else 503)
    if failing:
        from core.problems import RETRY_AFTER_SECONDS

        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response
