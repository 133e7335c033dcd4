"""The profiler (docs/tiering.md, "The profiler"): a workload measured on candidate slices by short leases.

``profiling_start`` requests one lease per candidate slice at once (the scheduler runs them in parallel where
capacity allows; the others wait in the queue until the run's deadline), each running the workload for
``window_seconds``. On the simulated fleet the lease's workload is ``agent/perf_workload.py`` with the
performance model's definition (``workload.perf``): the simulated agent drives the instance's DCGM series by
it and the process reports its throughput through ``POST /api/v1/leases/{id}/samples`` with the lease's samples
credential (``tiering.credentials``: posts that lease's samples and nothing else, until the run ends), given in
the workload's ``secret_env`` as ``PERF_TOKEN`` (never shown). No API token is minted for a run. On real GPUs the
tenant's own workload reports the same way, with an API token of its own in its ``secret_env``.

``profiling_advance`` (Celery ``tiering.profiling_advance``, again every few seconds while the run lasts)
closes each lease whose window is over: engine activity (mean) and framebuffer used (peak) over the window
from Prometheus, throughput (median of the samples) from the database → a ``profiled`` profile row; then it
releases the lease. A lease whose workload failed before its window (the workload did not fit: out of memory)
gives a row that does not fit. A lease still queued at the deadline is cancelled.

Profiling leases are billed as any lease of the tenant, at its price book's rates (a separate profiling rate
is not built: docs/tiering.md says so).
"""

from __future__ import annotations

import logging
import statistics
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from broker.choices import FINAL_STATES, LeaseState
from broker.models import Gpu, Lease
from core.errors import ApplicationError, Conflict, NotFound, ValidationFailed
from core.prometheus import Prometheus, PrometheusError
from core.task_registry import task
from gpus.performance import Slice, regime_infer, slice_from_key
from tenants.access import Actor, restrict
from tenants.models import ApiToken, Membership, Project
from tiering.models import LeaseSample, ProfilingLease, ProfilingRun, ProfilingState, Provenance, Workload

logger = logging.getLogger(__name__)
MAX_SLICES = 12
ACTOR = "tiering:profiler"


def _shape(where: Slice) -> dict:
    if where.kind == "mig":
        return {"kind": "mig", "model": where.model, "profile": where.profile}
    if where.kind == "share":
        return {"kind": "share", "model": where.model, "milli": where.milli, "memory_mib": where.memory_mib}
    return {"kind": "whole", "model": where.model}


SLICE_MODES = {"whole": "whole", "mig": "mig", "share": "shared"}  # the GPU mode that holds a slice of each kind


def slices_the_fleet_holds(slices: list[Slice]) -> list[Slice]:
    """The slices some GPU of the fleet (not lost, its node not cordoned) can hold in its present mode: a whole
    slice on a whole-mode GPU of its model, a MIG slice on a MIG-mode one, a share on a shared one. Issue 29: on
    the demo fleet, every H100 in MIG mode, a whole-H100 candidate could never be placed and each run waited
    its deadline for it."""
    held = set(Gpu.objects.filter(lost_at__isnull=True, node__cordoned=False)
               .values_list("model", "mode").distinct())
    return [where for where in slices if (where.model, SLICE_MODES[where.kind]) in held]


def profiling_candidates(*, workload: Workload) -> list[Slice]:
    """The default candidates: the whole GPU of every model the fleet has in whole mode (a whole slice on a
    model whose GPUs are all in MIG or shared mode would wait the run's deadline) and the tenant's price book
    prices (the profile's columns), cheapest first; the reference slice first when the fleet has it."""
    from tiering.services import REFERENCE_SLICE, tenant_slice_prices

    fleet = set(Gpu.objects.filter(lost_at__isnull=True, node__cordoned=False, mode="whole")
                .values_list("model", flat=True).distinct())
    priced = sorted(((where, price) for where, price in tenant_slice_prices(tenant=workload.tenant)
                     if where.kind == "whole" and where.model in fleet), key=lambda pair: (pair[1], pair[0].key))
    ordered = [where for where, _ in priced]
    ordered.sort(key=lambda where: where.key != REFERENCE_SLICE)
    return ordered[:MAX_SLICES]


