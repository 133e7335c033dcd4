"""The capacity loop in the service: run the planner, keep its proposals as rows, apply them.

``plan_run`` (the periodic Celery task ``capacity.plan_run``): snapshot (``capacity.selectors``) → the pure
planner (``capacity.planner.plan_capacity``) → ``adjustments_record`` (one open row per fingerprint; rows no
longer proposed expire) → every ``auto`` proposal applied → effects measured → tenants told.

Applying goes through the agents and the leasing services with conditional updates, so a race with the
scheduler never double-books:
- a **mode switch** closes the GPU to the scheduler first (``Gpu.mode_target``, set under the schedule
  cycle's advisory lock after checking that no lease holds it), then asks the agent, then records the mode;
  a drain preempts the over-quota holders with their promised notice and switches once they have left;
- a **warm pool** inserts warm allocations (no lease) — the exclusion constraint keeps them apart from
  every lease — then asks the agent to create them; a schedule cycle binds one to a lease with no agent
  call (``broker.services.cycle._bind_warm``);
- **idle reclaim** notices a lease (deadline, agent notice, ``lease.notice`` notification), then releases
  (in quota) or preempts (over quota) it, or withdraws the notice when it is busy again;
- **right-sizing** and **quota advice** are advice: accepting one records it (quota advice accepted by
  staff changes the project's deserved quota through ``tenants.services.quota_set``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.backends.postgresql.psycopg_any import NumericRange
from django.utils import timezone

from broker.choices import AllocationState, GpuKind, LeaseState
from broker.models import Allocation, Gpu, Lease
from capacity.choices import ADVICE_KINDS, AdjustmentKind, AdjustmentState, LoopMode
from capacity.models import Adjustment, CapacityPolicy
from capacity.planner import Adjustment as Proposal
from capacity.planner import plan_capacity
from capacity.selectors import MODE_FIELDS, NUMBER_FIELDS, capacity_snapshot, policies_in_force
from config.errors import ApplicationError, PermissionDenied, ValidationFailed
from gpus.mig import profile_get

logger = logging.getLogger(__name__)
PLAN_LOCK = 0x6770_6370  # "gpcp": one planner run at a time
LOOP = "capacity-loop"


class AdjustmentConflict(ApplicationError):
    status = 409
    code = "adjustment_conflict"
    title = "Adjustment no longer open"


# -- the run ---------------------------------------------------------------------------------------------
def plan_run(*, now: datetime | None = None) -> dict:
    """One turn of the loop. Returns counts: proposed (rows open after the run), new, expired, applied,
    failed, and what the snapshot could not read."""
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [PLAN_LOCK])
            if not cursor.fetchone()[0]:
                return {"skipped": 1}
        snapshot, notes = capacity_snapshot(now=now)
        proposals = plan_capacity(snapshot, now=now.timestamp())
        # without series the planner cannot judge idleness or size: what it proposed from them stays open
        blind = () if notes.prometheus == "ok" else (AdjustmentKind.IDLE_RECLAIM, AdjustmentKind.RIGHT_SIZE)
        rows, counts = adjustments_record(proposals, now=now, currency=snapshot.currency, keep=blind)
    counts |= {"applied": 0, "failed": 0, "prometheus": notes.prometheus}
    for row in rows:
        if row.mode == LoopMode.AUTO and row.state == AdjustmentState.PROPOSED and row.kind not in ADVICE_KINDS:
            try:
                done = adjustment_apply(adjustment=row, actor=LOOP)
            except AdjustmentConflict:  # another run, or a person, took it meanwhile
                continue
            counts["applied" if done.state in (AdjustmentState.APPLIED, AdjustmentState.APPLYING) else "failed"] += 1
    counts["drained"] = drains_finish(now=timezone.now())
    counts["interrupted"] = applying_sweep(now=timezone.now())
    counts["measured"] = effects_measure(now=timezone.now())
    return counts


def fingerprint(proposal: Proposal) -> str:
    body = {"kind": proposal.kind.value, "target": proposal.target, "change": asdict(proposal.change)}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def _who(proposal: Proposal) -> dict:
    """Whom an adjustment concerns: its lease, project, GPU, tenant, and every tenant whose lease it touches."""
    from tenants.models import Project

    found: dict = {"lease": None, "project": None, "gpu": None, "tenant": None}
    kind, _, rest = proposal.target.partition(":")
    if kind == "lease":
        found["lease"] = Lease.objects.select_related("project").filter(pk=int(rest)).first()
        if found["lease"]:
            found["project"], found["tenant"] = found["lease"].project, found["lease"].tenant
    elif kind == "project":
        found["project"] = Project.objects.select_related("tenant").filter(pk=int(rest.split("/")[0])).first()
        if found["project"]:
            found["tenant"] = found["project"].tenant
    elif kind == "gpu":
        found["gpu"] = Gpu.objects.filter(pk=int(rest.lstrip("g"))).first()
    touched = set(Lease.objects.filter(pk__in=[int(r) for r in proposal.risk]).values_list("tenant_id", flat=True))
    if found["tenant"]:
        touched.add(found["tenant"].pk)
    found["tenant_ids"] = sorted(touched)
    return found


def adjustments_record(proposals: list[Proposal], *, now: datetime, currency: str,
                       keep: tuple[str, ...] = ()) -> tuple[list[Adjustment], dict]:
    """Each proposal as a row: the open row with its fingerprint is refreshed (evidence, gain, last seen), or a
    new one is made (tenants told of new advice, once per fingerprint); open proposals the planner no longer
    makes expire (except those of the ``keep`` kinds, which this run could not judge), and so do those older
    than ``CAPACITY_PROPOSAL_TTL_SECONDS``. Inside the caller's transaction."""
    from django.db.models import Q

    by_print = {fingerprint(p): p for p in proposals}
    existing = {row.fingerprint: row for row in Adjustment.objects.select_for_update().filter(
        fingerprint__in=by_print, state__in=(AdjustmentState.PROPOSED, AdjustmentState.APPLYING))}
    # a person's "no" (or accepted advice) stands for the proposal's lifetime: not proposed again every minute
    decided = set(Adjustment.objects.filter(
        fingerprint__in=by_print, finished_at__gte=now - timedelta(seconds=settings.CAPACITY_PROPOSAL_TTL_SECONDS))
        .filter(Q(state=AdjustmentState.REJECTED) | Q(state=AdjustmentState.APPLIED, kind__in=ADVICE_KINDS))
        .values_list("fingerprint", flat=True))
    rows, new = [], 0
    for print_, proposal in by_print.items():
        if print_ in decided and print_ not in existing:
            continue
        gain = proposal.expected_gain
        values = {"evidence": {"start": proposal.evidence.start, "end": proposal.evidence.end,
                               "figures": dict(proposal.evidence.figures)},
                  "gain_gpu_seconds": gain.gpu_seconds, "gain_money_minor": gain.money_minor,
                  "gain_time_to_gpu_seconds": gain.time_to_gpu_seconds, "currency": currency,
                  "reason": proposal.reason, "mode": proposal.mode.value, "last_seen_at": now}
        row = existing.get(print_)
        if row is not None:
            if row.state == AdjustmentState.PROPOSED:
                for name, value in values.items():
                    setattr(row, name, value)
                _price_for_tenant(row)
                row.save(update_fields=[*values, "gain_money_minor", "currency"])
            rows.append(row)
            continue
        who = _who(proposal)
        row = Adjustment(kind=proposal.kind.value, target=proposal.target, fingerprint=print_,
                         change=asdict(proposal.change), risk=[int(r) for r in proposal.risk], proposed_at=now,
                         **values, **who)
        _price_for_tenant(row)
        row.save()
        new += 1
        rows.append(row)
        if row.kind in ADVICE_KINDS and row.tenant is not None:
            _tell_advice(row, now)
    stale = Adjustment.objects.filter(state=AdjustmentState.PROPOSED).exclude(fingerprint__in=by_print).exclude(
        kind__in=keep)
    expired = stale.update(state=AdjustmentState.EXPIRED, finished_at=now,
                           outcome="no longer proposed: the queue, the fleet or the usage changed")
    expired += Adjustment.objects.filter(state=AdjustmentState.PROPOSED, proposed_at__lt=now - timedelta(
        seconds=settings.CAPACITY_PROPOSAL_TTL_SECONDS)).update(
        state=AdjustmentState.EXPIRED, finished_at=now, outcome="nobody decided within the proposal's lifetime")
    return rows, {"proposed": len(rows), "new": new, "expired": expired}


