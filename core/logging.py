"""Structured logging: every record carries the request id, tenant and user of the work it belongs to.

The values live in context variables set by ``RequestContextMiddleware`` (web) and by Celery task
signals (workers), so a log line written anywhere below a view or task is attributable.
"""

from __future__ import annotations

import contextvars
import logging

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
tenant_var: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="-")
user_var: contextvars.ContextVar[str] = contextvars.ContextVar("user", default="-")


class RequestContextFilter(logging.Filter):
    """Adds ``request_id``, ``tenant`` and ``user`` attributes to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        record.tenant = tenant_var.get()
        record.user = user_var.get()
        return True
