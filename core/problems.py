"""Every API error as RFC 9457 ``application/problem+json``.

Body: ``type``, ``title``, ``status``, ``detail``, ``code``, ``field`` (the offending input, dotted for
nested fields, or null) and, for validation errors, ``errors``: every field with its messages.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.db import IntegrityError, InterfaceError, OperationalError
from django.http import Http404, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_default_handler

from core.errors import ApplicationError, TooManyRequests

logger = logging.getLogger(__name__)
PROBLEM_CONTENT_TYPE = "application/problem+json"
TYPE_BASE = "https://gpubroker.dev/problems/"
# what a client is told to wait before retrying while the database cannot be reached
RETRY_AFTER_SECONDS = 5
UNAVAILABLE_DETAIL = "The database cannot be reached; retry after a few seconds."


def database_unavailable(exc: BaseException | None) -> bool:
    """Whether ``exc`` says the database cannot be reached (refused, reset, shut down), not a bad query."""
    return isinstance(exc, OperationalError | InterfaceError)


def problem_body(
    *, status: int, title: str, detail: str, code: str, field: str | None = None, **extra: Any
) -> dict[str, Any]:
    body = {
        "type": TYPE_BASE + code,
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
        "field": field,
    }
    body.update(extra)
    return body


def _flatten(detail: Any, prefix: str = "") -> list[dict[str, str]]:
    """Turn DRF's nested error structure into ``[{"field", "message", "code"}]``."""
    if isinstance(detail, dict):
        out: list[dict[str, str]] = []
        for key, value in detail.items():
            if isinstance(key, int):
                out += _flatten(value, f"{prefix}[{key}]")
                continue
            name = "" if key in ("non_field_errors", "__all__") else str(key)
            out += _flatten(value, f"{prefix}.{name}" if prefix and name else (prefix or name))
        return out
    if isinstance(detail, list):
        out = []
        for index, value in enumerate(detail):
            if isinstance(value, dict | list) and not isinstance(value, str):
                out += _flatten(value, f"{prefix}[{index}]" if prefix else f"[{index}]")
            else:
                out += _flatten(value, prefix)
        return out
    return [{"field": prefix or None, "message": str(detail), "code": getattr(detail, "code", "invalid")}]


def _validation_problem(exc: drf_exceptions.ValidationError) -> dict[str, Any]:
    errors = _flatten(exc.detail)
    first = errors[0] if errors else {"field": None, "message": "Invalid input."}
    detail = f"{first['field']}: {first['message']}" if first["field"] else first["message"]
    return problem_body(
        status=400, title="Invalid input", detail=detail, code="invalid", field=first["field"], errors=errors
    )


