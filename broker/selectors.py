"""Readers of leasing data; every tenant-facing query goes through ``tenants.access.restrict``."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from broker.choices import LeaseState
from broker.models import Allocation, Lease, LeaseEvent
from config.errors import NotFound, ValidationFailed
from tenants.access import Actor, restrict


def lease_list(*, actor: Actor, state: str = "", project: str = "") -> QuerySet[Lease]:
    queryset = restrict(Lease.objects.all(), actor).select_related("project").order_by("-requested_at", "-pk")
    if state:
        states = [s.strip() for s in state.split(",") if s.strip()]
        unknown = [s for s in states if s not in LeaseState.values]
        if unknown:
            raise ValidationFailed(f"Unknown state {unknown[0]!r}; states: {', '.join(LeaseState.values)}.",
                                   field="state")
        queryset = queryset.filter(state__in=states)
    if project:
        queryset = queryset.filter(project__slug=project)
    return queryset


def lease_get(*, actor: Actor, lease_id: int) -> Lease:
    live = Allocation.objects.select_related("gpu__node").order_by("pk")
    lease = (restrict(Lease.objects.all(), actor).select_related("project")
             .prefetch_related(Prefetch("allocations", queryset=live),
                               Prefetch("events", queryset=LeaseEvent.objects.order_by("at", "pk")))
             .filter(pk=lease_id).first())
    if lease is None:
        raise NotFound("No such lease.", field="id")
    return lease
