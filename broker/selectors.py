"""Readers of leasing data; every tenant-facing query goes through ``tenants.access.restrict``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Prefetch, QuerySet
from django.utils import timezone

from broker.choices import GpuKind, GpuMode, LeaseState, NodeIsolation, ShareEnforcement
from broker.models import Allocation, Gpu, Lease, LeaseEvent, Node, Workload
from broker.snapshot import core_group
from core.errors import NotFound, ValidationFailed
from core.prometheus import OPTIONAL_TIMEOUT_SECONDS, Prometheus, PrometheusError
from tenants.access import Actor, restrict


def lease_list(*, actor: Actor, state: str = "", project: str = "") -> QuerySet[Lease]:
    queryset = restrict(Lease.objects.all(), actor).select_related("project").order_by("-requested_at", "-pk")
    if state:
        states = state.split(",")  # exactly the states, comma-separated: " queued" or "a,,b" is a 400
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
    lease = (restrict(Lease.objects.all(), actor).select_related("project", "workload__node")
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
    rows = (restrict(Allocation.objects.filter(freed_at__isnull=True, lease__isnull=False), actor)
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
        if mode == GpuMode.WHOLE:
            offer["whole"]["gpus"] += 1
            offer["whole"]["free"] += int(gpu.fits_whole())
        elif mode == GpuMode.SHARED:
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
    enforcement = share_enforcement_by_model()
    for offer in offers.values():
        offer["mig"] = sorted(offer["mig"].values(), key=lambda item: item["memory_mib"])
        if offer["share"]["gpus"]:  # whether a share's limits hold there (docs/leasing.md)
            offer["share"].update(share_enforcement_note(offer["model"], enforcement.get(offer["model"])))
    return sorted(offers.values(), key=lambda item: item["model"])


def share_enforcement_of(devices) -> dict | None:
    """Whether the limits of a lease's shares hold: ``{"mode": "mps" | "none", "reason": ...}`` from the GPUs its
    share allocations (``devices``: live allocations, their ``gpu`` loaded) are on — ``mps`` only when every one
    of them runs MPS; None for a lease without shares. A tenant is never told of an enforcement that is not there."""
    shares = [device for device in devices if device.kind == GpuKind.SHARE]
    if not shares:
        return None
    unenforced = [device for device in shares if device.gpu.share_enforcement != ShareEnforcement.MPS]
    gpus = {device.gpu_id for device in shares}
    if not unenforced and len(gpus) > 1:  # one CUDA process talks to one MPS daemon, and each GPU has its own
        return {"mode": ShareEnforcement.NONE.value,
                "reason": f"its shares are on {len(gpus)} GPUs and a process reaches one GPU's MPS control daemon: "
                          "a workload spanning them is limited on the first GPU only (each GPU's own MPS "
                          "enforces shares used from separate processes)"}
    if not unenforced:
        return {"mode": ShareEnforcement.MPS.value,
                "reason": "each share's compute and memory limits are enforced by the GPU's MPS control daemon"}
    reasons = sorted({device.gpu.share_enforcement_reason or "not reported" for device in unenforced})
    return {"mode": ShareEnforcement.NONE.value,
            "reason": "the share's limits are not enforced (they are environment variables the workload may ignore): "
                      + "; ".join(reasons)}


def share_enforcement_by_model() -> dict[str, dict]:
    """Per GPU model, the shared GPUs (live, on nodes not cordoned) whose shares MPS enforces and those it does
    not: ``{"mps_gpus": n, "unenforced_gpus": m, "enforcement": "mps" | "none" | "partial", "reasons": [...]}``."""
    rows = (Gpu.objects.filter(mode=GpuMode.SHARED, lost_at__isnull=True, node__cordoned=False)
            .values_list("model", "share_enforcement", "share_enforcement_reason"))
    found: dict[str, dict] = {}
    for model, mode, reason in rows:
        entry = found.setdefault(model, {"mps_gpus": 0, "unenforced_gpus": 0, "reasons": set()})
        if mode == ShareEnforcement.MPS:
            entry["mps_gpus"] += 1
        else:
            entry["unenforced_gpus"] += 1
            entry["reasons"].add(reason or "not reported")
    for entry in found.values():
        entry["enforcement"] = ("mps" if not entry["unenforced_gpus"] else
                                "none" if not entry["mps_gpus"] else "partial")
        entry["reasons"] = sorted(entry["reasons"])
    return found


def share_enforcement_note(model: str, found: dict | None) -> dict:
    """What an offer or a quote says of a share of ``model``: its enforcement and, in a sentence, what it means."""
    if not found:
        return {"enforcement": "none", "mps_gpus": 0, "unenforced_gpus": 0,
                "detail": f"No shared {model} GPU is up: nothing can be said of enforcement."}
    if found["enforcement"] == "mps":
        detail = f"Enforced: every shared {model} GPU runs MPS, which caps each share's compute and memory."
    elif found["enforcement"] == "none":
        detail = (f"Not enforced: the shared {model} GPUs run no MPS ({'; '.join(found['reasons'])}); a share's "
                  "limits are environment variables the workload may ignore.")
    else:
        detail = (f"Enforced on {found['mps_gpus']} of {found['mps_gpus'] + found['unenforced_gpus']} shared {model} "
                  "GPUs; the lease says which kind it got.")
    return {"enforcement": found["enforcement"], "mps_gpus": found["mps_gpus"],
            "unenforced_gpus": found["unenforced_gpus"], "detail": detail}


def workload_resumable(spec: dict | None) -> bool:
    """Whether a workload (its ``spec``) resumes after a preemption from where it stopped: it declares a checkpoint
    directory and a restart policy that restarts it when the lease is placed again (``on-preemption`` or
    ``on-failure``; ``never`` ends the lease at its stop). The capacity loop suspends such a lease when it idles
    instead of releasing it (docs/capacity.md, "Suspension of idle training")."""
    if not spec:
        return False
    return bool(spec.get("checkpoint_dir")) and spec.get("restart_policy", "never") != "never"


def lease_queue() -> QuerySet[Lease]:
    """The queue the scheduler works on, oldest first: QUEUED leases of active tenants. A suspended
    tenant's queued leases are held (tenants.services.tenant_set_status): never placed, never counted ahead
    of anyone, until the tenant is reactivated."""
    from tenants.choices import TenantStatus

    return Lease.objects.filter(state=LeaseState.QUEUED, tenant__status=TenantStatus.ACTIVE).order_by("queued_at",
                                                                                                       "pk")


class QueuedLease:
    """A queued lease as a schedule cycle reads it (``queued_leases``): the columns the core's request, the
    reasons and the write need, as plain attributes. ``core_request`` takes it or a ``Lease``."""

    __slots__ = ("avoid_nodes", "count", "cpu_milli_per_unit", "duration_seconds", "estimated_start", "gang",
                 "group_key", "guarantee_covered", "host_memory_mib_per_unit", "kind", "memory_mib", "milli",
                 "min_count", "models_allowed", "pk",
                 "priority", "profile", "project_id", "project_slug", "queue_position", "reason", "submitted_at",
                 "tenant_id", "workload_class")
    COLUMNS = ("pk", "tenant_id", "project_id", "project__slug", "kind", "count", "profile", "milli", "memory_mib",
               "models_allowed", "gang", "avoid_nodes", "submitted_at", "priority", "workload_class", "group_key",
               "reason", "queue_position", "duration_seconds", "estimated_start", "cpu_milli_per_unit",
               "host_memory_mib_per_unit", "min_count", "guarantee_covered")

    def __init__(self, row: tuple):
        (self.pk, self.tenant_id, self.project_id, self.project_slug, self.kind, self.count, self.profile, self.milli,
         self.memory_mib, self.models_allowed, self.gang, self.avoid_nodes, self.submitted_at, self.priority,
         self.workload_class, self.group_key, self.reason, self.queue_position, self.duration_seconds,
         self.estimated_start, self.cpu_milli_per_unit, self.host_memory_mib_per_unit, self.min_count,
         self.guarantee_covered) = row


def queued_leases(queryset: QuerySet[Lease]) -> list[QueuedLease]:
    """``queryset`` (of ``lease_queue``) as ``QueuedLease`` rows: one query, no model instances, the submission
    time as epoch seconds from PostgreSQL (a cycle reads 10,000: docs/scheduling.md, "Cycle speed at fleet scale")."""
    from django.db.models import F, FloatField, Func
    from django.db.models.functions import Coalesce

    # epoch seconds of the instant (no time zone conversion: EXTRACT of a timestamptz), as scheduler_snapshot does
    submitted = Func(Coalesce(F("queued_at"), F("requested_at")),
                     template="EXTRACT(EPOCH FROM %(expressions)s)::float8", output_field=FloatField())
    return [QueuedLease(row) for row in queryset.annotate(submitted_at=submitted).values_list(*QueuedLease.COLUMNS)]


def core_request(lease: Lease | QueuedLease, shapes: dict | None = None):
    """The scheduling core's ``Request`` for a queued lease (the cycle, the preview and the capacity loop).
    ``shapes``: a dict the caller keeps across calls, so that equal shapes are one ``Shape``."""
    from broker.scheduler import Kind, Request, Shape
    from broker.scheduler.types import WorkloadClass as CoreWorkloadClass

    key = (lease.kind, lease.count, lease.profile, lease.milli, lease.memory_mib, tuple(lease.models_allowed),
           lease.gang, tuple(lease.avoid_nodes), lease.cpu_milli_per_unit, lease.host_memory_mib_per_unit,
           lease.min_count)
    shape = None if shapes is None else shapes.get(key)
    if shape is None:
        # host CPU and memory: the lease asks them per GPU unit, the core's shape holds the request's totals
        shape = Shape(Kind(lease.kind), lease.count, profile=lease.profile, milli=lease.milli,
                      memory_mib=lease.memory_mib, models=key[5], gang=lease.gang, avoid_nodes=key[7],
                      cpu_milli=lease.cpu_milli_per_unit * lease.count,
                      host_memory_mib=lease.host_memory_mib_per_unit * lease.count, min_count=lease.min_count)
        if shapes is not None:
            shapes[key] = shape
    submitted = lease.submitted_at if isinstance(lease, QueuedLease) else (lease.queued_at or lease.requested_at
                                                                           ).timestamp()
    return Request(str(lease.pk), str(lease.project_id), str(lease.tenant_id), shape, submitted, lease.priority,
                   CoreWorkloadClass(lease.workload_class), group=core_group(lease.tenant_id, lease.group_key),
                   duration_seconds=lease.duration_seconds)


def scheduler_inputs(snapshot, *, now: datetime, history: dict | None = None):
    """``snapshot`` with what the core plans with beyond the fleet: the fair share's half-life and each project's
    decayed borrowed use (``history``: the rows the cycle has just moved on; else read and decayed to ``now``
    without writing), the preemption back-off's settings and the recent preemptions per lease, the running
    leases' expiries (for estimated starts; a preempted lease's notice deadline), and the (model, mode) pairs a
    GPU may be switched to for in-quota work (reclaim across modes). docs/scheduling.md."""
    from dataclasses import replace

    from django.conf import settings
    from django.db import connection
    from django.db.models import Q

    from broker import extensions
    from broker.models import ProjectUsageHistory
    from broker.scheduler import GpuMode as CoreMode
    from broker.scheduler import UsageHistory
    from broker.scheduler.fairshare import usage_decayed

    half_life = settings.LEASE_FAIR_SHARE_HALF_LIFE_SECONDS
    if history is None and half_life:
        history = {}
        for project_id, tier, decayed, updated in ProjectUsageHistory.objects.values_list(
                "project_id", "tier", "decayed_milli_seconds", "updated_at"):
            history[(str(project_id), tier)] = usage_decayed(
                previous_milli_seconds=decayed, used_milli=0, elapsed_seconds=(now - updated).total_seconds(),
                half_life_seconds=half_life)
    usage = tuple(UsageHistory(project, tier, decayed) for (project, tier), decayed in sorted((history or {}).items())
                  if decayed > 0)
    count, window = settings.LEASE_PREEMPTION_BACKOFF_COUNT, settings.LEASE_PREEMPTION_BACKOFF_WINDOW_SECONDS
    preempted: dict[str, tuple[float, ...]] = {}
    if count:
        # preemptions that can still protect a lease: within the window before a start inside the protection
        since = now.timestamp() - window - settings.LEASE_PREEMPTION_BACKOFF_PROTECT_SECONDS
        with connection.cursor() as cursor:
            cursor.execute("SELECT lease_id, EXTRACT(EPOCH FROM at)::float8 FROM broker_leaseevent "
                           "WHERE to_state = %s AND at >= to_timestamp(%s) ORDER BY lease_id, at",
                           [LeaseState.PREEMPTED, since])
            for lease_id, at in cursor.fetchall():
                preempted[str(lease_id)] = (*preempted.get(str(lease_id), ()), at)
    # reclaim across modes where the capacity loop switches GPUs on its own (``broker.extensions.mode_switch_modes``):
    # only a tier with a guarantee on it can have in-quota work, so those are the models asked about
    tiers = frozenset(q.tier for q in snapshot.quotas) | frozenset(q.tier for q in snapshot.tenant_quotas)
    switch_modes = extensions.mode_switch_modes(tiers, now) if tiers else frozenset()
    ends = {}
    for pk, ends_at, deadline in Lease.objects.filter(
            Q(ends_at__isnull=False) | Q(notice_deadline__isnull=False),
            state__in=[LeaseState.PROVISIONING, LeaseState.ACTIVE, LeaseState.PREEMPTED]).values_list(
            "pk", "ends_at", "notice_deadline"):
        moments = [m.timestamp() for m in (ends_at, deadline) if m is not None]
        ends[str(pk)] = min(moments)
    return replace(snapshot, usage_half_life_seconds=half_life, usage_history=usage, backoff_preemptions=count,
                   backoff_window_seconds=window,
                   backoff_protect_seconds=settings.LEASE_PREEMPTION_BACKOFF_PROTECT_SECONDS, preempted_at=preempted,
                   ends_at=ends, switch_modes=frozenset((model, CoreMode(mode)) for model, mode in switch_modes))


DEMAND_SAMPLE = 5000  # the most recent leases a demand mix is drawn from


class _DemandCache:
    """The demand mix as last read by this process: (when read, the window it was read for, the mix)."""

    read_at: float | None = None
    window: int = 0
    workload: list = []


def scheduler_demand_forget() -> None:
    """Read the demand mix afresh at the next cycle (tests: each starts from its own leases)."""
    _DemandCache.read_at = None


def scheduler_demand(*, now: datetime) -> list:
    """The demand mix the placement policy keeps room for, as the simulator feeds it (``placement.workload_from_needs``:
    the most frequent needs covering 95 % of them): the needs of the leases requested in the last
    ``LEASE_DEMAND_WINDOW_SECONDS`` (at most ``DEMAND_SAMPLE``, the newest), each resolved on the model it was placed on
    (its tier) or the one it asked for; a lease of model ``auto`` not placed yet says nothing of a model and is left
    out. One grouped query, read at most once per ``LEASE_DEMAND_REFRESH_SECONDS`` per process (a cycle, its preview
    and the next cycles share it). Empty with the window 0: the policy then sees no history (as before)."""
    from django.conf import settings

    from broker.scheduler import Kind, Shape
    from broker.scheduler.placement import need_for, workload_from_needs
    from gpus.catalogue import UnknownModel

    window = settings.LEASE_DEMAND_WINDOW_SECONDS
    if not window:
        return []
    wall = now.timestamp()
    cache = _DemandCache
    if (cache.read_at is not None and cache.window == window
            and 0 <= wall - cache.read_at < settings.LEASE_DEMAND_REFRESH_SECONDS):
        return cache.workload
    from django.db.models import Count

    recent = (Lease.objects.filter(requested_at__gte=now - timedelta(seconds=window), requested_at__lte=now)
              .order_by("-requested_at").values_list("pk", flat=True)[:DEMAND_SAMPLE])
    rows = (Lease.objects.filter(pk__in=recent)
            .values_list("kind", "count", "profile", "milli", "memory_mib", "models_allowed", "gang", "tier",
                         "cpu_milli_per_unit", "host_memory_mib_per_unit")
            .annotate(n=Count("pk")).order_by())
    needs = []
    for kind, count, profile, milli, memory, models, gang, tier, cpu, host_memory, n in rows:
        model = tier or (models[0] if models else "")
        if not model:
            continue
        shape = Shape(Kind(kind), count, profile=profile, milli=milli, memory_mib=memory, models=(model,), gang=gang,
                      cpu_milli=cpu * count, host_memory_mib=host_memory * count)
        try:
            need = need_for(shape, model)
        except (UnknownModel, KeyError, ValueError):  # a model or profile no longer in the catalogue
            continue
        if need is not None:
            needs.extend([need] * n)
    workload = workload_from_needs(needs) if needs else []
    cache.read_at, cache.window, cache.workload = wall, window, workload
    return workload


def node_pool_names() -> set[str]:
    """The node pools of the fleet (``Node.pool`` of every enrolled node): what a project may be bound to."""
    return set(Node.objects.values_list("pool", flat=True).distinct())


def scheduler_snapshot(*, now: datetime):
    """What the scheduling core sees: nodes (silent or cordoned ones closed to new work), GPUs not lost,
    live allocations grouped by lease, quotas, warm pool members, prices. Read whole, as plain values (no model
    instances), one query per table, each in id order (``broker.snapshot``, which also keeps it between cycles:
    ``snapshot_cache().load``, the schedule cycle's). Every GPU and every live allocation: the part of a cycle
    that grows with the fleet (100,000 GPUs: docs/scheduling.md, "Performance")."""
    from broker.snapshot import snapshot_read

    return snapshot_read(now=now)


# -- portal: request preview, utilisation, fleet and queue ----------------------------------------------
@dataclass(frozen=True)
class LeasePreview:
    """What would happen to a request if it were made now (nothing is written).

    ``outcome``: ``fits`` (placed at the next cycle), ``reclaims`` (placed once over-quota work of
    others has been given notice) or ``waits`` (with ``queue_position`` and ``reason``). ``tier`` is
    the GPU model it would run on (or the first one whose quota allows it when it waits), ``gpu`` the
    request's ``gpu`` object with that model filled in when the request said ``auto``.
    """

    outcome: str
    reason: str
    tier: str
    over_quota: bool
    queue_position: int | None
    units_milli: int
    gpu: dict
    # when it waits: when it would start, were the running leases to leave at their expiry (``estimate``); None
    # when it does not wait, or no estimate can be made
    estimated_start: datetime | None = None
    # whether the project's guarantee would cover it, its own queued requests ahead of it counted (``Scheduler.
    # covered``, what the first cycle records on the lease): only covered leases are time-to-GPU samples of the SLO;
    # None when the preview does not plan (a suspended tenant)
    guarantee_covered: bool | None = None


def lease_preview(*, actor: Actor, project: object, gpu: object, workload_class: object = "training",
                  priority: object = 0, duration_seconds: object = 3600, now: datetime | None = None) -> LeasePreview:
    """Dry run of ``services.lease_request``: the same checks and errors (each naming its field), then one
    scheduling plan over the current queue with this request appended last among its priority. Reads only."""
    return lease_dry_run(actor=actor, project=project, gpu=gpu, workload_class=workload_class, priority=priority,
                          duration_seconds=duration_seconds, now=now or timezone.now()).preview


@dataclass(frozen=True)
class DryRun:
    """A preview with what the quote needs besides it: the request as ``lease_request`` validated it."""

    preview: LeasePreview
    project: object  # tenants.models.Project
    shape: dict  # services.shape_from(gpu)
    gpu: dict  # the request's gpu object (a resolved kind, e.g. tiering's auto, replaced by what it chose)
    fitting: tuple[str, ...]  # models whose project quota limit admits it, in the request's order
    victims: tuple[str, ...]  # lease ids a reclaim would give notice to


def lease_dry_run(*, actor: Actor, project: object, gpu: object, workload_class: object, priority: object,
                  duration_seconds: object, now: datetime) -> DryRun:
    """The dry run behind ``lease_preview`` and billing's quote (``billing.selectors.quotes``): the request checked
    as ``lease_request`` checks it, then planned over the current queue. Reads only."""
    from broker.extensions import GpuRequest, gpu_resolve
    from broker.scheduler import DecisionMode, Kind, Request, Shape
    from broker.scheduler.plan import Scheduler
    from broker.validation import request_validate

    actor.require("view")
    # a kind another app resolves (tiering's auto) previews as what it resolves to, writing nothing
    choice = gpu_resolve(GpuRequest(actor=actor, project=project, gpu=gpu, workload_class=workload_class,
                                    duration_seconds=duration_seconds, now=now, preview=True))
    if choice is not None:
        gpu = choice.gpu
    valid = request_validate(actor=actor, project=project, gpu=gpu, workload_class=workload_class,
                             priority=priority, duration_seconds=duration_seconds)
    target, shape, units, quotas = valid.project, valid.input.shape, valid.fitting, valid.quotas
    fitting = tuple(units)
    resolved = dict(gpu)  # shape_from accepted it: an object

    covered: bool | None = None

    def result(outcome: str, reason: str, tier: str, over: bool, position: int | None,
               victims: tuple[str, ...] = (), estimate: datetime | None = None) -> DryRun:
        reason = reason.replace(f"project {target.pk} ", f"project '{target.slug}' ")  # the tenant's words
        if choice is not None:
            reason = f"{choice.reason}; {reason}"
        if tier and resolved.get("model", "auto") == "auto":
            resolved["model"] = tier
        preview = LeasePreview(outcome, reason, tier, over, position, units.get(tier, 0), resolved, estimate, covered)
        return DryRun(preview, target, shape, dict(gpu), fitting, victims)

    if not actor.tenant.is_active:  # its requests would be held, not scheduled
        return result("waits", f"held: tenant '{actor.tenant.slug}' is suspended", fitting[0], False, None)
    core_shape = Shape(Kind(shape["kind"]), shape["count"], profile=shape["profile"], milli=shape["milli"],
                       memory_mib=shape["memory_mib"], models=tuple(shape["models"]), gang=shape["gang"],
                       cpu_milli=shape.get("cpu_milli_per_unit", 0) * shape["count"],
                       host_memory_mib=shape.get("host_memory_mib_per_unit", 0) * shape["count"])
    from broker.scheduler.types import WorkloadClass as CoreWorkloadClass

    # the request's class matters: interactive work never borrows over quota (it waits for its guarantee)
    mine = Request("preview", str(target.pk), str(actor.tenant.pk), core_shape, now.timestamp(), priority,
                   CoreWorkloadClass(workload_class), duration_seconds=valid.input.duration_seconds)
    queued = lease_queue()[:5000]
    snapshot = scheduler_inputs(scheduler_snapshot(now=now), now=now)
    requests = [*map(core_request, queued), mine]
    from django.conf import settings

    scheduler = Scheduler(snapshot, workload=scheduler_demand(now=now),  # as the cycle plans
                          reservations=settings.LEASE_RESERVATIONS,
                          reserve_after_seconds=settings.LEASE_RESERVE_AFTER_SECONDS,
                          grow=False)  # elastic growth comes after every request: it changes no request's answer
    covered = scheduler.covered(requests)["preview"]  # before the plan: on the state as read, as the cycle does
    decisions = scheduler.schedule(requests, now=now.timestamp())
    decision = next(d for d in decisions if d.request == "preview")
    estimate = None
    if decision.mode == DecisionMode.WAITING:  # when it would start: the plan continued over the expiries
        from broker.scheduler.estimate import estimated_starts

        at = estimated_starts(scheduler, requests, decisions, now=now.timestamp(),
                              budget=settings.LEASE_ESTIMATE_TRIES).get("preview")
        estimate = None if at is None else datetime.fromtimestamp(at, tz=now.tzinfo)

    if decision.mode == DecisionMode.PLACED:
        allocation = decision.allocation
        kind = "over quota: preemptible, billed at the over-quota rate" if allocation.preemptible else "within quota"
        return result("fits", f"on {allocation.tier}, {kind}", allocation.tier, allocation.preemptible, None)
    if decision.mode == DecisionMode.PREEMPT:
        tier = decision.allocation.tier
        return result("reclaims", f"in quota on {tier}: starts once over-quota work of other projects has had its "
                                  f"preemption notice", tier, False, None, tuple(decision.victims))
    if decision.mode == DecisionMode.SWITCH:  # reclaim across modes: a GPU of another mode emptied and switched
        tier = next(gpu.model for gpu in snapshot.gpus if gpu.id == decision.switch[0])
        mode = "MIG" if decision.switch[1] == "mig" else decision.switch[1]
        emptied = ("once over-quota work of other projects has had its preemption notice and the GPU it held has been"
                   if decision.victims else "once an idle GPU has been")
        return result("reclaims", f"in quota on {tier}: no room in {mode} mode; starts {emptied} switched to {mode} "
                                  "mode for it", tier, False, None, tuple(decision.victims))
    if decision.mode == DecisionMode.SHRINK:  # an elastic over-quota lease gives back units: no notice to wait for
        tier = decision.allocation.tier
        return result("reclaims", f"in quota on {tier}: starts once an elastic over-quota lease has given back "
                                  "units (at once, no notice)", tier, False, None,
                      tuple(allocation_id for allocation_id, _ in decision.shrunk))
    # waiting: would it be in quota or over quota on the first model whose quota admits it now?
    fresh = Scheduler(snapshot)
    for tier, need in fresh.tiers_for(mine):
        blocked, in_quota = fresh.quota_check(mine, tier, need)
        if blocked is None:  # interactive work waits for its guarantee: it never runs over quota
            over = not in_quota and mine.workload_class != CoreWorkloadClass.INTERACTIVE
            return result("waits", decision.reason, tier, over, decision.queue_position, estimate=estimate)
    # no GPU of an allowed model is in the fleet now: judge by the project's own quota
    used = quota_usage(actor=actor)
    tier = fitting[0]
    in_use = used.get((target.pk, tier), {"in_use": 0})["in_use"]
    return result("waits", decision.reason, tier, in_use + units[tier] > quotas[tier].deserved_gpu_milli,
                  decision.queue_position, estimate=estimate)


def duration_words(seconds: int) -> str:
    """``7200`` → "2 h", ``5400`` → "1 h 30 min", ``90`` → "1 min 30 s", ``90000`` → "1 d 1 h"."""
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        amount, seconds = divmod(seconds, size)
        if amount:
            parts.append(f"{amount} {unit}")
    return " ".join(parts[:2]) or "0 s"


def lease_utilisation(*, lease: Lease, now: datetime | None = None, points: int = 60) -> list[float] | None:
    """The lease's compute utilisation (0-100 %, mean over its devices) from DCGM metrics in Prometheus,
    ``points`` samples over its time on GPUs; [] when there is none yet, None when Prometheus is down."""
    if lease.active_at is None:
        return []
    ids = "|".join(f"alloc-{pk}" for pk in Allocation.objects.filter(lease=lease).values_list("pk", flat=True))
    if not ids:
        return []
    end = lease.finished_at or now or timezone.now()
    start = lease.active_at
    step = max(1.0, (end - start).total_seconds() / points)
    try:
        result = Prometheus(timeout=OPTIONAL_TIMEOUT_SECONDS).query_range(
            f'avg(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{allocation_id=~"{ids}"}})',
            start=start.timestamp(), end=end.timestamp(), step=f"{step:.3f}")
    except PrometheusError:
        return None
    values = result[0]["values"] if result else []
    return [round(float(value) * 100, 1) for _, value in values]


def fleet_utilisation() -> dict[str, float] | None:
    """Platform staff: compute utilisation now (0-100 %) per allocation instance id and per GPU UUID
    (whole and shared GPUs), from Prometheus; None when it does not answer."""
    prometheus = Prometheus(timeout=OPTIONAL_TIMEOUT_SECONDS)
    try:
        consumers = prometheus.query('DCGM_FI_PROF_GR_ENGINE_ACTIVE{allocation_id!=""}')
    except PrometheusError:
        return None
    try:
        gpus = prometheus.query("DCGM_FI_DEV_GPU_UTIL")
    except PrometheusError:
        gpus = []
    found = {row["metric"]["allocation_id"]: round(float(row["value"][1]) * 100, 1) for row in consumers}
    found.update({row["metric"]["UUID"]: round(float(row["value"][1]), 1) for row in gpus})
    return found


def node_list() -> QuerySet[Node]:
    """Platform staff: every node with its GPUs (lost ones excluded), by pool and id."""
    return Node.objects.prefetch_related(
        Prefetch("gpus", queryset=Gpu.objects.filter(lost_at__isnull=True).order_by("index"))
    ).order_by("pool", "node_id")


def node_tenant_count(*, node: Node) -> int:
    """How many tenants hold live allocations on the node's GPUs now."""
    return (Allocation.objects.filter(gpu__node=node, freed_at__isnull=True, lease__isnull=False)
            .values("lease__tenant_id").distinct().count())


def node_isolation_warning(*, node: Node, tenant_count: int) -> str:
    """Platform staff: the warning for a node whose agent runs tenant processes as its own user (isolation
    ``none``, ``agent.isolation``) while it serves more than one tenant; "" otherwise."""
    if node.workload_runtime != "process" or node.isolation != NodeIsolation.NONE or tenant_count < 2:
        return ""
    return (f"{node.node_id} runs workloads as its agent's own user (isolation none) and serves {tenant_count} "
            "tenants: one tenant's workload can read another's environment and files and the node's secret. Run "
            "the agent as root (isolation uid) or cordon the node.")


def node_get(*, node_id: str) -> Node:
    node = Node.objects.filter(node_id=node_id).first()
    if node is None:
        raise NotFound(f"No node {node_id!r}.", field="node")
    return node


def allocation_list_live() -> QuerySet[Allocation]:
    """Platform staff: every allocation that holds capacity now, with its lease, tenant and project."""
    return (Allocation.objects.filter(freed_at__isnull=True, lease__isnull=False)
            .select_related("lease__tenant", "lease__project", "gpu").order_by("gpu_id", "mig_start", "pk"))


def queue_list() -> QuerySet[Lease]:
    """Platform staff: every waiting lease of every tenant in the scheduler's order (its last position)."""
    from django.db.models import F

    return (Lease.objects.filter(state__in=(LeaseState.REQUESTED, LeaseState.QUEUED))
            .select_related("tenant", "project")
            .order_by(F("queue_position").asc(nulls_last=True), "-priority", "queued_at", "pk"))


# -- how to use a lease: one environment per node, and what the node enforces --------------------------------
def _reported(*objects, names: tuple[str, ...]) -> str:
    """The first of ``names`` that one of ``objects`` carries, non-empty (fields another branch adds to the node's
    inventory, such as its isolation mode: read defensively, "" when no node reports it)."""
    for obj in objects:
        for name in names:
            value = getattr(obj, name, None)
            if isinstance(value, dict):
                value = value.get("mode") or value.get("value") or ""
            if value:
                return str(value)
    return ""


def lease_access(*, lease: Lease) -> list[dict]:
    """How to use a holding lease's devices, per node (a gang lease: one node): the node (its id and the host
    to reach it by), the one environment that shows a process all the lease's devices on it
    (``agent.protocol.instances_env``: ``CUDA_VISIBLE_DEVICES`` lists them all) and what is enforced there —
    the share limits (``share_enforcement_of`` the node's shares: MPS or nothing, and why) and the node's isolation
    mode, "unknown" where the node does not say — and, for a workload with a ``port``, ``interactive``: the broker URL
    that reaches it (``lease_interactive_url``; null otherwise); for any workload, ``ssh``: the command that opens a
    shell beside it through the broker's SSH gateway (``lease_ssh_command``; null without a gateway). Empty for a
    lease holding nothing."""
    from urllib.parse import urlsplit

    from agent.protocol import instances_env

    live = [a for a in lease.allocations.all() if a.freed_at is None]
    by_node: dict[int, list[Allocation]] = {}
    for allocation in sorted(live, key=lambda a: a.pk):
        by_node.setdefault(allocation.gpu.node_id, []).append(allocation)
    out = []
    for allocations in by_node.values():
        node = allocations[0].gpu.node
        env = instances_env([{"access": {**(a.access or {}), **(lease.access_extra or {})}, "kind": a.kind,
                              "memory_mib": a.memory_mib, "device_uuid": a.device_uuid} for a in allocations])
        shares = [a for a in allocations if a.kind == "share"]
        enforcement = share_enforcement_of(allocations)
        isolation = _reported(node, *(a.gpu for a in allocations),
                              names=("isolation_mode", "isolation", "workload_isolation")) or "unknown"
        out.append({
            "node": node.node_id, "host": node.hostname or urlsplit(node.address).hostname or "",
            "devices": [a.instance_id for a in allocations], "ready": all(a.device_uuid for a in allocations),
            "env": env,
            "share_enforcement": enforcement["mode"] if enforcement else None,
            "share_enforcement_text": enforcement["reason"] if enforcement else None,
            "share_limits": [{"instance_id": a.instance_id, "milli": a.milli, "memory_mib": a.memory_mib}
                             for a in shares],
            "isolation": isolation,
            "interactive": None,
            "ssh": None,
        })
    url = lease_interactive_url(lease=lease) if out else None
    if url is not None:  # a gang lease's workload runs on its one node
        out[0]["interactive"] = {
            "url": url, "websocket_url": "ws" + url[len("http"):], "port": lease.workload.spec["port"],
            "running": lease.workload.state in ("starting", "running"),
            "how": "send your API token (Authorization: Bearer …) or be signed in to the portal; the workload sees "
                   "the path after /port and X-Forwarded-Prefix"}
    ssh = lease_ssh_command(lease=lease) if out else None
    if ssh is not None:
        out[0]["ssh"] = {
            "command": ssh, "running": lease.workload.state in ("starting", "running"),
            "how": "register your SSH public key (Settings → SSH keys, or POST /api/v1/ssh-keys); the shell runs "
                   "beside the workload, as its user, in its working directory, with its devices"}
    return out


def lease_ssh_command(*, lease: Lease) -> str | None:
    """``ssh -p <port> lease-<id>@<host>``: how to reach a lease's workload through the broker's SSH gateway
    (``SSH_GATEWAY_ADDRESS``); None for a lease without a workload or where no gateway is configured."""
    try:
        workload = lease.workload
    except Workload.DoesNotExist:
        return None
    gateway = ssh_gateway_address()
    if workload is None or gateway is None:
        return None
    host, port = gateway
    return f"ssh -p {port} lease-{lease.pk}@{host}"


def ssh_gateway_address() -> tuple[str, str] | None:
    """(host, port) tenants are told for the SSH gateway (``SSH_GATEWAY_ADDRESS``), or None where none is set."""
    from django.conf import settings

    host, _, port = settings.SSH_GATEWAY_ADDRESS.rpartition(":")
    return (host, port) if host and port else None


INTERACTIVE_PATH = "/leases/{lease_id}/port/"


def lease_interactive_url(*, lease: Lease) -> str | None:
    """The broker URL of a lease's interactive workload port (``INTERACTIVE_PROXY_URL`` + ``/leases/<id>/port/``);
    None when the lease's workload declares no port or no proxy is configured. It answers while the workload runs."""
    from django.conf import settings

    try:
        workload = lease.workload
    except Workload.DoesNotExist:
        return None
    if workload is None or not workload.spec.get("port") or not settings.INTERACTIVE_PROXY_URL:
        return None
    return settings.INTERACTIVE_PROXY_URL + INTERACTIVE_PATH.format(lease_id=lease.pk)


def lease_interactive_target(*, actor: Actor, lease_id: int) -> dict:
    """Where the interactive proxy relays a request for ``lease_id``'s workload port: the node's agent (URL, node id
    and secret, to sign the relay) and the agent workload of the current placement. The lease is looked up among the
    actor's tenant's own (another tenant's: 404, as every lease read); using the port is the ``use`` action (a viewer
    or a read-only token: 403); a lease whose workload declares no port, or that does not run now, is 409 naming
    ``workload.port``."""
    return _workload_target(actor=actor, lease_id=lease_id, port=True)


def lease_shell_target(*, actor: Actor, lease_id: int) -> dict:
    """Where the SSH gateway opens a shell for ``lease_id``: as ``lease_interactive_target``, for any workload
    (no port needed); a lease without a workload, or whose workload does not run now, is 409 naming ``workload``."""
    return _workload_target(actor=actor, lease_id=lease_id, port=False)


def _workload_target(*, actor: Actor, lease_id: int, port: bool) -> dict:
    from core.errors import Conflict

    field = "workload.port" if port else "workload"
    lease = restrict(Lease.objects.all(), actor).filter(pk=lease_id).first()
    if lease is None:
        raise NotFound("No such lease.", field="id")
    actor.require("use")
    workload = Workload.objects.filter(lease=lease).select_related("node").first()
    if workload is None:
        raise Conflict(f"Lease {lease.pk} runs no workload: there is nothing to reach. Give the lease a workload "
                       "(for a bare shell, a command such as `sleep infinity`).", field=field)
    if port and not workload.spec.get("port"):
        raise Conflict("This lease's workload declares no port (workload.port): there is nothing to reach.",
                       field=field)
    if (lease.state != LeaseState.ACTIVE or workload.node is None or not workload.agent_workload_id
            or workload.state not in ("starting", "running")):
        raise Conflict(f"The lease is {lease.state} and its workload {workload.state}: "
                       f"{'the port answers' if port else 'a shell opens'} while the workload runs.", field=field)
    node = workload.node
    return {"lease_id": lease.pk, "node_id": node.node_id, "agent_url": node.address, "secret": node.secret,
            "agent_workload_id": workload.agent_workload_id}
