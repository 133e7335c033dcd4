"""Utilisation metering from Prometheus: what each lease did with its capacity in one UTC hour.

For one hour (or the part of it before ``now``) the meter asks Prometheus five questions, whatever the
number of leases (docs/billing.md "Utilisation metering"):

1. ``max(timestamp(up))`` (instant): the newest scrape. Older than the window's end → ``PrometheusLate``.
2. ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (range, one point per ``METERING_STEP_SECONDS``): per consumer.
3. ``DCGM_FI_DEV_GPU_UTIL / 100 unless on (Hostname, UUID) DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (range): the
   fallback, only for GPUs without the profiling metric.
4. ``DCGM_FI_DEV_FB_USED`` (range): per consumer.
5. ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (range): the mJ counter of each physical GPU.

A range query's point at ``t`` is the newest sample at or before ``t``. Points at ``[start, end)`` that
fall inside an allocation's held time belong to it — the time its lease held capacity (events) and its
allocation was live, so an allocation freed at :20 gets no point after :20. Series are mapped to
allocations by their ``allocation_id`` label, else by ``Hostname`` (the node's hostname or node id) +
``UUID`` (the physical GPU) + ``GPU_I_ID`` (the MIG GPU instance; none: the whole GPU).

Energy is never read per instance: each physical GPU's counter increase between consecutive points
(a drop is a counter reset: the new value is the increase since it) is apportioned to the allocations
on that GPU by their share (MIG compute slices / 7, a share's milli / 1000, a whole GPU all of it) and
the part of the interval they held. The points at the hour's two ends are shared with the neighbouring
hours, so hours add up to the counter's increase: nothing counted twice, nothing dropped between hours.

The result is one ``UtilisationUsage`` row per (lease, hour), written by upsert: metering an hour again
gives the same figures.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from itertools import pairwise

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from billing.core.metering import HOLDING, HOUR, held_intervals, hour_floor
from billing.models import UtilisationUsage
from broker.choices import GpuKind
from broker.models import Allocation, Lease, LeaseEvent
from core.errors import ApplicationError, ValidationFailed
from core.prometheus import Prometheus, PrometheusError
from gpus.mig import COMPUTE_SLICES, UnknownProfile, profile_get

logger = logging.getLogger(__name__)

ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
FRESHNESS_QUERY = "max(timestamp(up))"
QUERIES = {
    "engine_active": ENGINE_ACTIVE,
    "gpu_util": f"{GPU_UTIL} / 100 unless on (Hostname, UUID) {ENGINE_ACTIVE}",
    "fb_used": FB_USED,
    "energy": ENERGY,
}
MICRO = 1_000_000
MJ_PER_WH = 3_600_000
SIX_PLACES = Decimal("0.000001")
THREE_PLACES = Decimal("0.001")


class MeteringDeferred(ApplicationError):
    """The hour cannot be metered now; its window stays open and a later run fills it."""

    status = 503
    code = "metering_deferred"
    title = "Metering deferred"


class PrometheusUnavailable(MeteringDeferred):
    """Prometheus did not answer (connection refused, timeout, 5xx) or refused a query."""

    code = "prometheus_unavailable"
    title = "Prometheus unavailable"


class PrometheusLate(MeteringDeferred):
    """Prometheus answers but has not scraped past the end of the window yet."""

    code = "prometheus_late"
    title = "Prometheus has no data up to the window's end yet"


# -- what the database says was held ----------------------------------------------------------------
@dataclass(eq=False)
class _Holding:
    """One allocation's part of the window: where it sat, its energy share, when it held capacity
    (microseconds since the epoch, half-open intervals) and the points it collected."""

    allocation: Allocation
    hosts: frozenset[str]
    share: Fraction
    intervals: list[tuple[int, int]]
    engine: dict[int, Fraction] = field(default_factory=dict)
    fb: dict[int, Fraction] = field(default_factory=dict)
    energy_mj: Fraction = Fraction(0)
    energy_seen: bool = False

    def holds(self, moment: int) -> bool:
        return any(low <= moment < high for low, high in self.intervals)

    def overlap(self, low: int, high: int) -> int:
        return sum(max(0, min(high, b) - max(low, a)) for a, b in self.intervals)


def _micros(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _energy_share(allocation: Allocation) -> Fraction:
    """The part of its GPU's energy an allocation answers for while it holds it."""
    if allocation.kind == GpuKind.MIG:
        try:
            slices = profile_get(allocation.gpu.model, allocation.mig_profile).compute_slices
        except UnknownProfile:
            slices = max(1, round(allocation.milli * COMPUTE_SLICES / 1000))
        return Fraction(slices, COMPUTE_SLICES)
    if allocation.kind == GpuKind.SHARE:
        return Fraction(allocation.milli, 1000)
    return Fraction(1)


