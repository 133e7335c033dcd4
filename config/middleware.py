"""Request-scoped context: a request id (taken from ``X-Request-ID`` or generated) bound for logging,
echoed in the response, plus one access-log line per request with status and duration."""

from __future__ import annotations

import logging
import re
import time
import uuid

from django.http.multipartparser import MultiPartParserError

from core.logging import request_id_var, tenant_var, user_var

logger = logging.getLogger("gpubroker.access")
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class RequestContextMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        incoming = request.headers.get("X-Request-ID", "")
        request_id = incoming if _REQUEST_ID_RE.match(incoming) else uuid.uuid4().hex
        request.request_id = request_id
        tokens = [request_id_var.set(request_id), tenant_var.set("-"), user_var.set("-")]
        started = time.perf_counter()
        try:
            response = self.get_response(request)
            response["X-Request-ID"] = request_id
            if not request.path.startswith(("/healthz", "/static/")):
                # DRF authenticates inside the view; record who it found.
                user = getattr(request, "user", None)
                if user is not None and user.is_authenticated:
                    user_var.set(user.get_username())
                logger.info(
                    "%s %s %s",
                    request.method,
                    request.path,
                    response.status_code,
                    extra={
                        "method": request.method,
                        "path": request.path,
                        "status": response.status_code,
                        "duration_ms": round((time.perf_counter() - started) * 1000, 1),
                    },
                )
            return response
        finally:
            for var, token in zip((request_id_var, tenant_var, user_var), tokens, strict=True):
                var.reset(token)


class RejectNulMiddleware:
    """Refuse a NUL character in the path, a query parameter or a form field with 400 naming it.

    PostgreSQL text cannot hold NUL: psycopg raises ``ValueError`` for any query that carries one, which
    surfaced as a 500 wherever a parameter reaches a query. Checked once here so every route benefits;
    JSON bodies are checked by ``core.parsers.SafeJSONParser``. API routes answer problem+json, the
    portal an HTML page with the same message.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            field = self._offending_field(request)
            message = "NUL characters are not allowed."
        except MultiPartParserError as exc:
            field, message = "body", f"malformed multipart body ({exc})."
        if field is not None:
            from core.parsers import printable
            from core.problems import error_page, json_problem

            name = printable(field)
            detail = f"{name}: {message}"
            if request.path.startswith("/api/"):
                return json_problem(request, 400, "Invalid input", "invalid", detail, field=name)
            return error_page(request, status=400, title="Invalid input", message=detail)
        return self.get_response(request)

    @staticmethod
    def _offending_field(request) -> str | None:
        if "\x00" in request.path_info:
            return "path"
        for key, values in request.GET.lists():
            if "\x00" in key or any("\x00" in value for value in values):
                return key
        content_type = request.content_type or ""
        if request.method == "POST" and content_type in ("application/x-www-form-urlencoded",
                                                         "multipart/form-data"):
            for key, values in request.POST.lists():  # too large: RequestDataTooBig → handler400 (413)
                if "\x00" in key or any("\x00" in value for value in values if isinstance(value, str)):
                    return key
        return None
