"""The agents' ingress: the WSGI application of the node agents' own web server (``gunicorn config.agent_wsgi``).

Heartbeats (1,000 nodes every 15 s are 67 requests a second), workload reports and enrollments come here, to
processes of their own, so that they never share the tenant API's request workers, threads and GIL
(docs/operations.md, "The agents' ingress"; ``make run`` starts it on ``PORT + 1``, the image's ``agents``
role). It answers only what an agent calls (``/api/v1/agents/...``), the health probes and ``/metrics``;
everything else is 404 here (the tenant API, the portal and the admin are the web server's), whatever prefix
(``SCRIPT_NAME``) a request comes with: the route after the prefix decides.

The usual heartbeat (``POST /api/v1/agents/<node>/heartbeat``, a node id of the enrollment's alphabet, no
query, a body within ``DATA_UPLOAD_MAX_MEMORY_SIZE``, an allowed Host) is answered here without Django's
request cycle: no middleware (sessions, CSRF, messages, tenant lookup), no URL resolution, no DRF request,
throttle or response rendering. What it does is ``broker.services.node_heartbeat_signed``, the same service
the DRF view calls: the signature, timestamp window and nonce (claimed in PostgreSQL, so a replay is refused
by every process) are checked exactly as there. Anything else, and any request this path is not sure of,
goes to Django's full handler unchanged, so that every other answer (problem+json for bad input, 413, 400 on
a bad Host) is the one the single-port server gives.

No request budget here: DRF's per-address throttle (a pickled history list in the cache, read and written on
each request) kept 1,000 nodes behind one address from heartbeating at all past 6,000 a minute, and a
heartbeat that is not signed with a node's secret costs one indexed read and an HMAC, about what the
throttle's own round trips cost. Keep this port on the agents' network (docs/security.md).
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import time
import uuid

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_application = get_wsgi_application()

from django.conf import settings  # noqa: E402  (after the application: settings configured)
from django.db import close_old_connections  # noqa: E402
from django.http.request import split_domain_port, validate_host  # noqa: E402

from broker.services.nodes import node_heartbeat_signed  # noqa: E402
from core.errors import ApplicationError  # noqa: E402
from core.problems import RETRY_AFTER_SECONDS, UNAVAILABLE_DETAIL, database_unavailable, problem_body  # noqa: E402
from observability import metrics  # noqa: E402

logger = logging.getLogger("gpubroker.access")
errors = logging.getLogger(__name__)

AGENTS = "/api/v1/agents/"
OWN = ("/healthz", "/readyz", "/metrics")  # the probes, and this process's counters (bearer METRICS_TOKEN)
HEARTBEAT = re.compile(r"/api/v1/agents/([A-Za-z0-9][A-Za-z0-9._-]{0,99})/heartbeat")  # EnrollInput's node_id
ROUTE = "/api/v1/agents/<str:node_id>/heartbeat"  # the label the web server's metrics give it
REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
SIGNED = {"X-Gpub-Node": "HTTP_X_GPUB_NODE", "X-Gpub-Timestamp": "HTTP_X_GPUB_TIMESTAMP",
          "X-Gpub-Nonce": "HTTP_X_GPUB_NONCE", "X-Gpub-Signature": "HTTP_X_GPUB_SIGNATURE"}
STATUS = {200: "200 OK", 400: "400 Bad Request", 401: "401 Unauthorized", 404: "404 Not Found", 409: "409 Conflict",
          500: "500 Internal Server Error", 503: "503 Service Unavailable"}


def _answer(start_response, status: int, body: dict, request_id: str, content_type: str = "application/json",
            headers: tuple = ()) -> list[bytes]:
    raw = json.dumps(body).encode()
    start_response(STATUS[status], [("Content-Type", content_type), ("Content-Length", str(len(raw))),
                                    ("X-Request-ID", request_id), ("X-Content-Type-Options", "nosniff"), *headers])
    return [raw]


def _problem(start_response, status: int, title: str, code: str, detail: str, request_id: str,
             headers: tuple = ()) -> list[bytes]:
    return _answer(start_response, status, problem_body(status=status, title=title, detail=detail, code=code),
                   request_id, "application/problem+json", headers)


def _host_allowed(environ) -> bool:
    """The Host check Django's CommonMiddleware makes (``get_host``); False sends the request to Django, which
    answers it as it does on the web server (or accepts it where this check is stricter)."""
    if settings.USE_X_FORWARDED_HOST and "HTTP_X_FORWARDED_HOST" in environ:
        return False
    host = environ.get("HTTP_HOST") or environ.get("SERVER_NAME", "")
    domain, _port = split_domain_port(host)
    return bool(domain) and validate_host(domain, settings.ALLOWED_HOSTS)


def _to_django(environ, start_response, body: bytes | None = None):
    if body is not None:  # already read here: Django reads it again from the start
        environ["wsgi.input"] = io.BytesIO(body)
    return django_application(environ, start_response)


def heartbeat(environ, start_response, node_id: str):
    """``node_heartbeat_signed`` and its answer, as ``AgentHeartbeatApi`` gives them."""
    length = environ.get("CONTENT_LENGTH") or "0"
    if (not (length.isascii() and length.isdigit()) or int(length) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            or environ.get("QUERY_STRING") or not _host_allowed(environ)):
        return _to_django(environ, start_response)
    started = time.perf_counter()
    incoming = environ.get("HTTP_X_REQUEST_ID", "")
    request_id = incoming if REQUEST_ID.match(incoming) else uuid.uuid4().hex
    body = environ["wsgi.input"].read(int(length)) if length != "0" else b""
    headers = {name: environ.get(key, "") for name, key in SIGNED.items()}
    close_old_connections()  # as Django does when a request starts and ends (CONN_MAX_AGE, broken connections)
    try:
        node_heartbeat_signed(node_id=node_id, headers=headers, method="POST", path=environ["PATH_INFO"], query="",
                              body=body)
        status = 200
        answer = _answer(start_response, 200, {"heartbeat_seconds": settings.AGENT_HEARTBEAT_SECONDS}, request_id)
    except ApplicationError as error:  # AgentUnauthenticated: 401, the body the web server's handler gives
        status = error.status
        answer = _answer(start_response, status, problem_body(status=status, title=error.title, detail=error.message,
                                                              code=error.code, field=error.field, **error.extra),
                         request_id, "application/problem+json")
    except Exception as error:  # noqa: BLE001 - answered as the web server answers it
        if database_unavailable(error):
            errors.warning("database unavailable, answering 503", extra={"error": f"{type(error).__name__}: {error}"})
            status = 503
            answer = _problem(start_response, 503, "Service unavailable", "unavailable", UNAVAILABLE_DETAIL,
                              request_id, (("Retry-After", str(RETRY_AFTER_SECONDS)),))
        else:
            errors.exception("heartbeat of %s failed", node_id)
            status = 500
            answer = _problem(start_response, 500, "Internal server error", "server_error",
                              "The server failed to answer; the error was logged.", request_id)
    finally:
        close_old_connections()
    metrics.HTTP_REQUESTS.labels(ROUTE, "POST", str(status)).inc()
    metrics.HTTP_DURATION.labels(ROUTE, "POST").observe(time.perf_counter() - started)
    if logger.isEnabledFor(logging.INFO):
        logger.info("POST %s %s", environ["PATH_INFO"], status, extra={
            "method": "POST", "path": environ["PATH_INFO"], "status": status,
            "duration_ms": round((time.perf_counter() - started) * 1000, 1)})
    return answer


def application(environ, start_response):
    # PATH_INFO is the path after the prefix (SCRIPT_NAME), which is the path Django resolves: the allow-list
    # applies to it whatever the prefix, which gunicorn also takes from a ``SCRIPT_NAME`` request header.
    path = environ.get("PATH_INFO", "")
    if not path.startswith(AGENTS) and path not in OWN:
        return _problem(start_response, 404, "Not found", "not_found",
                        "This is the agents' ingress: it serves /api/v1/agents/ only (the API is on the web server).",
                        uuid.uuid4().hex)
    if environ.get("SCRIPT_NAME"):  # mounted under a prefix: signatures cover the full path, Django's handler
        return django_application(environ, start_response)  # builds it (request.path)
    match = HEARTBEAT.fullmatch(path)
    if match is not None and environ.get("REQUEST_METHOD") == "POST":
        return heartbeat(environ, start_response, match.group(1))
    return django_application(environ, start_response)
