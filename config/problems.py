"""Every API error as RFC 9457 ``application/problem+json``.

Body: ``type``, ``title``, ``status``, ``detail``, ``code``, ``field`` (the offending input, dotted for
nested fields, or null) and, for validation errors, ``errors``: every field with its messages.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import IntegrityError
from django.http import Http404, JsonResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_default_handler

from config.errors import ApplicationError

logger = logging.getLogger(__name__)
PROBLEM_CONTENT_TYPE = "application/problem+json"
TYPE_BASE = "https://gpubroker.dev/problems/"


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
    elif isinstance(exc, drf_exceptions.ValidationError):
        body = _validation_problem(exc)
    elif isinstance(exc, drf_exceptions.ParseError):
        body = problem_body(
            status=400, title="Malformed request body", detail=f"body: {exc.detail}", code="parse_error", field="body"
        )
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
        body = problem_body(
            status=exc.status_code, title=str(exc.default_detail).rstrip("."), detail=str(detail), code=code
        )
    else:
        return None
    return Response(body, status=body["status"], content_type=PROBLEM_CONTENT_TYPE, headers=headers)


def _json_problem(request, status: int, title: str, code: str, detail: str) -> JsonResponse:
    return JsonResponse(
        problem_body(status=status, title=title, detail=detail, code=code),
        status=status,
        content_type=PROBLEM_CONTENT_TYPE,
    )


def handler404(request, exception=None):
    if request.path.startswith("/api/"):
        return _json_problem(request, 404, "Not found", "not_found", f"No route or object at {request.path}.")
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def handler500(request):
    if request.path.startswith("/api/"):
        return _json_problem(request, 500, "Internal error", "internal_error",
                             "The server failed; the request id in X-Request-ID identifies it in the logs.")
    from django.views.defaults import server_error

    return server_error(request)