def _intersect(first: list[tuple[int, int]], second: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for a, b in first:
        for c, d in second:
            low, high = max(a, c), min(b, d)
            if low < high:
                out.append((low, high))
    return out


def _holdings(start: datetime, end: datetime) -> list[_Holding]:
    """Every allocation that held capacity in [start, end): its lease's held time (from events, as
    allocation metering counts it) ∩ the allocation's own life [created_at, freed_at) ∩ the window."""
    lease_ids = list(LeaseEvent.objects.filter(to_state__in=HOLDING, at__lt=end).values_list("lease_id", flat=True)
                     .distinct())
    lease_ids = list(Lease.objects.filter(pk__in=lease_ids)
                     .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=start)).values_list("pk", flat=True))
    if not lease_ids:
        return []
    events: dict[int, list[tuple[datetime, str]]] = defaultdict(list)
    for lease_id, at, state in (LeaseEvent.objects.filter(lease_id__in=lease_ids, at__lt=end)
                                .order_by("lease_id", "at", "pk").values_list("lease_id", "at", "to_state")):
        events[lease_id].append((at, state))
    held = {lease_id: [(_micros(a), _micros(b)) for a, b in held_intervals(items, until=end)]
            for lease_id, items in events.items()}
    window = [(_micros(start), _micros(end))]
    out = []
    allocations = (Allocation.objects.filter(lease_id__in=lease_ids, created_at__lt=end)
                   .filter(Q(freed_at__isnull=True) | Q(freed_at__gt=start))
                   .select_related("gpu__node").order_by("pk"))
    for allocation in allocations:
        life = [(_micros(allocation.created_at), _micros(allocation.freed_at or end))]
        intervals = _intersect(_intersect(held.get(allocation.lease_id, []), life), window)
        if not intervals:
            continue
        node = allocation.gpu.node
        out.append(_Holding(allocation, frozenset(h for h in (node.hostname, node.node_id) if h),
                            _energy_share(allocation), intervals))
    return out


class _Index:
    """Finds the holdings a series belongs to (the mapping rule in the module docstring)."""

    def __init__(self, holdings: list[_Holding]):
        self.by_instance = {h.allocation.instance_id: h for h in holdings}
        self.by_gpu: dict[str, list[_Holding]] = defaultdict(list)
        for holding in holdings:
            self.by_gpu[holding.allocation.gpu.uuid].append(holding)

    @staticmethod
    def _matches(holding: _Holding, labels: dict) -> bool:
        uuid, host = labels.get("UUID", ""), labels.get("Hostname", "")
        return (not uuid or uuid == holding.allocation.gpu.uuid) and (not host or host in holding.hosts)

    def _on_gpu(self, labels: dict) -> list[_Holding]:
        return [h for h in self.by_gpu.get(labels.get("UUID", ""), []) if self._matches(h, labels)]

    def consumers(self, labels: dict) -> list[_Holding]:
        """The holdings a consumer series (a whole GPU, a MIG instance or a share) may belong to."""
        allocation_id = labels.get("allocation_id", "")
        if allocation_id:
            holding = self.by_instance.get(allocation_id)
            return [holding] if holding is not None and self._matches(holding, labels) else []
        instance = labels.get("GPU_I_ID", "")
        if instance:
            return [h for h in self._on_gpu(labels) if h.allocation.kind == GpuKind.MIG
                    and h.allocation.gpu_instance_id is not None and str(h.allocation.gpu_instance_id) == instance]
        return [h for h in self._on_gpu(labels) if h.allocation.kind == GpuKind.WHOLE]

    def gpu(self, labels: dict) -> list[_Holding]:
        """Everyone on the physical GPU of a GPU-level series (no ``GPU_I_ID``)."""
        return [] if labels.get("GPU_I_ID") else self._on_gpu(labels)


