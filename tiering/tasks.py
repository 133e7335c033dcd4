"""Celery tasks: thin wrappers over ``tiering.services``."""

from __future__ import annotations

from celery import shared_task

from tiering import services


@shared_task(name="tiering.model_retrain")
def model_retrain() -> dict:
    """Retrain the decision model on the profile database (periodic, Celery beat)."""
    record = services.model_retrain()
    if record is None:
        return {"trained": False, "reason": "too few profile rows"}
    return {"trained": True, "model": record.pk, "rows": record.rows, "validation_error": record.validation_error}
