"""Issue 13, item 4: a signed agent request is accepted once by the whole broker, not once per web
process. Two separate gunicorn processes share only PostgreSQL; the heartbeat accepted by the first is
refused by the second (and by the first again)."""

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
from broker.models import AgentNonce
from tests.support.processes import ROOT, free_port, test_database_url, wait_http


def _gunicorn() -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "DATABASE_URL": test_database_url(), "LOG_LEVEL": "ERROR"}
    process = subprocess.Popen([sys.executable, "-m", "gunicorn", "config.wsgi", "--bind", f"127.0.0.1:{port}",
                                "--workers", "1", "--log-level", "warning"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", process, timeout=60)
    return process, url


def _post(url: str, body: bytes, headers: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        assert error.headers["Content-Type"].startswith("application/problem+json")
        return error.code, json.loads(error.read())


@pytest.fixture
def two_web_processes(transactional_db):
    servers = [_gunicorn(), _gunicorn()]
    yield [url for _, url in servers]
    for process, _ in servers:
        process.terminate()
    for process, _ in servers:
        process.wait(20)


def test_agent_heartbeat_replayed_to_another_web_process_is_refused(two_web_processes):
    first, second = two_web_processes
    token = services.enrollment_token_create()
    node = services.node_enroll(node_id="n1", token=token, address="http://127.0.0.1:9/n/n1", inventory={"gpus": []})
    path = "/api/v1/agents/n1/heartbeat"
    body = json.dumps({"time": 1, "instances": []}).encode()
    headers = sign(node.secret, "n1", "POST", path, body)
    assert _post(first + path, body, headers)[0] == 200
    status, problem = _post(second + path, body, headers)
    assert status == 401 and "replayed" in problem["detail"]
    assert _post(first + path, body, headers)[0] == 401
    # a fresh signature is accepted by either process
    assert _post(second + path, body, sign(node.secret, "n1", "POST", path, body))[0] == 200
    # the periodic heartbeat check prunes nonces whose window has passed
    assert AgentNonce.objects.count() == 2
    services.nodes_check_heartbeats(now=timezone.now() + timedelta(minutes=11))
    assert AgentNonce.objects.count() == 0
