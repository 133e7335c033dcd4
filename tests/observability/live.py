"""A live broker for the telemetry tests: gunicorn (2 workers) and a Celery worker sharing one
PROMETHEUS_MULTIPROC_DIR, simulated agents enrolled over HTTP, and lease traffic through the API."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

TOKEN = "metrics-test-token"


def scrape(base_url: str, token: str = TOKEN) -> str:
    request = urllib.request.Request(base_url + "/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        return response.read().decode()


def samples(text: str) -> dict[str, list]:
    """Sample name → its samples (``gpubroker_http_requests_total`` → [Sample(...), ...])."""
    found: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def value(found: dict, name: str, **labels) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(s.value for s in found.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))
