import json
import logging

import pytest


def test_health_healthz_answers_without_auth(client):
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}
    assert response["X-Request-ID"]


def test_health_readyz_checks_real_database_and_broker(db, client):
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["failing"] == [] and body["checks"]["database"]["ok"] and body["checks"]["broker"]["ok"]


def test_health_readyz_names_failing_broker(db, client, monkeypatch):
    from config import health

    monkeypatch.setattr(health, "_broker_url", lambda: "redis://127.0.0.1:1/0")  # nothing listens on port 1
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["failing"] == ["broker"]
    assert "Connection refused" in response.json()["checks"]["broker"]["error"]


def test_health_readyz_names_failing_database(db, client, monkeypatch):
    from config import health

    def broken():
        return "OperationalError: connection refused"

    monkeypatch.setattr(health, "_check_database", broken)
    response = client.get("/readyz")
    assert response.status_code == 503 and response.json()["failing"] == ["database"]


def test_health_request_id_is_echoed(client):
    response = client.get("/healthz", HTTP_X_REQUEST_ID="abc-123")
    assert response["X-Request-ID"] == "abc-123"


def test_logs_are_json_with_request_id_tenant_and_user(world, client, caplog):
    from pythonjsonlogger.json import JsonFormatter

    from config.logging import RequestContextFilter

    formatter = JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    records = []

    class Capture(logging.Handler):
        def emit(self, record):
            records.append(formatter.format(record))

    handler = Capture()
    handler.addFilter(RequestContextFilter())
    logger = logging.getLogger("gpubroker.access")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        world.client("owner").get("/api/v1/projects", HTTP_X_REQUEST_ID="req-42")
    finally:
        logger.removeHandler(handler)
    line = json.loads(records[-1])
    assert line["request_id"] == "req-42"
    assert line["tenant"] == "acme" and line["user"] == "alice"
    assert line["status"] == 200 and line["path"] == "/api/v1/projects"


@pytest.mark.parametrize("path", ["/accounts/login/", "/api/docs/"])
def test_pages_render(client, db, path):
    assert client.get(path).status_code == 200


def test_openapi_schema_is_valid(client, db):
    import yaml
    from drf_spectacular.validation import validate_schema

    response = client.get("/api/schema/")
    assert response.status_code == 200
    schema = yaml.safe_load(response.content)
    validate_schema(schema)
    assert "/api/v1/projects" in schema["paths"]
