"""The scheduler's snapshot kept between cycles: read whole once, then only what changed.

Every write that changes what ``selectors.scheduler_snapshot`` reads — a node's id, cordon, status or host CPU and
memory (migration 0020); a GPU's node,
model, mode, index, NVLink domain, loss or mode target; an allocation made, bound, freed or changed; a lease's
state, project, tenant, start, priority or group — appends (kind, id) to ``broker_snapshotchange`` by a trigger
(migration 0011), in the same transaction, with that transaction's id. A ``SnapshotCache`` remembers the
smallest transaction id that was still running when it last read (``pg_snapshot_xmin``, taken *before* that read:
its watermark); every transaction it may not have seen has an id at or above it. The next load re-reads by id
only the rows named by changes at or above the watermark, so it sees every change committed since, and the rows
it re-reads are read now, whatever order the writers committed in. Re-reading a row twice is harmless.

A full read instead, and on any doubt: the first time; when the log's epoch row is not the one the cache was read
under (a TRUNCATE of the fleet's tables deletes it, a test database flush empties it); when changes the cache
needs were pruned; when the reading transaction itself has written changes it may still roll back (then the
snapshot is read whole and not kept); when the server is not the one the cache was read from — it started
since (``pg_postmaster_start_time()``: a restart, a crash, a failover; a crash can lose commits the cache saw
when commits are asynchronous, and nothing in the log says so) or its transaction ids went backwards (a restore
or a standby that lagged): issue 27 item 12, 853 placements planned on such a snapshot and refused by the
overlap constraint after a database restart. Quotas, tenant quotas, prices and settings are small and read every time.

The result equals ``scheduler_snapshot(now=…)`` read at the same moment, records and order alike
(``tests/scheduler/test_snapshot_cache.py`` checks it after random fleet changes)."""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import datetime

from django.conf import settings
from django.db import connection

from broker.choices import AllocationState, LeaseState, NodeStatus

logger = logging.getLogger(__name__)

# changes older than this are deleted by the cycle (``prune``); a cache whose watermark is below the deleted
# ones reads whole again
PRUNE_AFTER_SECONDS = 600
PRUNE_EVERY_SECONDS = 60
# the reading statement's snapshot: a transaction it does not see has an id at or above xmax, or among xip (the
# ones still running); every other transaction had ended (its changes seen, when it committed)
# (and when the server started: a cache read before a restart is stale)
_SNAPSHOT = ("SELECT pg_snapshot_xmin(s)::text::bigint, pg_snapshot_xmax(s)::text::bigint, "
             "ARRAY(SELECT pg_snapshot_xip(s)::text::bigint), pg_current_xact_id_if_assigned()::text::bigint, "
             "pg_postmaster_start_time() FROM pg_current_snapshot() s")


def _allocation_sql(where: str) -> str:
    return ("SELECT a.lease_id, a.gpu_id, a.milli, a.memory_mib, a.mig_profile, a.mig_start, a.tier, a.preemptible, "  # noqa: S608
            "l.project_id, l.tenant_id, EXTRACT(EPOCH FROM COALESCE(l.active_at, l.queued_at))::float8, l.priority, "
            "l.group_key, a.id, l.cpu_milli_per_unit, l.host_memory_mib_per_unit, l.min_count, l.count, l.gang, "
            "l.state "
            "FROM broker_allocation a JOIN broker_lease l ON l.id = a.lease_id "
            "JOIN broker_gpu g ON g.id = a.gpu_id "
            f"WHERE a.freed_at IS NULL AND g.lost_at IS NULL AND l.state <> %s {where} ORDER BY a.id")


_GPU_SQL = ("SELECT id, node_id, model, mode, index, nvlink_domain, mode_target, memory_mib "
            "FROM broker_gpu "
            "WHERE lost_at IS NULL {where} ORDER BY id")
_NODE_SQL = ("SELECT id, node_id, cordoned, status, host_cpu_milli, host_memory_mib, pool FROM broker_node {where} "
             "ORDER BY id")
_WARM_SQL = ("SELECT a.id, a.gpu_id, a.mig_profile, a.mig_start, a.state FROM broker_allocation a "
             "JOIN broker_gpu g ON g.id = a.gpu_id WHERE a.freed_at IS NULL AND a.lease_id IS NULL "
             "AND g.lost_at IS NULL AND a.state IN (%s, %s) AND g.mode_target = '' {where} ORDER BY a.id")


