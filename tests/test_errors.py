"""Bad input gets a clear problem+json error naming the field, and nothing is written."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tenants.models import Project

ROOT = Path(__file__).resolve().parent.parent


def test_errors_malformed_json_names_body(world):
    response = world.client("owner").generic(
        "POST", "/api/v1/projects", '{"slug": "x", "name": ', content_type="application/json"
    )
    assert response.status_code == 400
    body = response.json()
    assert response["Content-Type"] == "application/problem+json"
    assert body["field"] == "body" and body["code"] == "parse_error" and "JSON" in body["detail"]


def test_errors_missing_field_is_named(world):
    response = world.client("owner").post("/api/v1/projects", {"slug": "x"}, format="json")
    assert response.status_code == 400
    body = response.json()
    assert body["field"] == "name"
    assert body["detail"].startswith("name:")
    assert body["errors"] == [{"field": "name", "message": "This field is required.", "code": "required"}]
    assert not Project.objects.filter(slug="x").exists()


def test_errors_unknown_field_is_named(world):
    response = world.client("owner").post("/api/v1/projects", {"slug": "x", "name": "X", "colour": 1}, format="json")
    assert response.status_code == 400 and response.json()["field"] == "colour"


def test_errors_domain_validation_names_field(world):
    response = world.client("owner").post("/api/v1/projects", {"slug": "Not A Slug", "name": "X"}, format="json")
    assert response.status_code == 400 and response.json()["field"] == "slug"
    duplicate = world.client("owner").post("/api/v1/projects", {"slug": "vision", "name": "X"}, format="json")
    assert duplicate.status_code == 409 and duplicate.json()["field"] == "slug"


def test_errors_body_must_be_object(world):
    response = world.client("owner").post("/api/v1/projects", ["slug"], format="json")
    assert response.status_code == 400 and response.json()["field"] == "body"


def test_errors_wrong_type_in_list(world):
    response = world.client("owner").post("/api/v1/tokens", {"name": "t", "scopes": ["admin"]}, format="json")
    assert response.status_code == 400
    assert response.json()["field"] == "scopes[0]"
    assert "admin" in response.json()["detail"]


def test_errors_unknown_api_route_is_problem_json(world):
    response = world.client("owner").get("/api/v1/nothing-here")
    assert response.status_code == 404 and response["Content-Type"] == "application/problem+json"


def test_errors_method_not_allowed(world):
    response = world.client("owner").put("/api/v1/projects", {}, format="json")
    assert response.status_code == 405 and response.json()["status"] == 405


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DATABASE_URL", "mysql://root@localhost/x"),
        ("DATABASE_URL", "not a url"),
        ("DJANGO_DEBUG", "maybe"),
        ("DATABASE_CONN_MAX_AGE", "-5"),
        ("CELERY_BROKER_URL", "kafka://x"),
        ("PROMETHEUS_URL", "localhost:9090"),
        ("LOG_LEVEL", "LOUD"),
        ("ALLOWED_HOSTS", " , "),
    ],
)
def test_errors_bad_environment_value_fails_at_start_naming_variable(variable, value):
    env = {**os.environ, variable: value, "SECRET_KEY": "x"}
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0
    assert f"Environment variable {variable}=" in result.stderr


def test_errors_missing_secret_key_fails_at_start():
    env = {k: v for k, v in os.environ.items() if k != "SECRET_KEY"}
    env["DJANGO_DEBUG"] = "0"
    result = subprocess.run([sys.executable, "-c", "import django, os; os.environ.setdefault("
                             "'DJANGO_SETTINGS_MODULE','config.settings'); from django.conf import settings; "
                             "settings.SECRET_KEY"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "SECRET_KEY" in result.stderr
