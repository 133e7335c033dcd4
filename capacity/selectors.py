"""Readers of the capacity loop: the planner's snapshot built from the tables and Prometheus, the loop's
policies, the adjustments a tenant or staff may see, and the fleet's pools.

``capacity_snapshot`` is the live twin of ``bench.sim.capacity.Replay._snapshot``: same types, filled
from PostgreSQL (GPUs, live and warm allocations, the queue with the scheduler's own quota verdict, the
request history, quotas and hourly usage, the general price book) and from Prometheus (the per-lease
engine-active and framebuffer series the DCGM metrics carry by ``allocation_id``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db.models import Q, QuerySet

from broker.choices import AllocationState, LeaseState, NodeStatus
from broker.models import Allocation, Gpu, Lease, Workload
from broker.scheduler import GpuMode as CoreMode
from broker.scheduler import Kind
from broker.scheduler.types import WorkloadClass
from capacity.choices import AdjustmentKind
from capacity.models import Adjustment, CapacityPolicy
from capacity.planner import (
    Arrivals,
    CapacityGpu,
    CapacitySnapshot,
    CreateLatency,
    DemandShape,
    History,
    IdleRule,
    Instance,
    Policy,
    Price,
    QuotaUse,
    ReclaimClass,
    Utilisation,
    Waiting,
    WarmInstance,
)
from capacity.planner.types import DEFAULT_IDLE_RULES, DEFAULT_MODES, Mode
from core.errors import NotFound
from core.prometheus import OPTIONAL_TIMEOUT_SECONDS, Prometheus, PrometheusError
from tenants.access import Actor
from tenants.models import Project

logger = logging.getLogger(__name__)

SIX_PLACES = Decimal("0.000001")

ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
FB_USED = "DCGM_FI_DEV_FB_USED"
MODE_FIELDS = ("mode_switch", "mig_layout", "warm_pool", "idle_reclaim", "right_size", "quota_advice")
NUMBER_FIELDS = ("warm_target_p95_seconds", "cold_provision_seconds", "warm_min_arrivals", "mode_hold_seconds")


# -- policies ------------------------------------------------------------------------------------------
def _rules(raw: dict, base: tuple) -> tuple[tuple[ReclaimClass, IdleRule], ...]:
    out = []
    for name, rule in base:
        given = raw.get(name.value) or {}
        out.append((name, IdleRule(**{**{"enabled": rule.enabled, "threshold_permille": rule.threshold_permille,
                                           "window_seconds": rule.window_seconds,
                                           "notice_seconds": rule.notice_seconds}, **given})))
    return tuple(out)


def _merge(base: Policy, row: CapacityPolicy) -> Policy:
    values = {name: Mode(getattr(row, name)) for name in MODE_FIELDS if getattr(row, name)}
    values |= {name: getattr(row, name) for name in NUMBER_FIELDS if getattr(row, name) is not None}
    return replace(base, scope=row.scope, idle_rules=_rules(row.idle_rules or {}, base.idle_rules), **values)


def switch_modes_in_force(models: frozenset[str], now: datetime) -> frozenset[tuple[str, str]]:
    """The (model, mode) pairs of ``models`` to which the loop switches a GPU on its own, so that a schedule cycle
    may empty one of over-quota work for an in-quota lease of that mode (``broker.extensions.mode_switch_register``):
    ``mig`` where MIG layout is ``auto``, ``whole`` and ``shared`` where mode switch is, each model under its pool's
    policy (scope ``pool:<model>``) else the platform's. One small read: the cycle asks every time."""
    builtin = Policy(**{name: Mode(mode) for name, mode in builtin_modes().items()})
    rows = {row.scope: row for row in CapacityPolicy.objects.filter(
        Q(scope="") | Q(scope__in=[f"pool:{model}" for model in models]))}
    default = _merge(builtin, rows[""]) if "" in rows else builtin
    pairs = set()
    for model in models:
        row = rows.get(f"pool:{model}")
        policy = _merge(default, row) if row is not None else default
        if policy.mig_layout == Mode.AUTO:
            pairs.add((model, CoreMode.MIG.value))
        if policy.mode_switch == Mode.AUTO:
            pairs.update({(model, CoreMode.WHOLE.value), (model, CoreMode.SHARED.value)})
    return frozenset(pairs)


def builtin_modes() -> dict[str, str]:
    """Each kind's mode where no policy row says otherwise: ``settings.CAPACITY_DEFAULT_MODE`` for every kind
    where it is set, else the planner's ``DEFAULT_MODES`` (auto where only idle capacity is touched)."""
    if settings.CAPACITY_DEFAULT_MODE:
        return dict.fromkeys(MODE_FIELDS, settings.CAPACITY_DEFAULT_MODE)
    return {kind.value: mode.value for kind, mode in DEFAULT_MODES}


