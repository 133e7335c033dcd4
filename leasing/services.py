"""The only writers of leasing data (docs/architecture.md §4-5).

Every lease change is a conditional update (``WHERE state = <the state we read>``) plus a ``LeaseEvent``
in the same transaction; a change that lost a race raises ``LeaseStateConflict`` and writes nothing.
Follow-up work (the schedule cycle, provisioning, releases) is enqueued with ``transaction.on_commit``.
Agent calls happen outside transactions; their results are written afterwards by the same rules, so a
worker killed at any point leaves state that the next run (or the reconcile) converges.
"""

from __future__ import annotations

import hashlib
import json
import logging
from contextlib import nullcontext
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.postgres.expressions import ArraySubquery
from django.db import IntegrityError, connection, transaction
from django.db.backends.postgresql.psycopg_any import NumericRange
from django.db.models import Exists, IntegerField, OuterRef, Q, Subquery, Value
from django.db.models.functions import JSONObject
from django.utils import timezone

from billing.models import SpendCap
from config.errors import (
    ApplicationError,
    IdempotencyConflict,
    LeaseStateConflict,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
    ValidationFailed,
)
from gpus.catalogue import UnknownModel, model_get
from gpus.mig import UnknownProfile, profile_get, profiles_for
from leasing.choices import (
    FINAL_STATES,
    TRANSITIONS,
    AllocationState,
    GpuKind,
    GpuMode,
    LeaseState,
    WorkloadClass,
)
from leasing.models import Allocation, Gpu, Lease, LeaseEvent, Node
from leasing.scheduler import DecisionMode, Kind, Request, Shape, plan
from leasing.scheduler.types import WorkloadClass as CoreWorkloadClass
from leasing.selectors import lease_queue, scheduler_snapshot
from tenants.access import Actor
from tenants.models import Project, Quota

logger = logging.getLogger(__name__)
MAX_COUNT = 64
# The highest priority a member may send; above it (up to 100) needs the tenant's admin or owner role.
# Priority orders requests inside one project only (the scheduler never compares it across projects), so
# this bound keeps one member from jumping every colleague's queue without an admin's say.
MEMBER_MAX_PRIORITY = 10
MAX_GPU_INDEX = 1023  # Gpu.index is a smallint; past it was a 500 ("smallint out of range")
MAX_GPU_MEMORY_MIB = 1 << 24  # 16 TiB; Gpu.memory_mib is an integer


# -- transitions -------------------------------------------------------------------------------------
def lease_transition(*, lease: Lease, to: str, reason: str, actor: str, now: datetime, **fields) -> Lease:
    """Move ``lease`` from the state it was read in to ``to`` (must be inside a transaction)."""
    if to not in TRANSITIONS[lease.state]:
        raise LeaseStateConflict(f"A {lease.state} lease cannot become {to}.", field="state")
    changed = Lease.objects.filter(pk=lease.pk, state=lease.state).update(state=to, reason=reason, **fields)
    if changed != 1:
        current = Lease.objects.filter(pk=lease.pk).values_list("state", flat=True).first()
        raise LeaseStateConflict(f"The lease changed meanwhile (now {current}).", field="state")
    LeaseEvent.objects.create(lease=lease, from_state=lease.state, to_state=to, reason=reason, actor=actor, at=now)
    previous = lease.state
    lease.state = to
    lease.reason = reason
    for name, value in fields.items():
        setattr(lease, name, value)
    logger.info("lease %s: %s -> %s (%s)", lease.pk, previous, to, reason)
    return lease


def _update_each(model, rows: list, fields: list[str], **only) -> int:
    """Write ``fields`` of many rows, each with its own values, in one statement (``UPDATE … FROM
    unnest(<one array per column>)``); ``only`` adds equality conditions (``state=LeaseState.QUEUED``).
    Django's ``bulk_update`` builds a CASE per field per row: for a few dozen rows that cost more CPU
    than the rest of a schedule cycle. Returns the number of rows changed."""
    if not rows:
        return 0
    meta = model._meta
    columns = [meta.pk, *(meta.get_field(name) for name in fields)]
    quote = connection.ops.quote_name
    arrays = [[meta.pk.get_db_prep_value(row.pk, connection) for row in rows]]
    arrays += [[field.get_db_prep_save(getattr(row, field.attname), connection) for row in rows]
               for field in columns[1:]]
    unnest = ", ".join(f"%s::{field.db_type(connection)}[]" for field in columns)
    names = ", ".join(quote(field.column) for field in columns)
    assignments = ", ".join(f"{quote(field.column)} = v.{quote(field.column)}" for field in columns[1:])
    conditions = "".join(f" AND t.{quote(meta.get_field(name).column)} = %s" for name in only)
    sql = (f"UPDATE {quote(meta.db_table)} AS t SET {assignments} FROM unnest({unnest}) AS v({names}) "  # noqa: S608
           f"WHERE t.{quote(meta.pk.column)} = v.{quote(meta.pk.column)}{conditions}")
    with connection.cursor() as cursor:
        cursor.execute(sql, [*arrays, *only.values()])
        return cursor.rowcount


def _enqueue(task_name: str, *args) -> None:
    """Send the task once the current transaction commits (a schedule cycle: ``schedule_cycle_request``)."""
    if task_name == "schedule_cycle" and not args:
        transaction.on_commit(schedule_cycle_request)
        return
    from leasing import tasks

    transaction.on_commit(lambda: getattr(tasks, task_name).delay(*args))


# -- schedule-cycle triggers -------------------------------------------------------------------------
# Every request, release and requeue asks for a cycle, but one cycle serves many: a flag in the Celery
# broker's Redis means "a cycle has been sent whose look at the queue after its commit is still to come".
# A trigger sets it (SET NX) once its own transaction has committed, and sends the task only when it was
# not set already. A cycle, after it commits, clears the flag and only then looks for queued leases it did
# not see (sending the next cycle when there are). So a trigger that found the flag set committed before
# that look and is found by it; while cycles run back to back, requests send no tasks at all. A cycle that
# finds another one running skips: the running one's look comes after it. The flag expires (a lost message
# costs at most CYCLE_FLAG_SECONDS, and beat sends a cycle every 10 s anyway); without Redis (amqp,
# filesystem) every trigger sends its task, as before.
CYCLE_FLAG_SECONDS = 10
_cycle_flags: dict[str, object] = {}


def _cycle_flag():
    """(Redis client, key) of this deployment's flag (its database and queue), or None without Redis."""
    from config.celery import app

    url = settings.CELERY_BROKER_URL
    if not url.startswith(("redis://", "rediss://")):
        return None
    client = _cycle_flags.get(url)
    if client is None:
        import redis

        client = _cycle_flags[url] = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    key = f"gpubroker:cycle-requested:{connection.settings_dict['NAME']}:{app.conf.task_default_queue}"
    return client, key


def schedule_cycle_request() -> None:
    """Ask for a schedule cycle; call it after the change it is for has committed (``_enqueue`` does)."""
    import redis

    from leasing import tasks

    flag = _cycle_flag()
    if flag is not None:
        client, key = flag
        try:
            if not client.set(key, b"1", nx=True, ex=CYCLE_FLAG_SECONDS):
                return  # a requested cycle has not read the queue yet: it will see this change
        except redis.RedisError as error:
            logger.warning("schedule-cycle flag not set (%s); sending the task anyway", error)
    tasks.schedule_cycle.delay()


def _cycle_flag_clear() -> None:
    """A cycle is about to look at the queue: changes committed after this must ask for another one."""
    import redis

    flag = _cycle_flag()
    if flag is not None:
        client, key = flag
        try:
            client.delete(key)
        except redis.RedisError as error:
            logger.warning("schedule-cycle flag not cleared (%s); it expires in %s s", error, CYCLE_FLAG_SECONDS)


