"""The agents' ingress (``config.agent_wsgi``), a gunicorn of its own beside the web server's, both real processes
sharing only PostgreSQL: the heartbeat it answers without Django's request cycle checks and records exactly what
the web server's view does, its refusals are the same problem+json, a nonce it accepted is refused by the web
server (and the other way round), what it does not take on itself goes to Django unchanged, and the tenant API
is not served there."""

import io
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
from django.utils import timezone

from agent.protocol import sign
from broker import services
from broker.models import Node
from tenants.models import AuditEvent
from tests.support.processes import ROOT, free_port, test_database_url, wait_http


def _gunicorn(app: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "DATABASE_URL": test_database_url(), "LOG_LEVEL": "ERROR"}
    process = subprocess.Popen([sys.executable, "-m", "gunicorn", app, "--bind", f"127.0.0.1:{port}",
                                "--workers", "1", "--worker-class", "gthread", "--threads", "2",
                                "--log-level", "warning"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", process, timeout=60)
    return process, url


def _call(url: str, body: bytes | None = None, headers: dict | None = None, method: str = "POST") -> tuple:
    request = urllib.request.Request(url, data=body, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], json.loads(error.read())


@pytest.fixture
def web_and_ingress(transactional_db):
    servers = [_gunicorn("config.wsgi"), _gunicorn("config.agent_wsgi")]
    yield [url for _, url in servers]
    for process, _ in servers:
        process.terminate()
    for process, _ in servers:
        process.wait(20)


def test_agent_ingress_heartbeat_is_the_web_servers_heartbeat(web_and_ingress):
    web, ingress = web_and_ingress
    token = services.enrollment_token_create(uses=2)
    # enrollment is not the lean path: Django's full handler answers it on the ingress too
    body = json.dumps({"node_id": "n1", "token": token, "address": "http://127.0.0.1:9/n/n1",
                       "inventory": {"gpus": []}}).encode()
    status, _, enrolled = _call(ingress + "/api/v1/agents/enroll", body)
    assert status == 201 and enrolled["node_id"] == "n1"
    secret = enrolled["secret"]
    assert Node.objects.get(node_id="n1").secret_used_at is None

    path = "/api/v1/agents/n1/heartbeat"
    body = json.dumps({"time": 1, "instances": []}).encode()
    headers = sign(secret, "n1", "POST", path, body)
    before = timezone.now()
    status, content_type, answer = _call(ingress + path, body, headers)
    assert (status, content_type, answer) == (200, "application/json", {"heartbeat_seconds": 15})
    node = Node.objects.get(node_id="n1")
    assert node.last_heartbeat_at >= before and node.secret_used_at is not None  # the enrollment answer is spent
    # one nonce for the whole broker: the web server refuses what the ingress accepted, and the other way round
    status, _, problem = _call(web + path, body, headers)
    assert status == 401 and "replayed" in problem["detail"]
    headers = sign(secret, "n1", "POST", path, body)
    assert _call(web + path, body, headers)[0] == 200
    assert _call(ingress + path, body, headers)[0] == 401

    # each refusal is the web server's answer, word for word
    for bad in ({**sign(secret, "n1", "POST", path, body), "X-Gpub-Signature": "v1=" + "0" * 64},
                sign(secret, "n1", "POST", path, body, now=1),
                sign("not-the-secret", "n1", "POST", path, body),
                {"X-Gpub-Node": "n1"},
                {**sign(secret, "n1", "POST", path, body), "X-Gpub-Nonce": "x" * 65}):
        from_web, from_ingress = _call(web + path, body, bad), _call(ingress + path, body, bad)
        assert from_ingress[0] == 401 and from_ingress[1] == "application/problem+json"
        if "stale" in from_web[2]["detail"]:  # the seconds in the message move on between the two calls
            assert "stale" in from_ingress[2]["detail"]
        else:
            assert from_ingress == from_web
    unknown = sign(secret, "ghost", "POST", "/api/v1/agents/ghost/heartbeat", body)
    assert _call(ingress + "/api/v1/agents/ghost/heartbeat", body, unknown) == \
        _call(web + "/api/v1/agents/ghost/heartbeat", body, unknown)
    # what the lean path leaves to Django is answered as on the web server (here: a NUL in the path)
    nul = "/api/v1/agents/n1%00/heartbeat"
    assert _call(ingress + nul, body)[:2] == _call(web + nul, body)[:2] == (400, "application/problem+json")
    # the tenant API, the portal and the admin are not served on the agents' port
    for route in ("/api/v1/leases", "/", "/admin/"):
        status, content_type, problem = _call(ingress + route, method="GET")
        assert (status, content_type, problem["code"]) == (404, "application/problem+json", "not_found")


def test_agent_ingress_heartbeat_of_a_silent_node_brings_it_back(web_and_ingress):
    _web, ingress = web_and_ingress
    token = services.enrollment_token_create()
    node = services.node_enroll(node_id="quiet", token=token, address="http://127.0.0.1:9/n/quiet",
                                inventory={"gpus": []})
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(minutes=2))
    assert services.nodes_check_heartbeats() == 1
    assert Node.objects.get(pk=node.pk).status == "silent"
    path = "/api/v1/agents/quiet/heartbeat"
    body = b"{}"
    assert _call(ingress + path, body, sign(node.secret, "quiet", "POST", path, body))[0] == 200
    node.refresh_from_db()
    assert node.status == "ready" and node.silent_since is None and node.secret_used_at is not None
    assert AuditEvent.objects.filter(action="node.back", target="quiet").count() == 1


# -- a prefix (SCRIPT_NAME) must not open the tenant API or the portal on the agents' port (issue 27, item 8) --
TENANT_ROUTES = ("/api/v1/leases", "/api/v1/projects", "/api/v1/tokens", "/api/v1/schema", "/", "/leases/",
                 "/settings/tokens", "/admin/", "/accounts/login/", "/ops/fleet")
PREFIXES = ("/x", "/api", "/api/v1/agents", "/healthz", "/metrics", "/a/b/c")


def _wsgi_status(environ: dict) -> tuple[str, dict]:
    from config.agent_wsgi import application

    seen = {}

    def start_response(status, headers, exc_info=None):
        seen["status"], seen["headers"] = status, dict(headers)

    body = b"".join(application(environ, start_response))
    return seen["status"], {"content_type": seen["headers"].get("Content-Type"), "body": body}


@pytest.mark.parametrize("prefix", ("", *PREFIXES))
def test_agent_ingress_never_serves_a_tenant_or_portal_route_whatever_the_prefix(db, prefix):
    """In process, every SCRIPT_NAME (what gunicorn derives from a ``SCRIPT_NAME`` header or its environment):
    the route after the prefix decides, and a tenant or portal route is the ingress's own 404."""
    for route in TENANT_ROUTES:
        for method in ("GET", "POST"):
            environ = {"REQUEST_METHOD": method, "SCRIPT_NAME": prefix, "PATH_INFO": route, "QUERY_STRING": "",
                       "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8001", "HTTP_HOST": "127.0.0.1:8001",
                       "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(b""), "CONTENT_LENGTH": "0",
                       "HTTP_AUTHORIZATION": "Bearer gpub_x_y"}
            status, answer = _wsgi_status(environ)
            assert status.startswith("404") and answer["content_type"] == "application/problem+json", \
                (prefix, route, method, status)
            assert json.loads(answer["body"])["code"] == "not_found"


@pytest.fixture
def ingress_only(transactional_db):
    process, url = _gunicorn("config.agent_wsgi")
    yield url
    process.terminate()
    process.wait(20)


def test_agent_ingress_refuses_tenant_routes_behind_a_script_name_header(ingress_only, world):
    """Over HTTP through gunicorn, which takes ``SCRIPT_NAME`` from a header of a trusted peer (127.0.0.1 by
    default): with a valid token and any prefix, the tenant API and the portal stay 404 here, while an agent's
    route under the prefix is still the agents' (an unsigned heartbeat: 401)."""
    token = {"Authorization": f"Bearer {world.tokens['owner']}"}
    for prefix in PREFIXES:
        for route in TENANT_ROUTES:
            status, content_type, problem = _call(ingress_only + prefix + route, method="GET",
                                                  headers={**token, "SCRIPT_NAME": prefix})
            assert (status, content_type, problem["code"]) == (404, "application/problem+json", "not_found"), \
                (prefix, route, status)
    status, content_type, _ = _call(ingress_only + "/x/api/v1/agents/n1/heartbeat", b"{}", {"SCRIPT_NAME": "/x"})
    assert (status, content_type) == (401, "application/problem+json")
