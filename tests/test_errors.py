"""Bad input gets a clear problem+json error naming the field, and nothing is written."""

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
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


# --- hostile input never reaches the database or the renderer as a 500 (issue 13, item 9) -------------


def _problem(response, status: int) -> dict:
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"] == "application/problem+json"
    return response.json()


@pytest.mark.parametrize(
    ("url", "field"),
    [
        ("/api/v1/leases?project=a%00b", "project"),
        ("/api/v1/leases?state=%00", "state"),
        ("/api/v1/quotas?project=%00", "project"),
        ("/api/v1/usage?group_by=day%00", "group_by"),
        ("/api/v1/projects?limit=1&x%00y=1", "x\\u0000y"),
        ("/api/v1/agents/node%00/heartbeat", "path"),
    ],
)
def test_errors_nul_in_query_or_path_is_named(world, url, field):
    client = world.client("owner")
    response = client.post(url, {}, format="json") if "heartbeat" in url else client.get(url)
    body = _problem(response, 400)
    assert body["field"] == field and "NUL" in body["detail"]


def test_errors_nul_in_portal_form_field_renders_error_page(world, client):
    client.force_login(world.owner)
    response = client.post("/settings/members/invite", {"username": "bob\x00", "role": "member"})
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")
    assert b"username: NUL characters are not allowed." in response.content
    listing = client.get("/leases/?project=%00")
    assert listing.status_code == 400 and b"project: NUL characters are not allowed." in listing.content


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"project": "vision", "gpu": {"kind": "mig", "profile": "\\ud800"}}', "gpu.profile"),
        ('{"project": "vision", "gpu": {"kind": "whole", "\\udc00": 1}}', "gpu.\\udc00"),
        ('{"project": "vision\\u0000", "gpu": {"kind": "whole"}}', "project"),
        ('{"project": "vision", "gpu": {"kind": "whole", "model": ["\\u0000"]}}', "gpu.model[0]"),
    ],
)
def test_errors_nul_or_lone_surrogate_in_json_is_named(world, body, field):
    response = world.client("owner").generic("POST", "/api/v1/leases", body, content_type="application/json")
    problem = _problem(response, 400)
    assert problem["field"] == field and problem["code"] == "parse_error"
    assert "NUL characters or lone UTF-16 surrogates" in problem["detail"]


@pytest.mark.parametrize("path", ["/api/v1/leases", "/api/v1/projects", "/api/v1/leases/999999/renew"])
def test_errors_deeply_nested_json_is_refused(world, path):
    depth = 1000
    body = '{"gpu": ' + "[" * depth + "]" * depth + "}"
    response = world.client("owner").generic("POST", path, body, content_type="application/json")
    problem = _problem(response, 400)
    assert problem["field"] == "body" and "nested deeper than" in problem["detail"]


def test_errors_json_nested_within_the_limit_still_reaches_validation(world):
    body = '{"project": "vision", "gpu": {"kind": "whole", "x": ' + "[" * 20 + "]" * 20 + "}}"
    response = world.client("owner").generic("POST", "/api/v1/leases", body, content_type="application/json")
    assert response.status_code == 400 and response.json()["code"] != "parse_error"


@pytest.mark.parametrize(
    "path", ["/api/v1/projects", "/api/v1/agents/node-1/heartbeat", "/api/v1/billing/stripe/webhook"]
)
def test_errors_oversized_body_is_problem_json_413(world, settings, path):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    settings.STRIPE_WEBHOOK_SECRET = "whsec_test"  # else the webhook answers 503 before reading the body
    body = '{"name": "' + "x" * 20_000 + '"}'
    response = world.client("owner").generic("POST", path, body, content_type="application/json")
    problem = _problem(response, 413)
    assert problem["field"] == "body" and problem["code"] == "request_too_large"


