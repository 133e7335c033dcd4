"""Readers of leasing data; every tenant-facing query goes through ``tenants.access.restrict``."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db.models import Prefetch, QuerySet

from broker.choices import LeaseState
from broker.models import Allocation, Gpu, Lease, LeaseEvent, Node
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
    from gpus.catalogue import model_get
    from gpus.mig import COMPUTE_SLICES, profiles_for

    cluster = ClusterState.from_snapshot(scheduler_snapshot(now=now or timezone.now()))
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


def scheduler_snapshot(*, now: datetime):
    """What the scheduling core sees: nodes (silent or cordoned ones closed to new work), GPUs not lost,
    live allocations grouped by lease, quotas."""
    from broker.scheduler import Allocation as CoreAllocation
    from broker.scheduler import Gpu as CoreGpu
    from broker.scheduler import GpuMode as CoreMode
    from broker.scheduler import Node as CoreNode
    from broker.scheduler import QuotaSpec, Snapshot, TenantQuotaSpec, Unit
    from tenants.models import Quota, TenantQuota

    nodes = list(Node.objects.all())
    gpus = list(Gpu.objects.filter(lost_at__isnull=True, node__in=nodes).select_related("node"))
    core_nodes = tuple(CoreNode(n.node_id, cordoned=n.cordoned or n.status != "ready") for n in nodes)
    core_gpus = tuple(CoreGpu(f"g{g.pk}", g.node.node_id, g.model, CoreMode(g.mode), g.index, g.nvlink_domain)
                      for g in gpus)
    units: dict[int, list] = {}
    meta: dict[int, Allocation] = {}
    # capacity of preempted leases counts as free: it is promised to whoever reclaimed it, and a placement
    # on it before the holder has left fails on the exclusion constraint and waits for the next cycle
    live = (Allocation.objects.filter(freed_at__isnull=True, gpu__in=gpus).exclude(lease__state=LeaseState.PREEMPTED)
            .select_related("lease", "gpu"))
    for allocation in live:
        units.setdefault(allocation.lease_id, []).append(Unit(
            f"g{allocation.gpu_id}", allocation.milli, allocation.memory_mib, allocation.mig_profile,
            allocation.mig_start if allocation.mig_start is not None else -1))
        meta.setdefault(allocation.lease_id, allocation)
    gpu_node = {g.pk: g.node.node_id for g in gpus}
    core_allocations = []
    for lease_id, held in units.items():
        first = meta[lease_id]
        lease = first.lease
        core_allocations.append(CoreAllocation(
            id=str(lease_id), project=str(lease.project_id), tenant=str(lease.tenant_id), tier=first.tier,
            node=gpu_node[first.gpu_id], units=tuple(held), preemptible=first.preemptible,
            started_at=(lease.active_at or lease.queued_at or now).timestamp(), priority=lease.priority))
    quotas = tuple(QuotaSpec(str(q.project_id), str(q.project.tenant_id), q.tier, q.deserved_gpu_milli,
                             q.limit_gpu_milli, q.over_quota_weight)
                   for q in Quota.objects.select_related("project"))
    tenant_quotas = tuple(TenantQuotaSpec(str(q.tenant_id), q.tier, q.deserved_gpu_milli, q.limit_gpu_milli)
                          for q in TenantQuota.objects.all())
    return Snapshot(nodes=core_nodes, gpus=core_gpus, allocations=tuple(core_allocations), quotas=quotas,
                    tenant_quotas=tenant_quotas, min_runtime_seconds=settings.LEASE_MIN_RUNTIME_SECONDS)