# -- request -----------------------------------------------------------------------------------------
def _shape_from(gpu: object) -> dict:
    """Validate the ``gpu`` object of a request; errors name the field (``gpu.profile``)."""
    if not isinstance(gpu, dict):
        raise ValidationFailed("gpu must be an object, e.g. {\"kind\": \"mig\", \"profile\": \"1g.10gb\"}.",
                               field="gpu")
    known = {"kind", "count", "model", "profile", "milli", "memory_mib", "gang"}
    for key in gpu:
        if key not in known:
            raise ValidationFailed(f"Unknown field {key!r}; known: {', '.join(sorted(known))}.", field=f"gpu.{key}")
    kind = gpu.get("kind")
    if kind not in GpuKind.values:
        raise ValidationFailed(f"gpu.kind must be one of {', '.join(GpuKind.values)}.", field="gpu.kind")

    def integer(name: str, default: int, low: int, high: int) -> int:
        value = gpu.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValidationFailed(f"gpu.{name} must be a whole number from {low} to {high}.", field=f"gpu.{name}")
        return value

    count = integer("count", 1, 1, MAX_COUNT)
    gang = gpu.get("gang", True)
    if not isinstance(gang, bool):
        raise ValidationFailed("gpu.gang must be true or false.", field="gpu.gang")
    model = gpu.get("model", "auto")
    if not isinstance(model, str):
        raise ValidationFailed("gpu.model must be a model code or \"auto\".", field="gpu.model")
    models: list[str] = []
    if model != "auto":
        try:
            models = [model_get(model).code]
        except UnknownModel as error:
            raise ValidationFailed(error.args[0], field="gpu.model") from None
    shape = {"kind": kind, "count": count, "gang": gang, "models": models, "profile": "", "milli": 0,
             "memory_mib": 0}
    # a key that does not apply to the kind is refused, not ignored (the OpenAPI document says so too)
    for name in {GpuKind.MIG: ("milli", "memory_mib"), GpuKind.SHARE: ("profile",)}.get(kind, ()):
        if name in gpu:
            raise ValidationFailed(f"gpu.{name} does not apply to kind {kind!r}.", field=f"gpu.{name}")
    if kind == GpuKind.MIG:
        profile = gpu.get("profile")
        if not isinstance(profile, str) or not profile:
            raise ValidationFailed("gpu.profile is required for a MIG slice, e.g. \"1g.10gb\".", field="gpu.profile")
        candidates = models or [m for m in ("A100-40GB", "A100-80GB", "H100-80GB", "H100-NVL-94GB", "H200-141GB")]
        offered = []
        for code in candidates:
            try:
                offered.append(profile_get(code, profile).name)
            except UnknownProfile:
                continue
        if not offered:
            if models:
                names = ", ".join(p.name for p in profiles_for(models[0])) or "none (no MIG on this model)"
                raise ValidationFailed(f"Profile {profile!r} is not offered on {models[0]}; offered: {names}.",
                                       field="gpu.profile")
            raise ValidationFailed(f"No GPU model offers MIG profile {profile!r}.", field="gpu.profile")
        shape["profile"] = offered[0]
    elif kind == GpuKind.SHARE:
        shape["milli"] = integer("milli", 0, 1, 999)
        shape["memory_mib"] = integer("memory_mib", 0, 1, 1 << 20)
    else:
        for name in ("profile", "milli"):
            if name in gpu:
                raise ValidationFailed(f"gpu.{name} does not apply to a whole GPU.", field=f"gpu.{name}")
        if "memory_mib" in gpu:
            shape["memory_mib"] = integer("memory_mib", 0, 1, 1 << 20)  # with model "auto": the need
    return shape


def _validate_priority(actor: Actor, priority: object) -> None:
    """Priority orders work inside a project only (docs/scheduling.md); members may send up to
    ``MEMBER_MAX_PRIORITY``, admins and owners up to 100. Shared by the request and its preview."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not -100 <= priority <= 100:
        raise ValidationFailed("priority must be a whole number from -100 to 100.", field="priority")
    if priority > MEMBER_MAX_PRIORITY and not actor.can("manage"):
        raise PermissionDenied(f"A priority above {MEMBER_MAX_PRIORITY} needs the admin or owner role in tenant "
                               f"'{actor.tenant.slug}'; members may send -100 to {MEMBER_MAX_PRIORITY}.",
                               field="priority")


def _validate_duration(value: object) -> int:
    low, high = settings.LEASE_MIN_DURATION_SECONDS, settings.LEASE_MAX_DURATION_SECONDS
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationFailed(f"duration_seconds must be a whole number from {low} to {high}.",
                               field="duration_seconds")
    return value


def _units_per_gpu(shape: dict, model: str) -> int:
    """How many units of the shape one GPU of ``model`` can hold at most, whatever its mode now (the capacity
    loop may switch it): a whole GPU 1, MIG instances of the profile on an empty GPU, shares 1000 // milli."""
    from gpus.mig import MigPlacement, free_starts

    if shape["kind"] == GpuKind.WHOLE:
        return 1
    if shape["kind"] == GpuKind.SHARE:
        return 1000 // max(1, shape["milli"])
    try:
        profile = profile_get(model, shape["profile"])
    except UnknownProfile:
        return 0
    layout: list = []
    while starts := free_starts(layout, profile):
        layout.append(MigPlacement(starts[0], profile))
    return len(layout)


def _never_fits(shape: dict, tiers: list[str]) -> str:
    """Why no node of the fleet as it is could ever hold this request — a gang needs its units on one node,
    a spread request on all of them together — or "" (it could, or the fleet has no GPU of these models yet:
    nodes may still enrol). Single units always fit a GPU of their model."""
    from django.db.models import Count

    count = shape["count"]
    if count <= 1:
        return ""
    nodes = list(Gpu.objects.filter(lost_at__isnull=True, model__in=tiers, node__status__in=("ready", "silent"))
                 .values("node_id", "model").annotate(gpus=Count("pk")).order_by())
    if not nodes:
        return ""
    per_node = [row["gpus"] * _units_per_gpu(shape, row["model"]) for row in nodes]
    most = max(per_node) if shape["gang"] else sum(per_node)
    if count <= most:
        return ""
    unit = {"mig": f"MIG {shape['profile']} instance", "share": f"share of {shape['milli']} milli"}.get(
        shape["kind"], "whole GPU")
    where = "one node of the fleet holds" if shape["gang"] else "the whole fleet holds"
    hint = "; ask for fewer, or gang: false to spread them over nodes" if shape["gang"] else "; ask for fewer"
    return (f"{count} x {unit} can never be placed: {where} at most {most} on {', '.join(tiers)}{hint}.")


