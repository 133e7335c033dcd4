"""Celery tasks of the capacity loop: thin, one service call each (STYLE.md)."""

from __future__ import annotations

from celery import shared_task

from capacity import services
from core.task_registry import tasks_register


@shared_task(name="capacity.plan_run", acks_late=True)
def plan_run() -> dict:
    """Periodic (``CAPACITY_PLAN_SECONDS``), and sent after a schedule cycle that left requests waiting for a
    mode an idle GPU could be switched to (``services.plan_on_wait``): snapshot → planner → adjustments recorded,
    auto ones applied."""
    return services.plan_run()


@shared_task(name="capacity.drains_run", acks_late=True)
def drains_run(adjustment: int | None = None) -> dict:
    """Sent by a schedule cycle's reclaim across modes (``services.mode_switch_for``) for the end of its leases'
    notice: the GPU is switched once they have left."""
    return services.drains_run(adjustment=adjustment)


# the services send them by name (core.task_registry): plan_on_wait would otherwise import this module back
tasks_register("capacity", plan_run=plan_run, drains_run=drains_run)
