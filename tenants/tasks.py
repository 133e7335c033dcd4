"""Celery tasks: thin wrappers over ``tenants.retention`` and ``tenants.offboarding``."""

from __future__ import annotations

from celery import shared_task

from core.task_registry import tasks_register
from tenants import retention


@shared_task(name="tenants.retention_apply")
def retention_apply() -> dict:
    """Periodic (Celery beat, ``RETENTION_APPLY_SECONDS``): purge what the retention policy says is too old;
    idempotent, returns what it removed."""
    return retention.retention_apply()


@shared_task(name="tenants.export_build", acks_late=True)
def export_build(export_id: int) -> str:
    """Build a requested tenant export (idempotent: an export already built or failed is left as it is)."""
    from tenants import offboarding

    return offboarding.tenant_export_build(export_id=export_id).state


tasks_register("tenants", retention_apply=retention_apply, export_build=export_build)
