"""Lease transitions: the conditional update every change is made of, freeing allocations, and what the holder
or the clock does to a lease (release, renew, expire) or the tenant's status does to all of them (hold, unhold,
release all)."""

from __future__ import annotations

import logging
import math
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models.expressions import RawSQL
from django.utils import timezone

from broker.choices import (
    FINAL_STATES,
    TRANSITIONS,
    AllocationState,
    LeaseState,
)
from broker.extensions import RenewalAdmission, renewal_admit
from broker.models import Lease, LeaseEvent
from broker.services.triggers import enqueue
from broker.validation import duration_check
from core.errors import (
    LeaseStateConflict,
)

logger = logging.getLogger(__name__)


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


def update_each(model, rows: list, fields: list[str], *, returning: bool = False, **only):
    """Write ``fields`` of many rows, each with its own values, in one statement (``UPDATE … FROM
    unnest(<one array per column>)``); ``only`` adds equality conditions (``state=LeaseState.QUEUED``).
    Django's ``bulk_update`` builds a CASE per field per row: for a few dozen rows that cost more CPU
    than the rest of a schedule cycle. Returns the number of rows changed (``returning``: their ids)."""
    if not rows:
        return [] if returning else 0
    columns = {}
    for name in fields:
        field = model._meta.get_field(name)
        columns[name] = [field.get_db_prep_save(getattr(row, field.attname), connection) for row in rows]
    return update_columns(model, [row.pk for row in rows], columns, returning=returning, **only)


def update_columns(model, pks: list, columns: dict[str, list], *, returning: bool = False, **only):
    """``update_each`` for values already in database form (ints, strings, booleans, datetimes, None), one list
    per field in ``pks``' order: no model instance per row (a schedule cycle writes 10,000 at once)."""
    if not pks:
        return [] if returning else 0
    meta = model._meta
    fields = [meta.pk, *(meta.get_field(name) for name in columns)]
    quote = connection.ops.quote_name
    arrays = [[meta.pk.get_db_prep_value(pk, connection) for pk in pks], *columns.values()]
    unnest = ", ".join(f"%s::{field.db_type(connection)}[]" for field in fields)
    names = ", ".join(quote(field.column) for field in fields)
    assignments = ", ".join(f"{quote(field.column)} = v.{quote(field.column)}" for field in fields[1:])
    conditions = "".join(f" AND t.{quote(meta.get_field(name).column)} = %s" for name in only)
    sql = (f"UPDATE {quote(meta.db_table)} AS t SET {assignments} FROM unnest({unnest}) AS v({names}) "  # noqa: S608
           f"WHERE t.{quote(meta.pk.column)} = v.{quote(meta.pk.column)}{conditions}"
           + (f" RETURNING t.{quote(meta.pk.column)}" if returning else ""))
    with connection.cursor() as cursor:
        cursor.execute(sql, [*arrays, *only.values()])
        return [pk for (pk,) in cursor.fetchall()] if returning else cursor.rowcount


def ids_in(ids) -> RawSQL:
    """The right side of ``pk__in`` for many ids: one array parameter (``IN (SELECT unnest(%s))``) instead of a
    placeholder per id, which Django compiles and psycopg parses one by one (10,000 in a schedule cycle)."""
    return RawSQL("SELECT unnest(%s::bigint[])", [list(ids)])


def insert_rows(model, fields: list[str], rows: list[tuple]) -> int:
    """Insert many rows by one ``COPY … FROM STDIN`` (inside the caller's transaction): ``rows`` are tuples of
    ``fields``' values in a form PostgreSQL reads as text (ints, strings, booleans, aware datetimes, None, ranges
    as ``"[0,8)"``, JSON as its text). Every column without a database default must be among ``fields``.
    ``bulk_create`` of 20,000 rows builds a model instance per row and one statement with 300,000
    placeholders, which psycopg then parses: a schedule cycle's write spent most of its CPU there. No signals
    are sent (``bulk_create`` sends none either); a refused row (a constraint) raises Django's
    ``IntegrityError`` like any statement, and nothing of the COPY is kept."""
    if not rows:
        return 0
    meta = model._meta
    quote = connection.ops.quote_name
    columns = ", ".join(quote(meta.get_field(name).column) for name in fields)
    with (connection.cursor() as cursor, connection.wrap_database_errors,
          cursor.cursor.copy(f"COPY {quote(meta.db_table)} ({columns}) FROM STDIN") as copy):
        for row in rows:
            copy.write_row(row)
    return len(rows)


# -- suspension of idle training (the capacity loop): the words that mark it -------------------------------
SUSPENDED = "suspended while idle"
SUSPENDED_REQUEUE_REASON = f"{SUSPENDED}: resumes when capacity frees"


def requeue_reason(lease: Lease, default: str) -> str:
    """The reason a PREEMPTED lease is requeued with: a suspension's own (``lease_suspend`` wrote the PREEMPTED
    reason), else ``default``."""
    return SUSPENDED_REQUEUE_REASON if lease.reason.startswith(SUSPENDED) else default