def _price_for_tenant(row: Adjustment) -> None:
    """Right-sizing priced from the lease's tenant's own price book (the planner priced it from the general
    one): (current unit price − suggested unit price) × hours of evidence × units, in the tenant's currency."""
    if row.kind != AdjustmentKind.RIGHT_SIZE or row.lease is None:
        return
    from billing.core.pricing import to_minor
    from billing.selectors import price_books_for

    lease = row.lease
    end = datetime.fromtimestamp(row.evidence["end"], tz=timezone.get_current_timezone())
    start = datetime.fromtimestamp(row.evidence["start"], tz=timezone.get_current_timezone())
    books = price_books_for(tenant=lease.tenant, start=end - timedelta(microseconds=1), end=end)
    if not books:
        return
    table = books[-1][2]
    held = lease.allocations.order_by("pk").first()
    if held is None:
        return
    current = table.unit_price(held.tier, held.kind, held.mig_profile, over_quota=held.preemptible,
                               workload_class=lease.workload_class)
    model = row.change.get("model") or held.tier
    profile = row.change.get("profile", "")
    suggested = table.unit_price(model, GpuKind.MIG if profile else GpuKind.WHOLE, profile,
                                 over_quota=held.preemptible, workload_class=lease.workload_class)
    if current is None or suggested is None:
        return
    hours = Decimal(int((end - start).total_seconds())) / 3600
    saving = (current[0] - suggested[0]) * hours * lease.count
    from billing.core.pricing import format_money

    row.currency = lease.tenant.currency
    row.gain_money_minor = to_minor(saving, row.currency)
    row.reason = (row.reason.split(" and saved ")[0] + f" and saved {format_money(row.gain_money_minor, row.currency)}"
                  f" at the prices of {books[-1][1].name}")
    row.evidence = {**row.evidence, "priced_with": books[-1][1].name, "current_per_hour": str(current[0]),
                    "suggested_per_hour": str(suggested[0])}


