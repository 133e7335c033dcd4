"""Reads of pipelines, plans and splits, always inside the actor's tenant (another tenant's is a 404)."""

from __future__ import annotations

from django.db.models import Q

from core.errors import NotFound
from pipelines.models import ModelSplit, Pipeline, PipelinePlan
from tenants.access import Actor, restrict


def pipeline_list(*, actor: Actor):
    """The tenant's pipelines (``restrict``: a project-limited member or token sees its projects' only)."""
    return restrict(Pipeline.objects.select_related("project"), actor)


def pipeline_get(*, actor: Actor, pk: int) -> Pipeline:
    found = pipeline_list(actor=actor).filter(pk=pk).first()
    if found is None:
        raise NotFound("No such pipeline in this tenant.", field="id")
    return found


def plan_list(*, actor: Actor, pipeline: Pipeline):
    """The pipeline's plans, newest first."""
    return PipelinePlan.objects.filter(tenant=actor.tenant, pipeline=pipeline).order_by("-pk")


def model_split_list(*, actor: Actor):
    """The tenant's model splits; an actor limited to projects does not see one applied in another project
    (its leases are another project's)."""
    splits = ModelSplit.objects.filter(tenant=actor.tenant)
    if actor.project_ids is not None:
        splits = splits.filter(Q(project__isnull=True) | Q(project_id__in=sorted(actor.project_ids)))
    return splits.order_by("-pk")


def plan_get(*, actor: Actor, pipeline: Pipeline, pk: int) -> PipelinePlan:
    found = PipelinePlan.objects.filter(tenant=actor.tenant, pipeline=pipeline, pk=pk).first()
    if found is None:
        raise NotFound("No such plan of this pipeline.", field="plan_id")
    return found


def model_split_get(*, actor: Actor, pk: int) -> ModelSplit:
    found = model_split_list(actor=actor).filter(pk=pk).first()
    if found is None:
        raise NotFound("No such model split in this tenant.", field="id")
    return found


def free_whole_gpus(*, actor: Actor, project=None, models: tuple[str, ...] = (),
                    nodes: int = 0) -> list[dict]:
    """The split's candidate fleet "free now": whole GPUs free this moment on nodes that take work (as the schedule
    cycle sees them: ``broker.selectors.scheduler_snapshot``), of the models the planners have figures for, and
    as many per model as the tenant may lease now — each GPU of a split is one whole-GPU lease, so a model counts
    at most ``headroom // 1000`` GPUs, where the headroom is the quota limit left (the project's when ``project``
    is given, else the best of the tenant's projects; the tenant's own limit caps both; a model none of them has a
    quota for gives none). ``models`` keeps only those models; ``nodes`` keeps at most that many nodes, those that
    could give the most candidates within the quotas. Nothing is reserved: the cycle places the split's leases
    when they are applied. ``[{id, node, model, free_mib}]``, those nodes first."""
    from django.utils import timezone

    from broker.scheduler.state import ClusterState
    from broker.scheduler.types import GpuMode
    from broker.selectors import scheduler_snapshot
    from gpus.catalogue import model_get
    from gpus.performance import SPECS

    snapshot = scheduler_snapshot(now=timezone.now())
    cluster = ClusterState.from_snapshot(snapshot)
    tenant = str(actor.tenant.pk)
    projects = ([str(project.pk)] if project is not None else
                [str(pk) for pk in actor.tenant.projects.values_list("pk", flat=True)])
    headroom: dict[str, int] = {}
    for quota in snapshot.quotas:
        if quota.project in projects:
            used = sum(cluster.project_usage.get((quota.project, quota.tier), [0, 0]))
            headroom[quota.tier] = max(headroom.get(quota.tier, 0), quota.limit_milli - used)
    for quota in snapshot.tenant_quotas:
        if quota.tenant == tenant and quota.tier in headroom:
            used = sum(cluster.tenant_usage.get((tenant, quota.tier), [0, 0]))
            headroom[quota.tier] = min(headroom[quota.tier], quota.limit_milli - used)
    by_node: dict[str, list] = {}
    for gpu in cluster.gpus.values():
        core = gpu.gpu
        if (core.mode != GpuMode.WHOLE or core.closed or cluster.nodes[core.node].node.cordoned
                or core.model not in SPECS or (models and core.model not in models) or not gpu.fits_whole()):
            continue
        by_node.setdefault(core.node, []).append(core)
    left = {tier: max(0, room) // 1000 for tier, room in headroom.items()}

    def usable(gpus: list) -> int:  # what the node could give alone, within the quotas
        per_model: dict[str, int] = {}
        for core in gpus:
            per_model[core.model] = per_model.get(core.model, 0) + 1
        return sum(min(count, left.get(model, 0)) for model, count in per_model.items())

    ordered = sorted(by_node.items(), key=lambda item: (-usable(item[1]), item[0]))
    if nodes:
        ordered = ordered[:nodes]
    found = []
    for node, gpus in ordered:
        for core in sorted(gpus, key=lambda g: g.index):
            if left.get(core.model, 0) < 1:
                continue
            left[core.model] -= 1
            found.append({"id": f"{node}/gpu{core.index}", "node": node, "model": core.model,
                          "free_mib": model_get(core.model).memory_mib})
    return found


def tier_node_size(model: str) -> int:
    """How many GPUs of ``model`` the fleet's nodes hold (the most on one node), 8 when the fleet has none (an
    HGX-style 8-GPU node): a split planned "on a tier" packs its hypothetical GPUs per node so."""
    from collections import Counter

    from broker.models import Gpu

    per_node = Counter(Gpu.objects.filter(model=model, lost_at__isnull=True).values_list("node_id", flat=True))
    return max(per_node.values(), default=8)


def nodes_holding(models: set[str]) -> dict[str, set[str]]:
    """GPU model -> the ids of the nodes holding a GPU of it (not lost, not released by staff)."""
    from broker.models import Gpu

    found: dict[str, set[str]] = {}
    for model, node_id in (Gpu.objects.filter(model__in=models, released_at__isnull=True, lost_at__isnull=True)
                           .values_list("model", "node__node_id")):
        found.setdefault(model, set()).add(node_id)
    return found