def _request_hash(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _quota_units(shape: dict, tier: str) -> int:
    if shape["kind"] == GpuKind.WHOLE:
        per = 1000
    elif shape["kind"] == GpuKind.MIG:
        per = profile_get(tier, shape["profile"]).gpu_milli
    else:
        per = shape["milli"]
    return per * shape["count"]


def lease_request(*, actor: Actor, project: str, gpu: object, workload_class: str = WorkloadClass.TRAINING,
                  priority: int = 0, duration_seconds: object = 3600, idempotency_key: str = "",
                  now: datetime | None = None) -> tuple[Lease, bool]:
    """Validate and queue a request: (the lease, created now?). The same idempotency key with the same
    body returns the first lease; with another body it is ``IdempotencyConflict``."""
    actor.require("use")
    now = now or timezone.now()
    if not isinstance(project, str):
        raise ValidationFailed("project must be a project slug.", field="project")
    shape = _shape_from(gpu)
    if workload_class not in WorkloadClass.values:
        raise ValidationFailed(f"workload_class must be one of {', '.join(WorkloadClass.values)}.",
                               field="workload_class")
    _validate_priority(actor, priority)
    _validate_duration(duration_seconds)
    if len(idempotency_key) > 200:
        raise ValidationFailed("Idempotency-Key is at most 200 characters.", field="Idempotency-Key")
    payload = {"project": project, "gpu": shape, "workload_class": workload_class, "priority": priority,
               "duration_seconds": duration_seconds}
    digest = _request_hash(payload)
    # one query: the project, its quota limits and the lease this idempotency key already made, if any
    keyed = Lease.objects.filter(tenant=actor.tenant, idempotency_key=idempotency_key).order_by()
    found = list(Project.objects.filter(tenant=actor.tenant, slug=project).order_by().annotate(
        limits=ArraySubquery(Quota.objects.filter(project=OuterRef("pk")).order_by().values(
            json=JSONObject(tier="tier", limit="limit_gpu_milli"))),
        replayed=Subquery(keyed.values("pk")[:1]) if idempotency_key else Value(None, IntegerField()),
        capped=Exists(SpendCap.objects.filter(tenant=actor.tenant).filter(
            Q(project__isnull=True) | Q(project=OuterRef("pk")))))[:1])
    target = found[0] if found else None
    replayed = target.replayed if target is not None else (
        keyed.values_list("pk", flat=True).first() if idempotency_key else None)
    if replayed is not None:
        existing = Lease.objects.select_related("project").get(pk=replayed)
        if existing.request_hash != digest:
            raise IdempotencyConflict("This Idempotency-Key was used with another request body.",
                                      field="Idempotency-Key")
        return existing, False
    if target is None:
        raise NotFound(f"No project {project!r} in this tenant.", field="project")
    limits = {quota["tier"]: quota["limit"] for quota in target.limits}
    tiers = shape["models"] or sorted(limits)
    fitting = []
    for tier in tiers:
        if tier not in limits:
            continue
        try:
            units = _quota_units(shape, tier)
        except UnknownProfile:
            continue
        if units <= limits[tier]:
            fitting.append(tier)
    if not fitting:
        wanted = ", ".join(tiers) or "any model"
        raise QuotaExceeded(f"Project {project!r} has no quota on {wanted} whose limit allows this request.",
                            field="gpu")
    never = _never_fits(shape, fitting)
    if never:
        raise ValidationFailed(never, field="gpu.count")
    budget_warning = ""
    if target.capped:  # a monthly spend cap applies: refuse (402 with the figures) or warn
        from billing.services import budget_check

        budget_warning = budget_check(
            tenant=actor.tenant, project=target, gpu={**gpu, "model": fitting[0]} if len(fitting) == 1 else gpu,
            workload_class=workload_class, duration_seconds=duration_seconds, now=now)
    # born queued: the events of its first two steps are written with it
    lease = Lease(
        tenant=actor.tenant, project=target, created_by=actor.user if actor.user.is_authenticated else None,
        kind=shape["kind"], count=shape["count"], models_allowed=shape["models"], profile=shape["profile"],
        milli=shape["milli"], memory_mib=shape["memory_mib"], gang=shape["gang"], workload_class=workload_class,
        priority=priority, duration_seconds=duration_seconds, requested_at=now, idempotency_key=idempotency_key,
        request_hash=digest, state=LeaseState.QUEUED, reason="waiting for the scheduler", queued_at=now)
    events = [LeaseEvent(from_state="", to_state=LeaseState.REQUESTED,
                         reason=f"requested; {budget_warning}" if budget_warning else "requested",
                         actor=f"user:{actor.user.get_username()}", at=now),
              LeaseEvent(from_state=LeaseState.REQUESTED, to_state=LeaseState.QUEUED,
                         reason="waiting for the scheduler", actor="broker", at=now)]
    try:
        _lease_insert(lease, events)
        _enqueue("schedule_cycle")
    except IntegrityError:
        # the same key raced us: the winner's lease is the answer (or a conflict when its body differs)
        existing = Lease.objects.get(tenant=actor.tenant, idempotency_key=idempotency_key)
        if existing.request_hash != digest:
            raise IdempotencyConflict("This Idempotency-Key was used with another request body.",
                                      field="Idempotency-Key") from None
        return existing, False
    return lease, True


def _lease_insert(lease: Lease, events: list[LeaseEvent]) -> None:
    """Insert a new lease and its first events in one statement — a transaction of its own (or part of
    the caller's), one round trip instead of five (BEGIN, two inserts, COMMIT) on the request path. The
    events keep their order (their ids follow it). Sets ``lease.pk``; an IntegrityError writes nothing."""
    quote = connection.ops.quote_name
    fields = [field for field in Lease._meta.concrete_fields if not field.primary_key]
    values = [field.get_db_prep_save(field.pre_save(lease, True), connection) for field in fields]
    event_fields = [LeaseEvent._meta.get_field(name) for name in ("from_state", "to_state", "reason", "actor", "at")]
    arrays = [[field.get_db_prep_save(getattr(event, field.attname), connection) for event in events]
              for field in event_fields]
    columns = ", ".join(quote(field.column) for field in event_fields)
    sql = (f"WITH lease AS (INSERT INTO {quote(Lease._meta.db_table)} "  # noqa: S608 (names from the models)
           f"({', '.join(quote(field.column) for field in fields)}) VALUES ({', '.join(['%s'] * len(fields))}) "
           f"RETURNING {quote(Lease._meta.pk.column)} AS id) "
           f"INSERT INTO {quote(LeaseEvent._meta.db_table)} ({quote('lease_id')}, {columns}) "
           f"SELECT lease.id, {columns} FROM lease, unnest("
           f"{', '.join(f'%s::{field.db_type(connection)}[]' for field in event_fields)}) WITH ORDINALITY "
           f"AS e({columns}, position) ORDER BY e.position RETURNING {quote('lease_id')}")
    with transaction.atomic() if connection.in_atomic_block else nullcontext(), connection.cursor() as cursor:
        cursor.execute(sql, [*values, *arrays])
        lease.pk = cursor.fetchone()[0]
    lease._state.adding, lease._state.db = False, connection.alias


# -- release / renew / expire ---------------------------------------------------------------------------
def lease_release(*, lease: Lease, actor: str, reason: str = "released by the holder",
                  final: str = LeaseState.RELEASED, now: datetime | None = None) -> Lease:
    """Give a lease back (idempotent): queued → released at once; holding → releasing, then the agent
    instances are destroyed by ``allocation_release_run`` and the lease becomes ``final``."""
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        lease = Lease.objects.select_for_update().get(pk=lease.pk)
        if lease.state in FINAL_STATES or lease.state == LeaseState.RELEASING:
            return lease
        if lease.state in (LeaseState.REQUESTED, LeaseState.QUEUED):
            return lease_transition(lease=lease, to=LeaseState.RELEASED, reason=reason, actor=actor, now=now,
                                    finished_at=now)
        lease_transition(lease=lease, to=LeaseState.RELEASING, reason=reason, actor=actor, now=now)
        lease.allocations.filter(freed_at__isnull=True).update(state=AllocationState.RELEASING)
        _enqueue("lease_release_run", lease.pk, final)
    return lease


# -- tenant suspension (called by tenants.services.tenant_set_status) ------------------------------------
HOLD_RELEASED_REASON = "waiting for the scheduler"


def schedule_cycle_wait() -> None:
    """Inside a transaction: wait until no schedule cycle runs, and keep cycles out until it commits (the
    cycle's advisory lock). Whatever a running cycle placed is committed when this returns."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ADVISORY_LOCK])


def leases_hold(*, tenant_id: int, reason: str, actor: str, now: datetime) -> int:
    """The tenant's waiting leases are held (part of the caller's transaction): they stay QUEUED, out of
    the queue the schedule cycle reads (``leasing.selectors.lease_queue``), with ``reason`` and an event."""
    held = list(Lease.objects.select_for_update().filter(
        tenant_id=tenant_id, state__in=(LeaseState.REQUESTED, LeaseState.QUEUED)).order_by("pk"))
    Lease.objects.filter(pk__in=[lease.pk for lease in held]).update(reason=reason, queue_position=None)
    LeaseEvent.objects.bulk_create(LeaseEvent(lease=lease, from_state=lease.state, to_state=lease.state,
                                              reason=reason, actor=actor, at=now) for lease in held)
    return len(held)


def leases_unhold(*, tenant_id: int, actor: str, now: datetime) -> int:
    """The tenant's held leases go back to the scheduler (part of the caller's transaction); a cycle is
    asked for after commit."""
    count = leases_hold(tenant_id=tenant_id, reason=HOLD_RELEASED_REASON, actor=actor, now=now)
    if count:
        _enqueue("schedule_cycle")
    return count


def leases_release_all(*, tenant_id: int, reason: str, actor: str, now: datetime | None = None) -> int:
    """Release every lease of the tenant that holds capacity (provisioning, active, preempted), each with
    ``lease_release`` (its own transaction; its instances are destroyed by the worker). Returns how many."""
    count = 0
    holding = (LeaseState.PROVISIONING, LeaseState.ACTIVE, LeaseState.PREEMPTED)
    for lease in Lease.objects.filter(tenant_id=tenant_id, state__in=holding).order_by("pk"):
        lease = lease_release(lease=lease, actor=actor, reason=reason, now=now)
        count += lease.state == LeaseState.RELEASING
    return count


def lease_renew(*, lease: Lease, actor: str, duration_seconds: object, now: datetime | None = None) -> Lease:
    """Extend an active lease to end ``duration_seconds`` after the renewal (``now``); the lease's own
    ``duration_seconds`` becomes its whole planned length, ``ends_at - active_at``, so the two always agree.
    The spend caps apply as on the request path:
    a renewal whose added cost takes the month's forecast over a ``refuse`` cap is refused (402 with the
    figures, nothing written); a ``warn`` cap's warning goes into the renewal event."""
    now = now or timezone.now()
    _validate_duration(duration_seconds)
    with transaction.atomic(durable=True):
        lease = Lease.objects.select_for_update().select_related("tenant", "project").get(pk=lease.pk)
        if lease.state != LeaseState.ACTIVE:
            raise LeaseStateConflict(f"Only an active lease can be renewed; this one is {lease.state}.",
                                     field="state")
        ends = now + timedelta(seconds=duration_seconds)
        from billing.services import budget_check_renewal

        budget_warning = budget_check_renewal(lease=lease, ends_at=ends, now=now)
        total = round((ends - lease.active_at).total_seconds()) if lease.active_at else duration_seconds
        if lease.active_at:  # whole seconds from the start, so active_at + duration_seconds == ends_at exactly
            ends = lease.active_at + timedelta(seconds=total)
        Lease.objects.filter(pk=lease.pk).update(ends_at=ends, duration_seconds=total)
        reason = f"renewed until {ends.isoformat(timespec='seconds')} ({duration_seconds} s from the renewal)"
        LeaseEvent.objects.create(lease=lease, from_state=lease.state, to_state=lease.state, actor=actor, at=now,
                                  reason=f"{reason}; {budget_warning}" if budget_warning else reason)
        lease.ends_at, lease.duration_seconds = ends, total
    return lease


