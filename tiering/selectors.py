"""Reads of auto-tiering rows, always within the actor's tenant."""

from __future__ import annotations

from django.db.models import QuerySet

from core.errors import NotFound
from tenants.access import Actor, restrict
from tiering.models import Profile, ProfilingRun, TierAdvice, Workload


def workload_list(*, actor: Actor) -> QuerySet[Workload]:
    return restrict(Workload.objects.all(), actor).order_by("name")


def workload_get(*, actor: Actor, name: str) -> Workload:
    workload = restrict(Workload.objects.all(), actor).filter(name=name).first()
    if workload is None:
        raise NotFound(f"No workload named '{name}'.", field="name")
    return workload


def profile_list(*, workload: Workload) -> QuerySet[Profile]:
    return workload.profiles.order_by("slice_key", "provenance", "-measured_at")


def profiling_run_list(*, workload: Workload) -> QuerySet[ProfilingRun]:
    return (workload.profiling_runs.select_related("workload", "project")
            .prefetch_related("leases__profile").order_by("-started_at", "-id"))


def advice_list(*, actor: Actor, workload: Workload | None = None, open_only: bool = True) -> QuerySet[TierAdvice]:
    """The tenant's auto-tiering advice (open rows unless ``open_only`` is False), newest first."""
    rows = restrict(TierAdvice.objects.select_related("workload", "lease"), actor)
    if workload is not None:
        rows = rows.filter(workload=workload)
    return rows.filter(open=True) if open_only else rows
