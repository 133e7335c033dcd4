"""The one Prometheus client: instant and range queries of the HTTP API (``/api/v1/query``, ``/api/v1/query_range``)
on ``requests``.

Metering (``billing.services.utilisation``), the broker's lease charts (``broker.selectors``), the capacity loop's
utilisation series (``capacity.selectors``) and the profiler (``tiering.profiler``) ask through it. Every failure
the caller can do nothing about — no answer, a timeout, an HTTP error status, a body that is not Prometheus's
``{"status": "success", "data": {"result": [...]}}`` — is one ``PrometheusError``; each caller decides what it
means there (metering keeps the window open, a chart shows nothing, the profiler reports the run unmeasured).
"""

from __future__ import annotations

import requests
from django.conf import settings
from requests.adapters import HTTPAdapter
from urllib3.util import Retry

# what a page or the capacity loop waits for telemetry that is optional there (a chart, idle reclaim's series)
OPTIONAL_TIMEOUT_SECONDS = 2.0


class PrometheusError(Exception):
    """Prometheus did not answer the query, or not with a result."""


class Prometheus:
    """A client for the server at ``url`` (default ``settings.PROMETHEUS_URL``). ``timeout`` seconds per request
    (default ``settings.PROMETHEUS_TIMEOUT_SECONDS``); ``retries`` more tries, with back-off, when the connection
    fails or a proxy in front answers 502/503/504 (queries only read, so a retry is harmless)."""

    def __init__(self, url: str | None = None, *, timeout: float | None = None, retries: int = 0):
        self.url = (url or settings.PROMETHEUS_URL).rstrip("/")
        self.timeout = settings.PROMETHEUS_TIMEOUT_SECONDS if timeout is None else timeout
        self.session = requests.Session()
        if retries:
            retry = Retry(total=retries, backoff_factor=0.2, status_forcelist=(502, 503, 504), allowed_methods=None,
                          raise_on_status=False)
            self.session.mount(self.url, HTTPAdapter(max_retries=retry))

    def query(self, expression: str, *, at: float | None = None) -> list[dict]:
        """The result of an instant query (at unix seconds ``at``, default: Prometheus's now)."""
        params = {"query": expression}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._get("query", params)

    def query_range(self, expression: str, *, start: float, end: float, step: float | str) -> list[dict]:
        """The result of a range query from ``start`` to ``end`` (unix seconds, sent as given) every ``step``."""
        return self._get("query_range", {"query": expression, "start": start, "end": end, "step": step})

    def _get(self, path: str, params: dict) -> list[dict]:
        try:
            response = self.session.get(f"{self.url}/api/v1/{path}", params=params, timeout=self.timeout)
            response.raise_for_status()
            body = response.json()
            if body.get("status") != "success":
                raise PrometheusError(f"{path}: {body.get('errorType', 'error')}: {body.get('error', body)}")
            return body["data"]["result"]
        except (requests.RequestException, ValueError, KeyError, TypeError, AttributeError) as error:
            raise PrometheusError(f"{path}: {error}") from error
