"""Celery tasks: thin wrappers over ``tiering.services``."""

from __future__ import annotations

from celery import shared_task

from core.task_registry import tasks_register
from tiering import services


@shared_task(name="tiering.model_retrain")
def model_retrain() -> dict:
    """Retrain the decision model on the profile database (periodic, Celery beat)."""
    record = services.model_retrain()
    if record is None:
        return {"trained": False, "reason": "too few profile rows"}
    return {"trained": True, "model": record.pk, "rows": record.rows, "validation_error": record.validation_error,
            "threshold": record.threshold}


@shared_task(name="tiering.profiling_advance")
def profiling_advance(run_id: int) -> str:
    """Close what is due in a profiling run; while it runs, ask again in a few seconds (idempotent)."""
    from tiering.profiler import profiling_advance as advance

    state = advance(run_id=run_id)
    if state == "running":
        profiling_advance.apply_async((run_id,), countdown=2)
    return state


@shared_task(name="tiering.profiling_advance_all")
def profiling_advance_all() -> int:
    """Periodic: every running profiling run advanced (a chain lost with a worker is picked up here)."""
    from tiering.models import ProfilingRun
    from tiering.profiler import profiling_advance as advance

    runs = list(ProfilingRun.objects.filter(state="running").values_list("pk", flat=True))
    for run_id in runs:
        advance(run_id=run_id)
    return len(runs)


@shared_task(name="tiering.advice_scan")
def advice_scan() -> dict:
    """Periodic: migration and quantization advice for the running leases whose workload is known."""
    from tiering.advice import advice_scan as scan

    return scan()


# the services send these by name (core.task_registry), without importing this module
tasks_register("tiering", model_retrain=model_retrain, profiling_advance=profiling_advance,
               profiling_advance_all=profiling_advance_all, advice_scan=advice_scan)
