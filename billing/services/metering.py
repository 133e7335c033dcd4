"""Usage metering from lease events: every hour recomputed whole and upserted (idempotent), so metering any window
again gives the same rows.

The rows are computed in PostgreSQL, one statement per chunk of leases (``METER_SQL``): the held intervals from
the lease events (window functions), the allocations held over each interval, the intervals cut at UTC hours
(``generate_series``) and clipped to the window, summed per lease-hour and upserted with ``INSERT ... ON
CONFLICT``. Nothing goes through Python row by row. The rules are those of the pure reference
``billing.core.metering.lease_hours``; tests/billing/test_metering_sql.py checks that the two give exactly
the same rows (seconds exact to the microsecond) on generated lease histories. Each row carries its lease's cost
allocation labels (``Lease.labels``, set once at the request), so breakdowns by label read the usage rows alone.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from billing.core.metering import HOLDING, hour_floor
from core.errors import ValidationFailed

HOLDING_STATES = sorted(HOLDING)

# The candidates: leases with an id in [lo, hi] not finished before the window (a lease with no holding event
# before ``until`` gives no interval, so it needs no test here). Each CTE names the rule of lease_hours it keeps.
METER_SQL = """
WITH lease AS (
    SELECT l.id, l.tenant_id, l.project_id, l.workload_class, l.profiling, l.ends_at, l.labels
      FROM broker_lease l
     WHERE l.id BETWEEN %(lo)s AND %(hi)s
       AND (l.finished_at IS NULL OR l.finished_at >= %(start)s)
       AND (%(tenant)s::bigint IS NULL OR l.tenant_id = %(tenant)s::bigint)
),
event AS (  -- events before ``until`` in (at, id) order; ``was`` is whether the lease held before this one;
           -- ``resized``: an elastic lease shrunk or grown (held_pieces: a cut of the held interval)
    SELECT e.lease_id, e.at, e.id, e.to_state = ANY(%(holding)s) AS holds,
           (e.to_state = 'active' AND e.reason LIKE 'resized:%%') AS resized,
           coalesce(lag(e.to_state = ANY(%(holding)s)) OVER (PARTITION BY e.lease_id ORDER BY e.at, e.id), false) AS was
      FROM broker_leaseevent e
      JOIN lease ON lease.id = e.lease_id
     WHERE e.lease_id BETWEEN %(lo)s AND %(hi)s AND e.at < %(until)s
),
edge AS (  -- where holding starts or stops, or a resize cuts it; a piece ends at the next edge, else at ``until``;
          -- ``span`` numbers the intervals (a cut keeps its interval's number)
    SELECT lease_id, at, holds, holds = was AS cut, lead(at) OVER (PARTITION BY lease_id ORDER BY at, id) AS next_at,
           sum(CASE WHEN holds <> was THEN 1 ELSE 0 END) OVER (PARTITION BY lease_id ORDER BY at, id) AS span
      FROM event
     WHERE holds <> was OR (holds AND resized)
),
held AS (  -- held_intervals, clipped to the window and to the lease's end (the expiry task's lag is not billed)
    SELECT edge.lease_id, edge.at AS begin_at, greatest(edge.at, %(start)s) AS low,
           least(coalesce(edge.next_at, %(until)s), %(until)s, coalesce(lease.ends_at, 'infinity')) AS high,
           bool_or(edge.cut) OVER (PARTITION BY edge.lease_id, edge.span) AS resized
      FROM edge
      JOIN lease ON lease.id = edge.lease_id
     WHERE edge.holds
),
unit AS (  -- the allocations held when the interval began; the first one (lowest id) names what was held
    SELECT held.*, u.*
      FROM held
     CROSS JOIN LATERAL (
        SELECT count(*) AS units, sum(a.milli)::integer AS gpu_milli, sum(a.memory_mib)::integer AS memory_mib,
               (array_agg(a.tier ORDER BY a.id))[1] AS tier, (array_agg(a.kind ORDER BY a.id))[1] AS kind,
               (array_agg(a.mig_profile ORDER BY a.id))[1] AS mig_profile,
               (array_agg(a.preemptible ORDER BY a.id))[1] AS over_quota
          FROM broker_allocation a
         WHERE a.lease_id = held.lease_id AND a.created_at <= held.begin_at
           AND (a.freed_at IS NULL OR a.freed_at > held.begin_at)) u
     WHERE held.low < held.high
),
piece AS (  -- split_hours: the interval cut at every UTC hour; exact seconds (numeric, microseconds kept)
    SELECT unit.*, hour,
           extract(epoch FROM least(hour + interval '1 hour', unit.high) - greatest(hour, unit.low)) AS seconds
      FROM unit
     CROSS JOIN LATERAL generate_series(date_trunc('hour', unit.low, 'UTC'), unit.high - interval '1 microsecond',
                                        interval '1 hour') AS hour
),
hourly AS (  -- per lease-hour: all the pieces' seconds; what the first interval touching the hour held; a resized
            -- interval's pieces by what each held (lease_hours)
    SELECT piece.*, sum(seconds) OVER (PARTITION BY lease_id, hour) AS total,
           sum(CASE WHEN resized THEN seconds * coalesce(gpu_milli, 0) END)
               OVER (PARTITION BY lease_id, hour) AS cut_ms,
           sum(CASE WHEN NOT resized THEN seconds END) OVER (PARTITION BY lease_id, hour) AS plain,
           max(CASE WHEN resized THEN coalesce(gpu_milli, 0) END) OVER (PARTITION BY lease_id, hour) AS top_milli,
           max(CASE WHEN resized THEN coalesce(memory_mib, 0) END) OVER (PARTITION BY lease_id, hour) AS top_memory,
           row_number() OVER (PARTITION BY lease_id, hour ORDER BY begin_at) AS nth
      FROM piece
)
INSERT INTO billing_allocationusage AS u (tenant_id, project_id, lease_id, hour_start, seconds, tier, kind,
                                          mig_profile, gpu_milli, memory_mib, workload_class, over_quota, profiling,
                                          metered_at, labels)