def _slices_clean(value: object, workload: Workload) -> list[Slice]:
    if value is None:
        slices = profiling_candidates(workload=workload)
        if not slices:
            raise ValidationFailed("No GPU of a model your price book prices is in the fleet: name the slices.",
                                   field="slices")
        return slices
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_SLICES:
        raise ValidationFailed(f"slices must be a list of 1 to {MAX_SLICES} slice keys (MODEL, MODEL/mig/PROFILE or "
                               "MODEL/share/MILLI).", field="slices")
    out = []
    for position, key in enumerate(value):
        try:
            where = slice_from_key(key) if isinstance(key, str) else None
        except (KeyError, ValueError) as error:
            raise ValidationFailed(f"slices[{position}]: {error.args[0]}", field="slices") from None
        if where is None:
            raise ValidationFailed(f"slices[{position}] must be a slice key.", field="slices")
        if where.key not in {s.key for s in out}:  # named twice: measured once
            out.append(where)
    return out


def profiling_start(*, actor: Actor, workload: Workload, project: object, slices: object = None,
                    window_seconds: object = None, now: datetime | None = None) -> ProfilingRun:
    """Start a profiling run of ``workload`` (the actor's): one lease per slice, requested now. Refused (naming
    the field) when the workload already has a running run, the project is unknown or a value is out of
    bounds; a slice whose lease is refused (no quota for its tier) is left out and said so in the run's
    outcome; when every one is refused the run fails and the first refusal is raised."""
    from broker.services import lease_request
    from tenants.audit import audit_record
    from tiering.credentials import samples_credential_issue
    from tiering.services import spec_of

    actor.require("use")
    now = now or timezone.now()
    window = settings.TIERING_PROFILING_WINDOW_SECONDS if window_seconds is None else window_seconds
    if isinstance(window, bool) or not isinstance(window, int) or not 5 <= window <= 3600:
        raise ValidationFailed("window_seconds must be a whole number from 5 to 3600.", field="window_seconds")
    if not isinstance(project, str) or not restrict(Project.objects.all(), actor).filter(slug=project).exists():
        raise NotFound(f"No project {project!r} in this tenant.", field="project")
    chosen = _slices_clean(slices, workload)
    if ProfilingRun.objects.filter(workload=workload, state=ProfilingState.RUNNING).exists():
        raise Conflict(f"Workload '{workload.name}' is being profiled already.", field="workload")
    deadline = now + timedelta(seconds=window + settings.TIERING_PROFILING_QUEUE_SECONDS)
    spec = spec_of(workload)
    perf = {"architecture": spec.architecture, "task": spec.task, "precision": spec.precision,
            "batch_size": spec.batch_size, "seq_len": spec.seq_len, "image_size": spec.image_size}
    body = {"command": list(settings.TIERING_PROFILER_COMMAND), "restart_policy": "never", "perf": perf,
            "env": {"PERF_SAMPLES_URL": settings.SITE_URL.rstrip("/") + "/api/v1/leases/{lease}/samples",
                    "PERF_INTERVAL_SECONDS": "1", "PERF_WORKLOAD": workload.name}}
    with transaction.atomic(durable=True):
        run = ProfilingRun.objects.create(
            tenant=actor.tenant, workload=workload, project=Project.objects.get(tenant=actor.tenant, slug=project),
            created_by=actor.user if actor.user.is_authenticated else None, window_seconds=window,
            deadline_at=deadline, started_at=now)
        audit_record(tenant=actor.tenant, by=actor, action="tiering.profiling_start", target=workload.name,
                     data={"run": run.pk, "slices": [s.key for s in chosen], "window_seconds": window})
    refused: list[tuple[Slice, ApplicationError]] = []
    for where in chosen:
        try:
            lease, _ = lease_request(
                actor=actor, project=project, gpu=_shape(where), duration_seconds=max(
                    settings.LEASE_MIN_DURATION_SECONDS, window * 3 + 60),
                workload_class="training" if spec.task == "training" else "inference", workload={
                    # the samples credential: this run's lease of this slice only, in the never-shown secret_env
                    **body, "secret_env": {"PERF_TOKEN": samples_credential_issue(
                        run_id=run.pk, slice_key=where.key, expires_at=deadline + timedelta(minutes=10))}},
                profiling=True, now=now)
        except ApplicationError as error:
            refused.append((where, error))
            continue
        ProfilingLease.objects.create(run=run, slice_key=where.key, lease=lease)
    if refused:
        note = "; ".join(f"{where.key}: {error.message}" for where, error in refused)[:480]
        ProfilingRun.objects.filter(pk=run.pk).update(outcome=f"not requested: {note}")
    if len(refused) == len(chosen):
        _finish(run, ProfilingState.FAILED, now)
        raise refused[0][1]
    transaction.on_commit(lambda: _enqueue(run.pk, countdown=2))
    run.refresh_from_db()
    return run


