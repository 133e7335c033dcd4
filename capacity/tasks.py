"""Celery tasks of the capacity loop: thin, one service call each (STYLE.md)."""

from __future__ import annotations

from celery import shared_task

from capacity import services


@shared_task(name="capacity.plan_run", acks_late=True)
def plan_run() -> dict:
    """Periodic (``CAPACITY_PLAN_SECONDS``): snapshot → planner → adjustments recorded, auto ones applied."""
    return services.plan_run()