SELECT lease.tenant_id, lease.project_id, hourly.lease_id, hourly.hour,
       least(CASE WHEN hourly.cut_ms IS NULL OR hourly.gpu_milli = 0 THEN hourly.total
                  WHEN hourly.top_milli <= hourly.gpu_milli
                       THEN round(coalesce(hourly.plain, 0) + hourly.cut_ms / hourly.gpu_milli, 6)
                  -- it grew in the hour: the most a cut piece held, the seconds scaled to match (lease_hours)
                  ELSE round((coalesce(hourly.plain, 0) * hourly.gpu_milli + hourly.cut_ms) / hourly.top_milli, 6)
             END, 3600), hourly.tier,
       hourly.kind, hourly.mig_profile,
       CASE WHEN hourly.cut_ms IS NOT NULL AND hourly.gpu_milli > 0 AND hourly.top_milli > hourly.gpu_milli
            THEN hourly.top_milli ELSE hourly.gpu_milli END,
       CASE WHEN hourly.cut_ms IS NOT NULL AND hourly.gpu_milli > 0 AND hourly.top_milli > hourly.gpu_milli
            THEN greatest(hourly.memory_mib, hourly.top_memory) ELSE hourly.memory_mib END,
       lease.workload_class,
       hourly.over_quota, lease.profiling, %(now)s, lease.labels
  FROM hourly
  JOIN lease ON lease.id = hourly.lease_id
 WHERE hourly.nth = 1 AND hourly.units > 0
 ORDER BY hourly.lease_id, hourly.hour
    ON CONFLICT (lease_id, hour_start) DO UPDATE
   SET seconds = EXCLUDED.seconds, tier = EXCLUDED.tier, kind = EXCLUDED.kind, mig_profile = EXCLUDED.mig_profile,
       gpu_milli = EXCLUDED.gpu_milli, memory_mib = EXCLUDED.memory_mib, workload_class = EXCLUDED.workload_class,
       over_quota = EXCLUDED.over_quota, profiling = EXCLUDED.profiling, metered_at = EXCLUDED.metered_at,
       labels = EXCLUDED.labels
 WHERE (u.seconds, u.tier, u.kind, u.mig_profile, u.gpu_milli, u.memory_mib, u.workload_class, u.over_quota,
        u.profiling, u.labels)
       IS DISTINCT FROM (EXCLUDED.seconds, EXCLUDED.tier, EXCLUDED.kind, EXCLUDED.mig_profile, EXCLUDED.gpu_milli,
                         EXCLUDED.memory_mib, EXCLUDED.workload_class, EXCLUDED.over_quota, EXCLUDED.profiling,
                         EXCLUDED.labels)