# what a project's idle reclaim opt-in covers: its interactive leases, and the suspension of its idle resumable
# training (which a project may refuse on its own: ``Project.idle_suspend_opt_out``)
OPT_IN_CLASSES = (ReclaimClass.INTERACTIVE, ReclaimClass.RESUMABLE)


def _without_suspension(policy: Policy) -> Policy:
    """``policy`` with the resumable-training rule switched off (a project that opted out of suspension)."""
    return replace(policy, idle_rules=tuple((name, replace(rule, enabled=False) if name == ReclaimClass.RESUMABLE
                                             else rule) for name, rule in policy.idle_rules))


def policies_in_force() -> tuple[Policy, ...]:
    """Every scope's policy, each merged over the default scope's, itself over the built-in modes
    (``builtin_modes``). A project whose tenant opted in to idle reclaim (``Project.idle_reclaim_opt_in``) gets
    its scope's policy with ``idle_auto_classes`` (interactive and resumable training), unless a staff policy of
    that scope sets ``idle_reclaim`` itself: staff's word wins. A project that opted out of suspension
    (``Project.idle_suspend_opt_out``) gets its scope's policy with the resumable-training rule off, whatever any
    policy says: its idle training is never suspended."""
    builtin = Policy(**{name: Mode(mode) for name, mode in builtin_modes().items()}, idle_rules=DEFAULT_IDLE_RULES)
    rows = list(CapacityPolicy.objects.order_by("scope"))
    default_row = next((row for row in rows if row.scope == ""), None)
    default = _merge(builtin, default_row) if default_row else builtin
    scoped = {row.scope: _merge(default, row) for row in rows if row.scope}
    explicit = {row.scope for row in rows if row.scope and row.idle_reclaim}
    for pk in Project.objects.filter(idle_reclaim_opt_in=True).values_list("pk", flat=True):
        scope = f"project:{pk}"
        if scope not in explicit:
            scoped[scope] = replace(scoped.get(scope, replace(default, scope=scope)), idle_auto_classes=OPT_IN_CLASSES)
    for pk in Project.objects.filter(idle_suspend_opt_out=True).values_list("pk", flat=True):
        scope = f"project:{pk}"
        scoped[scope] = _without_suspension(scoped.get(scope, replace(default, scope=scope)))
    return (default, *(scoped[scope] for scope in sorted(scoped)))


def project_policy(project_id: int, policies: tuple[Policy, ...] | None = None) -> Policy:
    """The policy in force for one project's leases (its scope's, else the default's)."""
    policies = policies_in_force() if policies is None else policies
    by_scope = {policy.scope: policy for policy in policies}
    return by_scope.get(f"project:{project_id}", by_scope[""])


def policy_list() -> QuerySet[CapacityPolicy]:
    return CapacityPolicy.objects.order_by("scope")


def policy_get(*, pk: int) -> CapacityPolicy:
    policy = CapacityPolicy.objects.filter(pk=pk).first()
    if policy is None:
        raise NotFound("No such capacity policy.", field="id")
    return policy


# -- the snapshot ----------------------------------------------------------------------------------------
@dataclass
class SnapshotNotes:
    """What the snapshot could not read (the run says so instead of failing)."""

    prometheus: str = "ok"
    skipped: list[str] = field(default_factory=list)


def capacity_snapshot(*, now: datetime) -> tuple[CapacitySnapshot, SnapshotNotes]:
    notes = SnapshotNotes()
    policies = policies_in_force()
    leases: dict[int, Lease] = {}
    gpus = _gpus(now, leases)
    queue = _queue(now)
    history = _history(now)
    # the resumable-training rule's hour of series is read only where a lease could use it
    resumable = any(instance.resumable for gpu in gpus for instance in gpu.instances)
    utilisation = _utilisation(now, leases, policies if resumable else tuple(map(_without_suspension, policies)),
                               notes)
    quotas, quota_use = _quotas(now, policies)
    prices, currency = _prices(now)
    snapshot = CapacitySnapshot(gpus=gpus, queue=queue, history=history, utilisation=utilisation, quotas=quotas,
                                quota_use=quota_use, prices=prices, currency=currency, policies=policies,
                                create_latency=create_latency(now=now))
    return snapshot, notes


