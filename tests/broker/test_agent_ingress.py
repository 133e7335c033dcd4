"""The agents' ingress (``config.agent_wsgi``), a gunicorn of its own beside the web server's, both real processes
sharing only PostgreSQL: the heartbeat it answers without Django's request cycle checks and records exactly what
the web server's view does, its refusals are the same problem+json, a nonce it accepted is refused by the web
server (and the other way round), what it does not take on itself goes to Django unchanged, and the tenant API
is not served there."""

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
from django.utils import timezone

from agent.signing import sign
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
