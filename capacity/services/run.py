"""One turn of the loop: the snapshot, the pure planner, its proposals kept as rows (refreshed, new, expired),
the ``auto`` ones applied, drains finished, interrupted rows failed, effects measured."""

from __future__ import annotations

import logging
from dataclasses import asdict
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.core.cache import cache
from django.db import DatabaseError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from broker.extensions import PoolWait
from broker.models import Gpu, Lease
from capacity.choices import ADVICE_KINDS, AdjustmentKind, AdjustmentState, LoopMode
from capacity.models import Adjustment
from capacity.planner import Adjustment as Proposal
from capacity.planner import AdjustmentKind as PlannerKind
from capacity.planner import Mode, plan_capacity
from capacity.selectors import capacity_snapshot, policies_in_force
from capacity.services.applying import adjustment_apply, applying_sweep
from capacity.services.common import LOOP, AdjustmentConflict, identity_print
from capacity.services.effects import effects_measure
from capacity.services.mode_switch import drains_finish
from capacity.services.right_size import price_for_tenant
from core.task_registry import task

PLAN_LOCK = 0x6770_6370  # "gpcp": one planner run at a time
logger = logging.getLogger(__name__)


def plan_run(*, now: datetime | None = None) -> dict:
    """One turn of the loop. Returns counts: proposed (rows open after the run), new, expired, applied,
    failed, and what the snapshot could not read. ``now`` is read once and is every step's clock."""
    now = now or timezone.now()
    _plan_soon_mark()  # a wait seen from now on asks for the next run only once the debounce has passed
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
                done = adjustment_apply(adjustment=row, actor=LOOP, now=now)
            except AdjustmentConflict:  # another run, or a person, took it meanwhile
                continue
            counts["applied" if done.state in (AdjustmentState.APPLIED, AdjustmentState.APPLYING) else "failed"] += 1
    counts["drained"] = drains_finish(now=now)
    counts["interrupted"] = applying_sweep(now=now)
    counts["measured"] = effects_measure(now=now)
    return counts


# -- the planner on a wait (issue 30) ------------------------------------------------------------------------
# A schedule cycle that leaves requests waiting which an idle GPU of another mode would serve (a whole-GPU lease on
# a pool all in MIG mode; a MIG lease on whole GPUs) tells the loop (``broker.extensions.PoolWait``), and where the
# kind that would serve it (mode switch to whole or shared, MIG layout to MIG) is ``auto`` for that model's pool,
# the planner runs as soon as the cycle commits instead of at its timer (``CAPACITY_PLAN_SECONDS``). At most one
# run per ``CAPACITY_PLAN_ON_WAIT_SECONDS``, counted from the last run of either kind: a key in the shared cache,
# added by the first wait (an atomic add: one of many cycles wins) and set by every run. A wait seen within the
# debounce is not lost: the cycles (beat sends one every 10 s) see it again once it has passed. 0: the timer only.


def _plan_soon_key() -> str:
    """This deployment's key: one per database (under the cache's ``KEY_PREFIX``)."""
    return f"capacity-plan-soon:{connection.settings_dict['NAME']}"


def _plan_soon_mark() -> None:
    seconds = settings.CAPACITY_PLAN_ON_WAIT_SECONDS
    if seconds <= 0:
        return
    try:
        cache.set(_plan_soon_key(), 1, timeout=seconds)
    except (redis.RedisError, DatabaseError) as error:
        logger.warning("capacity plan-soon key not set (%s)", error)


def plan_soon_clear() -> None:
    """Forget the last run's debounce (tests start each from a quiet loop)."""
    cache.delete(_plan_soon_key())


def plan_on_wait(wait: PoolWait) -> bool:
    """A schedule cycle left requests waiting that a GPU switched to ``mode`` would serve (``wait.pools``: (model,
    mode) pairs). Where that pool's kind is ``auto`` (MIG layout for ``mig``, mode switch otherwise), and no run
    happened or was asked for in the last ``CAPACITY_PLAN_ON_WAIT_SECONDS``, the planner's task is sent once the
    cycle commits. Returns whether it was. Inside the cycle's transaction."""
    seconds = settings.CAPACITY_PLAN_ON_WAIT_SECONDS
    if seconds <= 0 or not wait.pools:
        return False
    try:
        if not cache.add(_plan_soon_key(), 1, timeout=seconds):
            return False  # a run is under way or just happened; the cycles see the wait again after it
    except (redis.RedisError, DatabaseError) as error:
        logger.warning("capacity plan-soon key not read (%s): the planner waits for its timer", error)
        return False
    by_scope = {policy.scope: policy for policy in policies_in_force()}
    auto = [(model, mode) for model, mode in wait.pools
            if by_scope.get(f"pool:{model}", by_scope[""]).mode_of(
                PlannerKind.MIG_LAYOUT if mode == "mig" else PlannerKind.MODE_SWITCH) == Mode.AUTO]
    if not auto:
        return False
    logger.info("schedule cycle left requests waiting for %s: the capacity planner runs now",
                ", ".join(f"{mode} {model}" for model, mode in auto))
    transaction.on_commit(lambda: task("capacity", "plan_run").delay())
    return True


def fingerprint(proposal: Proposal) -> str:
    """The key of a proposal's open row (``proposal_identity``): proposed again by later runs while its
    evidence holds, the row stays open and is refreshed instead of expiring and being made anew."""
    return identity_print(proposal.kind.value, proposal.target, asdict(proposal.change), proposal.risk)


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
                  "priced_with": "", "reason": proposal.reason, "mode": proposal.mode.value,
                  "last_seen_at": now}
        row = existing.get(print_)
        if row is not None:
            if row.state == AdjustmentState.PROPOSED:
                # the same decision, its details as this run computed them (slots, sizes): what applying does
                values |= {"change": asdict(proposal.change), "risk": [int(r) for r in proposal.risk]}
                for name, value in values.items():
                    setattr(row, name, value)
                price_for_tenant(row)
                row.save(update_fields=[*values])
            rows.append(row)
            continue
        who = _who(proposal)
        row = Adjustment(kind=proposal.kind.value, target=proposal.target, fingerprint=print_,
                         change=asdict(proposal.change), risk=[int(r) for r in proposal.risk], proposed_at=now,
                         **values, **who)
        price_for_tenant(row)
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


def _tell_advice(row: Adjustment, now: datetime) -> None:
    from notifications.services import notification_emit

    # keyed by the fingerprint: the same advice proposed again after it expired is not told twice
    notification_emit(tenant=row.tenant, kind="advice", key=row.fingerprint[:24], lease=row.lease, now=now,
                      data={"adjustment": {"id": row.pk, "kind": row.kind, "target": row.target,
                                           "reason": row.reason, "saving_minor": row.gain_money_minor,
                                           "currency": row.currency, "priced_with": row.priced_with}})
