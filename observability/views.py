"""``GET /metrics``: the broker's metrics in Prometheus text format, behind a bearer token.

``METRICS_TOKEN`` set: only ``Authorization: Bearer <token>`` is answered (compared in constant time); unset:
404, the endpoint does not exist (so a deployment that forgot the token does not expose it). Events come from
every process that shares ``PROMETHEUS_MULTIPROC_DIR`` (gunicorn workers, Celery workers on the same host),
states from PostgreSQL (``observability.collector``).
"""

from __future__ import annotations

import hmac
import os

from django.conf import settings
from django.http import Http404, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from observability.collector import DatabaseCollector


class _Process:
    """This process's own default registry as one collector (single-process mode)."""

    def collect(self):
        return REGISTRY.collect()


def event_registry() -> CollectorRegistry:
    """Counters and histograms of every process (multi-process mode) or of this one."""
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_Process())
    return registry


def authorised(request) -> bool:
    token = settings.METRICS_TOKEN
    given = request.headers.get("Authorization", "")
    return bool(token) and hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


@never_cache
@require_GET
def metrics(request):
    if not settings.METRICS_TOKEN:
        raise Http404("metrics are off: set METRICS_TOKEN")
    if not authorised(request):
        response = HttpResponse("a bearer token is required (METRICS_TOKEN)\n", status=401,
                                content_type="text/plain; charset=utf-8")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    registry = event_registry()
    registry.register(DatabaseCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
