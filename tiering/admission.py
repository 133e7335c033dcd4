"""``gpu: {"kind": "auto", "workload": "<name>"}`` at admission (docs/tiering.md, "Auto at admission").

Registered in ``TieringConfig.ready`` as leasing's gpu resolver for the kind ``auto`` (``broker.extensions``):
before leasing validates a request, the workload's prediction at the tenant's prices, limited to the models the
project has quota for, picks the cheapest slice predicted to meet the target (the workload's, or one given
inline: ``target_throughput`` / ``target_latency_ms``). The lease asks for exactly that slice (its model, its
MIG profile or share), with the prediction and its confidence in its reason. When confidence is low (or the
workload was never measured, or no model is trained) the request is refused with ``profile_first`` (409) and a
profiling run of the workload on the project is started (unless one runs already): ask again once it is done.
So it is too when a slice is confident but cheaper ones might do (the engine's exploring): the run measures
those cheaper slices, and the next request places on the cheapest whose measurement meets the target.
"""

from __future__ import annotations

from broker.extensions import GpuChoice, GpuRequest
from core.errors import ApplicationError, NotFound, ValidationFailed
from tenants.access import restrict
from tenants.models import Project, Quota
from tiering.models import ProfilingRun, ProfilingState, Workload

AUTO_FIELDS = ("kind", "workload", "target_throughput", "target_latency_ms", "count", "gang")


class ProfileFirst(ApplicationError):
    """Not confident enough to place the workload: a profiling run measures it first."""

    status = 409
    code = "profile_first"
    title = "Profile first"


def _target(gpu: dict, name: str) -> float | None:
    value = gpu.get(name)
    if value is None:
        return None
    low = 0.01 if name == "target_latency_ms" else 1e-6
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= (
            3.6e6 if name == "target_latency_ms" else 1e9):
        raise ValidationFailed(f"gpu.{name} must be a positive number.", field=f"gpu.{name}")
    return float(value)


def auto_resolve(request: GpuRequest) -> GpuChoice:
    from tiering.profiler import MAX_SLICES, _shape, profiling_start, slices_the_fleet_holds
    from tiering.services import workload_predict

    gpu = request.gpu
    for key in gpu:
        if key not in AUTO_FIELDS:
            raise ValidationFailed(f"Unknown field {key!r} for kind auto; known: {', '.join(AUTO_FIELDS)}.",
                                   field=f"gpu.{key}")
    name = gpu.get("workload")
    if not isinstance(name, str) or not name:
        raise ValidationFailed("gpu.workload is required for kind auto: the name of a registered workload.",
                               field="gpu.workload")
    workload = Workload.objects.filter(tenant=request.actor.tenant, name=name).first()
    if workload is None:
        raise NotFound(f"No workload named {name!r}; register it first (POST /api/v1/workloads).",
                       field="gpu.workload")
    target_throughput, target_latency = _target(gpu, "target_throughput"), _target(gpu, "target_latency_ms")
    project = restrict(Project.objects.all(), request.actor).filter(slug=request.project).first() \
        if isinstance(request.project, str) else None
    if project is None:
        raise NotFound(f"No project {request.project!r} in this tenant.", field="project")
    tiers = set(Quota.objects.filter(project=project).values_list("tier", flat=True)) or None
    decision = workload_predict(workload=workload, store=False, target_throughput=target_throughput,
                                target_latency_ms=target_latency, tiers=tiers)
    if decision.profile_first or decision.option is None:
        running = ProfilingRun.objects.filter(workload=workload, state=ProfilingState.RUNNING).first()
        if request.preview:  # a preview or a quote writes nothing: it says what a request would do
            started = (f"profiling run {running.pk} is under way" if running else
                       "a request would start a profiling run")
        elif running is None:
            try:  # exploring: the cheaper slices that might do and the fleet can hold now (else the defaults)
                candidates = [where.key for where in slices_the_fleet_holds(
                    list(decision.candidates))[:MAX_SLICES]] or None
                running = profiling_start(actor=request.actor, workload=workload, project=project.slug,
                                          slices=candidates, now=request.now)
                started = f"profiling run {running.pk} started"
            except ApplicationError as error:
                started = f"profiling could not start ({error.message})"
        else:
            started = f"profiling run {running.pk} is under way"
        raise ProfileFirst(f"Workload '{name}': {decision.reason}. {started}; ask again when it is done "
                           f"(GET /api/v1/workloads/{name}/profiling-runs).", field="gpu.workload",
                           extra={"profiling_run": running.pk if running else None})
    option = decision.option
    shape = dict(_shape(option.slice))
    for key in ("count", "gang"):
        if key in gpu:
            shape[key] = gpu[key]
    reason = (f"auto-tiering of workload '{name}': {option.slice.label} at {option.price:.2f}/h, predicted "
              f"{option.throughput:,.0f}/s for {decision.required:,.0f}/s needed, {option.confidence_text}")
    return GpuChoice(gpu=shape, reason=reason)
