"""A lease request: validated by ``broker.validation`` (the rules the preview and the quote use too), admitted by the
checks other apps register (``broker.extensions``), and inserted born queued with its first events."""

from __future__ import annotations

import hashlib
import json
import logging
from contextlib import nullcontext
from datetime import datetime

from django.contrib.postgres.expressions import ArraySubquery
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.db.models import IntegerField, OuterRef, Subquery, Value
from django.db.models.functions import JSONObject
from django.utils import timezone

from broker.choices import (
    LeaseState,
    WorkloadClass,
)
from broker.extensions import GpuRequest, RequestAdmission, gpu_resolve, request_admit, request_check_conditions
from broker.models import Lease, LeaseEvent, Workload
from broker.services.triggers import enqueue
from broker.validation import labels_check, request_input_check, request_quota_check, workload_scope, workload_split
from broker.workload_secrets import secret_env_digest, secret_env_seal
from core.errors import (
    IdempotencyConflict,
    NotFound,
    PermissionDenied,
    ValidationFailed,
)
from core.prepared import PreparedQuery, preparing_cursor
from tenants.access import Actor
from tenants.choices import TenantStatus
from tenants.models import Project, Quota

logger = logging.getLogger(__name__)


def _request_hash(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def lease_request(*, actor: Actor, project: str, gpu: object, workload_class: str = WorkloadClass.TRAINING,
                  priority: int = 0, duration_seconds: object = 3600, idempotency_key: str = "",
                  workload: object = None, group: str | None = None, access_extra: dict | None = None,
                  profiling: bool = False, avoid_nodes: list[str] | None = None, labels: object = None,
                  now: datetime | None = None) -> tuple[Lease, bool]:
    """Validate and queue a request: (the lease, created now?). The same idempotency key with the same
    body returns the first lease; with another body it is ``IdempotencyConflict``. ``workload`` (optional)
    is what the lease runs once placed (``broker.validation.workload_check``; ``services.workloads``).
    ``group`` (optional, set by the apps that lease several things as one: a pipeline plan, a model split)
    makes the lease a member of the tenant's lease group of that key: the scheduler places the queued
    members together or none of them (docs/scheduling.md "Lease groups"). ``access_extra`` (optional, set by
    those apps too: a JSON object of at most 16 KiB) is added to each device's access details (a model split's
    layer range for that device). ``avoid_nodes`` (optional, set by those apps: node ids) keeps the lease off
    those nodes, as a re-placed workload's failed nodes are (a model split planned on the GPUs free now is pinned
    to its planned nodes this way). ``labels`` (optional): cost allocation labels, keys allowed by the tenant
    (``Tenant.allowed_label_keys``), copied into the lease's usage rows (``broker.validation.labels_check``)."""
    actor.require("use")
    now = now or timezone.now()
    requested_gpu = gpu
    # a gpu kind another app answers for (tiering's "auto"): resolved into a concrete gpu object first
    choice = gpu_resolve(GpuRequest(actor=actor, project=project, gpu=gpu, workload_class=workload_class,
                                    duration_seconds=duration_seconds, now=now))
    if choice is not None:
        gpu = choice.gpu
    checked = request_input_check(actor=actor, project=project, gpu=gpu, workload_class=workload_class,
                                  priority=priority, duration_seconds=duration_seconds)
    shape = checked.shape
    labels = labels_check(labels, allowed=actor.tenant.allowed_label_keys) if labels else {}
    workload_spec, secret_env = workload_split(
        workload, shape,
        scope=workload_scope(tenant_slug=actor.tenant.slug, project=project) if workload is not None else "")
    if len(idempotency_key) > 200:
        raise ValidationFailed("Idempotency-Key is at most 200 characters.", field="Idempotency-Key")
    if group is not None and (not isinstance(group, str) or not 1 <= len(group) <= 100):
        raise ValidationFailed("group is a key of 1 to 100 characters.", field="group")
    if access_extra is not None and (not isinstance(access_extra, dict)
                                     or len(json.dumps(access_extra, default=str)) > 16384):
        raise ValidationFailed("access_extra is a JSON object of at most 16 KiB.", field="access_extra")
    if avoid_nodes is not None and (not isinstance(avoid_nodes, list)
                                    or not all(isinstance(n, str) and 0 < len(n) <= 100 for n in avoid_nodes)):
        raise ValidationFailed("avoid_nodes is a list of node ids.", field="avoid_nodes")
    # a resolved request is the same request when its body is: the key replays it whatever it resolves to now
    payload = {"project": project, "gpu": shape if choice is None else requested_gpu, "workload_class": workload_class,
               "priority": priority, "duration_seconds": duration_seconds}
    if access_extra:
        payload["access_extra"] = access_extra
    if workload_spec is not None:
        payload["workload"] = workload_spec
        if secret_env:  # the same secrets replay the request; other ones conflict; the hash holds no clear value
            payload["workload_secret_env"] = secret_env_digest(secret_env)
    if group is not None:
        payload["group"] = group
    if avoid_nodes:
        payload["avoid_nodes"] = sorted(avoid_nodes)
    if labels:
        payload["labels"] = labels
    digest = _request_hash(payload)
    # one query: the project, its quota limits, the lease this idempotency key already made (if any) and
    # whether each admission check that said when it applies does (billing's: a spend cap exists)
    conditions = request_check_conditions()
    found = _project_lookup(bool(idempotency_key), conditions).rows(
        tenant_id=actor.tenant.pk, slug=project, key=idempotency_key)
    row = found[0] if found else None
    if actor.project_ids is not None and (row is None or row["id"] not in actor.project_ids):
        # a token limited to other projects: this one does not exist for it (tenants.access.restrict)
        raise NotFound(f"No project {project!r} in this tenant.", field="project")
    replayed = row["replayed"] if row is not None else (
        Lease.objects.filter(tenant=actor.tenant, idempotency_key=idempotency_key).order_by()
        .values_list("pk", flat=True).first() if idempotency_key else None)
    if replayed is not None:
        existing = Lease.objects.select_related("project").get(pk=replayed)
        if existing.request_hash != digest:
            raise IdempotencyConflict("This Idempotency-Key was used with another request body.",
                                      field="Idempotency-Key")
        return existing, False
    if row is None:
        raise NotFound(f"No project {project!r} in this tenant.", field="project")
    target = Project.from_db("default", _PROJECT_FIELDS, [row[name] for name in _PROJECT_FIELDS])
    target.tenant = actor.tenant  # the actor's, which the lookup filtered on
    if target.status != TenantStatus.ACTIVE:  # platform staff suspended this project (tenants.services)
        raise PermissionDenied(f"Project {project!r} is suspended; it takes no new lease requests.", field="project")
    fitting = list(request_quota_check(request=checked,
                                       limits={quota["tier"]: quota["limit"] for quota in row["limits"]}))
    # the checks other apps registered (billing's monthly spend caps: refuse with a 402, or warn)
    warning = request_admit(RequestAdmission(
        actor=actor, project=target, gpu={**gpu, "model": fitting[0]} if len(fitting) == 1 else dict(gpu),
        workload_class=workload_class, duration_seconds=duration_seconds, now=now),
        applicable={check: row[f"applies_{index}"] for index, (check, _) in enumerate(conditions)})
    # born queued: the events of its first two steps are written with it
    lease = Lease(
        tenant=actor.tenant, project=target, created_by=actor.user if actor.user.is_authenticated else None,
        kind=shape["kind"], count=shape["count"], models_allowed=shape["models"], profile=shape["profile"],
        milli=shape["milli"], memory_mib=shape["memory_mib"], gang=shape["gang"], min_count=shape.get("min_count", 0),
        cpu_milli_per_unit=shape.get("cpu_milli_per_unit", 0),
        host_memory_mib_per_unit=shape.get("host_memory_mib_per_unit", 0), workload_class=workload_class,
        priority=priority, duration_seconds=duration_seconds, requested_at=now, idempotency_key=idempotency_key,
        request_hash=digest, state=LeaseState.QUEUED, queued_at=now,
        reason="waiting for the scheduler" if choice is None else f"{choice.reason}; waiting for the scheduler",
        decision="" if choice is None else choice.reason, profiling=profiling,
        group_key=group, access_extra=access_extra or {}, avoid_nodes=sorted(avoid_nodes or []), labels=labels)
    requested = "requested" if choice is None else f"requested ({choice.reason})"
    events = [LeaseEvent(from_state="", to_state=LeaseState.REQUESTED,
                         reason=f"{requested}; {warning}" if warning else requested,
                         actor=f"user:{actor.user.get_username()}", at=now),
              LeaseEvent(from_state=LeaseState.REQUESTED, to_state=LeaseState.QUEUED,
                         reason="waiting for the scheduler", actor="broker", at=now)]
    try:
        if workload_spec is None:
            _lease_insert(lease, events)
        else:
            with transaction.atomic():
                _lease_insert(lease, events)
                Workload.objects.create(lease=lease, spec=workload_spec,
                                        secret_env_sealed=secret_env_seal(secret_env))
        enqueue("schedule_cycle")
    except IntegrityError:
        # the same key raced us: the winner's lease is the answer (or a conflict when its body differs)
        existing = Lease.objects.get(tenant=actor.tenant, idempotency_key=idempotency_key)
        if existing.request_hash != digest:
            raise IdempotencyConflict("This Idempotency-Key was used with another request body.",
                                      field="Idempotency-Key") from None
        return existing, False
    return lease, True


_PROJECT_FIELDS = [field.attname for field in Project._meta.concrete_fields]
_project_lookups: dict[tuple, PreparedQuery] = {}


def _project_lookup(keyed: bool, conditions: list) -> PreparedQuery:
    """The request's one read, compiled once per process (``core.prepared``; the ORM compiling this query —
    two subqueries and a JSON aggregate — cost more CPU than PostgreSQL answering it): the tenant's project of
    that slug with its quota limits, the lease an Idempotency-Key already made, and one ``applies_<i>`` flag per
    admission check that said when it applies. Its shape depends on whether a key was given and on which
    checks are registered (tests register their own), so one prepared query per shape."""
    shape = (keyed, tuple(id(check) for check, _ in conditions))
    prepared = _project_lookups.get(shape)
    if prepared is None:
        def build(tenant_id, slug, key=None):
            expressions = {f"applies_{index}": applies() for index, (_, applies) in enumerate(conditions)}
            keyed_lease = Lease.objects.filter(tenant_id=tenant_id, idempotency_key=key).order_by()
            return Project.objects.filter(tenant_id=tenant_id, slug=slug).order_by().annotate(
                limits=ArraySubquery(Quota.objects.filter(project=OuterRef("pk")).order_by().values(
                    json=JSONObject(tier="tier", limit="limit_gpu_milli"))),
                replayed=Subquery(keyed_lease.values("pk")[:1]) if keyed else Value(None, IntegerField()),
                **expressions).values(*_PROJECT_FIELDS, "limits", "replayed", *expressions)[:1]

        sentinels = {"tenant_id": -7_340_033, "slug": "\x00slug", **({"key": "\x00key"} if keyed else {})}
        prepared = _project_lookups[shape] = PreparedQuery(build, **sentinels)
    return prepared


_LEASE_EVENT_FIELDS = ("from_state", "to_state", "reason", "actor", "at")
_lease_insert_statements: dict[str, tuple] = {}


def _lease_insert_statement(db) -> tuple:
    """The insert's fields and SQL for this connection, built once per process (quoting 45 column names and
    building the text cost more than the rest of preparing the insert)."""
    statement = _lease_insert_statements.get(db.alias)
    if statement is None:
        quote = db.ops.quote_name
        fields = [field for field in Lease._meta.concrete_fields if not field.primary_key]
        event_fields = [LeaseEvent._meta.get_field(name) for name in _LEASE_EVENT_FIELDS]
        columns = ", ".join(quote(field.column) for field in event_fields)
        sql = (f"WITH lease AS (INSERT INTO {quote(Lease._meta.db_table)} "  # noqa: S608 (names from the models)
               f"({', '.join(quote(field.column) for field in fields)}) VALUES ({', '.join(['%s'] * len(fields))}) "
               f"RETURNING {quote(Lease._meta.pk.column)} AS id) "
               f"INSERT INTO {quote(LeaseEvent._meta.db_table)} ({quote('lease_id')}, {columns}) "
               f"SELECT lease.id, {columns} FROM lease, unnest("
               f"{', '.join(f'%s::{field.db_type(db)}[]' for field in event_fields)}) WITH ORDINALITY "
               f"AS e({columns}, position) ORDER BY e.position RETURNING {quote('lease_id')}")
        statement = _lease_insert_statements[db.alias] = (fields, event_fields, sql)
    return statement


def _lease_insert(lease: Lease, events: list[LeaseEvent]) -> None:
    """Insert a new lease and its first events in one statement — a transaction of its own (or part of
    the caller's), one round trip instead of five (BEGIN, two inserts, COMMIT) on the request path. The
    events keep their order (their ids follow it). Sets ``lease.pk``; an IntegrityError writes nothing."""
    db = connections[DEFAULT_DB_ALIAS]  # the connection itself, not the proxy (one lookup, not one per field)
    fields, event_fields, sql = _lease_insert_statement(db)
    values = [field.get_db_prep_save(field.pre_save(lease, True), db) for field in fields]
    arrays = [[field.get_db_prep_save(getattr(event, field.attname), db) for event in events]
              for field in event_fields]
    with transaction.atomic() if db.in_atomic_block else nullcontext(), preparing_cursor(db) as cursor:
        cursor.execute(sql, [*values, *arrays])
        lease.pk = cursor.fetchone()[0]
    lease._state.adding, lease._state.db = False, db.alias