class SnapshotCache:
    """One process's kept snapshot (the rows and the core records built from them)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        self.token: str | None = None
        self.server_started: datetime | None = None  # the server's start time when the cache was read
        self.watermark: int | None = None
        self.unseen: tuple[int, list[int]] = (0, [])
        self.nodes: dict[int, object] = {}  # pk → core Node
        self.node_ids: dict[int, str] = {}  # pk → node id
        self.gpus: dict[int, tuple] = {}  # pk → (core Gpu, node pk)
        self.switching: dict[int, str] = {}  # pk → the mode a GPU is being switched to (``Gpu.mode_target``)
        self.leases: dict[int, tuple] = {}  # lease pk → (first allocation id, its row, the lease's units)
        self.warm: dict[int, object] = {}  # allocation pk → core WarmInstance
        self._nodes = self._gpus = self._allocations = None  # tuples built from the above, None when stale
        self._built: dict[int, object] = {}  # lease pk → core Allocation (started_at known)
        self.last_prune = 0.0
        self.stats = {"full": 0, "delta": 0, "bypass": 0, "rows": 0, "stale": 0}

    # -- reading ------------------------------------------------------------------------------------------------
    def load(self, *, now: datetime):
        """The snapshot now: the kept one brought up to date, or read whole (see the module's doc)."""
        with self.lock, connection.cursor() as cursor:
            cursor.execute(_SNAPSHOT)
            watermark, xmax, running, own, server_started = cursor.fetchone()
            if own is not None:
                cursor.execute("SELECT EXISTS (SELECT 1 FROM broker_snapshotchange WHERE xid = %s)", [own])
                if cursor.fetchone()[0]:  # this transaction changed the fleet and may roll back: nothing kept
                    self.stats["bypass"] += 1
                    return snapshot_read(now=now)
            cursor.execute("SELECT token, pruned_xid FROM broker_snapshotepoch WHERE id = 1")
            row = cursor.fetchone()
            if row is None:
                cursor.execute("INSERT INTO broker_snapshotepoch (id, token, pruned_xid) VALUES (1, %s, 0) "
                               "ON CONFLICT (id) DO NOTHING", [str(uuid.uuid4())])
                cursor.execute("SELECT token, pruned_xid FROM broker_snapshotepoch WHERE id = 1")
                row = cursor.fetchone()
            token, pruned = row
            stale = self._stale_reason(server_started=server_started, xmax=xmax)
            if stale is not None:
                logger.warning("kept scheduler snapshot is stale (%s): read whole", stale)
                self.stats["stale"] += 1
            if self.token != token or self.watermark is None or pruned >= self.watermark or stale is not None:
                self._read_whole(cursor)
                self.token, self.server_started = token, server_started
                self.stats["full"] += 1
            else:
                self._read_changes(cursor, since=self.unseen)
                self.stats["delta"] += 1
            # the ones it may not have seen: those still running (this one too: the cycle writes its placements
            # after this read, under an id that may be below xmax and is never in its own snapshot's xip)
            running = [*running, own] if own is not None else running
            self.watermark = min([watermark, *running])  # transactions below it had all ended when it began
            self.unseen = (xmax, running)
            return self._snapshot(now)

    def _stale_reason(self, *, server_started: datetime, xmax: int) -> str | None:
        """Why what the cache holds cannot be brought up to date from the log, when it holds something: the server
        started since it was read (its log says nothing of commits a crash lost), or transaction ids went back."""
        if self.watermark is None:
            return None  # nothing kept: read whole anyway
        if self.server_started is not None and server_started != self.server_started:
            return f"the database server started at {server_started.isoformat()}, after this cache was read"
        if xmax < self.unseen[0]:
            return f"transaction ids went back from {self.unseen[0]} to {xmax} (a restore or a failover)"
        return None

    def _read_whole(self, cursor) -> None:
        token_keep, last_prune, stats, started = self.token, self.last_prune, self.stats, self.server_started
        self.clear()
        self.token, self.last_prune, self.stats, self.server_started = token_keep, last_prune, stats, started
        self._nodes_from(cursor, "", [])
        self._gpus_from(cursor, "", [])
        self._leases_from(cursor, "", [])
        self._warm_from(cursor, "", [])

    def _read_changes(self, cursor, *, since: tuple[int, list[int]]) -> None:
        # the changes of every transaction the last read did not see: those that began after it (xmax and
        # above) and those running then (however long they ran; an unrelated long transaction keeps xmin low,
        # so "xid >= xmin" would read the same old changes again and again)
        xmax, running = since
        cursor.execute("SELECT DISTINCT kind, key FROM broker_snapshotchange WHERE xid >= %s OR xid = ANY(%s)",
                       [xmax, running])
        keys: dict[str, set] = {"node": set(), "gpu": set(), "lease": set(), "alloc": set()}
        for kind, key in cursor.fetchall():
            keys[kind].add(key)
        self.stats["rows"] = sum(len(v) for v in keys.values())
        nodes, gpus, leases, warm = keys["node"], keys["gpu"], keys["lease"], keys["alloc"]
        if nodes:
            nodes = list(nodes)
            for pk in nodes:
                self.nodes.pop(pk, None)
                self.node_ids.pop(pk, None)
            self._nodes_from(cursor, "WHERE id = ANY(%s)", [nodes])
            # a GPU record carries its node's id: the node's GPUs are read again too
            cursor.execute("SELECT id FROM broker_gpu WHERE node_id = ANY(%s)", [nodes])
            gpus.update(pk for (pk,) in cursor.fetchall())  # (a GPU moved or deleted is a change of its own)
            self._nodes = None
        if gpus:
            gpus = list(gpus)
            for pk in gpus:
                self.gpus.pop(pk, None)
                self.switching.pop(pk, None)
            self._gpus_from(cursor, "AND id = ANY(%s)", [gpus])
            self._gpus = None
            # an allocation record carries its GPU's node, and a lost or closed GPU's allocations and warm members
            # leave the snapshot: those on these GPUs are read again
            cursor.execute("SELECT lease_id, id FROM broker_allocation WHERE gpu_id = ANY(%s) AND freed_at IS NULL",
                           [gpus])
            for lease_id, allocation_id in cursor.fetchall():
                if lease_id is None:
                    warm.add(allocation_id)
                else:
                    leases.add(lease_id)
            wanted = {f"g{pk}" for pk in gpus}
            warm.update(pk for pk, member in self.warm.items() if member.gpu in wanted)
        if leases:
            leases = list(leases)
            for pk in leases:
                self.leases.pop(pk, None)
                self._built.pop(pk, None)
            self._leases_from(cursor, "AND a.lease_id = ANY(%s)", [leases])
            self._allocations = None
        if warm:
            warm = list(warm)
            for pk in warm:
                self.warm.pop(pk, None)
            self._warm_from(cursor, "AND a.id = ANY(%s)", [warm])

    def _nodes_from(self, cursor, where: str, params: list) -> None:
        from broker.scheduler import Node as CoreNode

        cursor.execute(_NODE_SQL.format(where=where), params)
        # the host's CPU and memory its agent reported (0: not tracked): leases' host CPU and memory are placed in them
        for pk, node_id, cordoned, status, cpu_milli, memory_mib, pool in cursor.fetchall():
            self.nodes[pk] = CoreNode(node_id, cpu_milli, memory_mib, cordoned=cordoned or status != NodeStatus.READY,
                                      pool=pool)
            self.node_ids[pk] = node_id

    def _gpus_from(self, cursor, where: str, params: list) -> None:
        from broker.scheduler import Gpu as CoreGpu
        from broker.scheduler import GpuMode as CoreMode

        modes = {mode.value: mode for mode in CoreMode}
        node_ids = self.node_ids
        cursor.execute(_GPU_SQL.format(where=where), params)
        # a GPU whose mode the capacity loop is changing takes no new work until the agent has switched it
        # memory_mib: the usable memory the node's agent reported (shares are sized on it, not the nameplate)
        for pk, node, model, mode, index, nvlink_domain, target, memory_mib in cursor.fetchall():
            self.gpus[pk] = (CoreGpu(f"g{pk}", node_ids[node], model, modes[mode], index, nvlink_domain,
                                     bool(target), memory_mib), node)
            if target:  # the mode it is being switched to (the core waits for it rather than reclaim again)
                self.switching[pk] = target
            else:
                self.switching.pop(pk, None)

    def _leases_from(self, cursor, where: str, params: list) -> None:
        from broker.scheduler import Unit

        cursor.execute(_allocation_sql(where), [LeaseState.PREEMPTED, *params])
        leases = self.leases
        for row in cursor.fetchall():  # per lease: its first allocation's id and row, its units
            unit = Unit(f"g{row[1]}", row[2], row[3], row[4], row[5] if row[5] is not None else -1)
            held = leases.get(row[0])
            if held is None:
                leases[row[0]] = (row[13], row, [unit])
            else:
                held[2].append(unit)

    def _warm_from(self, cursor, where: str, params: list) -> None:
        from broker.scheduler import WarmInstance

        cursor.execute(_WARM_SQL.format(where=where), [AllocationState.WARM, AllocationState.PENDING, *params])
        for pk, gpu_id, profile, start, state in cursor.fetchall():
            self.warm[pk] = WarmInstance(str(pk), f"g{gpu_id}", profile, start, state == AllocationState.WARM)

    # -- the snapshot -------------------------------------------------------------------------------------------
    def _snapshot(self, now: datetime):
        from broker.scheduler import Allocation as CoreAllocation
        from broker.scheduler import Snapshot

        if self._nodes is None:
            self._nodes = tuple(self.nodes[pk] for pk in sorted(self.nodes))
        if self._gpus is None:
            self._gpus = tuple(self.gpus[pk][0] for pk in sorted(self.gpus))
        now_seconds = now.timestamp()
        built, gpus = self._built, self.gpus
        if self._allocations is None:
            dated = []
            for pk, (first, head, units) in self.leases.items():
                allocation = built.get(pk)
                if allocation is None:
                    gpu_id, tier, preemptible, project_id, tenant_id, started_at, priority, group_key = (
                        head[1], *head[6:13])
                    cpu_per_unit, memory_per_unit = head[14], head[15]  # the host CPU and memory it holds per unit
                    allocation = CoreAllocation(
                        id=str(pk), project=str(project_id), tenant=str(tenant_id), tier=tier,
                        node=gpus[gpu_id][0].node,
                        units=tuple(units),
                        preemptible=preemptible, started_at=now_seconds if started_at is None else started_at,
                        priority=priority, group=core_group(tenant_id, group_key),
                        cpu_milli=cpu_per_unit * len(units), host_memory_mib=memory_per_unit * len(units),
                        # an elastic lease (whole GPUs or shares) may give back units down to its minimum
                        min_units=head[16] if not head[4] else 0,
                        # an ACTIVE elastic lease shrunk below its count grows back toward it (``Scheduler._grow``)
                        grow_to=head[17] if head[16] and not head[4] and head[19] == LeaseState.ACTIVE else 0,
                        grow_spread=not head[18])
                    if started_at is not None:  # one without a start is dated by the cycle's clock: built anew
                        built[pk] = allocation
                dated.append((first, allocation))
            dated.sort(key=lambda item: item[0])
            allocations = tuple(allocation for _, allocation in dated)
            if len(built) == len(self.leases):
                self._allocations = allocations
        else:
            allocations = self._allocations
        quotas, tenant_quotas = snapshot_quotas()
        cohorts, project_pools, min_runtime_by_tenant = snapshot_tenancy(now=now)
        prices = tier_prices(now=now)
        return Snapshot(nodes=self._nodes, gpus=self._gpus, allocations=allocations, quotas=quotas,
                        tenant_quotas=tenant_quotas, min_runtime_seconds=settings.LEASE_MIN_RUNTIME_SECONDS,
                        cohorts=cohorts, project_pools=project_pools, min_runtime_by_tenant=min_runtime_by_tenant,
                        warm=tuple(self.warm[pk] for pk in sorted(self.warm)), prices=prices,
                        price_labels=tier_price_labels(prices),
                        group_reserve_after_seconds=settings.LEASE_GROUP_RESERVE_AFTER_SECONDS,
                        switching={f"g{pk}": target for pk, target in sorted(self.switching.items())})

    # -- pruning ------------------------------------------------------------------------------------------------
    def prune(self, *, wall: float) -> int:
        """Delete changes older than ``PRUNE_AFTER_SECONDS`` (at most once a ``PRUNE_EVERY_SECONDS`` per process),
        recording the highest transaction id deleted: a cache that may not have seen those reads whole. Run by
        the cycle, under its lock."""
        if wall - self.last_prune < PRUNE_EVERY_SECONDS:
            return 0
        self.last_prune = wall
        with connection.cursor() as cursor:
            cursor.execute(
                "WITH gone AS (DELETE FROM broker_snapshotchange WHERE at < now() - make_interval(secs => %s) "
                "RETURNING xid) UPDATE broker_snapshotepoch SET pruned_xid = GREATEST(pruned_xid, m.xid) "
                "FROM (SELECT max(xid) AS xid, count(*) AS n FROM gone) m WHERE m.xid IS NOT NULL RETURNING m.n",
                [PRUNE_AFTER_SECONDS])
            row = cursor.fetchone()
        return row[0] if row else 0


def snapshot_read(*, now: datetime):
    """The snapshot read whole now, nothing kept (``selectors.scheduler_snapshot``)."""
    cache = SnapshotCache()
    with connection.cursor() as cursor:
        cache._read_whole(cursor)
    return cache._snapshot(now)


_cache = SnapshotCache()


def snapshot_cache() -> SnapshotCache:
    """This process's kept snapshot (the schedule cycle brings it up to date with ``load``)."""
    return _cache


# -- what the snapshot reads besides the fleet -----------------------------------------------------------------
def core_group(tenant_id: int, group_key: str | None) -> str:
    """The core's group of a lease: its key within its tenant (two tenants' keys never meet); "" alone."""
    return f"{tenant_id}:{group_key}" if group_key else ""


def snapshot_quotas() -> tuple[tuple, tuple]:
    """The project and tenant quotas as the core's records (small: read every cycle)."""
    from broker.scheduler import QuotaSpec, TenantQuotaSpec
    from tenants.models import Quota, TenantQuota

    quotas = tuple(QuotaSpec(str(project_id), str(tenant_id), tier, deserved, limit, weight)
                   for project_id, tenant_id, tier, deserved, limit, weight in Quota.objects.values_list(
                       "project_id", "project__tenant_id", "tier", "deserved_gpu_milli", "limit_gpu_milli",
                       "over_quota_weight"))
    # the cohort limits: -1 for none (null)
    tenant_quotas = tuple(TenantQuotaSpec(str(tenant_id), tier, deserved, limit,
                                          -1 if lending is None else lending, -1 if borrowing is None else borrowing)
                          for tenant_id, tier, deserved, limit, lending, borrowing in TenantQuota.objects.values_list(
                              "tenant_id", "tier", "deserved_gpu_milli", "limit_gpu_milli",
                              "lending_limit_gpu_milli", "borrowing_limit_gpu_milli"))
    return quotas, tenant_quotas


def snapshot_tenancy(*, now: datetime) -> tuple[dict, dict, dict]:
    """What the core reads of tenants besides quotas (small: read every cycle): each cohort member's cohort
    (tenant id -> cohort name), the node pools of the projects bound to some (project id -> pools), and the
    minimum runtime of the tenants whose SLO contract in force sets one (tenant id -> seconds)."""
    from django.db.models import Q

    from tenants.models import Project, SloContract, Tenant

    cohorts = {str(pk): name for pk, name in Tenant.objects.filter(cohort__isnull=False).values_list(
        "pk", "cohort__name")}
    pools = {str(pk): tuple(found) for pk, found in Project.objects.exclude(pools=[]).values_list("pk", "pools")}
    runtimes = {str(tenant_id): float(seconds) for tenant_id, seconds in SloContract.objects.filter(
        Q(effective_to__isnull=True) | Q(effective_to__gt=now), effective_from__lte=now,
        min_runtime_seconds__isnull=False).values_list("tenant_id", "min_runtime_seconds")}
    return cohorts, pools, runtimes


def tier_prices(*, now: datetime) -> dict[str, int]:
    """Whole-GPU price per hour per model, in minor units: what ``model: auto`` ranks models by (cheapest per unit
    of work first) and names in its reasons. Billing provides them (``broker.extensions.list_prices_register``:
    the general price book in force, in ``LIST_PRICE_CURRENCY``); a tenant's own book may differ, the ranking
    follows the list prices. Empty without a book (or without billing)."""
    from broker.extensions import list_prices

    return list_prices(now)


def tier_price_labels(prices: dict[str, int]) -> dict[str, str]:
    """``tier_prices`` as people read them, with their currency and its decimals (``{"L4": "0.80 USD"}``):
    billing's money format through ``broker.extensions.money_format``."""
    from broker.extensions import money_format

    return {tier: money_format(minor, settings.LIST_PRICE_CURRENCY) for tier, minor in prices.items()}