def lease_expire_due(*, now: datetime | None = None) -> int:
    """Active leases past their end go to RELEASING and then EXPIRED."""
    now = now or timezone.now()
    count = 0
    for lease in Lease.objects.filter(state=LeaseState.ACTIVE, ends_at__lte=now).order_by("pk")[:500]:
        try:
            lease_release(lease=lease, actor="broker", reason="the lease reached its end", final=LeaseState.EXPIRED,
                          now=now)
            count += 1
        except LeaseStateConflict:
            continue
    return count


# -- allocations -----------------------------------------------------------------------------------------
def allocation_spec(allocation: Allocation) -> dict:
    """The agent's ``PUT /v1/instances/{id}`` body for ``allocation``."""
    if allocation.kind == GpuKind.MIG:
        return {"kind": "mig", "gpu": allocation.gpu.uuid, "profile": allocation.mig_profile,
                "start": allocation.mig_start}
    if allocation.kind == GpuKind.SHARE:
        return {"kind": "share", "gpu": allocation.gpu.uuid, "milli": allocation.milli,
                "memory_mib": allocation.memory_mib}
    return {"kind": "whole", "gpu": allocation.gpu.uuid}


def agent_client(node: Node):
    from agent.client import AgentClient

    return AgentClient(node.address, node.node_id, node.secret, timeout=settings.AGENT_TIMEOUT_SECONDS, retries=1)


def allocation_ready(*, allocation: Allocation, instance: dict, now: datetime) -> bool:
    """Record what the agent created; when every allocation of the lease is ready, the lease is ACTIVE.
    False when the allocation was no longer pending (recorded before, or freed)."""
    return allocations_ready(items=[(allocation, instance)], now=now)["ready"] == 1


def allocations_ready(*, items: list[tuple[Allocation, dict]], now: datetime) -> dict[str, int]:
    """Record what the agents created, in one transaction: each allocation still pending becomes READY
    with its device; each lease still PROVISIONING whose live allocations are now all ready becomes ACTIVE
    until ``now`` + its duration, with its event. The leases are locked first, in key order (as
    ``allocations_free`` does), so a release racing this waits or wins cleanly. Returns how many
    allocations were recorded (``ready``) and how many leases became ACTIVE (``active``)."""
    instances = {allocation.pk: instance for allocation, instance in items}
    lease_ids = sorted({allocation.lease_id for allocation, _ in items})
    with transaction.atomic(durable=True):
        leases = {lease.pk: lease for lease in Lease.objects.select_for_update().filter(pk__in=lease_ids)
                  .order_by("pk").only("pk", "state", "duration_seconds")}
        pending = Allocation.objects.filter(pk__in=instances, state=AllocationState.PENDING).values_list(
            "pk", flat=True)
        recorded = []
        for pk in sorted(pending):
            instance = instances[pk]
            recorded.append(Allocation(pk=pk, state=AllocationState.READY, ready_at=now,
                                       device_uuid=instance.get("device_uuid", ""),
                                       gpu_instance_id=instance.get("gpu_instance_id"),
                                       access=instance.get("access", {})))
        if not recorded:
            return {"ready": 0, "active": 0}
        _update_each(Allocation, recorded, ["state", "ready_at", "device_uuid", "gpu_instance_id", "access"])
        unfinished = set(Allocation.objects.filter(lease_id__in=lease_ids, freed_at__isnull=True)
                         .exclude(state=AllocationState.READY).values_list("lease_id", flat=True))
        node_of = {allocation.lease_id: allocation.gpu.node.node_id for allocation, _ in items}
        active, events = [], []
        for lease_id in lease_ids:
            lease = leases.get(lease_id)
            if lease is None or lease.state != LeaseState.PROVISIONING or lease_id in unfinished:
                continue
            reason = f"running on {node_of[lease_id]}"
            active.append(Lease(pk=lease_id, state=LeaseState.ACTIVE, reason=reason, active_at=now,
                                ends_at=now + timedelta(seconds=lease.duration_seconds)))
            events.append(LeaseEvent(lease_id=lease_id, from_state=LeaseState.PROVISIONING,
                                     to_state=LeaseState.ACTIVE, reason=reason, actor="worker", at=now))
        _update_each(Lease, active, ["state", "reason", "active_at", "ends_at"])
        LeaseEvent.objects.bulk_create(events)
    logger.info("%d instances recorded, %d leases active", len(recorded), len(active))
    return {"ready": len(recorded), "active": len(active)}


def allocations_free(*, lease: Lease, now: datetime, to: str, reason: str, actor: str = "worker") -> Lease:
    """Free every live allocation of the lease and move it to ``to`` (QUEUED to retry, FAILED, RELEASED,
    EXPIRED) in one transaction; then trigger a schedule cycle."""
    with transaction.atomic(durable=True):
        lease = Lease.objects.select_for_update().get(pk=lease.pk)
        if lease.state in FINAL_STATES:
            return lease
        lease.allocations.filter(freed_at__isnull=True).update(state=AllocationState.FREED, freed_at=now)
        extra = {"finished_at": now} if to in FINAL_STATES else {"queued_at": now, "tier": "", "over_quota": False}
        if to == LeaseState.QUEUED:
            extra.update(active_at=None, ends_at=None, notice_deadline=None)
        lease_transition(lease=lease, to=to, reason=reason, actor=actor, now=now, **extra)
        _enqueue("schedule_cycle")
    return lease


# -- the schedule cycle -------------------------------------------------------------------------------
ADVISORY_LOCK = 0x6770_7562  # "gpub"


def _core_request(lease: Lease):
    shape = Shape(Kind(lease.kind), lease.count, profile=lease.profile, milli=lease.milli,
                  memory_mib=lease.memory_mib, models=tuple(lease.models_allowed), gang=lease.gang)
    return Request(str(lease.pk), str(lease.project_id), str(lease.tenant_id), shape,
                   (lease.queued_at or lease.requested_at).timestamp(), lease.priority,
                   CoreWorkloadClass(lease.workload_class))


def schedule_cycle(*, now: datetime | None = None) -> dict:
    """One cycle for the pool (serialised by a PostgreSQL advisory lock): snapshot → core → one
    transaction of decisions; provisioning (one task per node) and notices are enqueued after commit."""
    now = now or timezone.now()
    counts = {"placed": 0, "preempt": 0, "waiting": 0}
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ADVISORY_LOCK])
            if not cursor.fetchone()[0]:
                # a cycle is running: it looks again for what it did not see once it has committed
                return {**counts, "skipped": 1}
        # suspended tenants' leases are held, never placed
        queued = list(lease_queue().select_related("project")[:5000])
        seen = [lease.pk for lease in queued]
        transaction.on_commit(lambda: _cycle_again_if_new(seen))
        if not queued:
            return counts
        counts["seen"] = len(queued)
        snapshot = scheduler_snapshot(now=now)
        by_id = {str(lease.pk): lease for lease in queued}
        decisions = plan(snapshot, [_core_request(lease) for lease in queued], now=now.timestamp())
        gpu_by_key = {f"g{g.pk}": g for g in Gpu.objects.filter(pk__in={
            int(u.gpu[1:]) for d in decisions if d.allocation for u in d.allocation.units}).select_related("node")}
        placements = [(by_id[d.request], d) for d in decisions if d.mode == DecisionMode.PLACED]
        placed, refused = _place_all(placements, gpu_by_key, now)
        counts["placed"] = len(placed)
        waiting = []
        for decision in decisions:
            lease = by_id[decision.request]
            if decision.mode == DecisionMode.PLACED:
                if lease.pk not in refused:
                    continue  # placed, or released since the cycle read it (its placement is undone)
                reason = "waiting: the capacity chosen is still being vacated; retrying next cycle"
            elif decision.mode == DecisionMode.PREEMPT:
                counts["preempt"] += 1
                _preempt(decision, now)
                reason = _reclaim_reason(lease, decision)
            else:
                counts["waiting"] += 1
                reason = _tenant_terms(decision.reason, lease)
            if (lease.reason, lease.queue_position) != (reason, decision.queue_position):
                lease.reason, lease.queue_position = reason, decision.queue_position
                waiting.append(lease)
        # what waits, and why: one statement for all whose reason or place changed (still queued only)
        _update_each(Lease, waiting, ["reason", "queue_position"], state=LeaseState.QUEUED)
    return counts


def _tenant_terms(reason: str, lease: Lease) -> str:
    """A core reason in the tenant's words: its project by slug, not by the core's internal id."""
    return reason.replace(f"project {lease.project_id} ", f"project '{lease.project.slug}' ")


