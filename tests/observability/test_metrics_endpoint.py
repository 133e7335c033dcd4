"""/metrics in one process (the test client): the token, the families, the request counter per route."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.django_db


def _families(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_metrics_are_off_without_a_token(client, settings):
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 404


def test_metrics_refuse_a_missing_or_wrong_token(client, settings):
    settings.METRICS_TOKEN = "s3cret-token"
    assert client.get("/metrics").status_code == 401
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_metrics_report_requests_by_route_and_database_states(client, settings, world):
    settings.METRICS_TOKEN = "s3cret-token"
    assert client.get("/healthz").status_code == 200
    assert client.get("/api/v1/leases", HTTP_AUTHORIZATION=f"Bearer {world.tokens['member']}").status_code == 200
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    families = _families(response.content.decode())
    requests = {(s.labels["route"], s.labels["method"], s.labels["status"]): s.value
                for s in families["gpubroker_http_requests"].samples if s.name.endswith("_total")}
    assert requests[("/healthz", "GET", "200")] >= 1
    assert requests[("/api/v1/leases", "GET", "200")] >= 1
    assert families["gpubroker_database_collector_up"].samples[0].value == 1
    states = {s.labels["state"] for s in families["gpubroker_leases"].samples}
    assert {"queued", "active", "provisioning"} <= states
    assert "gpubroker_queue_oldest_wait_seconds" in families
    assert {s.labels["source"] for s in families["gpubroker_metering_lag_seconds"].samples} == {
        "allocation", "utilisation"}


def test_every_task_the_hooks_read_is_a_registered_task():
    """A task renamed elsewhere would silently stop feeding its metrics: its name must still be registered."""
    from config.celery import app
    from observability.hooks import _RESULTS

    app.loader.import_default_modules()
    assert set(_RESULTS) - set(app.tasks) == set()