def _gpus(now: datetime, leases: dict[int, Lease]) -> tuple[CapacityGpu, ...]:
    """GPUs of ready, uncordoned nodes that are not lost, with their live instances (lease held) and warm pool
    members. ``leases`` is filled with the live leases read. A GPU already changing mode is there in the mode it is
    being switched to, empty and ``changing`` (what it still holds is leaving): the queue waiting for it is fitted
    on it, and nothing is proposed for it."""
    every = list(Gpu.objects.filter(lost_at__isnull=True, node__status=NodeStatus.READY, node__cordoned=False)
                 .select_related("node").order_by("node__node_id", "index"))
    rows = [gpu for gpu in every if not gpu.mode_target]
    changing = [gpu for gpu in every if gpu.mode_target]
    live = (Allocation.objects.filter(gpu__in=rows, freed_at__isnull=True).select_related("lease")
            .order_by("pk"))
    instances: dict[int, list[Instance]] = defaultdict(list)
    warm: dict[int, list[WarmInstance]] = defaultdict(list)
    noticed_at = _noticed_at([a.lease_id for a in live if a.lease_id is not None
                              and a.lease.state == LeaseState.ACTIVE and a.lease.notice_deadline is not None])
    resumable = _resumable({a.lease_id for a in live if a.lease_id is not None})
    for allocation in live:
        if allocation.lease_id is None:
            warm[allocation.gpu_id].append(WarmInstance(str(allocation.pk), allocation.mig_profile,
                                                        allocation.mig_start, allocation.state == AllocationState.WARM))
            continue
        lease = allocation.lease
        leases[lease.pk] = lease
        started = lease.active_at or lease.queued_at or lease.requested_at
        noticed = noticed_at.get(lease.pk)
        instances[allocation.gpu_id].append(Instance(
            lease=str(lease.pk), project=str(lease.project_id), in_quota=not allocation.preemptible,
            workload_class=WorkloadClass(lease.workload_class), profile=allocation.mig_profile,
            start=allocation.mig_start if allocation.mig_start is not None else -1, milli=allocation.milli,
            memory_mib=allocation.memory_mib, started_at=started.timestamp(), noticed_at=noticed,
            resumable=lease.pk in resumable and not lease.group_key))
    return tuple(CapacityGpu(id=f"g{gpu.pk}", node=gpu.node.node_id, model=gpu.model, mode=CoreMode(gpu.mode),
                             instances=tuple(instances[gpu.pk]), warm=tuple(warm[gpu.pk]),
                             mode_since=(gpu.mode_since or gpu.node.enrolled_at).timestamp(), pool=gpu.node.pool)
                 for gpu in rows) + tuple(
        CapacityGpu(id=f"g{gpu.pk}", node=gpu.node.node_id, model=gpu.model, mode=CoreMode(gpu.mode_target),
                    mode_since=now.timestamp(), pool=gpu.node.pool, changing=True) for gpu in changing)


def _resumable(lease_ids: set[int]) -> set[int]:
    """The leases among ``lease_ids`` whose workload can resume after a suspension (one query)."""
    from broker.selectors import workload_resumable

    if not lease_ids:
        return set()
    return {lease_id for lease_id, spec in Workload.objects.filter(lease_id__in=lease_ids)
            .values_list("lease_id", "spec") if workload_resumable(spec)}


def _noticed_at(lease_ids: list[int]) -> dict[int, float]:
    """Per noticed lease, when the capacity loop's idle notice went out (its newest applied notice
    adjustment), in one query; a lease noticed otherwise (the scheduler's preemption) is not in it."""
    if not lease_ids:
        return {}
    out: dict[int, float] = {}
    for lease_id, finished in (Adjustment.objects.filter(
            kind=AdjustmentKind.IDLE_RECLAIM, lease_id__in=set(lease_ids), state="applied", change__step="notice")
            .order_by("lease_id", "-finished_at").values_list("lease_id", "finished_at")):
        out.setdefault(lease_id, finished.timestamp())
    return out


def _queue(now: datetime) -> tuple[Waiting, ...]:
    """The scheduler's queue, each request resolved to a model and told in-quota or not by the scheduling
    core's own quota check on the current snapshot (the oldest ``CAPACITY_QUEUE_MAX``)."""
    from broker.scheduler.plan import Scheduler
    from broker.selectors import core_request, lease_queue, scheduler_snapshot

    queued = list(lease_queue()[: settings.CAPACITY_QUEUE_MAX])
    if not queued:
        return ()
    core = Scheduler(scheduler_snapshot(now=now))
    out = []
    for lease in queued:
        request = core_request(lease)
        chosen = None
        for tier, need in core.tiers_for(request):
            reason, in_quota = core.quota_check(request, tier, need)
            if reason is None:
                chosen = (tier, need, in_quota)
                break
            chosen = chosen or (tier, need, False)
        if chosen is None:
            continue
        tier, need, in_quota = chosen
        pools = tuple(request.shape.pools or core.snapshot.project_pools.get(request.project, ()))
        out.append(Waiting(request=str(lease.pk), project=str(lease.project_id), shape=_demand(tier, need),
                           count=lease.count, in_quota=in_quota, reason=lease.reason,
                           waited_seconds=int((now - (lease.queued_at or lease.requested_at)).total_seconds()),
                           pools=pools))
    return tuple(out)


def _demand(tier: str, need) -> DemandShape:
    if need.kind == Kind.MIG:
        return DemandShape(tier, Kind.MIG, need.profile.name, need.profile.gpu_milli)
    if need.kind == Kind.SHARE:
        return DemandShape(tier, Kind.SHARE, "", need.milli)
    return DemandShape(tier, Kind.WHOLE)