# -- release / renew / expire ---------------------------------------------------------------------------
def lease_release(*, lease: Lease, actor: str, reason: str = "released by the holder",
                  final: str = LeaseState.RELEASED, now: datetime | None = None) -> Lease:
    """Give a lease back (idempotent): queued → released at once; holding → releasing, then the agent
    instances are destroyed by ``allocation_release_run`` and the lease becomes ``final``."""
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        lease = Lease.objects.select_for_update().get(pk=lease.pk)
        return release_locked(lease=lease, actor=actor, reason=reason, final=final, now=now)


def release_locked(*, lease: Lease, actor: str, reason: str, now: datetime,
                   final: str = LeaseState.RELEASED) -> Lease:
    """``lease_release`` of a lease the caller has locked, inside its transaction."""
    if lease.state in FINAL_STATES or lease.state == LeaseState.RELEASING:
        return lease
    if lease.state in (LeaseState.REQUESTED, LeaseState.QUEUED):
        return lease_transition(lease=lease, to=LeaseState.RELEASED, reason=reason, actor=actor, now=now,
                                finished_at=now, queue_position=None)
    lease_transition(lease=lease, to=LeaseState.RELEASING, reason=reason, actor=actor, now=now)
    lease.allocations.filter(freed_at__isnull=True).update(state=AllocationState.RELEASING)
    enqueue("lease_release_run", lease.pk, final)
    return lease


def lease_group_release(*, tenant_id: int, group_key: str, actor: str, reason: str,
                        now: datetime | None = None) -> list[Lease]:
    """Release every member of a tenant's lease group in one transaction (a pipeline plan, a model split): no
    schedule cycle sees part of the group gone and places the rest as the group (as it would between releases
    made one by one). Idempotent per member, like ``lease_release``."""
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        members = list(Lease.objects.select_for_update().filter(tenant_id=tenant_id, group_key=group_key)
                       .order_by("pk"))
        return [release_locked(lease=lease, actor=actor, reason=reason, now=now) for lease in members]


# -- tenant suspension (called by broker.services.suspension, the broker's listener of tenants' status) ------
HOLD_RELEASED_REASON = "waiting for the scheduler"


def leases_hold(*, tenant_id: int, reason: str, actor: str, now: datetime) -> int:
    """The tenant's waiting leases are held (part of the caller's transaction): they stay QUEUED, out of
    the queue the schedule cycle reads (``broker.selectors.lease_queue``), with ``reason`` and an event."""
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
        enqueue("schedule_cycle")
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
    duration_check(duration_seconds)
    with transaction.atomic(durable=True):
        lease = Lease.objects.select_for_update().select_related("tenant", "project").get(pk=lease.pk)
        if lease.state != LeaseState.ACTIVE:
            raise LeaseStateConflict(f"Only an active lease can be renewed; this one is {lease.state}.",
                                     field="state")
        ends = now + timedelta(seconds=duration_seconds)
        budget_warning = renewal_admit(RenewalAdmission(lease=lease, ends_at=ends, now=now))
        total = round((ends - lease.active_at).total_seconds()) if lease.active_at else duration_seconds
        if lease.active_at:  # whole seconds from the start, so active_at + duration_seconds == ends_at exactly
            ends = lease.active_at + timedelta(seconds=total)
        Lease.objects.filter(pk=lease.pk).update(ends_at=ends, duration_seconds=total)
        reason = f"renewed until {ends.isoformat(timespec='seconds')} ({duration_seconds} s from the renewal)"
        LeaseEvent.objects.create(lease=lease, from_state=lease.state, to_state=lease.state, actor=actor, at=now,
                                  reason=f"{reason}; {budget_warning}" if budget_warning else reason)
        lease.ends_at, lease.duration_seconds = ends, total
    return lease


EXPIRY_RUNS_MAX = 30  # precise expiry runs one periodic run enqueues, at most (the rest wait for the next period)


def lease_expiries_upcoming(*, now: datetime, within_seconds: float) -> list[float]:
    """Seconds from ``now`` to each distinct end time (to 0.1 s) of an active lease ending within
    ``within_seconds``, soonest first, at most ``EXPIRY_RUNS_MAX``: when to run ``lease_expire_due`` so no lease
    waits for the next periodic run. A run a little after its end (+0.05 s) finds the lease due."""
    ends = (Lease.objects.filter(state=LeaseState.ACTIVE, ends_at__gt=now,
                                 ends_at__lte=now + timedelta(seconds=within_seconds))
            .order_by("ends_at").values_list("ends_at", flat=True)[:EXPIRY_RUNS_MAX * 4])
    out: list[float] = []
    for end in ends:
        wait = math.ceil(((end - now).total_seconds() + 0.05) * 10) / 10
        if not out or wait > out[-1]:
            out.append(wait)
    return out[:EXPIRY_RUNS_MAX]


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
