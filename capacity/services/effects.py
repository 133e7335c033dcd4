"""What applying achieved, measured ``CAPACITY_EFFECT_AFTER_SECONDS`` after: the leases a switched GPU served
since; the warm members bound and the time they were held idle."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from broker.models import Allocation
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
    return count