def _enqueue(run_id: int, countdown: float) -> None:
    task("tiering", "profiling_advance").apply_async((run_id,), countdown=countdown)


# -- reading what was measured ---------------------------------------------------------------------------

class PrometheusMissing(Exception):
    pass


def _instant_value(expression: str, at: datetime) -> float | None:
    """One instant query's single value (None: no series)."""
    try:
        result = Prometheus().query(expression, at=at.timestamp())
    except PrometheusError as error:
        raise PrometheusMissing(f"Prometheus at {settings.PROMETHEUS_URL} did not answer: {error}") from None
    return float(result[0]["value"][1]) if result else None


def _regime(workload: Workload, slice_key: str, seen: dict) -> str:
    """The regime the measured engine activity points to (``gpus.performance.regime_infer``): ``eager`` when the
    engine idles between the framework's operations, ``engine`` when its kernels run back to back."""
    from tiering.services import spec_of

    if seen.get("engine_active") is None:
        return "unknown"
    return regime_infer(spec_of(workload), slice_from_key(slice_key), seen["engine_active"])


def lease_telemetry(*, lease: Lease, start: datetime, end: datetime) -> dict:
    """The DCGM figures of a lease's first allocation over [start, end] from Prometheus: mean engine activity
    and peak framebuffer used, and the median of the throughput samples its workload reported meanwhile."""
    allocation = lease.allocations.order_by("pk").first()
    seconds = max(2, int((end - start).total_seconds()))
    label = f'{{allocation_id="{allocation.instance_id}"}}' if allocation else '{allocation_id="-"}'
    engine = _instant_value(f"avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{label}[{seconds}s])", end)
    memory = _instant_value(f"max_over_time(DCGM_FI_DEV_FB_USED{label}[{seconds}s])", end)
    samples = list(LeaseSample.objects.filter(lease=lease, reported_at__gte=start, reported_at__lte=end)
                   .values_list("throughput", flat=True))
    return {"engine_active": engine, "memory_mib": None if memory is None else int(memory),
            "throughput": statistics.median(samples) if samples else None, "samples": len(samples)}


