"""Writers of billing data. Metering is idempotent: every hour is recomputed whole from lease events and
upserted, so running any window again (after a crash half-way, or with more events) gives the same rows."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from billing.metering import HOLDING, HOUR, held_intervals, hour_floor, split_hours
from billing.models import AllocationUsage
from broker.models import Allocation, Lease, LeaseEvent
from config.errors import ValidationFailed


def usage_meter_window(*, start: datetime, end: datetime, now: datetime | None = None) -> int:
    """Meter every lease that held capacity in [start, end) (whole UTC hours); returns rows written.
    Time not yet past (after ``now``) is not metered; the hour in progress is completed by a later run."""
    now = now or timezone.now()
    if start != hour_floor(start) or end != hour_floor(end) or end <= start:
        raise ValidationFailed("The window must be whole UTC hours, start before end.", field="start")
    until = min(end, now)
    lease_ids = (LeaseEvent.objects.filter(to_state__in=HOLDING, at__lt=until).values("lease_id").distinct())
    leases = (Lease.objects.filter(pk__in=lease_ids)
              .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=start)).select_related("project"))
    rows = []
    for lease in leases:
        events = list(lease.events.order_by("at", "pk").values_list("at", "to_state"))
        allocations = list(Allocation.objects.filter(lease=lease).order_by("pk"))
        hours: dict[datetime, Decimal] = defaultdict(Decimal)
        held: dict[datetime, list[Allocation]] = {}
        for begin, finish in held_intervals(events, until=until):
            units = [a for a in allocations if a.created_at <= begin and (a.freed_at is None or a.freed_at >= finish)]
            for bucket, seconds in split_hours(begin, finish, window=(start, until)):
                hours[bucket] += Decimal(str(seconds))
                held.setdefault(bucket, units)
        for bucket, seconds in hours.items():
            units = held[bucket]
            if not units:
                continue
            first = units[0]
            rows.append(AllocationUsage(
                tenant_id=lease.tenant_id, project_id=lease.project_id, lease=lease, hour_start=bucket,
                seconds=min(seconds, Decimal(3600)), tier=first.tier, kind=first.kind, mig_profile=first.mig_profile,
                gpu_milli=sum(a.milli for a in units), memory_mib=sum(a.memory_mib for a in units),
                workload_class=lease.workload_class, over_quota=first.preemptible, metered_at=now))
    with transaction.atomic(durable=True):
        AllocationUsage.objects.bulk_create(
            rows, update_conflicts=True, unique_fields=["lease", "hour_start"],
            update_fields=["seconds", "tier", "kind", "mig_profile", "gpu_milli", "memory_mib", "workload_class",
                           "over_quota", "metered_at"])
    return len(rows)


__all__ = ["HOUR", "usage_meter_window"]
