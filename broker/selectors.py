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


def quota_usage(*, actor: Actor) -> dict[tuple[int, str], dict[str, int]]:
    """(project id, tier) → {"in_use": in-quota milli, "over": over-quota milli} of live allocations."""
    from django.db.models import Sum

    usage: dict[tuple[int, str], dict[str, int]] = {}
    rows = (restrict(Allocation.objects.filter(freed_at__isnull=True), actor)
            .values("lease__project_id", "tier", "preemptible").annotate(total=Sum("milli")))
    for row in rows:
        entry = usage.setdefault((row["lease__project_id"], row["tier"]), {"in_use": 0, "over": 0})
        entry["over" if row["preemptible"] else "in_use"] += row["total"]
    return usage


def offer_list(*, now=None) -> list[dict]:
    """Free capacity per GPU model: whole GPUs, MIG instances per profile, share milli (ready nodes only)."""
    from django.utils import timezone

    from broker.scheduler.state import ClusterState
    from broker.services import _snapshot
    from gpus.catalogue import model_get
    from gpus.mig import COMPUTE_SLICES, profiles_for

    cluster = ClusterState.from_snapshot(_snapshot(now or timezone.now()))
    offers: dict[str, dict] = {}
    for gpu in cluster.gpus.values():
        if cluster.nodes[gpu.gpu.node].node.cordoned:
            continue
        model = gpu.gpu.model
        offer = offers.setdefault(model, {
            "model": model, "memory_mib": model_get(model).memory_mib, "gpus": 0,
            "whole": {"gpus": 0, "free": 0}, "mig": {}, "share": {"gpus": 0, "free_milli": 0},
            "price_per_gpu_hour": None})
        offer["gpus"] += 1
        mode = gpu.gpu.mode.value
        if mode == "whole":
            offer["whole"]["gpus"] += 1
            offer["whole"]["free"] += int(gpu.fits_whole())
        elif mode == "shared":
            offer["share"]["gpus"] += 1
            offer["share"]["free_milli"] += gpu.free_milli
        else:
            for profile in profiles_for(model):
                if profile.shape.media_extensions:
                    continue
                # how many more of this profile fit, placed lowest start first on the current layout
                mask, compute, count = gpu.slot_mask, gpu.compute_used, 0
                width = (1 << profile.memory_slots) - 1
                for start in profile.starts:
                    if compute + profile.compute_slices <= COMPUTE_SLICES and not (mask >> start) & width:
                        mask |= width << start
                        compute += profile.compute_slices
                        count += 1
                entry = offer["mig"].setdefault(profile.name, {"profile": profile.name,
                                                               "memory_mib": profile.memory_mib, "free": 0})
                entry["free"] += count
    for offer in offers.values():
        offer["mig"] = sorted(offer["mig"].values(), key=lambda item: item["memory_mib"])
    return sorted(offers.values(), key=lambda item: item["model"])
