"""gunicorn settings (``gunicorn -c python:config.gunicorn config.wsgi``), used by make run, the image and the
manifests. With ``PROMETHEUS_MULTIPROC_DIR``, a worker that exits has its live gauges removed from the
metrics folder (prometheus_client's multi-process mode); its counters stay, as counters must. Each worker learns
its thread count as ``WEB_THREADS`` before it loads Django, so the settings derived from it (how many log follows
may wait in one process, ``WORKLOAD_LOG_FOLLOW_WAITERS``) fit the threads it really has.

Requests gunicorn refuses before the application sees them (a request line past ``limit_request_line``: 414;
more than ``limit_request_fields`` header fields or one past ``limit_request_field_size``: 431; a malformed
request line or header: 400) are answered as problem+json, like every error of the application, instead of
gunicorn's HTML page: ``write_problem`` takes the place of ``gunicorn.util.write_error``, the one function
gunicorn's workers answer those with. The OpenAPI document lists 414 and 431 on every operation.
"""

from __future__ import annotations

import json
import os

from gunicorn import util

# core.problems.TYPE_BASE (not imported: this module is read by gunicorn's master before Django is set up)
PROBLEM_TYPE_BASE = "https://gpubroker.dev/problems/"
_CODES = {400: "bad_request", 403: "forbidden", 414: "uri_too_long", 417: "expectation_failed",
          431: "header_fields_too_large", 500: "internal_error", 501: "not_implemented"}

# gunicorn's defaults, written here so that they are named where the 414 and 431 they cause are documented
limit_request_line = 4094
limit_request_fields = 100
limit_request_field_size = 8190


def write_problem(sock, status_int: int, reason: str, mesg: str) -> None:
    """gunicorn's refusal ``status_int reason`` (``mesg`` says why) as an RFC 9457 problem; the connection closes."""
    code = _CODES.get(status_int, "bad_request" if status_int < 500 else "internal_error")
    body = json.dumps({"type": PROBLEM_TYPE_BASE + code, "title": reason, "status": status_int,
                       "detail": mesg or reason, "code": code, "field": None}).encode()
    head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/problem+json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    util.write_nonblock(sock, head.encode("latin-1") + body)


util.write_error = write_problem


def child_exit(server, worker):
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)


def post_fork(server, worker):
    os.environ["WEB_THREADS"] = str(worker.cfg.threads)