def _tell_advice(row: Adjustment, now: datetime) -> None:
    from notifications.services import notification_emit

    # keyed by the fingerprint: the same advice proposed again after it expired is not told twice
    notification_emit(tenant=row.tenant, kind="advice", key=row.fingerprint[:24], lease=row.lease, now=now,
                      data={"adjustment": {"id": row.pk, "kind": row.kind, "target": row.target,
                                           "reason": row.reason, "saving_minor": row.gain_money_minor,
                                           "currency": row.currency}})


# -- deciding --------------------------------------------------------------------------------------------
def _may_decide(adjustment: Adjustment, *, user, actor) -> None:
    """Staff decide everything; a tenant's admins decide their own lease and project advice (idle reclaim,
    right-sizing); pool changes and quota advice are the platform's."""
    if user is not None and user.is_staff:
        return
    own = actor is not None and adjustment.tenant_id == actor.tenant.pk
    if not own or adjustment.kind not in (AdjustmentKind.IDLE_RECLAIM, AdjustmentKind.RIGHT_SIZE):
        raise PermissionDenied("Only platform staff decide this adjustment.", field="id")
    actor.require("release" if adjustment.kind == AdjustmentKind.IDLE_RECLAIM else "manage")


def adjustment_accept(*, adjustment: Adjustment, user, actor=None) -> Adjustment:
    """Accept a proposal: advice is recorded as accepted (quota advice accepted by staff sets the quota);
    a change is applied now."""
    _may_decide(adjustment, user=user, actor=actor)
    label = f"user:{user.get_username()}"
    if adjustment.kind in ADVICE_KINDS:
        return _accept_advice(adjustment, user=user, label=label)
    return adjustment_apply(adjustment=adjustment, actor=label, by_user=user)


def adjustment_reject(*, adjustment: Adjustment, user, actor=None, reason: str = "") -> Adjustment:
    _may_decide(adjustment, user=user, actor=actor)
    if len(reason) > 2000:
        raise ValidationFailed("reason is at most 2000 characters.", field="reason")
    now = timezone.now()
    with transaction.atomic():
        done = Adjustment.objects.filter(pk=adjustment.pk, state=AdjustmentState.PROPOSED).update(
            state=AdjustmentState.REJECTED, decided_at=now, decided_by=user, finished_at=now,
            outcome=f"rejected by {user.get_username()}" + (f": {reason}" if reason else ""))
        if not done:
            raise AdjustmentConflict(f"Adjustment {adjustment.pk} is {_state(adjustment)}; only a proposed one "
                                     "can be rejected.", field="state")
        _audit(adjustment, "adjustment.reject", user, {"reason": reason})
    adjustment.refresh_from_db()
    return adjustment


def _state(adjustment: Adjustment) -> str:
    return Adjustment.objects.values_list("state", flat=True).get(pk=adjustment.pk)


def _audit(adjustment: Adjustment, action: str, user, data: dict) -> None:
    from tenants.models import AuditEvent

    AuditEvent.objects.create(tenant=adjustment.tenant, actor=user if user is not None and user.is_authenticated
                              else None, action=action, target=f"adjustment:{adjustment.pk}",
                              data={"kind": adjustment.kind, "adjustment_target": adjustment.target, **data})


