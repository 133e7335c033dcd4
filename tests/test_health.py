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
    """The real probe against a PostgreSQL that does not answer: a connection like the default one, pointed at a
    port where nothing listens. The probe's own error path runs (nothing of it is replaced)."""
    from django.db import connections

    from config import health
    from tests.support.processes import free_port

    default = connections["default"]
    port = free_port()  # bound and closed again: nothing listens there
    unreachable = type(default)({**default.settings_dict, "HOST": "127.0.0.1", "PORT": str(port),
                                 "OPTIONS": {**default.settings_dict["OPTIONS"], "connect_timeout": 3}},
                                alias="unreachable")
    monkeypatch.setattr(health, "connection", unreachable)
    try:
        response = client.get("/readyz")
    finally:
        unreachable.close()
    assert response.status_code == 503, response.content
    assert response["Retry-After"]
    body = response.json()
    assert body["status"] == "unavailable" and body["failing"] == ["database"]
    database = body["checks"]["database"]
    assert database["ok"] is False
    assert database["error"].startswith("OperationalError: ")
    assert f"port {port} failed: Connection refused" in database["error"], database["error"]
    assert body["checks"]["broker"]["ok"] is True  # only the failing part is named


def test_health_request_id_is_echoed(client):
    response = client.get("/healthz", HTTP_X_REQUEST_ID="abc-123")
    assert response["X-Request-ID"] == "abc-123"


def test_logs_are_json_with_request_id_tenant_and_user(world, client, caplog):
    from pythonjsonlogger.json import JsonFormatter

    from core.logging import RequestContextFilter

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


@pytest.mark.parametrize("path", ["/api/docs/", "/api/redoc/"])
def test_api_docs_need_no_internet(client, db, path):
    """Swagger UI and ReDoc load their JavaScript and CSS from this deployment's static files, never a CDN:
    every script and stylesheet the page names is found by the static files finders."""
    import re

    from django.contrib.staticfiles import finders

    page = client.get(path).content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css|png))"', page)
    assert assets, page
    for asset in assets:
        assert asset.startswith("/static/"), f"{asset} is not served by this deployment"
        assert finders.find(asset.removeprefix("/static/")), f"{asset} is not among the static files"
    assert "cdn." not in page and "unpkg" not in page