def _history(now: datetime) -> History:
    """Units requested per shape over the last ``CAPACITY_HISTORY_SECONDS`` (the model and profile they
    ran on, or the first model they allowed when they never ran)."""
    start = now - timedelta(seconds=settings.CAPACITY_HISTORY_SECONDS)
    counts: dict[DemandShape, int] = defaultdict(int)
    rows = (Lease.objects.filter(requested_at__gte=start, requested_at__lt=now)
            .values_list("pk", "kind", "count", "tier", "models_allowed", "profile", "milli"))
    placed_profile = dict(Allocation.objects.filter(lease__requested_at__gte=start, lease__requested_at__lt=now)
                          .exclude(mig_profile="").values_list("lease_id", "mig_profile"))
    for pk, kind, count, tier, models_allowed, profile, milli in rows:
        model = tier or (models_allowed[0] if models_allowed else "")
        if not model:
            continue
        if kind == "mig":
            name = placed_profile.get(pk, profile)
            if "." not in name:
                continue  # an auto compute size that never resolved to a profile
            shape = DemandShape(model, Kind.MIG, name)
        elif kind == "share":
            shape = DemandShape(model, Kind.SHARE, "", milli)
        else:
            shape = DemandShape(model, Kind.WHOLE)
        counts[shape] += count
    return History(start.timestamp(), now.timestamp(), tuple(Arrivals(s, n) for s, n in sorted(counts.items())))