def _accept_advice(adjustment: Adjustment, *, user, label: str) -> Adjustment:
    """Taken once (proposed → applying); staff accepting quota advice then set the quota through
    ``quota_set`` (its own transaction, which checks the tenant's bound): refused, the row is ``failed`` with
    the reason and the refusal reaches the caller."""
    now = timezone.now()
    if not Adjustment.objects.filter(pk=adjustment.pk, state=AdjustmentState.PROPOSED).update(
            state=AdjustmentState.APPLYING, decided_at=now, decided_by=user, applied_by=label):
        raise AdjustmentConflict(f"Adjustment {adjustment.pk} is {_state(adjustment)}; only a proposed one "
                                 "can be accepted.", field="state")
    outcome = "accepted (advice: nothing changes by itself)"
    if adjustment.kind == AdjustmentKind.QUOTA_ADVICE and user.is_staff and adjustment.project is not None:
        from tenants.models import Quota
        from tenants.services import quota_set

        tier = adjustment.change.get("model", "")
        quota = Quota.objects.filter(project=adjustment.project, tier=tier).first()
        limit = max(quota.limit_gpu_milli if quota else 0, adjustment.change["size_after"])
        try:
            quota_set(project=adjustment.project, tier=tier, deserved_gpu_milli=adjustment.change["size_after"],
                      limit_gpu_milli=limit, over_quota_weight=quota.over_quota_weight if quota else 1, by_user=user)
        except ApplicationError as error:
            with transaction.atomic():
                _finish(adjustment, AdjustmentState.FAILED, f"the quota was not changed: {error}")
                _audit(adjustment, "adjustment.accept", user, {"outcome": adjustment.outcome})
            raise
        outcome = f"accepted: deserved quota on {tier} set to {adjustment.change['size_after']} milli"
    with transaction.atomic():
        _finish(adjustment, AdjustmentState.APPLIED, outcome)
        _audit(adjustment, "adjustment.accept", user, {"outcome": outcome})
    adjustment.refresh_from_db()
    return adjustment


# -- applying ----------------------------------------------------------------------------------------------
def adjustment_apply(*, adjustment: Adjustment, actor: str, by_user=None) -> Adjustment:
    """Apply a proposed change (the loop in auto mode, or a person accepting it). Conditional: only a
    PROPOSED row is taken (proposed → applying), and each kind re-checks the world under locks."""
    now = timezone.now()
    if not Adjustment.objects.filter(pk=adjustment.pk, state=AdjustmentState.PROPOSED).update(
            state=AdjustmentState.APPLYING, applied_by=actor, decided_at=now,
            decided_by=by_user if by_user is not None and by_user.is_authenticated else None):
        raise AdjustmentConflict(f"Adjustment {adjustment.pk} is {_state(adjustment)}; only a proposed one can be "
                                 "applied.", field="state")
    adjustment.refresh_from_db()
    try:
        if adjustment.kind in (AdjustmentKind.MODE_SWITCH, AdjustmentKind.MIG_LAYOUT):
            _apply_mode(adjustment, now)
        elif adjustment.kind == AdjustmentKind.WARM_POOL:
            _apply_warm(adjustment, now)
        elif adjustment.kind == AdjustmentKind.IDLE_RECLAIM:
            _apply_reclaim(adjustment, now)
        else:
            _finish(adjustment, AdjustmentState.APPLIED, "advice recorded")
    except Exception as error:
        logger.exception("adjustment %s failed", adjustment.pk)
        _finish(adjustment, AdjustmentState.FAILED, f"{type(error).__name__}: {error}")
    adjustment.refresh_from_db()
    with transaction.atomic():
        _audit(adjustment, "adjustment.apply", by_user, {"actor": actor, "state": adjustment.state,
                                                          "outcome": adjustment.outcome})
    return adjustment


def _finish(adjustment: Adjustment, state: str, outcome: str, effect: dict | None = None) -> None:
    now = timezone.now()
    fields = {"state": state, "finished_at": now, "outcome": outcome}
    if effect is not None:
        fields |= {"effect": effect, "effect_at": now}
    Adjustment.objects.filter(pk=adjustment.pk).update(**fields)
    adjustment.state, adjustment.outcome = state, outcome


def _cycle_lock() -> None:
    """Wait for the schedule cycle's advisory lock (held to the end of the caller's transaction): no cycle
    places while the loop changes a GPU. A cycle that found the lock taken meanwhile skipped (leaving its
    trigger flag set, which would hold back every trigger until it expires): after the commit the flag is
    cleared and a cycle asked for, so what queued meanwhile is placed at once."""
    from broker.services import ADVISORY_LOCK, cycle_flag_clear, schedule_cycle_request

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ADVISORY_LOCK])

    def again() -> None:
        cycle_flag_clear()
        schedule_cycle_request()

    transaction.on_commit(again)


def _gpu_of(adjustment: Adjustment) -> int:
    return int(str(adjustment.change["gpu"]).lstrip("g"))


