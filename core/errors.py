"""The one tree of errors the application raises on purpose.

Each error knows its HTTP status, a stable machine-readable ``code``, a human-readable message and,
where one input was at fault, the ``field``. ``core.problems`` turns them into RFC 9457
``application/problem+json`` responses; portal views show the same message next to the field.
"""

from __future__ import annotations

from typing import Any


class ApplicationError(Exception):
    status = 400
    code = "application_error"
    title = "Request cannot be processed"

    def __init__(self, message: str, *, field: str | None = None, extra: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.extra = extra or {}


class ValidationFailed(ApplicationError):
    status = 400
    code = "invalid"
    title = "Invalid input"


class NotFound(ApplicationError):
    status = 404
    code = "not_found"
    title = "Not found"


class PermissionDenied(ApplicationError):
    status = 403
    code = "permission_denied"
    title = "Permission denied"


class TenantSuspended(ApplicationError):
    status = 403
    code = "tenant_suspended"
    title = "Tenant suspended"


class Conflict(ApplicationError):
    status = 409
    code = "conflict"
    title = "Conflict"


class QuotaExceeded(ApplicationError):
    """A request would take a project or tenant beyond its quota ``limit`` (or a quota change would
    break the tenant-level bound)."""

    status = 409
    code = "quota_exceeded"
    title = "Quota exceeded"


class LeaseStateConflict(ApplicationError):
    status = 409
    code = "lease_state_conflict"
    title = "Lease is not in a state that allows this"


class IdempotencyConflict(ApplicationError):
    status = 409
    code = "idempotency_conflict"
    title = "Idempotency key reused with a different request"


class TooManyRequests(ApplicationError):
    """Over a limit of concurrent or repeated work; answered 429 with ``Retry-After: retry_after_seconds``."""

    status = 429
    code = "too_many_requests"
    title = "Too many requests"

    def __init__(self, message: str, *, retry_after_seconds: int, field: str | None = None,
                 extra: dict[str, Any] | None = None):
        super().__init__(message, field=field, extra=extra)
        self.retry_after_seconds = max(1, int(retry_after_seconds))
