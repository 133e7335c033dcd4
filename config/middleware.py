"""Request-scoped context: a request id (taken from ``X-Request-ID`` or generated) bound for logging,
echoed in the response, plus one access-log line per request with status and duration."""

from __future__ import annotations

import logging
import re
import time
import uuid

from config.logging import request_id_var, tenant_var, user_var

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