def problem_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    headers: dict[str, str] = {}
    if isinstance(exc, ApplicationError):
        body = problem_body(
            status=exc.status, title=exc.title, detail=exc.message, code=exc.code, field=exc.field, **exc.extra
        )
        if isinstance(exc, TooManyRequests):
            headers = {"Retry-After": str(exc.retry_after_seconds)}
    elif isinstance(exc, drf_exceptions.ValidationError):
        body = _validation_problem(exc)
    elif isinstance(exc, drf_exceptions.ParseError):
        field = getattr(exc, "field", "body")
        detail = str(exc.detail) if str(exc.detail).startswith(f"{field}:") else f"{field}: {exc.detail}"
        body = problem_body(status=400, title="Malformed request body", detail=detail, code="parse_error",
                            field=field)
    elif isinstance(exc, RequestDataTooBig):
        body = problem_body(status=413, title="Request body too large", detail=f"body: {exc}",
                            code="request_too_large", field="body")
    elif database_unavailable(exc):
        logger.warning("database unavailable, answering 503", extra={"error": f"{type(exc).__name__}: {exc}"})
        body = problem_body(status=503, title="Service unavailable", detail=UNAVAILABLE_DETAIL, code="unavailable")
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    elif isinstance(exc, Http404 | drf_exceptions.NotFound):
        body = problem_body(status=404, title="Not found", detail="No such object.", code="not_found")
    elif isinstance(exc, DjangoPermissionDenied):
        body = problem_body(status=403, title="Permission denied", detail=str(exc) or "Permission denied.",
                            code="permission_denied")
    elif isinstance(exc, IntegrityError):
        # The database refused a write a racing request made impossible; nothing was written.
        constraint = getattr(getattr(exc.__cause__, "diag", None), "constraint_name", None)
        logger.info("integrity error mapped to 409", extra={"constraint": constraint})
        body = problem_body(
            status=409, title="Conflict", code="conflict",
            detail=f"The change conflicts with the current state ({constraint or 'database constraint'}).",
            constraint=constraint,
        )
    elif isinstance(exc, drf_exceptions.APIException):
        response = drf_default_handler(exc, context)
        if response is None:
            return None
        headers = {k: v for k, v in response.items() if k in ("WWW-Authenticate", "Retry-After", "Allow")}
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        code = exc.get_codes() if isinstance(exc.get_codes(), str) else exc.default_code
        body = problem_body(status=exc.status_code, title=_title(exc), detail=str(detail), code=code)
    else:
        return None
    return Response(body, status=body["status"], content_type=PROBLEM_CONTENT_TYPE, headers=headers)


def _title(exc: drf_exceptions.APIException) -> str:
    """A fixed title per kind of error; DRF's default details are templates ("{media_type}") or sentences."""
    titles = {415: "Unsupported media type", 429: "Too many requests", 406: "Not acceptable",
              405: "Method not allowed", 401: "Not authenticated", 403: "Permission denied"}
    return titles.get(exc.status_code) or str(exc.default_detail).rstrip(".")


def json_problem(request, status: int, title: str, code: str, detail: str, field: str | None = None,
                  headers: dict[str, str] | None = None) -> JsonResponse:
    """A problem+json answer outside DRF (Django's error handlers, the middleware that refuses NUL)."""
    response = JsonResponse(
        problem_body(status=status, title=title, detail=detail, code=code, field=field),
        status=status,
        content_type=PROBLEM_CONTENT_TYPE,
    )
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def error_page(request, *, status: int, title: str, message: str, headers: dict[str, str] | None = None):
    """The portal's error page: standalone HTML (no database, no session) with the same message."""
    response = HttpResponse(render_to_string("error.html", {"title": title, "message": message}), status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def handler400(request, exception=None):
    """Django's 400s (oversized bodies, bad form data seen by middleware): problem+json under /api/."""
    if isinstance(exception, RequestDataTooBig):
        status, title, code, detail = 413, "Request body too large", "request_too_large", f"body: {exception}"
    else:
        status, title, code, detail = 400, "Bad request", "bad_request", "The request could not be read."
    if request.path.startswith("/api/"):
        return json_problem(request, status, title, code, detail, field="body")
    return error_page(request, status=status, title=title, message=detail)


def handler404(request, exception=None):
    if request.path.startswith("/api/"):
        return json_problem(request, 404, "Not found", "not_found", f"No route or object at {request.path}.")
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def handler500(request):
    # Django calls this while handling the uncaught exception, so it is still in sys.exc_info().
    if database_unavailable(sys.exc_info()[1]):
        retry = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        if request.path.startswith("/api/"):
            return json_problem(request, 503, "Service unavailable", "unavailable", UNAVAILABLE_DETAIL,
                                 headers=retry)
        return error_page(request, status=503, title="Service unavailable", message=UNAVAILABLE_DETAIL,
                          headers=retry)
    if request.path.startswith("/api/"):
        return json_problem(request, 500, "Internal error", "internal_error",
                             "The server failed; the request id in X-Request-ID identifies it in the logs.")
    from django.views.defaults import server_error

    return server_error(request)
