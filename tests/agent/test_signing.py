"""Every /v1 request must be signed: unsigned, forged, stale, replayed or foreign requests get 401 and
change nothing."""

import json
import time
import urllib.error
import urllib.request

import pytest

from agent.protocol import WINDOW, NonceCache, SignatureError, sign, verify
from tests.support.agents import SECRET, gpu_of, snapshot_of


def send(agent, method, path, body=b"", headers=None):
    request = urllib.request.Request(agent.url + path, data=body or None, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def create_body(client) -> bytes:
    gpu = gpu_of(client.inventory(), "A100-80GB", "whole")
    return json.dumps({"kind": "whole", "gpu": gpu["uuid"]}).encode()


def test_unsigned_request_is_refused(agent, client):
    before = snapshot_of(client)
    status, problem = send(agent, "PUT", "/v1/instances/x1", create_body(client), {"Content-Type": "application/json"})
    assert status == 401 and "unsigned" in problem["detail"]
    assert snapshot_of(client) == before


@pytest.mark.parametrize(("case", "words"), [
    ("wrong secret", "bad signature"),
    ("other body", "bad signature"),
    ("other path", "bad signature"),
    ("other method", "bad signature"),
    ("stale", "stale request"),
    ("future", "stale request"),
    ("other node", "unknown node"),
    ("bad timestamp", "unix seconds"),
])
def test_forged_or_stale_requests_are_refused_and_change_nothing(agent, client, case, words):
    body = create_body(client)
    path = "/v1/instances/x1"
    secret, node, method, signed_path, signed_body, now = SECRET, agent.node_id, "PUT", path, body, time.time()
    if case == "wrong secret":
        secret = "not-the-secret"
    elif case == "other body":
        signed_body = body.replace(b"whole", b"share")
    elif case == "other path":
        signed_path = "/v1/instances/x2"
    elif case == "other method":
        method = "DELETE"
    elif case == "stale":  # a minute beyond the window: the request's own transit cannot bring it back inside
        now -= WINDOW + 60
    elif case == "future":  # (301 s ahead was accepted once in CI: the agent read its clock over a second later)
        now += WINDOW + 60
    elif case == "other node":
        node = "node-2"
    headers = sign(secret, node, method, signed_path, signed_body, now=now)
    if case == "bad timestamp":
        headers["X-Gpub-Timestamp"] = "yesterday"
    before = snapshot_of(client)
    status, problem = send(agent, "PUT", path, body, {**headers, "Content-Type": "application/json"})
    assert status == 401, problem
    assert words in problem["detail"]
    assert snapshot_of(client) == before


def test_a_replayed_request_is_refused(agent, client):
    body = create_body(client)
    headers = {**sign(SECRET, agent.node_id, "PUT", "/v1/instances/r1", body), "Content-Type": "application/json"}
    assert send(agent, "PUT", "/v1/instances/r1", body, headers)[0] == 201
    client.destroy("r1")
    status, problem = send(agent, "PUT", "/v1/instances/r1", body, headers)  # the captured request again
    assert status == 401 and "replayed" in problem["detail"]
    assert client.inventory()["instances"] == []


def test_metrics_and_healthz_are_open_but_read_only(agent):
    assert send(agent, "GET", "/healthz")[0] == 200
    assert send(agent, "POST", "/healthz")[0] == 405


def test_verify_unit_cases():
    nonces = NonceCache()
    headers = sign("s", "n", "GET", "/v1/inventory", b"", now=1000.0, nonce="abc")
    assert verify(headers, "GET", "/v1/inventory", "", b"", lambda n: "s", nonces, now=1000.0) == "n"
    with pytest.raises(SignatureError, match="replayed"):
        verify(headers, "GET", "/v1/inventory", "", b"", lambda n: "s", nonces, now=1001.0)
    other = sign("s", "n", "GET", "/v1/inventory", b"", query="a=1", now=1000.0)
    with pytest.raises(SignatureError, match="bad signature"):
        verify(other, "GET", "/v1/inventory", "a=2", b"", lambda n: "s", nonces, now=1000.0)


def test_nonce_cache_forgets_only_what_is_outside_the_window():
    cache = NonceCache(limit=3)
    assert cache.add("a", 0) and not cache.add("a", 1)
    assert cache.add("b", 1) and cache.add("c", 2) and cache.add("d", 3)  # over the limit: "a" is dropped
    assert cache.add("a", 4)