def _reclaim_reason(lease: Lease, decision) -> str:
    """Why an in-quota request waits for a reclaim, naming only the tenant's own leases (another tenant's
    lease ids and projects are not its business)."""
    victims = list(Lease.objects.filter(pk__in=[int(v) for v in decision.victims]).values_list("pk", "tenant_id"))
    own = [str(pk) for pk, tenant_id in victims if tenant_id == lease.tenant_id]
    tier = decision.allocation.tier if decision.allocation else ""
    mine = f" (yours: lease {', '.join(own)})" if own else ""
    return (f"waiting: in quota on {tier}: {len(victims)} over-quota lease(s) given notice{mine}; starts when "
            "they have left")


def _cycle_again_if_new(seen: list[int]) -> None:
    """After a cycle commits: requests queued while it ran (their trigger found the flag set, or the lock
    taken) get the next cycle."""
    _cycle_flag_clear()
    if lease_queue().exclude(pk__in=seen).exists():
        schedule_cycle_request()


def _allocation_rows(lease: Lease, decision, gpu_by_key: dict, now: datetime) -> list[Allocation]:
    allocation = decision.allocation
    rows = []
    for unit in allocation.units:
        gpu = gpu_by_key[unit.gpu]
        if unit.mig_profile:
            size = profile_get(gpu.model, unit.mig_profile).memory_slots
            slots = NumericRange(unit.mig_start, unit.mig_start + size)
            kind = GpuKind.MIG
        elif gpu.mode == GpuMode.SHARED:
            slots, kind = NumericRange(0, 0), GpuKind.SHARE
        else:
            slots, kind = NumericRange(0, 8), GpuKind.WHOLE
        rows.append(Allocation(lease=lease, gpu=gpu, tier=allocation.tier, kind=kind,
                               mig_profile=unit.mig_profile or "",
                               mig_start=unit.mig_start if unit.mig_profile else None, slots=slots,
                               milli=unit.milli, memory_mib=unit.memory_mib, preemptible=allocation.preemptible,
                               created_at=now))
    return rows


def _place_all(placements: list, gpu_by_key: dict, now: datetime) -> tuple[list[int], set[int]]:
    """Write the cycle's placements: (ids placed, ids whose capacity the database refused).

    All at once first — the leases still queued locked in key order, their allocations in one insert, their
    transitions in one update and one insert of events, in a savepoint. When the database refuses one
    allocation (capacity of a preempted lease not yet vacated: the exclusion constraint), the savepoint is
    undone and each lease is placed in a savepoint of its own, so only the refused ones wait."""
    if not placements:
        return [], set()
    try:
        with transaction.atomic():
            placed = _place_many(placements, gpu_by_key, now)
        return placed, set()
    except IntegrityError:
        pass
    placed, refused = [], set()
    for lease, decision in placements:
        try:
            with transaction.atomic():
                placed += _place_many([(lease, decision)], gpu_by_key, now)
        except IntegrityError:
            refused.add(lease.pk)
    return placed, refused


def _place_many(placements: list, gpu_by_key: dict, now: datetime) -> list[int]:
    """Placements → PROVISIONING with their allocations and events (inside a transaction); leases no longer
    queued (released since the cycle read them) are skipped. Provisioning is enqueued per node on commit."""
    claimed = set(Lease.objects.select_for_update().filter(
        pk__in=[lease.pk for lease, _ in placements], state=LeaseState.QUEUED).order_by("pk")
        .values_list("pk", flat=True))
    rows, changed, events, by_node, warm = [], [], [], {}, []
    for lease, decision in placements:
        if lease.pk not in claimed:
            continue
        allocation = decision.allocation
        if decision.warm:  # warm pool members: bound below, no agent call
            warm.append((lease, decision))
            continue
        rows += _allocation_rows(lease, decision, gpu_by_key, now)
        changed.append(Lease(pk=lease.pk, state=LeaseState.PROVISIONING, reason=decision.reason,
                             tier=allocation.tier, over_quota=allocation.preemptible, queue_position=None))
        events.append(LeaseEvent(lease_id=lease.pk, from_state=LeaseState.QUEUED, to_state=LeaseState.PROVISIONING,
                                 reason=decision.reason, actor="scheduler", at=now))
        by_node.setdefault(gpu_by_key[allocation.units[0].gpu].node_id, []).append(lease.pk)
    Allocation.objects.bulk_create(rows)
    _update_each(Lease, changed, ["state", "reason", "tier", "over_quota", "queue_position"])
    LeaseEvent.objects.bulk_create(events)
    for lease, decision in warm:
        _bind_warm(lease, decision, gpu_by_key, now)
    for lease_ids in by_node.values():
        _enqueue("leases_provision_run", lease_ids)
    logger.info("placed %d leases on %d nodes", len(changed), len(by_node))
    return [lease.pk for lease in changed]


def _bind_warm(lease: Lease, decision, gpu_by_key: dict, now: datetime) -> None:
    """A placement on warm pool members: each member still warm (no lease, ready, live) becomes the lease's
    allocation by one conditional update, and the lease is ACTIVE at once — no agent call on the path. A
    member taken or removed since the cycle read it refuses the whole placement (IntegrityError: the
    caller's savepoint is undone and the lease waits for the next cycle)."""
    allocation = decision.allocation
    ids = [int(warm_id) for warm_id in decision.warm]
    bound = Allocation.objects.filter(pk__in=ids, lease__isnull=True, state=AllocationState.WARM,
                                      freed_at__isnull=True).update(
        lease=lease, tier=allocation.tier, preemptible=allocation.preemptible, state=AllocationState.READY,
        bound_at=now)
    if bound != len(ids):
        raise IntegrityError(f"warm instance(s) {decision.warm} were taken or removed since the cycle read them")
    extra = _allocation_rows(lease, decision, gpu_by_key, now)[len(ids):]
    if extra:  # units beyond the warm members (a gang): placed the cold way, the lease provisions
        Allocation.objects.bulk_create(extra)
    node = gpu_by_key[allocation.units[0].gpu].node
    reason = f"{decision.reason}; bound warm instance(s) {', '.join(f'alloc-{i}' for i in ids)}"
    lease_transition(lease=lease, to=LeaseState.PROVISIONING, reason=reason, actor="scheduler", now=now,
                     tier=allocation.tier, over_quota=allocation.preemptible, queue_position=None)
    if extra:
        _enqueue("leases_provision_run", [lease.pk])
        return
    lease_transition(lease=lease, to=LeaseState.ACTIVE, reason=f"running on {node.node_id} (warm instance)",
                     actor="scheduler", now=now, active_at=now, ends_at=now + timedelta(seconds=lease.duration_seconds))


def _preempt(decision, now: datetime) -> None:
    """Victims get a notice and a deadline — the notice their tenant's SLO contract promises, else
    ``LEASE_PREEMPTION_NOTICE_SECONDS`` — and at the deadline they are released and requeued."""
    longest = settings.LEASE_PREEMPTION_NOTICE_SECONDS
    claimant = Lease.objects.filter(pk=int(decision.request)).values_list("tenant_id", flat=True).first()
    for victim_id in decision.victims:
        victim = Lease.objects.select_for_update().filter(pk=int(victim_id)).first()
        if victim is None or victim.state != LeaseState.ACTIVE:
            continue
        # the victim learns which of its own tenant's leases claimed the GPU, never another tenant's
        whose = f"lease {decision.request}" if claimant == victim.tenant_id else "another tenant"
        notice = lease_preempt(lease=victim, actor="scheduler", now=now, why=f"for in-quota work ({whose})")
        longest = max(longest, notice)
    from leasing import tasks

    transaction.on_commit(lambda: tasks.lease_expire_due.apply_async(countdown=longest + 0.5))


def lease_notice_seconds(*, tenant_id: int, now: datetime) -> int:
    """The preemption notice a tenant is promised: its SLO contract's, else ``LEASE_PREEMPTION_NOTICE_SECONDS``."""
    from tenants.models import SloContract

    contract = (SloContract.objects.filter(tenant_id=tenant_id, effective_from__lte=now)
                .filter(Q(effective_to__isnull=True) | Q(effective_to__gt=now)).first())
    return contract.preemption_notice_seconds if contract else settings.LEASE_PREEMPTION_NOTICE_SECONDS