def profiling_advance(*, run_id: int, now: datetime | None = None) -> str:
    """Close what is due in a run (idempotent; see the module docstring). Returns the run's state."""
    from broker.services import lease_release
    from tiering.services import profile_record

    now = now or timezone.now()
    run = ProfilingRun.objects.select_related("workload").get(pk=run_id)
    if run.state != ProfilingState.RUNNING:
        return run.state
    window = timedelta(seconds=run.window_seconds)
    for item in ProfilingLease.objects.filter(run=run, done=False).select_related("lease").order_by("pk"):
        lease = item.lease
        first = LeaseSample.objects.filter(lease=lease).order_by("reported_at").values_list(
            "reported_at", flat=True).first() if lease.state == LeaseState.ACTIVE else None
        # the window starts with the workload's first sample (the devices run it from then on: before, the
        # instance was idle or still starting it), the warm-up left out; with no sample after three windows
        # the workload is not reporting
        started = first + timedelta(seconds=min(5, run.window_seconds // 4)) if first else None
        due = lease.state == LeaseState.ACTIVE and lease.active_at and (
            (started is not None and now - started >= window)
            or (started is None and now - lease.active_at >= 3 * window))
        if due:
            start = started or lease.active_at
            try:
                seen = lease_telemetry(lease=lease, start=start, end=now)
            except PrometheusMissing as error:
                if now < run.deadline_at + timedelta(minutes=5):
                    continue  # ask again at the next advance
                seen = {"error": str(error)}
            if not _claim(item):
                continue  # another advance took it
            if "error" in seen:
                _close(item, seen["error"])
            elif seen["throughput"] is None:
                _close(item, "the workload reported no throughput in its window")
            elif seen["memory_mib"] is None:
                _close(item, "Prometheus has no DCGM series of the lease's device")
            else:
                profile = profile_record(workload=run.workload, slice_key=item.slice_key,
                                         provenance=Provenance.PROFILED, throughput=seen["throughput"],
                                         memory_mib=seen["memory_mib"], engine_active=seen["engine_active"],
                                         lease=lease, at=now)
                _close(item, f"measured: {seen['throughput']:.1f}/s (median of {seen['samples']} samples), engine "
                             f"{(seen['engine_active'] or 0):.0%} ({_regime(run.workload, item.slice_key, seen)} "
                             f"regime), peak {seen['memory_mib']} MiB", profile)
            lease_release(lease=lease, actor=ACTOR, now=now, reason="the profiling window is over")
        elif lease.state in FINAL_STATES or lease.state == LeaseState.RELEASING:
            if not _claim(item):
                continue
            failed = getattr(getattr(lease, "workload", None), "state", "") == "failed"
            if failed:  # the workload died before its window was over: it does not fit this slice
                where = slice_from_key(item.slice_key)
                profile = profile_record(workload=run.workload, slice_key=item.slice_key,
                                         provenance=Provenance.PROFILED, throughput=0.0,
                                         memory_mib=where.memory_mib, engine_active=0.0, lease=lease, at=now)
                _close(item, "the workload failed on this slice (out of memory): it does not fit", profile)
            else:
                _close(item, f"the lease ended ({lease.state}: {lease.reason}) before its window was over")
        elif lease.state == LeaseState.QUEUED and now >= run.deadline_at:
            if not _claim(item):
                continue
            lease_release(lease=lease, actor=ACTOR, now=now, reason="profiling: no capacity before the deadline")
            _close(item, "no capacity for it before the run's deadline")
    if ProfilingLease.objects.filter(run=run, done=False).exists():
        return run.state
    measured = ProfilingLease.objects.filter(run=run, profile__isnull=False).exists()
    _finish(run, ProfilingState.DONE if measured else ProfilingState.FAILED, now)
    return ProfilingRun.objects.get(pk=run.pk).state


def _claim(item: ProfilingLease) -> bool:
    """Take a candidate's closing once (a conditional update: two advances never record it twice)."""
    return ProfilingLease.objects.filter(pk=item.pk, done=False, outcome="").update(outcome="closing") == 1


def _close(item: ProfilingLease, outcome: str, profile=None) -> None:
    ProfilingLease.objects.filter(pk=item.pk).update(done=True, outcome=outcome[:300], profile=profile)


def _finish(run: ProfilingRun, state: str, now: datetime) -> None:
    """End the run (once): its leases' samples credentials stop working with it. A run started before the
    samples credential existed had an API token minted for it (``token_prefix``): it is revoked here."""
    from tenants.audit import audit_record
    from tenants.services import api_token_revoke

    with transaction.atomic(durable=True):
        changed = ProfilingRun.objects.filter(pk=run.pk, state=ProfilingState.RUNNING).update(
            state=state, finished_at=now)
        if changed:
            audit_record(tenant=run.tenant, by=None, action=f"tiering.profiling_{state}", target=run.workload.name,
                         data={"run": run.pk,
                               "measured": list(ProfilingLease.objects.filter(run=run, profile__isnull=False)
                                                .values_list("slice_key", flat=True))})
    token = ApiToken.objects.filter(tenant=run.tenant, prefix=run.token_prefix, revoked_at__isnull=True).first()
    if changed and token is not None and run.created_by is not None:
        membership = Membership.objects.filter(tenant=run.tenant, user=run.created_by).first()
        if membership is not None:
            api_token_revoke(actor=Actor(user=run.created_by, tenant=run.tenant, role=membership.role), token=token,
                             now=now)