# mode switch / MIG layout
def _apply_mode(adjustment: Adjustment, now: datetime) -> None:
    from broker.services import lease_preempt

    change = adjustment.change
    with transaction.atomic(durable=True):
        _cycle_lock()
        gpu = Gpu.objects.select_for_update().select_related("node").get(pk=_gpu_of(adjustment))
        if gpu.mode != change["from_mode"] or gpu.mode_target or gpu.lost_at or gpu.node.status != "ready":
            return _finish(adjustment, AdjustmentState.EXPIRED, f"the GPU changed since the proposal (now {gpu.mode}"
                           f"{', changing' if gpu.mode_target else ''}, node {gpu.node.status})")
        live = list(Allocation.objects.filter(gpu=gpu, freed_at__isnull=True).select_related("lease"))
        held = [a for a in live if a.lease_id is not None]
        if held:
            others = {a.lease_id for a in held} - set(adjustment.risk)
            if not change.get("drain") or others or any(not a.preemptible for a in held):
                return _finish(adjustment, AdjustmentState.EXPIRED,
                               "a lease the proposal did not count now holds the GPU; left alone")
            for lease_id in sorted({a.lease_id for a in held}):
                lease = Lease.objects.select_for_update().get(pk=lease_id)
                if lease.state == LeaseState.ACTIVE:
                    lease_preempt(lease=lease, actor=LOOP, now=now,
                                  why=f"to switch GPU {gpu} to {change['to_mode']} mode for queued in-quota work "
                                      f"(adjustment {adjustment.pk})")
        warm = [a.pk for a in live if a.lease_id is None]
        Allocation.objects.filter(pk__in=warm, lease__isnull=True).update(state=AllocationState.RELEASING)
        gpu.mode_target = change["to_mode"]
        gpu.save(update_fields=["mode_target"])
    if warm:
        _destroy_warm(warm)
    if held:
        Adjustment.objects.filter(pk=adjustment.pk).update(
            outcome=f"draining lease(s) {', '.join(str(a) for a in sorted({a.lease_id for a in held}))}; the switch "
                    "follows once they have left")
        return None
    return _switch_now(adjustment)


def _switch_now(adjustment: Adjustment) -> None:
    from agent.client import AgentHTTPError, AgentUnreachable
    from broker.services import agent_client, schedule_cycle_request

    gpu = Gpu.objects.select_related("node").get(pk=_gpu_of(adjustment))
    target = adjustment.change["to_mode"]
    try:
        agent_client(gpu.node).set_gpu_mode(gpu.uuid, target)
    except (AgentHTTPError, AgentUnreachable) as error:
        Gpu.objects.filter(pk=gpu.pk, mode_target=target).update(mode_target="")
        return _finish(adjustment, AdjustmentState.FAILED, f"the agent did not switch {gpu}: {error}")
    now = timezone.now()
    with transaction.atomic():
        Gpu.objects.filter(pk=gpu.pk).update(mode=target, mode_target="", mode_since=now)
        _finish(adjustment, AdjustmentState.APPLIED, f"{gpu.node.node_id}/{gpu.index} switched from "
                f"{adjustment.change['from_mode']} to {target} mode")
    schedule_cycle_request()
    return None


def drains_finish(*, now: datetime) -> int:
    """Switches waiting for a drain: once no lease holds the GPU any more, switch it; a drain that outlived
    its leases' notices by far (a stuck release) gives the GPU back to the scheduler and fails."""
    count = 0
    for adjustment in Adjustment.objects.filter(state=AdjustmentState.APPLYING, kind__in=(
            AdjustmentKind.MODE_SWITCH, AdjustmentKind.MIG_LAYOUT)).order_by("pk"):
        gpu_pk = _gpu_of(adjustment)
        if Allocation.objects.filter(gpu_id=gpu_pk, freed_at__isnull=True).exists():
            if adjustment.decided_at and now - adjustment.decided_at > timedelta(hours=6):
                Gpu.objects.filter(pk=gpu_pk).update(mode_target="")
                _finish(adjustment, AdjustmentState.FAILED, "the drained leases did not leave within 6 hours")
            continue
        if not Gpu.objects.filter(pk=gpu_pk, mode_target=adjustment.change["to_mode"]).exists():
            continue
        _switch_now(adjustment)
        count += 1
    return count


def applying_sweep(*, now: datetime) -> int:
    """Rows left ``applying`` by a process that died mid-way (not drains, which wait on purpose) fail after
    10 minutes with that said; what was done is in the audit log and the lease events."""
    stuck = Adjustment.objects.filter(state=AdjustmentState.APPLYING, decided_at__lt=now - timedelta(minutes=10))
    return stuck.exclude(kind__in=(AdjustmentKind.MODE_SWITCH, AdjustmentKind.MIG_LAYOUT)).update(
        state=AdjustmentState.FAILED, finished_at=now, outcome="interrupted while being applied (the process "
                                                               "stopped); see the audit log and lease events")


# warm pools
def _apply_warm(adjustment: Adjustment, now: datetime) -> None:
    change = adjustment.change
    removed = _remove_warm([int(i) for i in change.get("remove", ())])
    created, skipped = _create_warm(change.get("slots", ()), now)
    outcome = f"pool {change['model']} {change['profile']}: {created} created, {removed} removed"
    if skipped:
        outcome += f"; {len(skipped)} slot(s) skipped ({'; '.join(skipped)})"
    state = AdjustmentState.APPLIED if created or removed or not change.get("slots") else AdjustmentState.FAILED
    _finish(adjustment, state, outcome)