def lease_preempt(*, lease: Lease, actor: str, now: datetime, why: str, notice_seconds: int | None = None) -> int:
    """An ACTIVE lease (locked by the caller, inside its transaction) becomes PREEMPTED with a deadline —
    ``notice_seconds`` or the tenant's promised notice — and the agent tells its instances; at the deadline
    ``lease_preempt_due`` releases and requeues it. Returns the notice given, in seconds."""
    notice = lease_notice_seconds(tenant_id=lease.tenant_id, now=now) if notice_seconds is None else notice_seconds
    deadline = now + timedelta(seconds=notice)
    lease_transition(lease=lease, to=LeaseState.PREEMPTED, actor=actor, now=now, notice_deadline=deadline,
                     reason=f"preempted {why}; notice until {deadline.isoformat(timespec='seconds')}")
    _enqueue("lease_notice_run", lease.pk)
    return notice


def lease_preempt_due(*, now: datetime | None = None) -> int:
    """Preempted leases past their notice deadline: instances destroyed, lease back in the queue."""
    now = now or timezone.now()
    due = list(Lease.objects.filter(state=LeaseState.PREEMPTED, notice_deadline__lte=now).order_by("pk")[:500])
    for lease in due:
        _release_instances_quietly(lease)
        allocations_free(lease=lease, now=timezone.now(), to=LeaseState.QUEUED, actor="broker",
                         reason="preempted: requeued, restarts when capacity frees")
    return len(due)


# -- agent work (outside transactions) ----------------------------------------------------------------
def lease_provision(*, lease_id: int) -> str:
    """Create every pending instance of the lease on its node (idempotent). Returns the lease state."""
    leases_provision(lease_ids=[lease_id])
    return Lease.objects.values_list("state", flat=True).get(pk=lease_id)


def leases_provision(*, lease_ids: list[int]) -> dict[str, int]:
    """Create the pending instances of these leases (idempotent): one batch call per node
    (``AgentClient.create_many``), then one transaction records them all (``allocations_ready``). A
    refusal (4xx) requeues that lease with the reason, its other instances destroyed. A node that does
    not answer (or answers 5xx) raises ``AgentUnreachable`` once what the other nodes made is recorded;
    running this again is harmless (the agent returns the instances it already made)."""
    from agent.client import AgentHTTPError, AgentUnreachable

    pending = (Allocation.objects.filter(lease_id__in=lease_ids, lease__state=LeaseState.PROVISIONING,
                                         state=AllocationState.PENDING).select_related("gpu__node").order_by("pk"))
    by_node: dict[int, list[Allocation]] = {}
    for allocation in pending:
        by_node.setdefault(allocation.gpu.node_id, []).append(allocation)
    ready, refused, unreachable = [], {}, []
    for allocations in by_node.values():
        node = allocations[0].gpu.node
        try:
            answers = agent_client(node).create_many({a.instance_id: allocation_spec(a) for a in allocations})
        except AgentUnreachable as error:
            unreachable.append(str(error))
            continue
        except AgentHTTPError as error:  # the call as a whole refused
            answers = {a.instance_id: {"status": error.status, "problem": error.problem} for a in allocations}
        for allocation in allocations:
            answer = answers.get(allocation.instance_id) or {"status": 502, "problem": {"detail": "no answer"}}
            if answer["status"] < 300:
                ready.append((allocation, answer["instance"]))
            elif answer["status"] < 500:  # the agent refuses: retrying will not help
                refused.setdefault(allocation.lease_id, answer["problem"].get("detail"))
            else:
                unreachable.append(f"{node.node_id}: {allocation.instance_id}: {answer['problem'].get('detail')}")
    counts = {"active": 0, "requeued": 0}
    if ready:
        counts["active"] = allocations_ready(items=ready, now=timezone.now())["active"]
    for lease_id, detail in refused.items():
        lease = Lease.objects.get(pk=lease_id)
        _release_instances_quietly(lease)  # what was already made for this lease goes
        allocations_free(lease=lease, now=timezone.now(), to=LeaseState.QUEUED,
                         reason=f"the node refused the instance ({detail}); requeued")
        counts["requeued"] += 1
    if unreachable:
        raise AgentUnreachable("; ".join(unreachable))
    return counts


def leases_provision_give_up(*, lease_ids: list[int], reason: str) -> int:
    """After the last retry: the leases still provisioning free their allocations and wait again."""
    count = 0
    for lease in Lease.objects.filter(pk__in=lease_ids, state=LeaseState.PROVISIONING).order_by("pk"):
        allocations_free(lease=lease, now=timezone.now(), to=LeaseState.QUEUED, reason=reason)
        count += 1
    return count


def lease_release_instances(*, lease: Lease) -> None:
    """Destroy the agent instances of every live allocation (already gone is success)."""
    for allocation in lease.allocations.filter(freed_at__isnull=True).select_related("gpu__node"):
        agent_client(allocation.gpu.node).destroy(allocation.instance_id)


def _release_instances_quietly(lease: Lease) -> None:
    """Best effort: an unreachable node keeps its instance until the reconcile destroys it as an orphan."""
    from agent.client import AgentUnreachable

    try:
        lease_release_instances(lease=lease)
    except AgentUnreachable as error:
        logger.warning("lease %s: instances not destroyed now (%s); the reconcile will", lease.pk, error)


def lease_release_finish(*, lease_id: int, final: str) -> str:
    lease = Lease.objects.get(pk=lease_id)
    if lease.state != LeaseState.RELEASING:
        return lease.state
    lease_release_instances(lease=lease)
    reason = "the lease reached its end" if final == LeaseState.EXPIRED else "released"
    return allocations_free(lease=lease, now=timezone.now(), to=final, reason=reason).state


def lease_notice(*, lease_id: int) -> None:
    lease = Lease.objects.get(pk=lease_id)
    # a preemption, or the capacity loop's idle notice on a running lease
    if lease.state not in (LeaseState.PREEMPTED, LeaseState.ACTIVE) or lease.notice_deadline is None:
        return
    for allocation in lease.allocations.filter(freed_at__isnull=True).select_related("gpu__node"):
        agent_client(allocation.gpu.node).notice(allocation.instance_id, lease.notice_deadline.timestamp(),
                                                 lease.reason)


# -- nodes: enrollment and heartbeats --------------------------------------------------------------------
ENROLL_PREFIX = "gpub_enroll_"


class AgentUnauthenticated(ApplicationError):
    """An agent request without valid credentials: a bad enrollment token or a bad signature (401)."""

    status = 401
    code = "unauthenticated"
    title = "Not authenticated"


class EnrollmentConflict(ApplicationError):
    """An enrollment that would take over another node's identity or GPUs (409; nothing written)."""

    status = 409
    code = "enrollment_conflict"
    title = "Enrollment refused"


def enrollment_token_create(*, uses: int = 1, pool: str = "default", ttl_seconds: int = 3600, by_user=None,
                            now: datetime | None = None) -> str:
    """A token good for ``uses`` enrollments (one by default) within ``ttl_seconds``; only its hash is
    stored. A token enrolls new node ids only: an enrolled node re-enrolls with its own secret or with
    staff approval (``node_reenroll_approve``)."""
    import secrets

    from leasing.models import EnrollmentToken

    if isinstance(uses, bool) or not isinstance(uses, int) or not 1 <= uses <= 100_000:
        raise ValidationFailed("uses must be a whole number from 1 to 100000.", field="uses")
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or not 1 <= ttl_seconds <= 7 * 86400:
        raise ValidationFailed("ttl_seconds must be a whole number from 1 to 604800.", field="ttl_seconds")
    now = now or timezone.now()
    prefix = secrets.token_hex(4)
    secret = secrets.token_urlsafe(24)
    token = f"{ENROLL_PREFIX}{prefix}_{secret}"
    with transaction.atomic():
        EnrollmentToken.objects.create(prefix=prefix, secret_hash=hashlib.sha256(token.encode()).hexdigest(),
                                       pool=pool, uses_left=uses, expires_at=now + timedelta(seconds=ttl_seconds),
                                       created_at=now)
        _audit(action="node.enrollment_token_create", target=prefix, by_user=by_user,
               data={"pool": pool, "uses": uses, "ttl_seconds": ttl_seconds})
    return token


def enrollment_token_revoke(*, prefix: str, by_user=None, reason: str = "") -> int:
    """Spend what is left of an enrollment token at once (a token that leaked, or one no longer needed).
    Idempotent; audited with the uses it took away. Returns that number (0: already spent or unknown)."""
    from leasing.models import EnrollmentToken

    with transaction.atomic():
        record = EnrollmentToken.objects.select_for_update().filter(prefix=prefix).first()
        if record is None:
            raise NotFound(f"No enrollment token with prefix {prefix!r}.", field="prefix")
        taken = record.uses_left
        if taken:
            EnrollmentToken.objects.filter(pk=record.pk).update(uses_left=0)
            _audit(action="node.enrollment_token_revoke", target=prefix, by_user=by_user,
                   data={"uses_taken": taken, **({"reason": reason} if reason else {})})
    return taken