def create_latency(*, now: datetime) -> tuple[CreateLatency, ...]:
    """The fleet's measured cold create time of MIG instances over the last ``CAPACITY_HISTORY_SECONDS``: per
    model and profile, and per model over every profile (``profile`` empty), the p95 of ``ready_at −
    created_at`` of instances created for a lease (a warm member bound later is not a cold create) and of
    ``warm_at − created_at`` of warm pool members (made by the same agent call)."""
    start = now - timedelta(seconds=settings.CAPACITY_HISTORY_SECONDS)
    rows = (Allocation.objects.filter(created_at__gte=start, created_at__lt=now).exclude(mig_profile="")
            .filter(Q(lease__isnull=False, bound_at__isnull=True, ready_at__isnull=False)
                    | Q(warm_at__isnull=False))
            .values_list("gpu__model", "mig_profile", "created_at", "ready_at", "warm_at"))
    samples: dict[tuple[str, str], list[int]] = defaultdict(list)
    for model, profile, created, ready, warm in rows:
        done = warm if warm is not None else ready
        milliseconds = max(0, round((done - created).total_seconds() * 1000))
        samples[(model, profile)].append(milliseconds)
        samples[(model, "")].append(milliseconds)
    out = []
    for (model, profile), values in sorted(samples.items()):
        ordered = sorted(values)
        p95 = ordered[min(len(ordered) - 1, max(0, -(-95 * len(ordered) // 100) - 1))]
        out.append(CreateLatency(model, profile, p95, len(ordered)))
    return tuple(out)


def _series_seconds(policies: tuple[Policy, ...]) -> int:
    longest = 0
    for policy in policies:
        if policy.idle_reclaim != Mode.OFF:
            longest = max([longest, *(r.window_seconds for _, r in policy.idle_rules if r.enabled)])
        if policy.right_size != Mode.OFF:
            longest = max(longest, policy.right_size_min_seconds)
    return min(longest, settings.CAPACITY_SERIES_MAX_SECONDS)


def _utilisation(now: datetime, leases: dict[int, Lease], policies, notes: SnapshotNotes) -> tuple[Utilisation, ...]:
    """Per live lease: engine-active per-mille (mean over its instances) and framebuffer MiB (their sum),
    one point per ``CAPACITY_SERIES_STEP_SECONDS`` from when the lease started (or the window's start)."""
    seconds = _series_seconds(policies)
    running = {pk: lease for pk, lease in leases.items()
               if lease.state in (LeaseState.ACTIVE, LeaseState.PREEMPTED) and lease.active_at is not None}
    if not seconds or not running:
        return ()
    step = settings.CAPACITY_SERIES_STEP_SECONDS
    start = now - timedelta(seconds=seconds)
    owner = {f"alloc-{pk}": lease_id for pk, lease_id in Allocation.objects.filter(
        lease_id__in=running, freed_at__isnull=True).values_list("pk", "lease_id")}
    series: dict[str, dict[int, dict[int, list[float]]]] = {}
    prometheus = Prometheus(timeout=OPTIONAL_TIMEOUT_SECONDS)
    for name, metric in (("engine", ENGINE_ACTIVE), ("fb", FB_USED)):
        try:
            result = prometheus.query_range(f'{metric}{{allocation_id!=""}}', start=start.timestamp(),
                                            end=now.timestamp(), step=step)
        except PrometheusError:
            notes.prometheus = f"Prometheus at {settings.PROMETHEUS_URL} did not answer; idle reclaim and " \
                               "right-sizing were skipped this run"
            return ()
        points: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for row in result:
            lease_id = owner.get(row["metric"].get("allocation_id", ""))
            if lease_id is None:
                continue
            for moment, value in row["values"]:
                points[lease_id][round(float(moment))].append(float(value))
        series[name] = points
    out = []
    for lease_id in sorted(running):
        lease = running[lease_id]
        since = max(lease.active_at, start).timestamp()
        engine = series["engine"].get(lease_id, {})
        moments = sorted(t for t in engine if t >= since)
        if not moments:
            continue
        fb = series["fb"].get(lease_id, {})
        active, memory = [], []
        for moment in range(moments[0], int(now.timestamp()) + 1, step):
            values = engine.get(moment)
            if values is None:  # a missed scrape: the newest point before it stands
                values = [active[-1] / 1000] if active else [0.0]
            active.append(round(1000 * sum(values) / len(values)))
            memory.append(round(sum(fb.get(moment, [memory[-1] if memory else 0]))))
        out.append(Utilisation(str(lease_id), float(moments[0] - step), step, tuple(active), tuple(memory)))
    return tuple(out)


def _quotas(now: datetime, policies) -> tuple[tuple, tuple[QuotaUse, ...]]:
    from billing.models import AllocationUsage
    from broker.selectors import scheduler_snapshot

    quotas = scheduler_snapshot(now=now).quotas
    if all(policy.quota_advice == Mode.OFF for policy in policies):
        return quotas, ()
    window = max(policy.quota_window_seconds for policy in policies)
    start = (now - timedelta(seconds=window)).replace(minute=0, second=0, microsecond=0)
    hours = int((now - start).total_seconds() // 3600)
    if hours <= 0:
        return quotas, ()
    use: dict[tuple[str, str], list[int]] = {}
    for project_id, tier, hour, milli, seconds in (
            AllocationUsage.objects.filter(hour_start__gte=start, hour_start__lt=now, over_quota=False)
            .values_list("project_id", "tier", "hour_start", "gpu_milli", "seconds")):
        index = int((hour - start).total_seconds() // 3600)
        if 0 <= index < hours:
            use.setdefault((str(project_id), tier), [0] * hours)[index] += int(milli * seconds / 3600)
    return quotas, tuple(QuotaUse(project, tier, start.timestamp(), 3600, tuple(values))
                         for (project, tier), values in sorted(use.items()))


def _prices(now: datetime) -> tuple[tuple[Price, ...], str]:
    """The general price book in force in ``LIST_PRICE_CURRENCY`` (whole-GPU and MIG-profile rates). A
    tenant's own book prices its right-sizing advice (``capacity.services``)."""
    from billing.selectors import list_prices

    currency, rates = list_prices(at=now)
    return tuple(Price(tier, minor, profile=profile, share=kind == "share")
                 for tier, kind, profile, minor in rates), currency


# -- what people see ---------------------------------------------------------------------------------------
def adjustment_list(*, actor: Actor | None, staff: bool = False, kind: str = "", state: str = "",
                    open_only: bool = False) -> QuerySet[Adjustment]:
    """Staff: every adjustment. A tenant: its own advice and every change that touched one of its leases; an
    actor limited to projects does not see advice on another project."""
    rows = Adjustment.objects.select_related("tenant", "project", "lease", "gpu__node").order_by("-proposed_at", "-pk")
    if not staff:
        rows = rows.filter(Q(tenant=actor.tenant) | Q(tenant_ids__contains=[actor.tenant.pk]))
        if actor.project_ids is not None:
            rows = rows.filter(Q(project__isnull=True) | Q(project_id__in=list(actor.project_ids)))
    if kind:
        rows = rows.filter(kind=kind)
    if state:
        rows = rows.filter(state=state)
    if open_only:
        rows = rows.filter(state__in=("proposed", "applying"))
    return rows


def leases_of_tenant(tenant_id: int, lease_ids) -> set[int]:
    """Which of ``lease_ids`` are the tenant's."""
    return set(Lease.objects.filter(pk__in=list(lease_ids), tenant_id=tenant_id).values_list("pk", flat=True))


def adjustment_get(*, actor: Actor | None, pk: int, staff: bool = False) -> Adjustment:
    found = adjustment_list(actor=actor, staff=staff).filter(pk=pk).first()
    if found is None:
        raise NotFound("No such adjustment.", field="id")
    return found


def advice_savings(*, actor: Actor) -> dict:
    """The tenant dashboard's advice panel: open advice and what following it would have saved."""
    rows = list(adjustment_list(actor=actor, open_only=True).filter(
        kind__in=(AdjustmentKind.RIGHT_SIZE, AdjustmentKind.IDLE_RECLAIM, AdjustmentKind.QUOTA_ADVICE)))
    money: dict[str, int] = defaultdict(int)
    for row in rows:
        if row.gain_money_minor > 0 and row.currency:
            money[row.currency] += row.gain_money_minor
    return {"count": len(rows), "rows": rows[:5], "money": dict(money)}


def fleet_pools() -> list[dict]:
    """Staff fleet page: per model, GPUs by mode (and changing), warm pool members by profile, live leases."""
    pools: dict[str, dict] = {}
    for gpu in Gpu.objects.filter(lost_at__isnull=True).order_by("model"):
        pool = pools.setdefault(gpu.model, {"model": gpu.model, "modes": defaultdict(int), "changing": 0,
                                            "warm": defaultdict(lambda: [0, 0]), "gpus": 0})
        pool["gpus"] += 1
        pool["modes"][gpu.mode] += 1
        pool["changing"] += bool(gpu.mode_target)
    for model, profile, state in Allocation.objects.filter(lease__isnull=True, freed_at__isnull=True).values_list(
            "gpu__model", "mig_profile", "state"):
        if model in pools:
            pools[model]["warm"][profile][0 if state == AllocationState.WARM else 1] += 1
    return [{**p, "modes": dict(p["modes"]),
             "warm": [{"profile": k, "ready": v[0], "creating": v[1]} for k, v in sorted(p["warm"].items())]}
            for _, p in sorted(pools.items())]


def warm_instances() -> QuerySet[Allocation]:
    return (Allocation.objects.filter(lease__isnull=True, freed_at__isnull=True).select_related("gpu__node")
            .order_by("gpu__model", "mig_profile", "pk"))


def warm_holding(*, start: datetime, end: datetime) -> dict[str, dict]:
    """The platform's cost of warm pools over [start, end): per model and profile, the GPU-hours warm members
    were held by nobody (from ``warm_at`` until bound, freed or ``end``), priced at the general book."""
    from billing.core.pricing import gpu_hours_of

    out: dict[str, dict] = {}
    rows = (Allocation.objects.filter(warm_at__isnull=False, warm_at__lt=end)
            .filter(Q(bound_at__isnull=True) | Q(bound_at__gt=start))
            .filter(Q(freed_at__isnull=True) | Q(freed_at__gt=start))
            .values_list("gpu__model", "mig_profile", "milli", "warm_at", "bound_at", "freed_at"))
    for model, profile, milli, warm_at, bound_at, freed_at in rows:
        until = min(t for t in (bound_at, freed_at, end) if t is not None)
        since = max(warm_at, start)
        if until <= since:
            continue
        entry = out.setdefault(f"{model} {profile}", {"model": model, "profile": profile, "milli_seconds": 0,
                                                      "members": 0})
        entry["milli_seconds"] += int(milli * (until - since).total_seconds())
        entry["members"] += 1
    prices, currency = _prices(end)
    for entry in out.values():
        entry["gpu_hours"] = gpu_hours_of(entry["milli_seconds"])
        per_hour = _profile_price(prices, entry["model"], entry["profile"])
        # the platform's cost: what the idle member's capacity would have earned at the general list price
        entry["currency"] = currency
        entry["cost_minor"] = (None if per_hour is None else
                               round(per_hour * entry["milli_seconds"] / _milli_of(entry["model"], entry["profile"])
                                     / 3600))
    return out


def _profile_price(prices: tuple[Price, ...], model: str, profile: str) -> int | None:
    """Minor units per instance-hour of ``profile``: its own rate, else the whole-GPU rate pro rata."""
    from gpus.mig import profile_get

    whole = None
    for price in prices:
        if price.model == model and price.profile == profile:
            return price.minor_per_gpu_hour
        if price.model == model and not price.profile and not price.share:
            whole = price.minor_per_gpu_hour
    if whole is None:
        return None
    return whole * profile_get(model, profile).compute_slices // 7


def _milli_of(model: str, profile: str) -> int:
    from gpus.mig import profile_get

    return profile_get(model, profile).gpu_milli


# -- a project's idle reclaim opt-in ---------------------------------------------------------------------------
OPT_IN_ESTIMATE_DAYS = 7


@dataclass
class IdleOptInEstimate:
    """What the opt-in would have saved over ``[start, end)``: the project's in-quota interactive lease-hours,
    those with a measured engine activity, those measured idle (the hour's mean under the rule's threshold),
    and the idle ones priced at the tenant's price book in force now (None: no book, or no price for a shape)."""

    start: datetime
    end: datetime
    interactive_gpu_hours: Decimal
    measured_gpu_hours: Decimal
    idle_gpu_hours: Decimal
    saving_minor: int | None
    currency: str
    price_book: str


@dataclass
class IdleOptIn:
    """A project's idle reclaim opt-in as its page and API show it, before and after the choice."""

    project: Project
    opt_in: bool
    mode: str  # what the loop does now with the project's idle interactive leases
    mode_opted_in: str  # what it does once opted in
    mode_opted_out: str  # and without the opt-in
    staff_mode: str  # a staff policy of the project's scope sets idle reclaim ("" none): it wins
    rule: IdleRule
    notice: str
    estimate: IdleOptInEstimate | None
    estimate_note: str
    suspend: SuspendModes | None = None  # the project's opt-out of suspending its idle resumable training


@dataclass(frozen=True)
class SuspendModes:
    """The suspension of ``project``'s idle resumable training: the opt-out, the rule in force (off while opted
    out), what the loop does now (``off``: never; ``advise``: proposed; ``auto``: applied) and in words."""

    opt_out: bool
    rule: IdleRule
    mode: Mode
    notice: str


@dataclass(frozen=True)
class IdleOptInModes:
    """What the opt-in changes for ``project``: the interactive rule, idle reclaim's mode opted in and out, and a
    staff policy of the project's scope that sets idle reclaim ("" none: when set, it wins)."""

    rule: IdleRule
    opted_in: Mode
    opted_out: Mode
    staff_mode: str

    def mode(self, opt_in: bool) -> Mode:
        return self.opted_in if opt_in else self.opted_out


def idle_opt_in_modes(*, project: Project, policies: tuple[Policy, ...] | None = None) -> IdleOptInModes:
    """The rule and modes of ``project``'s opt-in (``policies``: ``policies_in_force()``, read once by a caller
    that shows many projects)."""
    policies = policies_in_force() if policies is None else policies
    staff_mode = next((row.idle_reclaim for row in CapacityPolicy.objects.filter(scope=f"project:{project.pk}")), "")
    policy = replace(project_policy(project.pk, policies), idle_auto_classes=())
    opted_out = policy.idle_mode(ReclaimClass.INTERACTIVE)
    opted_in = opted_out if staff_mode else replace(policy, idle_auto_classes=OPT_IN_CLASSES).idle_mode(
        ReclaimClass.INTERACTIVE)
    return IdleOptInModes(policy.idle_rule(ReclaimClass.INTERACTIVE), opted_in, opted_out, staff_mode)


def suspend_modes(*, project: Project, policies: tuple[Policy, ...] | None = None) -> SuspendModes:
    """What the loop does with ``project``'s idle resumable training (``policies``: ``policies_in_force()``, which
    already switches the rule off for a project that opted out)."""
    policy = project_policy(project.pk, policies)
    rule = policy.idle_rule(ReclaimClass.RESUMABLE)
    off = project.idle_suspend_opt_out or not rule.enabled or policy.idle_reclaim == Mode.OFF
    mode = Mode.OFF if off else policy.idle_mode(ReclaimClass.RESUMABLE)
    if project.idle_suspend_opt_out:
        words = "Opted out: the loop never suspends this project's training; an idle one keeps its GPUs."
    elif not rule.enabled or policy.idle_reclaim == Mode.OFF:
        words = "Platform staff have switched suspension off for this project: no training is suspended."
    else:
        words = (f"A training lease whose workload declares a checkpoint directory and a restart policy that "
                 f"restarts it (on-preemption or on-failure), averaging under {rule.threshold_permille / 10:.1f} % "
                 f"engine activity over {_minutes(rule.window_seconds)} while other work waits for its GPU model, "
                 f"gets a notice (the lease.notice notification, the deadline on the lease); still idle "
                 f"{_minutes(rule.notice_seconds)} later it is suspended: SIGTERM, the promised preemption notice to "
                 f"checkpoint, back to the queue (nothing billed while it waits), and it resumes from its "
                 f"checkpoint when placed again. "
                 + ("This happens automatically (the project opted in to idle reclaim)." if mode == Mode.AUTO
                    else "The loop only proposes it as advice."))
    return SuspendModes(project.idle_suspend_opt_out, rule, mode, words)


def idle_opt_in_get(*, project: Project, now: datetime | None = None,
                    policies: tuple[Policy, ...] | None = None) -> IdleOptIn:
    """The opt-in of ``project`` (already fetched through the actor's scope), the interactive rule it would
    apply, the modes with and without it, and the saving estimated from the last seven days' metering."""
    from django.utils import timezone

    now = now or timezone.now()
    modes = idle_opt_in_modes(project=project, policies=policies)
    estimate, note = _idle_estimate(project, modes.rule, now)
    return IdleOptIn(project=project, opt_in=project.idle_reclaim_opt_in,
                     mode=modes.mode(project.idle_reclaim_opt_in).value, mode_opted_in=modes.opted_in.value,
                     mode_opted_out=modes.opted_out.value, staff_mode=modes.staff_mode, rule=modes.rule,
                     notice=_notice_text(modes.rule, modes.opted_in, modes.staff_mode), estimate=estimate,
                     estimate_note=note, suspend=suspend_modes(project=project, policies=policies))


def _minutes(seconds: int) -> str:
    return f"{seconds // 60} min" if seconds % 60 == 0 and seconds >= 60 else f"{seconds} s"


def _notice_text(rule: IdleRule, opted_in: Mode, staff_mode: str) -> str:
    if not rule.enabled:
        return ("Platform staff have switched the interactive idle rule off: no interactive lease is reclaimed, "
                "opted in or not.")
    what = (f"An interactive lease whose engine activity averages under {rule.threshold_permille / 10:.1f} % over "
            f"{_minutes(rule.window_seconds)} gets a notice (the lease.notice notification, and the deadline on the "
            f"lease); still idle {_minutes(rule.notice_seconds)} later, it is released. Busy again before the "
            f"deadline: the notice is withdrawn.")
    if staff_mode:
        return f"{what} A platform policy of this project sets idle reclaim to {staff_mode}: it applies whatever "\
               "you choose."
    if opted_in != Mode.AUTO:
        return f"{what} Idle reclaim is {opted_in.value} on this platform: opting in changes nothing."
    return f"{what} Opted in, this happens automatically; otherwise the loop only proposes it as advice."


def _idle_estimate(project: Project, rule: IdleRule, now: datetime) -> tuple[IdleOptInEstimate | None, str]:
    """The last seven days of metering: hourly usage rows of the project's in-quota interactive leases, and
    each hour's measured engine activity (``billing.UtilisationUsage``, from DCGM). Idle: the hour's mean under
    the rule's threshold. Hours with no measurement count as neither idle nor busy."""
    from billing.core.pricing import to_minor, units_of
    from billing.models import AllocationUsage, UtilisationUsage
    from billing.selectors import price_books_for

    end = now.replace(minute=0, second=0, microsecond=0)
    start = end - timedelta(days=OPT_IN_ESTIMATE_DAYS)
    rows = list(AllocationUsage.objects.filter(
        tenant_id=project.tenant_id, project_id=project.pk, workload_class=WorkloadClass.INTERACTIVE.value,
        over_quota=False, hour_start__gte=start, hour_start__lt=end)
        .values_list("lease_id", "hour_start", "tier", "kind", "mig_profile", "profiling", "seconds", "gpu_milli"))
    if not rows:
        return None, (f"No estimate: the project held no interactive lease in the last {OPT_IN_ESTIMATE_DAYS} days "
                      "(in quota), so there is nothing to measure.")
    engine = {(lease, hour): active for lease, hour, active in UtilisationUsage.objects.filter(
        lease_id__in={row[0] for row in rows}, hour_start__gte=start, hour_start__lt=end,
        engine_active_avg__isnull=False).values_list("lease_id", "hour_start", "engine_active_avg")}
    threshold = Decimal(rule.threshold_permille) / 1000
    held = measured = 0
    idle: dict[tuple, Decimal] = defaultdict(Decimal)
    for lease, hour, tier, kind, profile, profiling, seconds, milli in rows:
        milli_seconds = Decimal(seconds) * milli
        held += milli_seconds
        active = engine.get((lease, hour))
        if active is None:
            continue
        measured += milli_seconds
        if active < threshold:
            idle[(tier, kind, profile, profiling)] += milli_seconds
    if not measured:
        return None, ("No estimate: no engine activity was metered for the project's interactive leases in the "
                      f"last {OPT_IN_ESTIMATE_DAYS} days (the utilisation meter reads DCGM through Prometheus), so "
                      "nothing says which hours were idle.")
    currency, book_name, saving = project.tenant.currency, "", None
    books = price_books_for(tenant=project.tenant, start=now - timedelta(microseconds=1), end=now)
    unpriced = False
    if books:
        _, book, table = books[-1]
        book_name, saving = book.name, Decimal(0)
        for (tier, kind, profile, profiling), milli_seconds in idle.items():
            found = table.unit_price(tier, kind, profile, over_quota=False,
                                     workload_class=WorkloadClass.INTERACTIVE.value, profiling=profiling)
            if found is None:
                unpriced = True
                continue
            saving += units_of(kind, tier, profile, milli_seconds) * found[0]
    hours = Decimal(3_600_000)
    estimate = IdleOptInEstimate(
        start=start, end=end, interactive_gpu_hours=(held / hours).quantize(SIX_PLACES),
        measured_gpu_hours=(measured / hours).quantize(SIX_PLACES),
        idle_gpu_hours=(sum(idle.values(), Decimal(0)) / hours).quantize(SIX_PLACES),
        saving_minor=None if saving is None or unpriced else to_minor(saving, currency), currency=currency,
        price_book=book_name)
    note = (f"The project's interactive lease-hours of the last {OPT_IN_ESTIMATE_DAYS} days whose metered engine "
            f"activity averaged under the rule's {rule.threshold_permille / 10:.1f} % for the hour, at the prices of "
            f"{book_name or 'no price book'}. An upper bound: the loop reclaims a lease only after "
            f"{_minutes(rule.window_seconds)} of idleness and {_minutes(rule.notice_seconds)} of notice, and hours "
            "with no measurement count as busy.")
    if estimate.saving_minor is None:
        note += (" No money figure: " + ("the price book has no price for some of the shapes used." if books else
                                         "no price book is in force for the tenant."))
    return estimate, note
