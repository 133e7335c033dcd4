"""Idle reclaim in three steps, each its own proposal: a notice (deadline, agent notice, ``lease.notice``
notification), then at the deadline a release (in quota), a preemption (over quota) or a suspension (in-quota
training whose workload can resume: ``broker.services.lease_suspend``), or the notice withdrawn when the lease is
busy again. Every step re-reads the lease under its row lock.

A suspension's notice is the tenant's only (the deadline on the lease, the ``lease.notice`` notification): the
agent is not told then, because an agent notice SIGTERMs the workload at once and a training run would stop
half an hour early, or for nothing when it gets busy again. The SIGTERM comes with the suspension itself, with
the tenant's promised preemption notice to checkpoint."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction

from broker.choices import LeaseState
from broker.models import Lease
from capacity.choices import AdjustmentState
from capacity.models import Adjustment
from capacity.selectors import project_policy
from capacity.services.common import LOOP, _finish


def reclaim_apply(adjustment: Adjustment, now: datetime) -> None:
    from broker.services import enqueue, lease_preempt, lease_release, lease_suspend
    from notifications.services import notification_emit

    step = adjustment.step
    lease_id = int(adjustment.change["lease"])
    figures = adjustment.evidence.get("figures", {})
    with transaction.atomic(durable=True):
        lease = Lease.objects.select_for_update().select_related("tenant").get(pk=lease_id)
        if lease.state != LeaseState.ACTIVE:
            return _finish(adjustment, AdjustmentState.EXPIRED, f"the lease is {lease.state} now", now=now)
        resumable = _resumable(lease)
        if step == "notice":
            if lease.notice_deadline is not None:
                return _finish(adjustment, AdjustmentState.EXPIRED, "the lease already has a notice", now=now)
            seconds = _notice_seconds(lease, resumable)
            deadline = now + timedelta(seconds=seconds)
            step_word = ("preempted (back to the queue)" if lease.over_quota else
                         "suspended (its workload checkpoints, the lease goes back to the queue and resumes from "
                         "the checkpoint when capacity frees)" if resumable else "released")
            reason = (f"idle: engine activity {figures.get('mean engine active (permille)', '?')}‰ on average over "
                      f"{figures.get('window seconds', '?')} s; it will be {step_word} at "
                      f"{deadline.isoformat(timespec='seconds')} unless it gets busy")
            Lease.objects.filter(pk=lease.pk).update(notice_deadline=deadline, reason=reason)
            notification_emit(tenant=lease.tenant, kind="lease.notice", lease=lease, key=f"idle{adjustment.pk}",
                              now=now, data={"reason": reason, "deadline": deadline.isoformat(),
                                             "adjustment": adjustment.pk})
            if not resumable:  # a suspension's SIGTERM waits for the suspension itself (module docstring)
                enqueue("lease_notice_run", lease.pk)
            return _finish(adjustment, AdjustmentState.APPLIED, f"notice given until {deadline.isoformat()}", now=now)
        if step == "cancel":
            Lease.objects.filter(pk=lease.pk).update(notice_deadline=None, reason="busy again: idle notice withdrawn")
            return _finish(adjustment, AdjustmentState.APPLIED, "notice withdrawn: the lease is busy again", now=now)
        if lease.notice_deadline is None:  # withdrawn (busy again) since the proposal: the lease stays
            return _finish(adjustment, AdjustmentState.EXPIRED, "the lease has no idle notice any more", now=now)
        remaining = max(0, int(((lease.ends_at or now) - now).total_seconds()))
        milli = sum(lease.allocations.filter(freed_at__isnull=True).values_list("milli", flat=True))
        # a release frees the GPUs until the lease's end; a suspension or preemption only until the lease is
        # placed again: that effect is measured when it is (``effects.effects_measure``), not promised here
        effect = {"gpu_seconds_freed": milli * remaining // 1000, "milli": milli}
        why = (f"idle (engine activity {figures.get('mean engine active (permille)', '?')}‰ over "
               f"{figures.get('window seconds', '?')} s, notice given) — adjustment {adjustment.pk}")
        if step == "suspend":
            if not resumable:
                return _finish(adjustment, AdjustmentState.EXPIRED, "the lease can no longer be suspended (no "
                               "resumable workload, or its project opted out of suspension)", now=now)
            grace = lease_suspend(lease=lease, actor=LOOP, now=now, why=why)
            return _finish(adjustment, AdjustmentState.APPLIED, f"suspended: {grace} s to checkpoint, then back to "
                           "the queue", now=now)
        if step == "preempt":
            lease_preempt(lease=lease, actor=LOOP, now=now, why=f"as {why}", notice_seconds=0)
            transaction.on_commit(_expire_soon)
            return _finish(adjustment, AdjustmentState.APPLIED, "preempted: back to the queue", now=now)
    lease_release(lease=lease, actor=LOOP, reason=f"released: {why}", now=now)
    return _finish(adjustment, AdjustmentState.APPLIED, "released", now=now, effect=effect)


def _expire_soon() -> None:
    from broker import tasks

    tasks.lease_expire_due.apply_async(countdown=0.5)


def _resumable(lease: Lease) -> bool:
    """In-quota training whose workload can resume, not in a lease group, of a project that did not opt out of
    suspension: what the planner's ``resumable-training`` class holds, re-read under the lease's lock."""
    from broker.models import Workload
    from broker.selectors import workload_resumable
    from tenants.models import Project

    if lease.over_quota or lease.group_key or lease.workload_class != "training":
        return False
    spec = Workload.objects.filter(lease_id=lease.pk).values_list("spec", flat=True).first()
    return workload_resumable(spec) and not Project.objects.filter(pk=lease.project_id,
                                                                   idle_suspend_opt_out=True).exists()


def _notice_seconds(lease: Lease, resumable: bool) -> int:
    from broker.scheduler.types import WorkloadClass
    from capacity.planner.planner import reclaim_class

    policy = project_policy(lease.project_id)
    klass = reclaim_class(not lease.over_quota, WorkloadClass(lease.workload_class), resumable)
    return policy.idle_rule(klass).notice_seconds
