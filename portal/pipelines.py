"""Pipelines and model splits in the portal. ``/pipelines/`` lists the tenant's pipelines and splits;
``/pipelines/<id>`` shows a pipeline's stages as a graph (server-rendered SVG, laid out here: no script, no CDN)
with the slice, batch and instances each stage got in the chosen plan, and how the plan split the SLO over the
stages; buttons plan it, apply the plan (its stages leased as one lease group) and release it.
``/model-splits/<id>`` shows the layers coloured by the GPU that runs them and a memory bar per GPU, with apply
(in a project) and release.

Reads go through ``pipelines.selectors`` (another tenant's pipeline or split is 404), writes through one
``pipelines.services`` function each; a refusal is the service's own message."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect, render

from core.errors import ApplicationError
from core.parsers import MAX_ID, parse_integer
from pipelines import selectors, services
from pipelines.models import ModelSplit, PipelinePlan, PlanState
from portal.views import TenantView
from tenants.models import Project

# colours of the GPUs of a split (and of nothing else): distinct, readable on white, cycled past eight
PALETTE = ("#2563eb", "#d97706", "#059669", "#dc2626", "#7c3aed", "#0891b2", "#c026d3", "#65a30d")
NODE_W, NODE_H, GAP_X, GAP_Y, PAD = 220, 64, 56, 24, 12


# -- presenters: everything the templates show, computed here ---------------------------------------------
def pipeline_graph(pipeline, plan: PipelinePlan | None) -> dict:
    """Stages placed in columns by their depth (the longest chain of edges before them), rows in the order
    given; an edge is a path from the right of one box to the left of the next. Each box names its stage and,
    once planned, the slice, batch and instances it got and its share of the SLO."""
    names = [stage["name"] for stage in pipeline.stages]
    preds = {name: [a for a, b in pipeline.edges if b == name] for name in names}
    depth: dict[str, int] = {}

    def depth_of(name: str, seen: frozenset = frozenset()) -> int:
        if name not in depth:
            depth[name] = 1 + max((depth_of(p, seen | {name}) for p in preds[name] if p not in seen), default=-1)
        return depth[name]

    for name in names:
        depth_of(name)
    chosen = {row["stage"]: row for row in (plan.result.get("stages", []) if plan else [])}
    rows_in: dict[int, int] = {}
    boxes = {}
    for index, stage in enumerate(pipeline.stages):
        column = depth[stage["name"]]
        row = rows_in.get(column, 0)
        rows_in[column] = row + 1
        x, y = PAD + column * (NODE_W + GAP_X), PAD + row * (NODE_H + GAP_Y)
        pick = chosen.get(stage["name"])
        model = stage.get("architecture") or f"{len(stage.get('profile', []))} measured rows"
        boxes[stage["name"]] = {
            "x": x, "y": y, "name": stage["name"], "planned": bool(pick), "index": index,
            "slice": pick["slice"] if pick else model,
            "detail": (f"batch {pick['batch']} × {pick['instances']} · {pick['latency_ms']:.1f} of "
                       f"{pick['budget_ms']:.1f} ms" if pick else "not planned yet")}
    edges = []
    for a, b in pipeline.edges:
        if a in boxes and b in boxes:
            x1, y1 = boxes[a]["x"] + NODE_W, boxes[a]["y"] + NODE_H // 2
            x2, y2 = boxes[b]["x"], boxes[b]["y"] + NODE_H // 2
            middle = (x1 + x2) // 2
            edges.append({"d": f"M{x1},{y1} C{middle},{y1} {middle},{y2} {x2 - 6},{y2}", "label": f"{a} → {b}"})
    width = PAD * 2 + (max(depth.values(), default=0) + 1) * (NODE_W + GAP_X) - GAP_X
    height = PAD * 2 + max(rows_in.values(), default=1) * (NODE_H + GAP_Y) - GAP_Y
    return {"boxes": list(boxes.values()), "edges": edges, "width": width, "height": height,
            "node_w": NODE_W, "node_h": NODE_H}


def slo_split(plan: PipelinePlan | None) -> list[dict]:
    """The plan's SLO split as bar segments: each group of stages with the part of the SLO it was given (a
    percentage of the SLO) and what its plan uses of that part (a percentage of the part)."""
    if plan is None or not plan.result.get("split"):
        return []
    slo = plan.result.get("slo_ms") or 1.0
    return [{"stages": ", ".join(group["stages"]), "share_ms": group["share_ms"], "budget_ms": group["budget_ms"],
             "used_ms": group["used_ms"], "share_pct": round(100 * group["budget_ms"] / slo, 2),
             "used_pct": round(100 * min(group["used_ms"], group["budget_ms"]) / max(group["budget_ms"], 1e-9), 2)}
            for group in plan.result["split"]]


def split_view(split: ModelSplit) -> dict:
    """Layers as a strip of cells coloured by their GPU (width by parameters, at least a sliver), and a memory
    bar per GPU: what the group holds of the memory that was free, the rest idle."""
    groups = split.result.get("groups", [])
    colour_of = {g["gpu"]: PALETTE[i % len(PALETTE)] for i, g in enumerate(groups)}
    owner = {}
    for group in groups:
        for index in range(group["first"], group["last"] + 1):
            owner[index] = group["gpu"]
    total = sum(max(layer["params"], 1) for layer in split.layers) or 1
    cells = [{"name": layer["name"], "index": index, "gpu": owner.get(index, ""),
              "colour": colour_of.get(owner.get(index, ""), "#9ca3af"),
              "pct": max(round(100 * max(layer["params"], 1) / total, 3), 0.4)}
             for index, layer in enumerate(split.layers)]
    bars = [{"gpu": g["gpu"], "node": g["node"], "model": g["model"], "colour": colour_of[g["gpu"]],
             "first": g["first"], "last": g["last"], "memory_mib": g["memory_mib"], "free_mib": g["free_mib"],
             "idle_mib": g["idle_mib"], "compute_ms": g["compute_ms"], "transfer_in_ms": g["transfer_in_ms"],
             "used_pct": round(100 * g["memory_mib"] / max(g["free_mib"], 1), 2)} for g in groups]
    baselines = [{"method": name, "latency_ms": b.get("latency_ms"), "idle_mib": b.get("idle_mib"),
                  "feasible": b.get("feasible")} for name, b in split.result.get("baselines", {}).items()]
    return {"cells": cells, "bars": bars, "baselines": baselines}


def _plan_of(request, actor, pipeline) -> PipelinePlan | None:
    """The plan asked for (``?plan=``), else the latest."""
    wanted = request.GET.get("plan", "")
    plans = selectors.plan_list(actor=actor, pipeline=pipeline)
    if wanted:
        return plans.filter(pk=parse_integer(wanted, field="plan", low=1, high=MAX_ID)).first()
    return plans.first()


# -- views ----------------------------------------------------------------------------------------------------
class PipelineListView(TenantView):
    template_name = "portal/pipelines.html"

    def get(self, request):
        pipelines = list(selectors.pipeline_list(actor=self.actor)[:100])
        splits = list(selectors.model_split_list(actor=self.actor)[:100])
        from gpus.layers import layered
        from pipelines.api.serializers import TIERS

        return render(request, self.template_name, {
            "pipelines": pipelines, "splits": splits, "can_use": self.actor.can("use"),
            "architectures": layered(), "tiers": TIERS,
            "projects": Project.objects.filter(tenant=self.actor.tenant).order_by("slug")})


class ModelSplitCreateView(TenantView):
    """``POST /model-splits/new``: a catalogue architecture split over a candidate fleet chosen as the API's
    ``candidates`` — the GPUs free now within the tenant's quotas (optionally in one project, of one model), or
    ``count`` GPUs of a tier — through ``services.model_split_create``; its error, naming the field, comes back as a
    message."""

    http_method_names = ["post"]

    def required_action(self, request) -> str:
        return "use"

    def post(self, request):
        from portal.forms import number

        data = request.POST
        if data.get("source") == "tier":
            candidates = {"tier": data.get("tier", ""), "count": number(data.get("count"))}
            if (data.get("per_node") or "").strip():
                candidates["per_node"] = number(data.get("per_node"))
        else:
            candidates = {"free": True, **({"project": data["project"]} if data.get("project") else {}),
                          **({"models": [data["model"]]} if data.get("model") else {})}
        try:
            split = services.model_split_create(actor=self.actor, architecture_name=data.get("architecture", ""),
                                                batch=number(data.get("batch") or "1"), candidates=candidates)
        except ApplicationError as refused:
            messages.error(request, f"{refused.field}: {refused.message}" if refused.field else refused.message)
            return redirect("portal:pipelines")
        messages.success(request, f"Split {split.pk} planned over {len(split.gpus)} candidate GPUs.")
        return redirect("portal:model-split", pk=split.pk)


class PipelineDetailView(TenantView):
    template_name = "portal/pipeline_detail.html"

    def get(self, request, pk: int):
        pipeline = selectors.pipeline_get(actor=self.actor, pk=pk)
        plan = _plan_of(request, self.actor, pipeline)
        leases = list(plan.leases.select_related("lease").order_by("id")) if plan else []
        return render(request, self.template_name, {
            "pipeline": pipeline, "plan": plan, "graph": pipeline_graph(pipeline, plan), "split": slo_split(plan),
            "leases": leases, "plans": selectors.plan_list(actor=self.actor, pipeline=pipeline)[:20],
            "can_use": self.actor.can("use"), "can_release": self.actor.can("release")})


class PipelinePlanView(TenantView):
    """``POST /pipelines/<id>/plan``: plan with the method chosen (ESG by default)."""

    http_method_names = ["post"]
    write_action = "use"

    def post(self, request, pk: int):
        pipeline = selectors.pipeline_get(actor=self.actor, pk=pk)
        try:
            plan = services.plan_create(actor=self.actor, pipeline=pipeline,
                                        method=request.POST.get("method", "esg") or "esg")
        except ApplicationError as refused:
            messages.error(request, refused.message)
            return redirect("portal:pipeline", pk=pipeline.pk)
        messages.success(request, f"Planned with {plan.method}: "
                         + ("meets the SLO." if plan.feasible else plan.result.get("reason", "does not meet the SLO.")))
        return redirect(f"/pipelines/{pipeline.pk}?plan={plan.pk}")


class PlanActionView(TenantView):
    """``POST /pipelines/<id>/plans/<plan>/apply`` and ``…/release``."""

    http_method_names = ["post"]
    action = "apply"

    def required_action(self, request) -> str:
        return "use" if self.action == "apply" else "release"

    def post(self, request, pk: int, plan_id: int):
        pipeline = selectors.pipeline_get(actor=self.actor, pk=pk)
        plan = selectors.plan_get(actor=self.actor, pipeline=pipeline, pk=plan_id)
        try:
            if self.action == "apply":
                plan = services.plan_apply(actor=self.actor, plan=plan)
                messages.success(request, f"Plan {plan.pk} applied: {plan.leases.count()} leases, placed together.")
            else:
                plan = services.plan_release(actor=self.actor, plan=plan)
                messages.success(request, f"Plan {plan.pk} released: its leases are given back.")
        except ApplicationError as refused:
            messages.error(request, refused.message)
        return redirect(f"/pipelines/{pipeline.pk}?plan={plan.pk}")


class ModelSplitDetailView(TenantView):
    template_name = "portal/model_split_detail.html"

    def get(self, request, pk: int):
        split = selectors.model_split_get(actor=self.actor, pk=pk)
        return render(request, self.template_name, {
            "split": split, "view": split_view(split),
            "leases": list(split.leases.select_related("lease").order_by("group")),
            "projects": Project.objects.filter(tenant=self.actor.tenant).order_by("slug"),
            "can_use": self.actor.can("use"), "can_release": self.actor.can("release"),
            "applied": split.state == PlanState.APPLIED})


class ModelSplitActionView(TenantView):
    """``POST /model-splits/<id>/apply`` (with ``project``) and ``…/release``."""

    http_method_names = ["post"]
    action = "apply"

    def required_action(self, request) -> str:
        return "use" if self.action == "apply" else "release"

    def post(self, request, pk: int):
        split = selectors.model_split_get(actor=self.actor, pk=pk)
        try:
            if self.action == "apply":
                split = services.model_split_apply(actor=self.actor, split=split,
                                                   project=request.POST.get("project", ""))
                messages.success(request, f"Split {split.pk} applied: {split.leases.count()} GPUs leased as one gang.")
            else:
                split = services.model_split_release(actor=self.actor, split=split)
                messages.success(request, f"Split {split.pk} released.")
        except ApplicationError as refused:
            messages.error(request, refused.message)
        return redirect("portal:model-split", pk=split.pk)
