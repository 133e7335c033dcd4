"""Usage metering from lease events: every hour recomputed whole and upserted (idempotent), so metering any window
again gives the same rows."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from billing.core.metering import HOLDING, held_intervals, hour_floor, split_hours
from billing.models import (
    AllocationUsage,
)
from config.errors import ValidationFailed
from leasing.models import Allocation, Lease, LeaseEvent


def usage_meter_window(*, start: datetime, end: datetime, now: datetime | None = None, chunk: int = 2000) -> int:
    """Meter every lease that held capacity in [start, end) (whole UTC hours); returns rows written.
    Time not yet past (after ``now``) is not metered; the hour in progress is completed by a later run.
    Leases are read and written in chunks (two queries and one upsert per chunk); each chunk commits on
    its own, and a re-run after a crash recomputes the same rows."""
    now = now or timezone.now()
    if start != hour_floor(start) or end != hour_floor(end) or end <= start:
        raise ValidationFailed("The window must be whole UTC hours, start before end.", field="start")
    until = min(end, now)
    lease_ids = (LeaseEvent.objects.filter(to_state__in=HOLDING, at__lt=until).values("lease_id").distinct())
    candidates = list(Lease.objects.filter(pk__in=lease_ids)
                      .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=start)).order_by("pk")
                      .values_list("pk", "tenant_id", "project_id", "workload_class"))
    written = 0
    for offset in range(0, len(candidates), chunk):
        part = candidates[offset:offset + chunk]
        ids = [row[0] for row in part]
        events: dict[int, list] = defaultdict(list)
        for lease_id, at, to_state in (LeaseEvent.objects.filter(lease_id__in=ids, at__lt=until)
                                       .order_by("lease_id", "at", "pk").values_list("lease_id", "at", "to_state")):
            events[lease_id].append((at, to_state))
        allocations: dict[int, list[Allocation]] = defaultdict(list)
        for allocation in Allocation.objects.filter(lease_id__in=ids).order_by("pk").only(
                "lease_id", "tier", "kind", "mig_profile", "milli", "memory_mib", "preemptible", "created_at",
                "freed_at"):
            allocations[allocation.lease_id].append(allocation)
        rows = []
        for lease_id, tenant_id, project_id, workload_class in part:
            rows.extend(_usage_rows(lease_id, tenant_id, project_id, workload_class, events[lease_id],
                                    allocations[lease_id], start=start, until=until, now=now))
        with transaction.atomic(durable=True):
            AllocationUsage.objects.bulk_create(
                rows, update_conflicts=True, unique_fields=["lease", "hour_start"],
                update_fields=["seconds", "tier", "kind", "mig_profile", "gpu_milli", "memory_mib", "workload_class",
                               "over_quota", "metered_at"], batch_size=5000)
        written += len(rows)
    return written


def _usage_rows(lease_id, tenant_id, project_id, workload_class, events, allocations, *, start, until, now):
    hours: dict[datetime, Decimal] = defaultdict(Decimal)
    held: dict[datetime, list[Allocation]] = {}
    for begin, finish in held_intervals(events, until=until):
        units = [a for a in allocations if a.created_at <= begin and (a.freed_at is None or a.freed_at >= finish)]
        for bucket, seconds in split_hours(begin, finish, window=(start, until)):
            hours[bucket] += Decimal(str(seconds))
            held.setdefault(bucket, units)
    rows = []
    for bucket, seconds in hours.items():
        units = held[bucket]
        if not units:
            continue
        first = units[0]
        rows.append(AllocationUsage(
            tenant_id=tenant_id, project_id=project_id, lease_id=lease_id, hour_start=bucket,
            seconds=min(seconds, Decimal(3600)), tier=first.tier, kind=first.kind, mig_profile=first.mig_profile,
            gpu_milli=sum(a.milli for a in units), memory_mib=sum(a.memory_mib for a in units),
            workload_class=workload_class, over_quota=first.preemptible, metered_at=now))
    return rows
