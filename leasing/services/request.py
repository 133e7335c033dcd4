"""A lease request: validated by ``leasing.validation`` (the rules the preview and the quote use too), admitted by the
checks other apps register (``leasing.extensions``), and inserted born queued with its first events."""

from __future__ import annotations

import hashlib
import json
import logging
from contextlib import nullcontext
from datetime import datetime

from django.contrib.postgres.expressions import ArraySubquery
from django.db import IntegrityError, connection, transaction
from django.db.models import IntegerField, OuterRef, Subquery, Value
from django.db.models.functions import JSONObject
from django.utils import timezone

from config.errors import (
    IdempotencyConflict,
    NotFound,
    ValidationFailed,
)
from leasing.choices import (
    LeaseState,
    WorkloadClass,
)
from leasing.extensions import GpuRequest, RequestAdmission, gpu_resolve, request_admit
from leasing.models import Lease, LeaseEvent, Workload
from leasing.services.triggers import enqueue
from leasing.validation import request_input_check, request_quota_check, workload_check
from tenants.access import Actor
from tenants.models import Project, Quota

logger = logging.getLogger(__name__)


def _request_hash(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def lease_request(*, actor: Actor, project: str, gpu: object, workload_class: str = WorkloadClass.TRAINING,
                  priority: int = 0, duration_seconds: object = 3600, idempotency_key: str = "",
                  workload: object = None, group: str | None = None,
                  now: datetime | None = None) -> tuple[Lease, bool]:
    """Validate and queue a request: (the lease, created now?). The same idempotency key with the same
    body returns the first lease; with another body it is ``IdempotencyConflict``. ``workload`` (optional)
    is what the lease runs once placed (``leasing.validation.workload_check``; ``services.workloads``).
    ``group`` (optional, set by the apps that lease several things as one: a pipeline plan, a model split)
    makes the lease a member of the tenant's lease group of that key: the scheduler places the queued
    members together or none of them (docs/scheduling.md "Lease groups")."""
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
    workload_spec = workload_check(workload, shape)
    if len(idempotency_key) > 200:
        raise ValidationFailed("Idempotency-Key is at most 200 characters.", field="Idempotency-Key")
    if group is not None and (not isinstance(group, str) or not 1 <= len(group) <= 100):
        raise ValidationFailed("group is a key of 1 to 100 characters.", field="group")
    # a resolved request is the same request when its body is: the key replays it whatever it resolves to now
    payload = {"project": project, "gpu": shape if choice is None else requested_gpu, "workload_class": workload_class,
               "priority": priority, "duration_seconds": duration_seconds}
    if workload_spec is not None:
        payload["workload"] = workload_spec
    if group is not None:
        payload["group"] = group
    digest = _request_hash(payload)
    # one query: the project, its quota limits and the lease this idempotency key already made, if any
    keyed = Lease.objects.filter(tenant=actor.tenant, idempotency_key=idempotency_key).order_by()
    found = list(Project.objects.filter(tenant=actor.tenant, slug=project).order_by().annotate(
        limits=ArraySubquery(Quota.objects.filter(project=OuterRef("pk")).order_by().values(
            json=JSONObject(tier="tier", limit="limit_gpu_milli"))),
        replayed=Subquery(keyed.values("pk")[:1]) if idempotency_key else Value(None, IntegerField()))[:1])
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
    fitting = list(request_quota_check(request=checked,
                                       limits={quota["tier"]: quota["limit"] for quota in target.limits}))
    # the checks other apps registered (billing's monthly spend caps: refuse with a 402, or warn)
    warning = request_admit(RequestAdmission(
        actor=actor, project=target, gpu={**gpu, "model": fitting[0]} if len(fitting) == 1 else dict(gpu),
        workload_class=workload_class, duration_seconds=duration_seconds, now=now))
    # born queued: the events of its first two steps are written with it
    lease = Lease(
        tenant=actor.tenant, project=target, created_by=actor.user if actor.user.is_authenticated else None,
        kind=shape["kind"], count=shape["count"], models_allowed=shape["models"], profile=shape["profile"],
        milli=shape["milli"], memory_mib=shape["memory_mib"], gang=shape["gang"], workload_class=workload_class,
        priority=priority, duration_seconds=duration_seconds, requested_at=now, idempotency_key=idempotency_key,
        request_hash=digest, state=LeaseState.QUEUED, queued_at=now,
        reason="waiting for the scheduler" if choice is None else f"{choice.reason}; waiting for the scheduler",
        group_key=group)
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
                Workload.objects.create(lease=lease, spec=workload_spec)
        enqueue("schedule_cycle")
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