def _remove_warm(ids: list[int]) -> int:
    with transaction.atomic():
        taken = list(Allocation.objects.select_for_update().filter(
            pk__in=ids, lease__isnull=True, freed_at__isnull=True).values_list("pk", flat=True))
        Allocation.objects.filter(pk__in=taken).update(state=AllocationState.RELEASING)
    _destroy_warm(taken)
    return len(taken)


def _destroy_warm(ids: list[int]) -> None:
    """Destroy warm members on their agents, then free the rows (one not destroyed now is freed anyway: the
    reconcile destroys it as an orphan when its node answers)."""
    from agent.client import AgentHTTPError, AgentUnreachable
    from broker.services import agent_client

    for allocation in Allocation.objects.filter(pk__in=ids).select_related("gpu__node"):
        try:
            agent_client(allocation.gpu.node).destroy(allocation.instance_id)
        except (AgentHTTPError, AgentUnreachable) as error:
            logger.warning("warm instance %s not destroyed now (%s); the reconcile will", allocation.instance_id, error)
    Allocation.objects.filter(pk__in=ids, lease__isnull=True, freed_at__isnull=True).update(
        state=AllocationState.FREED, freed_at=timezone.now())


def _create_warm(slots, now: datetime) -> tuple[int, list[str]]:
    """Warm allocations for the slots (each on a MIG GPU no lease holds, its slots free: the exclusion
    constraint decides), then one agent call per node; what the agent made becomes WARM."""
    from agent.client import AgentHTTPError, AgentUnreachable
    from broker.services import agent_client, allocation_spec

    skipped: list[str] = []
    made: list[Allocation] = []
    with transaction.atomic(durable=True):
        _cycle_lock()
        for slot in slots:
            gpu = (Gpu.objects.select_for_update().select_related("node")
                   .filter(pk=int(str(slot["gpu"]).lstrip("g"))).first())
            if gpu is None or gpu.mode != "mig" or gpu.mode_target or gpu.lost_at or gpu.node.status != "ready":
                skipped.append(f"{slot['gpu']}: not an available MIG GPU")
                continue
            if Allocation.objects.filter(gpu=gpu, freed_at__isnull=True, lease__isnull=False).exists():
                skipped.append(f"{gpu}: a lease holds it now")
                continue
            profile = profile_get(gpu.model, slot["profile"])
            try:
                with transaction.atomic():
                    made.append(Allocation.objects.create(
                        lease=None, gpu=gpu, tier=gpu.model, kind=GpuKind.MIG, mig_profile=profile.name,
                        mig_start=slot["start"],
                        slots=NumericRange(slot["start"], slot["start"] + profile.memory_slots),
                        milli=profile.gpu_milli, memory_mib=profile.memory_mib, state=AllocationState.PENDING,
                        created_at=now))
            except IntegrityError:
                skipped.append(f"{gpu} slot {slot['start']}: taken")
    by_node: dict[int, list[Allocation]] = {}
    for allocation in made:
        by_node.setdefault(allocation.gpu.node_id, []).append(allocation)
    created = 0
    for allocations in by_node.values():
        node = allocations[0].gpu.node
        try:
            answers = agent_client(node).create_many({a.instance_id: allocation_spec(a) for a in allocations})
        except (AgentUnreachable, AgentHTTPError) as error:
            answers = {a.instance_id: {"status": 503, "problem": {"detail": str(error)}} for a in allocations}
        for allocation in allocations:
            answer = answers.get(allocation.instance_id) or {"status": 502, "problem": {"detail": "no answer"}}
            if answer["status"] < 300:
                instance = answer["instance"]
                created += Allocation.objects.filter(pk=allocation.pk, state=AllocationState.PENDING,
                                                     lease__isnull=True).update(
                    state=AllocationState.WARM, warm_at=timezone.now(), ready_at=timezone.now(),
                    device_uuid=instance.get("device_uuid", ""), gpu_instance_id=instance.get("gpu_instance_id"),
                    access=instance.get("access", {}))
            else:
                skipped.append(f"{allocation.instance_id}: {answer['problem'].get('detail')}")
                _destroy_warm([allocation.pk])
    if created:
        from broker.services import schedule_cycle_request

        schedule_cycle_request()  # queued requests of the profile may bind them now
    return created, skipped