# -- Prometheus ---------------------------------------------------------------------------------------
def _client() -> Prometheus:
    return Prometheus(retries=2)


def _ask(what: str, call, *args, **kwargs) -> list:
    try:
        return call(*args, **kwargs)
    except PrometheusError as error:
        raise PrometheusUnavailable(f"Prometheus at {settings.PROMETHEUS_URL} did not answer the {what} query: "
                                    f"{error}", extra={"query": what}) from error


def _points(series: dict) -> list[tuple[int, Fraction]]:
    out = []
    for moment, raw in series.get("values", []):
        value = float(raw)
        if math.isfinite(value):
            out.append((round(float(moment) * MICRO), Fraction(Decimal(raw))))
    return out


def _check_fresh(prometheus: Prometheus, end: datetime) -> None:
    result = _ask("freshness", prometheus.query, FRESHNESS_QUERY)
    if not result:
        raise PrometheusLate("Prometheus has no recent scrape (no `up` sample in its last 5 minutes); the window "
                             f"up to {end.isoformat()} stays open.")
    newest = float(result[0]["value"][1])
    if newest < end.timestamp():
        newest_at = datetime.fromtimestamp(newest, tz=UTC)
        raise PrometheusLate(f"Prometheus's newest sample ({newest_at.isoformat(timespec='seconds')}) is older than "
                             f"the window's end ({end.isoformat(timespec='seconds')}); it stays open.")


# -- the meter -------------------------------------------------------------------------------------------
def _collect(holdings: list[_Holding], results: dict[str, list], window: tuple[int, int]) -> None:
    index = _Index(holdings)
    for key in ("engine_active", "gpu_util", "fb_used"):
        for series in results[key]:
            consumers = index.consumers(series["metric"])
            if not consumers:
                continue
            for moment, value in _points(series):
                if not window[0] <= moment < window[1]:
                    continue
                for holding in consumers:
                    if not holding.holds(moment):
                        continue
                    if key == "fb_used":
                        holding.fb[moment] = value
                    elif key == "engine_active":
                        holding.engine[moment] = min(Fraction(1), max(Fraction(0), value))
                    else:  # the fallback never overrides the profiling metric
                        holding.engine.setdefault(moment, min(Fraction(1), max(Fraction(0), value)))
    # one energy counter per physical GPU: duplicates (a target scraped twice) are not added up
    counters: dict[str, tuple[tuple, dict, list]] = {}
    for series in results["energy"]:
        labels = series["metric"]
        if labels.get("GPU_I_ID") or not index.gpu(labels):
            continue
        points = _points(series)
        rank = (-len(points), sorted(labels.items()))  # the fullest series; ties by labels, stable
        uuid = labels.get("UUID", "")
        if uuid not in counters or rank < counters[uuid][0]:
            counters[uuid] = (rank, labels, points)
    for _rank, labels, points in counters.values():
        on_gpu = index.gpu(labels)
        for holding in on_gpu:
            holding.energy_seen = True
        for (low, before), (high, after) in pairwise(points):
            increase = after - before if after >= before else after  # a reset: the counter restarted from 0
            if high <= low or increase == 0:
                continue
            for holding in on_gpu:
                overlap = holding.overlap(low, high)
                if overlap:
                    holding.energy_mj += increase * holding.share * Fraction(overlap, high - low)


