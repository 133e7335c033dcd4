"""The only writers of pipelines, plans and model splits. Planning is the pure ``pipelines.planner``; applying
a plan leases its stages through ``broker.services.lease_request`` (quotas, spend caps, billing and SLO
accounting as for any lease), all of them in one transaction: if any stage is refused, no lease is made.

Input errors name the field (``stages[1].architecture``, ``edges[0]``) as every service does: 400 when a value is
of the wrong form (what the OpenAPI document states), 422 ``unprocessable`` when well-formed parts do not fit
together (an edge naming no stage, a cycle, a MIG profile its tier does not offer, a model that fits on none of
the tiers, more free memory than the GPU has): relations the document cannot state."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from broker import services as broker
from broker.extensions import list_prices
from core.errors import ApplicationError, Conflict, NotFound, ValidationFailed
from gpus import performance
from gpus.architectures import ARCHITECTURES
from gpus.catalogue import UnknownModel, model_get
from gpus.layers import Layer, NoLayerTable, layers_of
from pipelines.models import ModelSplit, ModelSplitLease, Pipeline, PipelinePlan, PlanLease, PlanState
from pipelines.planner import esg, splits
from pipelines.planner.profiles import (
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    Candidate,
    generation_profile_for,
    profile_for,
)
from tenants.access import Actor, restrict
from tenants.audit import audit_record
from tenants.models import Project, Quota

MAX_STAGES = 24


class Unprocessable(ApplicationError):
    """Well-formed input whose parts do not fit together (422), naming the field at fault."""

    status = 422
    code = "unprocessable"
    title = "The input's parts do not fit together"
DEFAULT_TIERS = ("H100-80GB", "A100-80GB", "L4")


def _number(value, field: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low < value <= high:
        raise ValidationFailed(f"{field} must be a number above {low:g} and at most {high:g}.", field=field)
    return float(value)


def _tiers(value) -> list[str]:
    if value in (None, []):
        return list(DEFAULT_TIERS)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValidationFailed("tiers must be a list of GPU model codes.", field="tiers")
    found = []
    for index, code in enumerate(value):
        try:
            found.append(model_get(code).code)
            performance.spec_get(code)
        except KeyError as error:  # an unknown model, or one without compute figures
            raise ValidationFailed(str(error.args[0]), field=f"tiers[{index}]") from None
    return found


MEASURED = ("profiled", "observed")  # tiering.models.Provenance: a measurement beats a prediction


def _workload_rows(stage: dict, index: int, tiers: list[str], tenant) -> list[tuple[Candidate, str]]:
    """A stage naming a registered workload (auto-tiering, ``tiering.models.Workload`` of the tenant): its latency
    per slice from the workload's profile rows on ``tiers`` — for each slice the newest measured row (profiled or
    observed), else the newest predicted one; the batch is the workload's, the time of a batch its step time
    (else one step's samples over the throughput). Each candidate with its row's provenance."""
    from tiering.models import Workload

    field = f"stages[{index}].workload"
    name = stage["workload"]
    if not isinstance(name, str) or not name.strip():
        raise ValidationFailed("workload is the name of a registered workload.", field=field)
    workload = Workload.objects.filter(tenant=tenant, name=name).first()
    if workload is None:
        raise Unprocessable(f"No workload named {name!r} in this tenant (register it: POST /api/v1/workloads).",
                            field=field)
    best: dict[str, object] = {}
    for row in workload.profiles.filter(tier__in=tiers, fits=True).order_by("-measured_at", "-pk"):
        held = best.get(row.slice_key)
        if held is None or (row.provenance in MEASURED and held.provenance not in MEASURED):
            best[row.slice_key] = row
    from gpus.performance import work_of
    from tiering.services import spec_of

    samples = work_of(spec_of(workload)).samples  # what one step handles (the throughput's unit per step)
    found = []
    for key in sorted(best):
        row = best[key]
        exec_ms = row.step_ms if row.step_ms else (samples / row.throughput * 1000.0 if row.throughput > 0 else None)
        try:
            slice_ = performance.slice_from_key(key)
        except KeyError:
            continue  # a slice the catalogue no longer offers
        if exec_ms and exec_ms > 0:
            found.append((Candidate(slice_, workload.batch_size, round(exec_ms, 4)), row.provenance))
    return found


def _sourced(stage: dict, index: int, tiers: list[str], tenant=None) -> list[tuple[Candidate, str]]:
    """A stage's latency table, each row with where it came from: a registered ``workload``'s auto-tiering
    profile rows (profiled, observed or predicted) where they exist, else the rows given (``given``), else the
    performance model for a named ``architecture`` (``performance-model``)."""
    field = f"stages[{index}]"
    if "workload" in stage:
        found = _workload_rows(stage, index, tiers, tenant)
        have = {(c.slice.key, c.batch) for c, _ in found}
        if stage.get("profile") is not None:
            found += [(c, "given") for c in _given(stage, index) if (c.slice.key, c.batch) not in have]
        if not found:
            raise Unprocessable(f"workload {stage['workload']!r} has no profile on {', '.join(tiers)} that fits "
                                "(profile it, or ask for a prediction: POST /api/v1/workloads/{id}/predict); or "
                                "give the stage a profile.", field=f"{field}.workload")
        return found
    if "architecture" in stage:
        return [(c, "performance-model") for c in _architecture(stage, index, tiers)]
    return [(c, "given") for c in _given(stage, index)]


def _architecture(stage: dict, index: int, tiers: list[str]) -> tuple[Candidate, ...]:
    field = f"stages[{index}].architecture"
    if not isinstance(stage["architecture"], str):
        raise ValidationFailed(f"architecture is one of {', '.join(ARCHITECTURES)}.", field=field)
    task = stage.get("task", "inference")
    if task not in ("inference", "generation"):
        raise ValidationFailed("task is inference (one forward pass) or generation (an LLM's answer: time to "
                               "first token, then tokens).", field=f"stages[{index}].task")
    try:
        if task == "generation":
            found = generation_profile_for(
                stage["architecture"], tuple(tiers),
                prompt_tokens=_tokens(stage, index, "prompt_tokens", PROMPT_TOKENS),
                output_tokens=_tokens(stage, index, "output_tokens", OUTPUT_TOKENS))
        else:
            found = profile_for(stage["architecture"], tuple(tiers))
    except KeyError as error:
        raise ValidationFailed(error.args[0], field=field) from None
    except ValueError as error:  # generation of an encoder or a convnet
        raise Unprocessable(str(error), field=f"stages[{index}].task") from None
    if not found:
        raise Unprocessable(f"{stage['architecture']} fits on no slice of {', '.join(tiers)}.", field=field)
    return found


def _tokens(stage: dict, index: int, name: str, default: int) -> int:
    value = stage.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 32768:
        raise ValidationFailed(f"{name} must be a whole number from 1 to 32768.", field=f"stages[{index}].{name}")
    return value


def _given(stage: dict, index: int) -> tuple[Candidate, ...]:
    field = f"stages[{index}]"
    rows = stage.get("profile")
    if rows is None:
        raise Unprocessable(f"a stage needs a registered workload, an architecture (one of "
                            f"{', '.join(ARCHITECTURES)}) or a latency profile: a list of {{tier, kind, "
                            "profile|milli, batch, latency_ms}.", field=field)
    if not isinstance(rows, list) or not rows:
        raise ValidationFailed(f"a stage needs an architecture (one of {', '.join(ARCHITECTURES)}) or a latency "
                               "profile: a list of {tier, kind, profile|milli, batch, latency_ms}.", field=field)
    found = []
    for r, row in enumerate(rows):
        at = f"{field}.profile[{r}]"
        if not isinstance(row, dict):
            raise ValidationFailed("each profile row is an object.", field=at)
        try:
            tier = model_get(str(row.get("tier", ""))).code
            kind = row.get("kind", "whole")
            if kind == "mig":
                slice_ = performance.mig(tier, str(row.get("profile", "")))
            elif kind == "share":
                slice_ = performance.share(tier, int(row.get("milli", 0)))
            elif kind == "whole":
                slice_ = performance.whole(tier)
            else:
                raise ValidationFailed("kind must be whole, mig or share.", field=f"{at}.kind")
        except UnknownModel as error:
            raise ValidationFailed(str(error.args[0]), field=f"{at}.tier") from None
        except KeyError as error:  # a MIG profile the tier does not offer, a tier without compute figures
            raise Unprocessable(str(error.args[0]), field=at) from None
        except (ValueError, TypeError) as error:  # a share without its milli
            raise Unprocessable(str(error), field=at) from None
        batch = row.get("batch", 1)
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 1024:
            raise ValidationFailed("batch must be a whole number from 1 to 1024.", field=f"{at}.batch")
        found.append(Candidate(slice_, batch, _number(row.get("latency_ms"), f"{at}.latency_ms", 0, 3_600_000)))
    return tuple(found)


def _pure(pipeline: Pipeline) -> tuple[esg.Pipeline, dict[str, dict[tuple[str, int], str]]]:
    """The planner's pipeline, and per stage where each (slice, batch) of its latency table came from."""
    sourced = [_sourced(s, i, pipeline.tiers, pipeline.tenant) for i, s in enumerate(pipeline.stages)]
    stages = tuple(esg.Stage(s["name"], tuple(c for c, _ in rows)) for s, rows in zip(pipeline.stages, sourced,
                                                                                      strict=True))
    sources = {s["name"]: {(c.slice.key, c.batch): source for c, source in rows}
               for s, rows in zip(pipeline.stages, sourced, strict=True)}
    return (esg.Pipeline(stages, tuple(tuple(e) for e in pipeline.edges), pipeline.slo_ms, pipeline.rate_rps),
            sources)


def pipeline_create(*, actor: Actor, project: str, name: str, stages, edges, slo_ms, rate_rps,
                    tiers=None) -> Pipeline:
    actor.require("use")
    target = restrict(Project.objects.all(), actor).filter(slug=project).first()
    if target is None:
        raise NotFound(f"No project {project!r} in this tenant.", field="project")
    if not isinstance(name, str) or not 1 <= len(name.strip()) <= 100:
        raise ValidationFailed("name is 1 to 100 characters.", field="name")
    if not isinstance(stages, list) or not 1 <= len(stages) <= MAX_STAGES:
        raise ValidationFailed(f"stages is a list of 1 to {MAX_STAGES} stages.", field="stages")
    for index, stage in enumerate(stages):
        if not isinstance(stage, dict) or not isinstance(stage.get("name"), str) or not stage["name"].strip():
            raise ValidationFailed("each stage is an object with a name.", field=f"stages[{index}].name")
    if not isinstance(edges, list) or not all(isinstance(e, list | tuple) and len(e) == 2 for e in edges):
        raise ValidationFailed("edges is a list of [from, to] stage-name pairs.", field="edges")
    row = Pipeline(tenant=actor.tenant, project=target, name=name.strip(), stages=stages,
                   edges=[list(e) for e in edges], slo_ms=_number(slo_ms, "slo_ms", 0, 3_600_000),
                   rate_rps=_number(rate_rps, "rate_rps", 0, 1_000_000), tiers=_tiers(tiers),
                   created_by=actor.user if actor.user.is_authenticated else None)
    try:
        esg._order(_pure(row)[0])  # names unique, edges known, no cycle
    except esg.PipelineError as error:
        raise Unprocessable(str(error), field=error.field or "stages") from None
    with transaction.atomic():
        row.save()
        audit_record(tenant=actor.tenant, by=actor, action="pipeline.create", target=f"pipeline:{row.pk}",
                     data={"name": row.name, "stages": len(stages)})
    return row


def _prices(tiers: list[str]) -> dict[str, int]:
    prices = list_prices(timezone.now())
    missing = [t for t in tiers if t not in prices]
    if len(missing) == len(tiers):
        # the pipeline is well formed; today's price list has nothing for its tiers (a state, not the body)
        raise Conflict(f"no list price for {', '.join(missing)}: nothing to plan with.", field="tiers")
    return {t: prices[t] for t in tiers if t in prices}


def _quota_tiers(pipeline: Pipeline) -> tuple[list[str], list[dict]]:
    """The pipeline's tiers its project may lease (a quota with a limit above 0), and the others with the reason
    (issue 29: stages planned on a tier without quota made applying the plan answer 409). None usable: 409 on
    ``tiers`` naming the project."""
    allowed = set(Quota.objects.filter(project=pipeline.project, limit_gpu_milli__gt=0)
                  .values_list("tier", flat=True))
    usable = [tier for tier in pipeline.tiers if tier in allowed]
    skipped = [{"tier": tier, "reason": f"project '{pipeline.project.slug}' has no quota for {tier}"}
               for tier in pipeline.tiers if tier not in allowed]
    if not usable:
        raise Conflict(f"project '{pipeline.project.slug}' has no quota for {', '.join(pipeline.tiers)}: nothing to "
                       f"plan on; its quotas are on {', '.join(sorted(allowed)) or 'no tier'}.", field="tiers")
    return usable, skipped


def plan_create(*, actor: Actor, pipeline: Pipeline, method: str = "esg") -> PipelinePlan:
    """Plan with ``method`` (esg, even_greedy, astar); the answer keeps the other planners' figures beside it."""
    actor.require("use")
    if method not in ("esg", "even_greedy", "astar"):
        raise ValidationFailed("method must be esg, even_greedy or astar.", field="method")
    pure, sources = _pure(pipeline)
    usable, skipped = _quota_tiers(pipeline)
    prices = _prices(usable)
    try:
        plan = esg.PLANNERS[method](pure, prices)
        compared = {name: esg.PLANNERS[name](pure, prices) for name in ("esg", "even_greedy") if name != method}
    except esg.PipelineError as error:
        raise ValidationFailed(str(error), field=error.field or "stages") from None
    result = plan.as_dict() | {"baselines": {name: {k: v for k, v in p.as_dict().items()
                                                    if k in ("feasible", "latency_ms", "cost_per_1k", "reason")}
                                             for name, p in compared.items()},
                               "prices": prices, "rate_rps": pipeline.rate_rps,
                               # tiers of the pipeline it did not plan on, and why (applying would answer 409)
                               "tiers_skipped": skipped,
                               # where each stage's latency table came from, row by row (docs/pipelines.md)
                               "profiles": {stage: [{"slice": key, "batch": batch, "source": source}
                                                    for (key, batch), source in rows.items()]
                                            for stage, rows in sources.items()}}
    for stage in result["stages"]:  # the chosen row's source beside the choice
        stage["profile_source"] = sources[stage["stage"]].get((stage["slice"], stage["batch"]), "given")
    with transaction.atomic():
        row = PipelinePlan.objects.create(
            tenant=actor.tenant, pipeline=pipeline, method=method, feasible=plan.feasible,
            latency_ms=plan.latency_ms if plan.choices else None,
            cost_per_1k=plan.cost_per_1k if plan.choices else None, result=result)
        audit_record(tenant=actor.tenant, by=actor, action="pipeline.plan", target=f"pipeline-plan:{row.pk}",
                     data={"pipeline": pipeline.pk, "method": method, "feasible": plan.feasible})
    return row


def _gpu_of(stage: dict) -> dict:
    """The lease request of a planned stage: its instances as one request of its slice on its tier."""
    gpu = {"kind": stage["kind"], "model": stage["tier"], "count": stage["instances"], "gang": False}
    if stage["kind"] == "mig":
        gpu["profile"] = stage["profile"]
    elif stage["kind"] == "share":
        gpu["milli"] = stage["milli"]
        gpu["memory_mib"] = model_get(stage["tier"]).memory_mib * stage["milli"] // 1000
    return gpu


def plan_apply(*, actor: Actor, plan: PipelinePlan, duration_seconds: int = 3600) -> PipelinePlan:
    """Lease every stage of a feasible plan, all or none: one transaction, so a stage refused (quota limit, a
    spend cap) leaves no lease of the others; the leases are one lease group (``pipeline-plan-<id>``), so the
    scheduler places them together or none of them, and a stage preempted takes the others with it.
    Applying an applied plan again is a no-op."""
    actor.require("use")
    with transaction.atomic():
        plan = PipelinePlan.objects.select_for_update().get(pk=plan.pk)
        if plan.state == PlanState.APPLIED:
            return plan
        if plan.state != PlanState.PLANNED:
            raise Conflict(f"The plan is {plan.state}; plan again to apply.", field="state")
        if not plan.feasible:
            raise Conflict("The plan does not meet the SLO: it is not applied.", field="feasible")
        for stage in plan.result["stages"]:
            lease, _ = broker.lease_request(
                actor=actor, project=plan.pipeline.project.slug, gpu=_gpu_of(stage), workload_class="inference",
                duration_seconds=duration_seconds, idempotency_key=f"pipeline-plan-{plan.pk}-{stage['stage']}",
                group=f"pipeline-plan-{plan.pk}")
            PlanLease.objects.create(plan=plan, stage=stage["stage"], lease=lease)
        plan.state, plan.applied_at = PlanState.APPLIED, timezone.now()
        plan.save(update_fields=["state", "applied_at"])
        audit_record(tenant=actor.tenant, by=actor, action="pipeline.apply", target=f"pipeline-plan:{plan.pk}",
                     data={"leases": [p.lease_id for p in plan.leases.all()]})
    return plan


def _group_release(*, actor: Actor, model, row, what: str, audit: str, target: str) -> object:
    """Release every lease of an applied plan or split together: the row marked released (locked, so two releases
    do not race), then its lease group's members released in one transaction (``broker.services
    .lease_group_release``: idempotent, a member already gone is left as it is). The group's key is
    ``<target>-<id>``, as applying made it."""
    actor.require("release")
    with transaction.atomic():
        row = model.objects.select_for_update().get(pk=row.pk)
        if row.state != PlanState.APPLIED:
            raise Conflict(f"The {what} is {row.state}, not applied.", field="state")
        row.state, row.released_at = PlanState.RELEASED, timezone.now()
        row.save(update_fields=["state", "released_at"])
        audit_record(tenant=actor.tenant, by=actor, action=audit, target=f"{target}:{row.pk}")
    # every member in one transaction: no cycle sees part of the group gone
    broker.lease_group_release(tenant_id=row.tenant_id, group_key=f"{target}-{row.pk}",
                                actor=f"user:{actor.user.get_username()}", reason=f"{what} {row.pk} released")
    return row


def plan_release(*, actor: Actor, plan: PipelinePlan) -> PipelinePlan:
    """Release every lease of an applied plan together."""
    return _group_release(actor=actor, model=PipelinePlan, row=plan, what="pipeline plan", audit="pipeline.release",
                          target="pipeline-plan")


def _layers(raw, field: str) -> list[Layer]:
    if not isinstance(raw, list) or not raw:
        raise ValidationFailed("layers is a non-empty list of {name, params, flops, out_bytes}.", field=field)
    found = []
    for index, row in enumerate(raw):
        at = f"{field}[{index}]"
        if not isinstance(row, dict):
            raise ValidationFailed("each layer is an object.", field=at)
        values = {}
        for key in ("params", "flops", "out_bytes"):
            value = row.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValidationFailed(f"{key} must be a number of at least 0.", field=f"{at}.{key}")
            values[key] = value
        found.append(Layer(str(row.get("name", f"layer{index}")), int(values["params"]), float(values["flops"]),
                           int(values["out_bytes"])))
    return found


MAX_SPLIT_GPUS = 64


def _fleet(actor: Actor, gpus, candidates) -> tuple[list, dict]:
    """The candidate fleet and how it was chosen: the GPUs given (``gpus``), or ``candidates`` — ``{"free": true}``
    (whole GPUs free now that the tenant may lease: ``selectors.free_whole_gpus``; optionally ``project``,
    ``models``, ``nodes``) or ``{"tier": model, "count": n}`` (n hypothetical GPUs of that model, all memory
    free, packed per node as the fleet's nodes of that model are, or ``per_node``): planned, nothing reserved."""
    if (gpus is None) == (candidates is None):
        raise Unprocessable("give the candidate GPUs (gpus) or how to choose them (candidates), one of the two.",
                            field="candidates")
    if gpus is not None:
        return gpus, {"source": "given"}
    if not isinstance(candidates, dict):
        raise ValidationFailed("candidates is {free: true, ...} or {tier, count}.", field="candidates")
    if bool(candidates.get("free")) == bool(candidates.get("tier")):
        raise Unprocessable("candidates is either {free: true} (the GPUs free now) or {tier, count} (a tier).",
                            field="candidates")
    if candidates.get("free"):
        from pipelines.selectors import free_whole_gpus

        project = None
        if candidates.get("project"):
            project = restrict(Project.objects.all(), actor).filter(slug=candidates["project"]).first()
            if project is None:
                raise NotFound(f"No project {candidates['project']!r} in this tenant.", field="candidates.project")
        models = tuple(candidates.get("models") or ())
        found = free_whole_gpus(actor=actor, project=project, models=models, nodes=candidates.get("nodes") or 0)
        if not found:
            scope = f" of {', '.join(models)}" if models else ""
            raise Conflict(f"no whole GPU{scope} is free now that this tenant's quotas let it lease; plan on a tier "
                           "(candidates: {tier, count}) or list the GPUs.", field="candidates")
        return found[:MAX_SPLIT_GPUS], {"source": "free", "gpus": len(found[:MAX_SPLIT_GPUS]),
                                        **({"project": project.slug} if project else {}),
                                        **({"models": list(models)} if models else {}),
                                        **({"nodes": candidates["nodes"]} if candidates.get("nodes") else {})}
    from pipelines.selectors import tier_node_size

    try:
        model = model_get(str(candidates["tier"]))
        performance.spec_get(model.code)
    except KeyError as error:
        raise ValidationFailed(str(error.args[0]), field="candidates.tier") from None
    count = candidates.get("count")
    if count is None:  # the body is well formed (each field is optional alone), the pair is not: a tier needs count
        raise Unprocessable(f"a tier needs count: how many GPUs of it, 1 to {MAX_SPLIT_GPUS}.",
                            field="candidates.count")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_SPLIT_GPUS:
        raise ValidationFailed(f"count is a whole number from 1 to {MAX_SPLIT_GPUS}.", field="candidates.count")
    per_node = candidates.get("per_node") or tier_node_size(model.code)
    if isinstance(per_node, bool) or not isinstance(per_node, int) or not 1 <= per_node <= 16:
        raise ValidationFailed("per_node is a whole number from 1 to 16.", field="candidates.per_node")
    found = [{"id": f"{model.code}#{i}", "node": f"{model.code}-node-{i // per_node}", "model": model.code,
              "free_mib": model.memory_mib} for i in range(count)]
    return found, {"source": "tier", "tier": model.code, "count": count, "per_node": per_node}


def model_split_create(*, actor: Actor, gpus=None, architecture_name: str = "", layers=None, batch=1,
                       name: str = "", candidates=None) -> ModelSplit:
    """Plan a split of a named architecture or a layer table over candidate GPUs ``[{id, node, model,
    free_mib}]`` — given, or chosen by ``candidates`` (``_fleet``) — with the heuristic; the equal-layers baseline
    and, for up to 6 GPUs and 128 layers, the optimum beside it. The result names how the candidates were chosen
    (``result.candidates``)."""
    actor.require("use")
    if architecture_name:
        try:
            table = list(layers_of(architecture_name))
        except NoLayerTable as error:
            raise ValidationFailed(error.args[0], field="architecture") from None
    elif layers is None:
        raise Unprocessable("give an architecture or a layer table.", field="layers")
    else:
        table = _layers(layers, "layers")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 1024:
        raise ValidationFailed("batch must be a whole number from 1 to 1024.", field="batch")
    gpus, source = _fleet(actor, gpus, candidates)
    if not isinstance(gpus, list) or not 1 <= len(gpus) <= MAX_SPLIT_GPUS:
        raise ValidationFailed("gpus is a list of 1 to 64 candidates {id, node, model, free_mib}.", field="gpus")
    candidates = []
    for index, row in enumerate(gpus):
        at = f"gpus[{index}]"
        if not isinstance(row, dict):
            raise ValidationFailed("each GPU is an object.", field=at)
        try:
            model = model_get(str(row.get("model", "")))
            performance.spec_get(model.code)
        except KeyError as error:  # an unknown model, or one without compute figures
            raise ValidationFailed(str(error.args[0]), field=f"{at}.model") from None
        free = row.get("free_mib", model.memory_mib)
        if isinstance(free, bool) or not isinstance(free, int) or free < 1:
            raise ValidationFailed("free_mib is a whole number of at least 1.", field=f"{at}.free_mib")
        if free > model.memory_mib:
            raise Unprocessable(f"a {model.code} has {model.memory_mib} MiB: free_mib is at most that.",
                                field=f"{at}.free_mib")
        candidates.append(splits.SplitGpu(str(row.get("id", f"gpu{index}")), str(row.get("node", "node")),
                                          model.code, free, model.nvlink))
    try:
        heuristic = splits.plan_split(table, candidates, batch)
        equal = splits.plan_equal_layers(table, candidates, batch)
        small = len(candidates) <= 6 and len(table) <= 128  # the exact search grows as layers^2 x 2^GPUs
        optimal = splits.plan_split_optimal(table, candidates, batch) if small else None
    except splits.SplitError as error:  # two candidates with one id
        raise Unprocessable(str(error), field=error.field or "gpus") from None
    result = heuristic.as_dict(table) | {"candidates": source, "baselines": {
        "equal_layers": equal.as_dict(), **({"optimal": optimal.as_dict()} if optimal else {})}}
    with transaction.atomic():
        row = ModelSplit.objects.create(
            tenant=actor.tenant, name=name[:100], architecture=architecture_name, batch=batch,
            layers=[{"name": layer.name, "params": layer.params, "flops": layer.flops, "out_bytes": layer.out_bytes}
                    for layer in table],
            gpus=[{"id": g.id, "node": g.node, "model": g.model, "free_mib": g.free_mib} for g in candidates],
            feasible=heuristic.feasible, result=result,
            created_by=actor.user if actor.user.is_authenticated else None)
        audit_record(tenant=actor.tenant, by=actor, action="model_split.create", target=f"model-split:{row.pk}",
                     data={"feasible": heuristic.feasible, "gpus": len(heuristic.groups)})
    return row


def _split_access(split: ModelSplit, index: int, group: dict) -> dict:
    """What the device of a split's group must know: its layer range in the whole model, and its neighbours."""
    count = len(split.result["groups"])
    names = group.get("layers") or []
    return {"split": {"model_split": split.pk, "architecture": split.architecture or split.name, "batch": split.batch,
                      "group": index, "groups": count, "first_layer": group["first"], "last_layer": group["last"],
                      "first_layer_name": names[0] if names else "", "last_layer_name": names[-1] if names else "",
                      "planned_gpu": group["gpu"], "planned_node": group["node"],
                      "receives_from_group": index - 1 if index else None,
                      "sends_to_group": index + 1 if index + 1 < count else None}}


def _split_pins(split: ModelSplit) -> list[list[str]] | None:
    """A split planned on the GPUs free now (``candidates: {free: true}``) is leased on the nodes it was planned
    on, since its latency counts the transfers between those nodes: per group, the other nodes holding GPUs of its
    model, for the lease's ``avoid_nodes`` (the scheduler's node exclusion), so the group waits for its planned
    node rather than run elsewhere. None for a split planned on given GPUs or on a tier (no real nodes: any GPU
    of the model will do). A planned node gone since (removed, or no GPU of that model any more) is a 409."""
    if (split.result.get("candidates") or {}).get("source") != "free":
        return None
    from pipelines.selectors import nodes_holding

    groups = split.result["groups"]
    holders = nodes_holding({group["model"] for group in groups})
    pins = []
    for index, group in enumerate(groups):
        nodes = holders.get(group["model"], set())
        if group["node"] not in nodes:
            raise Conflict(f"group {index} was planned on node {group['node']}, which has no {group['model']} any "
                           "more: plan the split again.", field="groups")
        pins.append(sorted(nodes - {group["node"]}))
    return pins


def model_split_apply(*, actor: Actor, split: ModelSplit, project: str,
                      duration_seconds: int = 3600) -> ModelSplit:
    """Lease the GPUs of a feasible split as a gang: one lease per group (a whole GPU of the group's model, as
    the split's latency model assumes), all in one transaction through ``broker.services.lease_request``
    (quotas, spend caps, billing), one lease group (``model-split-<id>``) so the scheduler places them all or
    none, provisioning requeues them together, and a member preempted takes the others with it. Each lease's
    access details carry its layer range. Applying an applied split again is a no-op."""
    actor.require("use")
    with transaction.atomic():
        split = ModelSplit.objects.select_for_update().get(pk=split.pk)
        if split.state == PlanState.APPLIED:
            return split
        if split.state != PlanState.PLANNED:
            raise Conflict(f"The split is {split.state}; plan it again to apply.", field="state")
        if not split.feasible:
            raise Conflict("The split found no groups that fit: it is not applied.", field="feasible")
        target = restrict(Project.objects.all(), actor).filter(slug=project).first()
        if target is None:
            raise NotFound(f"No project {project!r} in this tenant.", field="project")
        pins = _split_pins(split)
        for index, group in enumerate(split.result["groups"]):
            lease, _ = broker.lease_request(
                actor=actor, project=target.slug, gpu={"kind": "whole", "model": group["model"], "count": 1},
                workload_class="inference", duration_seconds=duration_seconds,
                idempotency_key=f"model-split-{split.pk}-{index}", group=f"model-split-{split.pk}",
                access_extra=_split_access(split, index, group), avoid_nodes=pins[index] if pins else None)
            ModelSplitLease.objects.create(split=split, group=index, lease=lease)
        split.state, split.project, split.applied_at = PlanState.APPLIED, target, timezone.now()
        split.save(update_fields=["state", "project", "applied_at"])
        audit_record(tenant=actor.tenant, by=actor, action="model_split.apply", target=f"model-split:{split.pk}",
                     data={"project": target.slug,
                           "leases": [link.lease_id for link in split.leases.order_by("group")]})
    return split


def model_split_release(*, actor: Actor, split: ModelSplit) -> ModelSplit:
    """Release every lease of an applied split together."""
    return _group_release(actor=actor, model=ModelSplit, row=split, what="model split", audit="model_split.release",
                          target="model-split")