# idle reclaim
def _apply_reclaim(adjustment: Adjustment, now: datetime) -> None:
    from broker.services import enqueue, lease_preempt, lease_release
    from notifications.services import notification_emit

    step = adjustment.step
    lease_id = int(adjustment.change["lease"])
    figures = adjustment.evidence.get("figures", {})
    with transaction.atomic(durable=True):
        lease = Lease.objects.select_for_update().select_related("tenant").get(pk=lease_id)
        if lease.state != LeaseState.ACTIVE:
            return _finish(adjustment, AdjustmentState.EXPIRED, f"the lease is {lease.state} now")
        if step == "notice":
            if lease.notice_deadline is not None:
                return _finish(adjustment, AdjustmentState.EXPIRED, "the lease already has a notice")
            seconds = _notice_seconds(adjustment, lease)
            deadline = now + timedelta(seconds=seconds)
            step_word = "preempted (back to the queue)" if lease.over_quota else "released"
            reason = (f"idle: engine activity {figures.get('mean engine active (permille)', '?')}‰ on average over "
                      f"{figures.get('window seconds', '?')} s; it will be {step_word} at "
                      f"{deadline.isoformat(timespec='seconds')} unless it gets busy")
            Lease.objects.filter(pk=lease.pk).update(notice_deadline=deadline, reason=reason)
            notification_emit(tenant=lease.tenant, kind="lease.notice", lease=lease, key=f"idle{adjustment.pk}",
                              now=now, data={"reason": reason, "deadline": deadline.isoformat(),
                                             "adjustment": adjustment.pk})
            enqueue("lease_notice_run", lease.pk)
            return _finish(adjustment, AdjustmentState.APPLIED, f"notice given until {deadline.isoformat()}")
        if step == "cancel":
            Lease.objects.filter(pk=lease.pk).update(notice_deadline=None, reason="busy again: idle notice withdrawn")
            return _finish(adjustment, AdjustmentState.APPLIED, "notice withdrawn: the lease is busy again")
        if lease.notice_deadline is None:  # withdrawn (busy again) since the proposal: the lease stays
            return _finish(adjustment, AdjustmentState.EXPIRED, "the lease has no idle notice any more")
        remaining = max(0, int(((lease.ends_at or now) - now).total_seconds()))
        milli = sum(lease.allocations.filter(freed_at__isnull=True).values_list("milli", flat=True))
        effect = {"gpu_seconds_freed": milli * remaining // 1000, "milli": milli}
        why = (f"idle (engine activity {figures.get('mean engine active (permille)', '?')}‰ over "
               f"{figures.get('window seconds', '?')} s, notice given) — adjustment {adjustment.pk}")
        if step == "preempt":
            lease_preempt(lease=lease, actor=LOOP, now=now, why=f"as {why}", notice_seconds=0)
            transaction.on_commit(_expire_soon)
            return _finish(adjustment, AdjustmentState.APPLIED, "preempted: back to the queue", effect)
    lease_release(lease=lease, actor=LOOP, reason=f"released: {why}")
    return _finish(adjustment, AdjustmentState.APPLIED, "released", effect)


def _expire_soon() -> None:
    from broker import tasks

    tasks.lease_expire_due.apply_async(countdown=0.5)


def _notice_seconds(adjustment: Adjustment, lease: Lease) -> int:
    from capacity.planner import ReclaimClass

    policies = {p.scope: p for p in policies_in_force()}
    policy = policies.get(f"project:{lease.project_id}", policies[""])
    klass = ReclaimClass.OVER_QUOTA if lease.over_quota else ReclaimClass(lease.workload_class)
    return policy.idle_rule(klass).notice_seconds


# -- effects -----------------------------------------------------------------------------------------------
def effects_measure(*, now: datetime) -> int:
    """Applied mode switches and warm pools get their measured effect ``CAPACITY_EFFECT_AFTER_SECONDS`` after:
    the leases the switched GPU served since; the warm members bound and the time they were held idle."""
    due = Adjustment.objects.filter(state=AdjustmentState.APPLIED, effect__isnull=True, kind__in=(
        AdjustmentKind.MODE_SWITCH, AdjustmentKind.MIG_LAYOUT, AdjustmentKind.WARM_POOL),
        finished_at__lte=now - timedelta(seconds=settings.CAPACITY_EFFECT_AFTER_SECONDS))
    count = 0
    for adjustment in due.order_by("pk")[:200]:
        since = adjustment.finished_at
        if adjustment.kind == AdjustmentKind.WARM_POOL:
            gpus = [int(str(s["gpu"]).lstrip("g")) for s in adjustment.change.get("slots", ())]
            members = Allocation.objects.filter(gpu_id__in=gpus, warm_at__gte=since - timedelta(seconds=1),
                                                mig_profile=adjustment.change.get("profile", ""))
            effect = {"members": members.count(), "bound": members.filter(bound_at__isnull=False).count(),
                      "window_seconds": int((now - since).total_seconds())}
        else:
            served = Allocation.objects.filter(gpu_id=_gpu_of(adjustment), lease__isnull=False,
                                               created_at__gte=since)
            effect = {"leases_served": served.values("lease_id").distinct().count(),
                      "window_seconds": int((now - since).total_seconds())}
        Adjustment.objects.filter(pk=adjustment.pk).update(effect=effect, effect_at=now)
        count += 1
    return count


# -- policies ----------------------------------------------------------------------------------------------
IDLE_CLASSES = ("interactive", "inference", "training", "over-quota")
RULE_KEYS = {"enabled": bool, "threshold_permille": int, "window_seconds": int, "notice_seconds": int}


def _clean_scope(scope: object) -> str:
    from gpus.catalogue import UnknownModel, model_get
    from tenants.models import Project

    if not isinstance(scope, str):
        raise ValidationFailed("scope must be a string: \"\", \"pool:<model>\" or \"project:<id>\".", field="scope")
    if scope == "":
        return scope
    kind, _, rest = scope.partition(":")
    if kind == "pool":
        try:
            model_get(rest)
        except UnknownModel as error:
            raise ValidationFailed(f"scope: {error}", field="scope") from error
        return scope
    if (kind == "project" and rest.isascii() and rest.isdigit() and len(rest) < 19
            and Project.objects.filter(pk=int(rest)).exists()):
        return scope
    raise ValidationFailed("scope must be \"\" (the default), \"pool:<GPU model>\" or \"project:<id of a project>\".",
                           field="scope")


def _clean_rules(raw: object) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValidationFailed("idle_rules must be an object keyed by class.", field="idle_rules")
    out = {}
    for name, rule in raw.items():
        if name not in IDLE_CLASSES:
            raise ValidationFailed(f"idle_rules: unknown class {name!r}; one of {', '.join(IDLE_CLASSES)}.",
                                   field=f"idle_rules.{name}")
        if not isinstance(rule, dict):
            raise ValidationFailed("each idle rule is an object.", field=f"idle_rules.{name}")
        clean = {}
        for key, value in rule.items():
            kind = RULE_KEYS.get(key)
            if kind is None:
                raise ValidationFailed(f"unknown key {key!r}; one of {', '.join(RULE_KEYS)}.",
                                       field=f"idle_rules.{name}.{key}")
            if (kind is bool and not isinstance(value, bool)) or (kind is int and (
                    isinstance(value, bool) or not isinstance(value, int))):
                raise ValidationFailed(f"{key} must be {'true or false' if kind is bool else 'an integer'}.",
                                       field=f"idle_rules.{name}.{key}")
            if kind is int and not (0 <= value <= (1000 if key == "threshold_permille" else 30 * 86_400)):
                raise ValidationFailed(f"{key} is out of range.", field=f"idle_rules.{name}.{key}")
            if key == "window_seconds" and value < 1:
                raise ValidationFailed("window_seconds must be at least 1.", field=f"idle_rules.{name}.{key}")
            clean[key] = value
        out[name] = clean
    return out


def policy_set(*, scope: object, values: dict, by_user=None) -> CapacityPolicy:
    """Create or change the policy of a scope; fields not given keep their value (null: inherit). Audited."""
    from tenants.models import AuditEvent

    scope = _clean_scope(scope)
    clean: dict = {}
    for name, value in values.items():
        if name in MODE_FIELDS:
            if value not in ("", None, *LoopMode.values):
                raise ValidationFailed(f"{name} must be one of off, advise, auto (or empty: inherit).", field=name)
            clean[name] = value or ""
        elif name in NUMBER_FIELDS:
            bad = isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 86_400 * 30
            if value is not None and bad:
                raise ValidationFailed(f"{name} must be an integer between 0 and 2592000 (or null: inherit).",
                                       field=name)
            clean[name] = value
        elif name == "idle_rules":
            clean[name] = _clean_rules(value)
        else:
            raise ValidationFailed(f"unknown field {name!r}.", field=name)
    with transaction.atomic():
        policy, _ = CapacityPolicy.objects.select_for_update().get_or_create(scope=scope)
        for name, value in clean.items():
            setattr(policy, name, value)
        policy.save()
        AuditEvent.objects.create(tenant=None, actor=by_user if by_user is not None and by_user.is_authenticated
                                  else None, action="capacity_policy.set",
                                  target=f"capacity_policy:{scope or 'default'}", data=dict(clean))
    return policy


def policy_delete(*, policy: CapacityPolicy, by_user=None) -> None:
    from tenants.models import AuditEvent

    if policy.scope == "":
        raise ValidationFailed("The default policy cannot be deleted; set its fields to empty to inherit the "
                               "built-in defaults.", field="scope")
    with transaction.atomic():
        AuditEvent.objects.create(tenant=None, actor=by_user if by_user is not None and by_user.is_authenticated
                                  else None, action="capacity_policy.delete", target=f"capacity_policy:{policy.scope}",
                                  data={})
        policy.delete()