def test_errors_unsupported_media_type_title_is_not_a_template(world):
    response = world.client("owner").generic("POST", "/api/v1/projects", "slug=x", content_type="text/plain")
    problem = _problem(response, 415)
    assert problem["title"] == "Unsupported media type" and "{" not in problem["title"]
    assert "text/plain" in problem["detail"]


def test_errors_database_outage_is_503_with_retry_after(db):
    """A real server process whose PostgreSQL is unreachable (nothing listens on its port)."""
    from tests.api.server import api_server, free_port

    with api_server(f"postgres://postgres@127.0.0.1:{free_port()}/gpubroker",
                    DATABASE_CONNECT_TIMEOUT="2") as url:
        token = "gpub_abcdefghij_" + "s" * 40
        for path in ("/api/v1/projects", "/api/v1/leases/1", "/api/v1/tenant"):
            request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {token}"})
            with pytest.raises(urllib.error.HTTPError) as answer:
                urllib.request.urlopen(request, timeout=20)
            assert answer.value.code == 503, path
            assert answer.value.headers["Content-Type"] == "application/problem+json"
            assert int(answer.value.headers["Retry-After"]) > 0
            problem = json.loads(answer.value.read())
            assert problem["status"] == 503 and problem["code"] == "unavailable"
        with pytest.raises(urllib.error.HTTPError) as ready:
            urllib.request.urlopen(url + "/readyz", timeout=20)
        assert ready.value.code == 503 and int(ready.value.headers["Retry-After"]) > 0
        assert json.loads(ready.value.read())["failing"] == ["database"]
        # a session cookie makes the portal read its session from the database
        portal = urllib.request.Request(url + "/", headers={"Cookie": "sessionid=" + "a1" * 16})
        with pytest.raises(urllib.error.HTTPError) as page:
            urllib.request.urlopen(portal, timeout=20)
        assert page.value.code == 503 and int(page.value.headers["Retry-After"]) > 0
        assert page.value.headers["Content-Type"].startswith("text/html")


def test_errors_refused_before_the_application_are_problem_json(db):
    """Issue 27, item 11: gunicorn refuses a request line past ``limit_request_line`` (414) and too many or too
    large header fields (431) before Django sees them; they were gunicorn's HTML pages. With the deployment's
    gunicorn configuration (``config.gunicorn``) they are problem+json like every other error, and documented."""
    import http.client
    from urllib.parse import urlsplit

    from tests.api.server import api_server
    from tests.support.processes import test_database_url

    with api_server(test_database_url()) as url:
        host, port = urlsplit(url).hostname, urlsplit(url).port
        cases = {414: ("/api/v1/projects?q=" + "x" * 5000, {}),
                 431: ("/api/v1/projects", {f"X-Filler-{n}": "y" for n in range(120)})}
        for status, (path, headers) in cases.items():
            connection = http.client.HTTPConnection(host, port, timeout=20)
            connection.request("GET", path, headers=headers)
            answer = connection.getresponse()
            body = answer.read()
            connection.close()
            assert answer.status == status, (status, answer.status, body[:200])
            assert answer.getheader("Content-Type") == "application/problem+json", body[:200]
            problem = json.loads(body)
            assert problem["status"] == status and problem["type"].endswith("/" + problem["code"])
            assert set(problem) >= {"type", "title", "status", "detail", "code", "field"}


def test_errors_openapi_documents_402_of_profiling_runs_and_the_servers_refusals(client):
    """Issue 27, item 11: a profiling run refused by a spend cap is a 402 the document did not list; 414 and 431
    (refused by gunicorn) may answer any operation."""
    from config import gunicorn as gunicorn_config
    from core.problems import TYPE_BASE

    schema = client.get("/api/schema/", {"format": "json"}).json()
    profiling = schema["paths"]["/api/v1/workloads/{name}/profiling-runs"]["post"]["responses"]
    assert "402" in profiling and "application/problem+json" in profiling["402"]["content"]
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            assert {"414", "431"} <= set(operation["responses"]), (method, path)
    assert gunicorn_config.PROBLEM_TYPE_BASE == TYPE_BASE
