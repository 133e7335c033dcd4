"""What applying achieved, measured ``CAPACITY_EFFECT_AFTER_SECONDS`` after: the leases a switched GPU served
since; the warm members bound and the time they were held idle; and, once the lease is placed again (or ends),
the GPU-seconds an idle lease's suspension or preemption freed (a release's are known when it is applied: the
rest of the lease)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from broker.choices import FINAL_STATES, LeaseState
from broker.models import Allocation, LeaseEvent
from capacity.choices import AdjustmentKind, AdjustmentState
from capacity.models import Adjustment
from capacity.services.common import _gpu_of


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
    return count + _requeued_measure(now)


def _requeued_measure(now: datetime) -> int:
    """Applied idle suspensions and preemptions: the lease went back to the queue and comes back, so what it
    freed is its milli-GPUs × the time from its return to the queue until it was placed again (or ended without
    being placed). Measured once that has happened; until then the effect stays empty ("not yet known")."""
    due = Adjustment.objects.filter(state=AdjustmentState.APPLIED, effect__isnull=True,
                                    kind=AdjustmentKind.IDLE_RECLAIM, change__step__in=("suspend", "preempt"),
                                    lease__isnull=False).order_by("pk")
    count = 0
    for adjustment in due[:200]:
        events = list(LeaseEvent.objects.filter(lease_id=adjustment.lease_id, at__gte=adjustment.finished_at)
                      .order_by("at", "pk").values_list("to_state", "at"))
        queued = next((at for state, at in events if state == LeaseState.QUEUED), None)
        if queued is None:
            continue  # still checkpointing (PREEMPTED until its workload stops or the deadline)
        back = next(((state, at) for state, at in events if at >= queued and (
            state in (LeaseState.PROVISIONING, LeaseState.ACTIVE) or state in FINAL_STATES)), None)
        if back is None:
            continue  # still waiting: the GPUs are still free for others
        milli = int(adjustment.evidence.get("figures", {}).get("milli held", 0))
        seconds = max(0, int((back[1] - queued).total_seconds()))
        effect = {"gpu_seconds_freed": milli * seconds // 1000, "milli": milli, "requeued_at": queued.isoformat(),
                  "back_at": back[1].isoformat(), "back_as": str(back[0]), "seconds_in_queue": seconds}
        Adjustment.objects.filter(pk=adjustment.pk).update(effect=effect, effect_at=now)
        count += 1
    return count