def _decimal(value: Fraction, places: Decimal) -> Decimal:
    return (Decimal(value.numerator) / Decimal(value.denominator)).quantize(places)


def _rows(holdings: list[_Holding], hour_start: datetime, now: datetime) -> list[UtilisationUsage]:
    by_lease: dict[int, list[_Holding]] = defaultdict(list)
    for holding in holdings:
        by_lease[holding.allocation.lease_id].append(holding)
    leases = {lease.pk: lease for lease in Lease.objects.filter(pk__in=by_lease).only("pk", "tenant_id")}
    rows = []
    for lease_id, items in sorted(by_lease.items()):
        engine = [value for h in items for value in h.engine.values()]
        fb_means = [sum(h.fb.values(), Fraction(0)) / len(h.fb) for h in items if h.fb]
        seen_energy = any(h.energy_seen for h in items)
        rows.append(UtilisationUsage(
            tenant_id=leases[lease_id].tenant_id, lease_id=lease_id, hour_start=hour_start,
            engine_active_avg=_decimal(sum(engine, Fraction(0)) / len(engine), SIX_PLACES) if engine else None,
            fb_used_avg_mib=_decimal(sum(fb_means, Fraction(0)), THREE_PLACES) if fb_means else None,
            energy_wh=_decimal(sum((h.energy_mj for h in items), Fraction(0)) / MJ_PER_WH, SIX_PLACES)
            if seen_energy else None,
            samples=sum(len(h.engine.keys() | h.fb.keys()) for h in items), metered_at=now))
    return rows


def utilisation_meter_hour(*, hour_start: datetime, now: datetime | None = None,
                           prometheus: Prometheus | None = None) -> int:
    """Meter one UTC hour from Prometheus (up to ``now`` when it is still running) and upsert one
    ``UtilisationUsage`` row per lease that held capacity in it; returns the rows written.

    Raises ``PrometheusUnavailable`` when Prometheus does not answer and ``PrometheusLate`` when its
    newest sample is older than the end of the window; nothing is written then. An hour in which no
    lease held capacity needs no question to Prometheus and writes nothing."""
    now = now or timezone.now()
    if hour_start.tzinfo is None or hour_start != hour_floor(hour_start):
        raise ValidationFailed("hour_start must be the start of a UTC hour.", field="hour_start")
    step = settings.METERING_STEP_SECONDS
    if step < 1 or 3600 % step:
        raise ValidationFailed("METERING_STEP_SECONDS must divide an hour.", field="METERING_STEP_SECONDS")
    end = min(hour_start + HOUR, now)
    if end <= hour_start:
        return 0
    holdings = _holdings(hour_start, end)
    if not holdings:
        return 0
    prometheus = prometheus or _client()
    _check_fresh(prometheus, end)
    # whole seconds, as the window's edges are (the HTTP API takes fractions too)
    results = {key: _ask(key, prometheus.query_range, query, start=round(hour_start.timestamp()),
                         end=round(end.timestamp()), step=str(step))
               for key, query in QUERIES.items()}
    _collect(holdings, results, (_micros(hour_start), _micros(end)))
    rows = _rows(holdings, hour_start, now)
    with transaction.atomic(durable=True):
        UtilisationUsage.objects.bulk_create(
            rows, update_conflicts=True, unique_fields=["lease", "hour_start"],
            update_fields=["tenant", "engine_active_avg", "fb_used_avg_mib", "energy_wh", "samples", "metered_at"])
    logger.info("utilisation metered for %s: %d leases, %d allocations", hour_start.isoformat(), len(rows),
                len(holdings))
    return len(rows)