"""

CANDIDATES_SQL = """
SELECT l.id
  FROM broker_lease l
 WHERE (l.finished_at IS NULL OR l.finished_at >= %(start)s)
   AND (%(tenant)s::bigint IS NULL OR l.tenant_id = %(tenant)s::bigint)
   AND EXISTS (SELECT 1 FROM broker_leaseevent e
                WHERE e.lease_id = l.id AND e.to_state = ANY(%(holding)s) AND e.at < %(until)s)
 ORDER BY l.id
"""


def usage_meter_window(*, start: datetime, end: datetime, now: datetime | None = None, chunk: int = 20000,
                       workers: int = 1, tenant_id: int | None = None) -> int:
    """Meter every lease that held capacity in [start, end) (whole UTC hours); returns the rows written (new
    or changed: a row that already holds the same figures is left alone, ``metered_at`` included, so metering
    a window again writes nothing and returns 0).
    Time not yet past (after ``now``) is not metered; the hour in progress is completed by a later run.
    The leases are metered in chunks of ``chunk`` (by id), one statement and one transaction each; a re-run
    after a crash recomputes the same rows, and two runs at once write the same values (rows are upserted
    in (lease, hour) order, so they wait on each other rather than deadlock). ``workers`` > 1 meters that
    many chunks at once on their own connections (the chunks share no lease); it needs the leases committed,
    so it is for callers outside a transaction (the month's re-metering, the benchmark). ``tenant_id``: only
    that tenant's leases (the on-demand metering of a tenant's hour in progress, ``usage_meter_recent``)."""
    now = now or timezone.now()
    if start != hour_floor(start) or end != hour_floor(end) or end <= start:
        raise ValidationFailed("The window must be whole UTC hours, start before end.", field="start")
    until = min(end, now)
    params = {"start": start, "until": until, "now": now, "holding": HOLDING_STATES, "tenant": tenant_id}
    with connection.cursor() as cursor:
        cursor.execute(CANDIDATES_SQL, params)
        candidates = [row[0] for row in cursor.fetchall()]
    bounds = [(candidates[offset], candidates[min(offset + chunk, len(candidates)) - 1])
              for offset in range(0, len(candidates), chunk)]
    if workers > 1 and len(bounds) > 1 and connection.in_atomic_block:
        raise ValidationFailed("Metering with several workers needs committed leases: call it outside a "
                               "transaction.", field="workers")
    written = _meter_chunks(params, bounds, workers)
    if written >= ANALYZE_AFTER_ROWS:
        # a month metered at once: the planner's statistics would still describe the table before it, and
        # the invoice run's plan with them (an on-disk sort of every row instead of a hash of the groups)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE billing_allocationusage")
    return written


ANALYZE_AFTER_ROWS = 1_000_000


def _meter_chunks(params: dict, bounds: list[tuple[int, int]], workers: int) -> int:
    if workers <= 1 or len(bounds) <= 1:
        return sum(_meter_chunk(params, lo, hi) for lo, hi in bounds)

    def on_own_connection(bound: tuple[int, int]) -> int:
        try:
            return _meter_chunk(params, *bound)
        finally:
            connection.close()  # this thread's connection

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="metering") as pool:
        return sum(pool.map(on_own_connection, bounds))


# The chunk's leases have no row in the window yet (the hourly run's new hour, a month metered the first time):
# a plain INSERT, which skips the upsert's per-row conflict check and its speculative-insertion confirmation
# (about a sixth of PostgreSQL's CPU per row, measured for issue 16: docs/billing.md).
UNMETERED_SQL = """
SELECT NOT EXISTS (SELECT 1 FROM billing_allocationusage
                    WHERE lease_id BETWEEN %(lo)s AND %(hi)s AND hour_start >= %(start)s AND hour_start < %(until)s)
"""
INSERT_SQL = METER_SQL[:METER_SQL.index("    ON CONFLICT")]


def _meter_chunk(params: dict, lo: int, hi: int) -> int:
    chunk = {**params, "lo": lo, "hi": hi}
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        # the planner's estimate for generate_series (1,000 rows per interval) would have it JIT-compile the
        # statement: 1.7 s per chunk for nothing
        cursor.execute("SET LOCAL jit = off")
        cursor.execute(UNMETERED_SQL, chunk)
        if cursor.fetchone()[0]:
            try:
                with transaction.atomic():  # a run at once may insert the same rows first: then the upsert
                    cursor.execute(INSERT_SQL, chunk)
                    return cursor.rowcount
            except IntegrityError:
                pass
        cursor.execute(METER_SQL, chunk)
        return cursor.rowcount