def _audit(*, action: str, target: str, data: dict, by_user=None) -> None:
    from tenants.models import AuditEvent

    AuditEvent.objects.create(tenant=None, actor=by_user if by_user is not None and by_user.is_authenticated else None,
                              action=action, target=target, data=data)


def node_enroll(*, node_id: str, token: str, address: str, inventory: object, hostname: str = "",
                agent_version: str = "", signed_by_node: bool = False, now: datetime | None = None) -> Node:
    """Give a node a (new) secret and record its GPUs, in one transaction that writes nothing when refused.

    - A new node id: an enrollment token (one use spent; 401 when invalid, expired or spent).
    - An enrolled node id: the request signed with the node's current secret (``signed_by_node``, checked
      by the caller with ``node_request_verify``), or a token after staff approved it once
      (``node_reenroll_approve``); otherwise 409 on ``node_id`` and no token use is spent.
    - Every GPU reported must be new, this node's already, or released by staff (``gpu_release``); another
      node's GPU is refused with 409 naming ``inventory.gpus[i]``.
    """
    import secrets

    from leasing.models import EnrollmentToken

    now = now or timezone.now()
    with transaction.atomic(durable=True):
        existing = Node.objects.select_for_update().filter(node_id=node_id).first()
        how = "signed" if existing is not None and signed_by_node else "token"
        record = None
        if how == "token":
            digest = hashlib.sha256(token.encode()).hexdigest()
            record = EnrollmentToken.objects.select_for_update().filter(secret_hash=digest).first() if token else None
            if record is None or record.uses_left < 1 or (record.expires_at and record.expires_at <= now):
                raise AgentUnauthenticated("Invalid, expired or spent enrollment token.", field="token")
            if existing is not None:
                if existing.reenroll_approved_at is None:
                    raise EnrollmentConflict(
                        f"Node {node_id} is already enrolled. It re-enrolls with a request signed with its "
                        "current secret; an agent that lost its secret needs a staff member to approve its "
                        f"re-enrollment (manage.py node_reenroll_approve {node_id}).", field="node_id")
                how = "approved"
            # one use, taken while the row is locked: racing enrollments cannot overspend a token
            EnrollmentToken.objects.filter(pk=record.pk).update(uses_left=record.uses_left - 1)
        fields = {"address": address, "hostname": hostname, "agent_version": agent_version,
                  "secret": secrets.token_urlsafe(32), "status": "ready", "silent_since": None,
                  "reenroll_approved_at": None, "enrolled_at": now, "last_heartbeat_at": now}
        if existing is None:
            node = Node.objects.create(node_id=node_id, pool=record.pool, **fields)
        else:
            Node.objects.filter(pk=existing.pk).update(**fields)
            node = Node.objects.get(pk=existing.pk)
        node_inventory_sync(node=node, inventory=inventory, now=now, strict=True)
        _audit(action="node.enroll" if existing is None else "node.reenroll", target=node_id,
               data={"how": how, "address": address, **({"token": record.prefix} if record else {})})
    return node


def node_inventory_sync(*, node: Node, inventory: object, now: datetime, strict: bool = False) -> list[int]:
    """The node's GPUs as its agent reports them; GPUs no longer reported are marked lost. A GPU that
    another node enrolled (and staff did not release) is never moved: ``strict`` (enrollment) refuses the
    whole inventory with 409 on ``inventory.gpus[i]``; otherwise (reconcile) it is left out and logged.
    Returns the indexes (in ``inventory.gpus``) that were left out."""
    gpus = inventory.get("gpus") if isinstance(inventory, dict) else None
    if not isinstance(gpus, list):
        raise ValidationFailed("inventory.gpus must be a list.", field="inventory.gpus")
    parsed = []
    for index, item in enumerate(gpus):
        try:
            uuid, model, mode = str(item["uuid"]), model_get(item["model"]).code, item["mode"]
            if mode not in GpuMode.values or not uuid or len(uuid) > 80:
                raise ValueError(mode)
            gpu_index, memory_mib = int(item["index"]), int(item["memory_mib"])
            if not 0 <= gpu_index <= MAX_GPU_INDEX or not 1 <= memory_mib <= MAX_GPU_MEMORY_MIB:
                raise ValueError(f"index 0-{MAX_GPU_INDEX}, memory_mib 1-{MAX_GPU_MEMORY_MIB}")
            parsed.append((index, uuid, {"index": gpu_index, "model": model, "mode": mode, "memory_mib": memory_mib}))
        except (KeyError, TypeError, ValueError, UnknownModel) as error:
            raise ValidationFailed(f"inventory.gpus[{index}] is not a GPU the broker knows: {error}",
                                   field=f"inventory.gpus[{index}]") from None
    owners = dict(Gpu.objects.select_for_update().filter(uuid__in=[uuid for _, uuid, _ in parsed],
                                                         released_at__isnull=True)
                  .exclude(node=node).values_list("uuid", "node__node_id"))
    refused = [index for index, uuid, _ in parsed if uuid in owners]
    if refused and strict:
        index = refused[0]
        uuid = parsed[index][1]
        raise EnrollmentConflict(f"GPU {uuid} belongs to node {owners[uuid]}; a staff member must release it "
                                 f"(manage.py gpu_release {uuid}) before another node can claim it.",
                                 field=f"inventory.gpus[{index}]")
    seen = []
    for _index, uuid, values in parsed:
        if uuid in owners:
            logger.warning("node %s reports GPU %s, which belongs to node %s: ignored (staff must release it)",
                           node.node_id, uuid, owners[uuid])
            continue
        Gpu.objects.update_or_create(uuid=uuid, defaults={"node": node, **values, "lost_at": None,
                                                          "released_at": None})
        seen.append(uuid)
    Gpu.objects.filter(node=node, lost_at__isnull=True).exclude(uuid__in=seen).update(lost_at=now)
    return refused


def node_request_verify(*, node_id: str, headers, method: str, path: str, query: str, body: bytes,
                        now: datetime | None = None) -> Node:
    """The node that signed this request (``agent.signing``), else ``AgentUnauthenticated``. The nonce is
    claimed in PostgreSQL (unique per node), so a replay is refused by every web process."""
    from agent.signing import HEADER_NONCE, WINDOW, SignatureError, verify

    now = now or timezone.now()
    node = Node.objects.filter(node_id=node_id).only("pk", "node_id", "secret").first()
    if len(headers.get(HEADER_NONCE, "")) > 64:
        raise AgentUnauthenticated("X-Gpub-Nonce must be at most 64 characters.", field=HEADER_NONCE)

    class _Nonces:
        @staticmethod
        def add(nonce: str, _now: float) -> bool:
            with connection.cursor() as cursor:
                cursor.execute(
                    "INSERT INTO broker_agentnonce (node_id, nonce, expires_at) VALUES (%s, %s, %s) "
                    "ON CONFLICT (node_id, nonce) DO NOTHING", [node.pk, nonce, now + timedelta(seconds=2 * WINDOW)])
                return cursor.rowcount == 1

    try:
        verify(headers, method, path, query, body,
               lambda nid: node.secret if node is not None and nid == node_id else None, _Nonces,
               now=now.timestamp())
    except SignatureError as error:
        raise AgentUnauthenticated(str(error)) from None
    return node


SILENT_NOTE = "is silent"


def node_heartbeat(*, node: Node, now: datetime | None = None) -> Node:
    """Record a heartbeat. A node that was silent (within the grace: its leases still hold their
    capacity) is back: it is open to scheduling again and its leases say so; audited."""
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        node_row = Node.objects.select_for_update().get(pk=node.pk)
        Node.objects.filter(pk=node.pk).update(last_heartbeat_at=now, status="ready", silent_since=None)
        if node_row.status == "silent":
            reason = (f"node {node.node_id} answers again (silent since "
                      f"{node_row.silent_since.isoformat(timespec='seconds') if node_row.silent_since else '?'}); "
                      f"the lease runs on")
            leases = _leases_on(node).filter(reason__contains=SILENT_NOTE)
            count = leases.update(reason=reason)
            _audit(action="node.back", target=node.node_id, data={
                "last_heartbeat_at": node_row.last_heartbeat_at.isoformat() if node_row.last_heartbeat_at else None,
                "leases_kept": count})
            if not node_row.cordoned:
                _enqueue("schedule_cycle")
    node.last_heartbeat_at = now
    node.status = "ready"
    return node


def _leases_on(node: Node):
    """Leases not final that hold a live allocation on the node."""
    return Lease.objects.filter(pk__in=Allocation.objects.filter(gpu__node=node, freed_at__isnull=True)
                                .values("lease_id")).exclude(state__in=FINAL_STATES)


