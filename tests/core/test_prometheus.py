"""The one Prometheus client (core/prometheus.py) against a real HTTP server that answers as Prometheus's API does:
what it sends, what it returns, and that every kind of failure is one ``PrometheusError``."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from core.prometheus import Prometheus, PrometheusError


class _Api(BaseHTTPRequestHandler):
    answers: dict[str, tuple[int, bytes]] = {}
    seen: list[tuple[str, dict]] = []

    def do_GET(self):
        parts = urlsplit(self.path)
        self.seen.append((parts.path, {k: v[0] for k, v in parse_qs(parts.query).items()}))
        status, body = self.answers.get(parts.path, (404, b"not found"))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def api():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Api.answers, _Api.seen = {}, []
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _success(result) -> tuple[int, bytes]:
    return 200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def test_prometheus_query_sends_the_expression_and_time_and_returns_the_result(api):
    _, url = api
    row = {"metric": {"UUID": "GPU-1"}, "value": [1700000000, "0.5"]}
    _Api.answers["/api/v1/query"] = _success([row])
    assert Prometheus(url, timeout=2).query("DCGM_FI_DEV_GPU_UTIL", at=1700000000.25) == [row]
    assert _Api.seen == [("/api/v1/query", {"query": "DCGM_FI_DEV_GPU_UTIL", "time": "1700000000.250"})]


def test_prometheus_query_range_sends_the_window_as_given(api):
    _, url = api
    _Api.answers["/api/v1/query_range"] = _success([])
    assert Prometheus(url + "/", timeout=2).query_range("up", start=1700000000, end=1700003600, step="15") == []
    assert _Api.seen == [("/api/v1/query_range",
                          {"query": "up", "start": "1700000000", "end": "1700003600", "step": "15"})]


@pytest.mark.parametrize(
    "answer",
    [
        (503, b"unavailable"),  # an HTTP error
        (200, b"<html>not json</html>"),  # not Prometheus
        (200, json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"}).encode()),
        (200, json.dumps({"status": "success"}).encode()),  # no data
    ],
)
def test_prometheus_failure_is_one_error(api, answer):
    _, url = api
    _Api.answers["/api/v1/query"] = answer
    with pytest.raises(PrometheusError):
        Prometheus(url, timeout=2).query("up")


def test_prometheus_no_server_is_one_error(api):
    server, url = api
    server.shutdown()
    server.server_close()
    with pytest.raises(PrometheusError):
        Prometheus(url, timeout=1).query("up")


def test_prometheus_retries_a_proxy_error_when_asked(api):
    _, url = api
    _Api.answers["/api/v1/query"] = (502, b"bad gateway")
    with pytest.raises(PrometheusError):
        Prometheus(url, timeout=2, retries=2).query("up")
    assert len(_Api.seen) == 3  # the first try and two more