def node_reenroll_approve(*, node: Node, by_user=None, reason: str = "") -> Node:
    """Staff: let the next token enrollment of this node id through once (an agent that lost its secret).
    Audited; the approval is spent by that enrollment."""
    now = timezone.now()
    with transaction.atomic(durable=True):
        Node.objects.filter(pk=node.pk).update(reenroll_approved_at=now)
        _audit(action="node.reenroll_approve", target=node.node_id, data={"reason": reason} if reason else {},
               by_user=by_user)
    node.refresh_from_db()
    return node


def gpu_release(*, gpu: Gpu, by_user=None, reason: str = "") -> Gpu:
    """Staff: release a GPU from its node so that another node may claim it (moved hardware). It leaves
    scheduling at once (marked lost until a node reports it again); refused while an allocation holds it."""
    from config.errors import Conflict

    now = timezone.now()
    with transaction.atomic(durable=True):
        gpu = Gpu.objects.select_for_update().select_related("node").get(pk=gpu.pk)
        if Allocation.objects.filter(gpu=gpu, freed_at__isnull=True).exists():
            raise Conflict(f"GPU {gpu.uuid} is held by a live lease; release or fail that lease first.",
                           field="gpu")
        Gpu.objects.filter(pk=gpu.pk).update(released_at=now, lost_at=gpu.lost_at or now)
        _audit(action="gpu.release", target=gpu.uuid, by_user=by_user,
               data={"node": gpu.node.node_id, **({"reason": reason} if reason else {})})
    gpu.refresh_from_db()
    return gpu


# -- reconcile ---------------------------------------------------------------------------------------
STUCK_AFTER = timedelta(seconds=30)


def leases_resume_stuck(*, now: datetime | None = None) -> int:
    """Leases left mid-flight by a worker that died (its message may come back only much later):
    provisioning or releasing for longer than ``STUCK_AFTER`` → the idempotent task again."""
    now = now or timezone.now()
    from leasing import tasks

    count = 0
    stale = now - STUCK_AFTER
    for lease_id in Lease.objects.filter(state=LeaseState.PROVISIONING, allocations__freed_at__isnull=True,
                                         allocations__created_at__lte=stale).values_list("pk", flat=True).distinct():
        tasks.lease_provision_run.delay(lease_id)
        count += 1
    releasing = Lease.objects.filter(state=LeaseState.RELEASING, events__to_state=LeaseState.RELEASING,
                                     events__at__lte=stale).values_list("pk", flat=True).distinct()
    for lease_id in releasing:
        final = LeaseState.EXPIRED if Lease.objects.filter(pk=lease_id, ends_at__lte=now).exists() \
            else LeaseState.RELEASED
        tasks.lease_release_run.delay(lease_id, final)
        count += 1
    return count


def node_reconcile(*, node: Node, now: datetime | None = None) -> dict:
    """The agent's inventory against the database: instances no live allocation owns are destroyed
    (orphans); live, ready allocations whose instance vanished fail their lease at that moment."""
    now = now or timezone.now()
    asked_at = timezone.now()
    inventory = agent_client(node).inventory()
    with transaction.atomic(durable=True):
        node_inventory_sync(node=node, inventory=inventory, now=now)
    present = {item["allocation_id"] for item in inventory["instances"]}
    live = {a.instance_id: a for a in Allocation.objects.filter(gpu__node=node, freed_at__isnull=True)
            .select_related("lease")}
    orphans = [instance for instance in present if instance not in live]
    for instance in orphans:
        # made by a create whose answer never arrived, or left behind by a release that gave up
        agent_client(node).destroy(instance)
    # only what was ready before the inventory was asked for (a create racing the reconcile is not lost)
    vanished = [a for a in live.values() if a.instance_id not in present and a.state == AllocationState.READY
                and a.ready_at is not None and a.ready_at < asked_at]
    lost_warm = [a.pk for a in live.values() if a.lease_id is None and a.state == AllocationState.WARM
                 and a.instance_id not in present and a.warm_at is not None and a.warm_at < asked_at]
    if lost_warm:  # a warm pool member destroyed behind the broker's back: the pool is one smaller
        Allocation.objects.filter(pk__in=lost_warm, lease__isnull=True, state=AllocationState.WARM).update(
            state=AllocationState.FREED, freed_at=now)
    for lease_id in sorted({a.lease_id for a in vanished}):
        lease = Lease.objects.get(pk=lease_id)
        if lease.state in FINAL_STATES:
            continue
        _release_instances_quietly(lease)  # the rest of a multi-GPU lease goes too
        allocations_free(lease=lease, now=now, to=LeaseState.FAILED, actor=f"agent:{node.node_id}",
                         reason=f"the instance vanished from {node.node_id} (GPU lost or destroyed outside the "
                                f"broker) at {now.isoformat(timespec='seconds')}")
    return {"orphans": len(orphans), "vanished": len(vanished)}


def nodes_check_heartbeats(*, now: datetime | None = None) -> int:
    """Silence, in two steps (docs/operations.md, "A silent node"):

    1. A ready node silent for three heartbeat periods becomes ``silent``: out of scheduling at once. Its
       leases keep their allocations (and their instances on the node) and their reason says the node is
       silent and when they will fail. Audited (``node.silent``).
    2. A silent node whose last heartbeat is older than ``AGENT_LOST_AFTER_SECONDS`` loses its leases:
       they fail, and their time stops counting (billing, SLO) at the node's last heartbeat (or at the
       lease's own last event, when that is later), not at the end of the grace.

    A node that heartbeats within the grace is ready again (``node_heartbeat``) and its leases run on.
    Also prunes expired agent nonces. Returns the number of nodes newly taken out."""
    from leasing.models import AgentNonce

    now = now or timezone.now()
    grace = timedelta(seconds=settings.AGENT_LOST_AFTER_SECONDS)
    limit = now - timedelta(seconds=3 * settings.AGENT_HEARTBEAT_SECONDS)
    silenced = 0
    for node in Node.objects.filter(status="ready", last_heartbeat_at__lt=limit).order_by("pk"):
        with transaction.atomic(durable=True):
            if not Node.objects.filter(pk=node.pk, status="ready", last_heartbeat_at__lt=limit).update(
                    status="silent", silent_since=now):
                continue  # it answered meanwhile
            last = node.last_heartbeat_at
            deadline = last + grace
            reason = (f"node {node.node_id} {SILENT_NOTE} (last heartbeat {last.isoformat(timespec='seconds')}); "
                      f"the lease keeps its capacity and fails at {deadline.isoformat(timespec='seconds')} "
                      f"unless the node answers again")
            count = _leases_on(node).update(reason=reason)
            _audit(action="node.silent", target=node.node_id,
                   data={"last_heartbeat_at": last.isoformat(), "lost_at": deadline.isoformat(), "leases": count})
            silenced += 1
    for node in Node.objects.filter(status="silent", last_heartbeat_at__lt=now - grace).order_by("pk"):
        for lease in _leases_on(node).order_by("pk"):
            last_event = lease.events.order_by("-at").values_list("at", flat=True).first()
            stop = max(node.last_heartbeat_at, last_event or node.last_heartbeat_at)
            if not Node.objects.filter(pk=node.pk, status="silent").exists():
                break  # it came back meanwhile: its leases run on
            allocations_free(lease=lease, now=stop, to=LeaseState.FAILED, actor="broker",
                             reason=f"node {node.node_id} stopped answering (last heartbeat "
                                    f"{node.last_heartbeat_at.isoformat(timespec='seconds')}, silent for more than "
                                    f"{settings.AGENT_LOST_AFTER_SECONDS} s); the lease ended at its last heartbeat")
    AgentNonce.objects.filter(expires_at__lt=now).delete()
    return silenced


# -- nodes: cordon ---------------------------------------------------------------------------------------
def node_cordon(*, node: Node, by_user=None, reason: str = "") -> Node:
    """Close a node to new placements (platform staff). Leases running there keep running; the scheduler
    snapshot treats the node as full from the next cycle. Idempotent; the change is audited."""
    return _node_set_cordoned(node=node, cordoned=True, by_user=by_user, reason=reason)


def node_uncordon(*, node: Node, by_user=None, reason: str = "") -> Node:
    """Open a cordoned node to new placements again and trigger a cycle for what waits. Idempotent."""
    return _node_set_cordoned(node=node, cordoned=False, by_user=by_user, reason=reason)


def _node_set_cordoned(*, node: Node, cordoned: bool, by_user, reason: str) -> Node:
    from tenants.models import AuditEvent

    with transaction.atomic(durable=True):
        changed = Node.objects.filter(pk=node.pk, cordoned=not cordoned).update(cordoned=cordoned)
        if changed:
            AuditEvent.objects.create(
                tenant=None, actor=by_user if by_user is not None and by_user.is_authenticated else None,
                action="node.cordon" if cordoned else "node.uncordon", target=node.node_id,
                data={"reason": reason} if reason else {})
            if not cordoned:
                _enqueue("schedule_cycle")
    node.refresh_from_db()
    return node
