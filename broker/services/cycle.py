"""The schedule cycle: snapshot → scheduling core → one transaction of decisions (placements, warm binds,
preemptions); provisioning and notices are enqueued after commit."""

from __future__ import annotations

import logging
import re
import time
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from broker import extensions
from broker.choices import (
    AllocationState,
    GpuKind,
    GpuMode,
    LeaseState,
)
from broker.models import Allocation, Lease, LeaseEvent
from broker.scheduler import DecisionMode
from broker.scheduler.collector import collector_paused
from broker.scheduler.estimate import estimated_starts
from broker.scheduler.plan import Scheduler
from broker.scheduler.pool_wait import pool_waits
from broker.selectors import (
    QueuedLease,
    core_request,
    lease_queue,
    queued_leases,
    scheduler_demand,
    scheduler_inputs,
)
from broker.services.elastic import lease_grow, lease_shrink, leases_shrunk_exist
from broker.services.fairshare import usage_history_record
from broker.services.groups import allocations_free, group_leaving, group_preempted
from broker.services.provisioning import release_instances_quietly, workloads_start_after
from broker.services.transitions import (
    SUSPENDED,
    ids_in,
    insert_rows,
    lease_transition,
    requeue_reason,
    update_columns,
    update_each,
)
from broker.services.triggers import cycle_flag_clear, enqueue, enqueue_each, schedule_cycle_request, task
from broker.snapshot import core_group, snapshot_cache
from gpus.mig import profile_get

logger = logging.getLogger(__name__)
ADVISORY_LOCK = 0x6770_7562  # "gpub": one schedule cycle at a time
QUEUE_LIMIT = 10_000  # queued leases one cycle reads (oldest first); the rest wait for the next cycle


def schedule_cycle(*, now: datetime | None = None) -> dict:
    """One cycle for the pool (serialised by a PostgreSQL advisory lock): snapshot → core → one
    transaction of decisions; provisioning (one task per node) and notices are enqueued after commit."""
    now = now or timezone.now()
    counts = {"placed": 0, "preempt": 0, "waiting": 0}
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ADVISORY_LOCK])
            if not cursor.fetchone()[0]:
                # a cycle is running: it looks again for what it did not see once it has committed
                return {**counts, "skipped": 1}
        # the collector paused while the cycle makes its objects (broker/scheduler/collector.py)
        with collector_paused():
            return _schedule_cycle_locked(now, counts)


def _schedule_cycle_locked(now: datetime, counts: dict) -> dict:
    """The cycle's body, in ``schedule_cycle``'s transaction with its lock held."""
    started = time.time()  # the lock is held from here to the commit: no other cycle runs meanwhile
    # suspended tenants' leases are held, never placed
    queued = queued_leases(lease_queue()[:QUEUE_LIMIT])  # plain rows (QueuedLease), not model instances
    grouped = {(lease.tenant_id, lease.group_key) for lease in queued if lease.group_key}
    if grouped and len(queued) == QUEUE_LIMIT:  # a group cut by the limit is read whole: placed whole or not
        queued += queued_leases(lease_queue().filter(group_key__in={key for _, key in grouped}).exclude(
            pk__in=ids_in(lease.pk for lease in queued)))
    seen = [lease.pk for lease in queued]
    transaction.on_commit(lambda: _cycle_again_if_new(seen))
    # a group with a member still serving its preemption notice is placed again only once that member has
    # left and is queued with the rest (else the others would start without it)
    leaving = group_leaving(queued)
    if leaving:
        held = [lease for lease in queued if (lease.tenant_id, lease.group_key) in leaving]
        for lease in held:
            member = leaving[(lease.tenant_id, lease.group_key)]
            lease.reason = (f"waiting: group '{lease.group_key}': lease {member} is serving its preemption "
                            "notice; the group is placed again whole once it has left")
            lease.queue_position = None
        update_each(Lease, held, ["reason", "queue_position"], state=LeaseState.QUEUED)
        queued = [lease for lease in queued if (lease.tenant_id, lease.group_key) not in leaving]
    if not queued and not (settings.LEASE_ELASTIC_GROW and leases_shrunk_exist()):
        return counts  # (an elastic lease shrunk below its count: a cycle with no request may grow it back)
    counts["seen"] = len(queued)
    # this process's snapshot kept since its last cycle, with only what changed since read again (by the
    # change log's transaction ids: broker/snapshot.py); read whole the first time and on any doubt
    cache = snapshot_cache()
    snapshot = cache.load(now=now)
    cache.prune(wall=started)
    # fair share with history (the decayed use moved on to now), the back-off's preemptions, the expiries
    snapshot = scheduler_inputs(snapshot, now=now, history=usage_history_record(snapshot=snapshot, now=now))
    by_id = {str(lease.pk): lease for lease in queued}
    shapes: dict = {}
    requests = [core_request(lease, shapes) for lease in queued]
    # the placement policy keeps room for the recent demand mix (the shapes asked lately), as in the simulator;
    # reservations come from the running leases' expiries
    scheduler = Scheduler(snapshot, workload=scheduler_demand(now=now), reservations=settings.LEASE_RESERVATIONS,
                          reserve_after_seconds=settings.LEASE_RESERVE_AFTER_SECONDS,
                          grow=settings.LEASE_ELASTIC_GROW)
    # whether the project's guarantee covers each lease counting the project's own requests ahead of it: recorded
    # once, on the first cycle that sees the lease, from the state as read (billing samples time to GPU by it)
    fresh = [lease for lease in queued if lease.guarantee_covered is None]
    new = {lease.pk for lease in fresh}
    if fresh:
        covered = scheduler.covered(requests)
        for lease in fresh:  # written with the lease's placement or its waiting reason below, else on its own
            lease.guarantee_covered = covered[str(lease.pk)]
    decisions = scheduler.schedule(requests, now=now.timestamp())
    # what waits gets an estimated start: the plan continued over the running leases' expiries (the working state
    # is this cycle's own; the placements below are written from the decisions)
    estimates = estimated_starts(scheduler, requests, decisions, now=now.timestamp(),
                                 budget=settings.LEASE_ESTIMATE_TRIES)
    # requests left waiting that an idle GPU of another mode would serve: the capacity loop is told (it runs its
    # planner soon rather than on its timer: issue 30); read on the working state the decisions left
    if extensions.pool_wait_listened():
        pools = pool_waits(scheduler, requests, decisions)
        if pools:
            counts["pool_wait"] = len(pools)
            extensions.pool_wait_tell(extensions.PoolWait(tuple((model, mode.value) for model, mode in pools), now))
    gpus = {gpu.id: gpu for gpu in snapshot.gpus}  # what the plan placed on: model, mode, node
    placements = [(by_id[d.request], d) for d in decisions if d.mode == DecisionMode.PLACED]
    placed, refused = _place_all(placements, gpus, now)
    counts["placed"] = len(placed)
    if refused:  # planned on capacity the database says is taken (not yet vacated, or a stale snapshot)
        counts["refused"] = len(refused)
    waiting = []
    for decision in decisions:
        lease = by_id[decision.request]
        estimate = None
        if decision.mode == DecisionMode.PLACED:
            if lease.pk not in refused:
                continue  # placed, or released since the cycle read it (its placement is undone)
            reason = "waiting: the capacity chosen is still being vacated; retrying next cycle"
        elif decision.mode == DecisionMode.PREEMPT:
            counts["preempt"] += 1
            notice = _preempt(decision, now)
            reason = _reclaim_reason(lease, decision)
            estimate = now + timedelta(seconds=notice)  # the victims' notice, at the longest
        elif decision.mode == DecisionMode.SWITCH:
            counts["switch"] = counts.get("switch", 0) + 1
            notice = _preempt(decision, now) if decision.victims else 0
            gpu_id, mode = decision.switch
            extensions.mode_switch_tell(extensions.ModeSwitchFor(
                gpu=int(gpu_id.lstrip("g")), to_mode=mode, leases=tuple(int(v) for v in decision.victims),
                lease=lease.pk, now=now))
            reason = _switch_reason(lease, decision, gpus[gpu_id].model)
            estimate = now + timedelta(seconds=notice)  # the victims' notice, at the longest, then the switch
        elif decision.mode == DecisionMode.SHRINK:
            counts["shrink"] = counts.get("shrink", 0) + 1
            reason = _shrink(lease, decision, now)
            estimate = None if reason.startswith("waiting: the elastic") else now
        else:
            counts["waiting"] += 1
            reason = _tenant_terms(decision.reason, lease)
            at = estimates.get(decision.request)
            estimate = None if at is None else datetime.fromtimestamp(at, tz=UTC)
        if (lease.reason, lease.queue_position, lease.estimated_start) != (reason, decision.queue_position,
                                                                            estimate) or lease.pk in new:
            lease.reason, lease.queue_position, lease.estimated_start = reason, decision.queue_position, estimate
            waiting.append(lease)
    # what waits, why, and when it may start: one statement for all whose reason, place or estimate changed, and for
    # those seen for the first time, with their guarantee's coverage (still queued only)
    update_each(Lease, waiting, ["reason", "queue_position", "estimated_start", "guarantee_covered"],
                state=LeaseState.QUEUED)
    # the coverage of the first-seen leases neither placed above nor left waiting (bound to warm instances: placed
    # by their own write)
    if fresh:
        written = set(placed).union(lease.pk for lease in waiting)
        unwritten = [lease for lease in fresh if lease.pk not in written]
        if unwritten:
            update_columns(Lease, [lease.pk for lease in unwritten],
                           {"guarantee_covered": [lease.guarantee_covered for lease in unwritten]})
    # last, as the core decided them: shrunk elastic leases take units back on what every request left idle
    for decision in scheduler.grown:
        if lease_grow(lease_id=int(decision.request), decision=decision, gpus=gpus, now=now,
                      fields=ALLOCATION_FIELDS, rows=_allocation_rows) is not None:
            counts["grow"] = counts.get("grow", 0) + 1
    # a cycle that decided something, with the span it held the lock (wall clock; the scale-out test checks
    # that no two of these overlap across scheduler workers: tests/deploy/test_scaleout.py)
    logger.info("schedule cycle ran from %.6f to %.6f: %s", started, time.time(), counts)
    return counts


def _tenant_terms(reason: str, lease: QueuedLease) -> str:
    """A core reason in the tenant's words: its project by slug, not by the core's internal id; a lease group by
    its key, its members (the core's requests) as leases — a group is one tenant's, so they are all its own; the
    leases a group would have reclaimed in the same cycle (any tenant's) its own by id, another tenant's counted."""
    reason = reason.replace(f"project {lease.project_id} ", f"project '{lease.project_slug}' ")
    if lease.group_key:
        reason = reason.replace(f"group {core_group(lease.tenant_id, lease.group_key)}", f"group '{lease.group_key}'")
        reason = re.sub(r"\brequest (\d+)\b", r"lease \1", reason)
        placed = _PLACED_THIS_CYCLE.search(reason)
        if placed:  # the leases a group would have reclaimed: any tenant's, so its own by id and the others counted
            ids = [int(part) for part in placed.group(1).split(", ")]
            own = set(Lease.objects.filter(pk__in=ids, tenant_id=lease.tenant_id).values_list("pk", flat=True))
            mine = [str(pk) for pk in ids if pk in own]
            others = len(ids) - len(mine)
            words = [f"lease {', '.join(mine)}"] if mine else []
            if others:
                words.append(f"{others} lease(s) of another tenant" if not mine else f"{others} of another tenant")
            reason = reason[:placed.start(1)] + " and ".join(words) + reason[placed.end(1):]
    return reason


# the core's words for a group that would reclaim what the same cycle placed (``Scheduler._try_group_now``)
_PLACED_THIS_CYCLE = re.compile(r"placed in this cycle \((\d+(?:, \d+)*)\)")


def _reclaim_reason(lease: QueuedLease, decision) -> str:
    """Why an in-quota request waits for a reclaim, naming only the tenant's own leases (another tenant's
    lease ids and projects are not its business)."""
    victims = list(Lease.objects.filter(pk__in=[int(v) for v in decision.victims]).values_list("pk", "tenant_id"))
    own = [str(pk) for pk, tenant_id in victims if tenant_id == lease.tenant_id]
    tier = decision.allocation.tier if decision.allocation else ""
    mine = f" (yours: lease {', '.join(own)})" if own else ""
    return (f"waiting: in quota on {tier}: {len(victims)} over-quota lease(s) given notice{mine}; starts when "
            "they have left")


def _switch_reason(lease: QueuedLease, decision, tier: str) -> str:
    """Why an in-quota request waits for a GPU of another mode to be switched for it, naming only the tenant's own
    leases among those given notice."""
    mode = "MIG" if decision.switch[1] == "mig" else decision.switch[1]
    if not decision.victims:
        return (f"waiting: in quota on {tier}: no room in {mode} mode; an idle {tier} GPU is being switched to {mode} "
                "mode for it")
    victims = list(Lease.objects.filter(pk__in=[int(v) for v in decision.victims]).values_list("pk", "tenant_id"))
    own = [str(pk) for pk, tenant_id in victims if tenant_id == lease.tenant_id]
    mine = f" (yours: lease {', '.join(own)})" if own else ""
    return (f"waiting: in quota on {tier}: no room in {mode} mode; a {tier} GPU is being emptied of {len(victims)} "
            f"over-quota lease(s) given notice{mine} and switched to {mode} mode for it; starts when it is done")


def _shrink(lease: QueuedLease, decision, now: datetime) -> str:
    """Apply a shrink decided for ``lease`` (``elastic.lease_shrink``: the units freed now, the node told after
    commit, a cycle asked for once it has answered) and say why the lease still waits, naming only the tenant's own
    lease shrunk (another tenant's lease ids are not its business)."""
    done = []
    for allocation_id, units in decision.shrunk:
        freed = lease_shrink(lease_id=int(allocation_id), units=units, claimant=lease.pk, now=now)
        if freed is None:
            return ("waiting: the elastic lease chosen to give back units has changed since the cycle read it; "
                    "retrying next cycle")
        done.append((int(allocation_id), len(freed)))
    tier = decision.allocation.tier if decision.allocation else ""
    own = [f"lease {pk} gave back {count}" for pk, count in done
           if Lease.objects.filter(pk=pk, tenant_id=lease.tenant_id).exists()]
    mine = f" (yours: {', '.join(own)})" if own else ""
    return (f"waiting: in quota on {tier}: an elastic over-quota lease gave back units{mine}; starts when its node "
            "has released them")


def _cycle_again_if_new(seen: list[int]) -> None:
    """After a cycle commits: requests queued while it ran (their trigger found the flag set, or the lock
    taken) get the next cycle."""
    cycle_flag_clear()
    if lease_queue().exclude(pk__in=ids_in(seen)).exists():
        schedule_cycle_request()


# an allocation row as the cycle writes it (``insert_rows``: one COPY), the other columns take their defaults
ALLOCATION_FIELDS = ["lease", "gpu", "tier", "kind", "mig_profile", "mig_start", "slots", "milli", "memory_mib",
                     "preemptible", "state", "device_uuid", "access", "created_at"]
EVENT_FIELDS = ["lease", "from_state", "to_state", "reason", "actor", "at"]
_MIG, _SHARE, _WHOLE = GpuKind.MIG.value, GpuKind.SHARE.value, GpuKind.WHOLE.value
_SHARED, _PENDING = GpuMode.SHARED.value, AllocationState.PENDING.value


def _allocation_rows(lease_id: int, decision, gpus: dict, now: datetime) -> list[tuple]:
    """The allocation rows (``ALLOCATION_FIELDS``) of a placement: tuples, not model instances. ``gpus``: the
    snapshot's GPUs by the core's id (``g<pk>``), whose model and mode the plan was made on."""
    allocation = decision.allocation
    rows = []
    for unit in allocation.units:
        gpu = gpus[unit.gpu]
        if unit.mig_profile:
            size = profile_get(gpu.model, unit.mig_profile).memory_slots
            slots, kind, start = f"[{unit.mig_start},{unit.mig_start + size})", _MIG, unit.mig_start
        elif gpu.mode.value == _SHARED:
            slots, kind, start = "empty", _SHARE, None
        else:
            slots, kind, start = "[0,8)", _WHOLE, None
        rows.append((lease_id, int(unit.gpu[1:]), allocation.tier, kind, unit.mig_profile or "", start, slots,
                     unit.milli, unit.memory_mib, allocation.preemptible, _PENDING, "", "{}", now))
    return rows


def _place_all(placements: list, gpus: dict, now: datetime) -> tuple[list[int], set[int]]:
    """Write the cycle's placements: (ids placed, ids whose capacity the database refused).

    All at once first — the leases still queued locked in key order, their allocations in one insert, their
    transitions in one update and one insert of events, in a savepoint. When the database refuses one
    allocation (capacity of a preempted lease not yet vacated: the exclusion constraint), the savepoint is
    undone and each lease is placed in a savepoint of its own, so only the refused ones wait."""
    if not placements:
        return [], set()
    try:
        with transaction.atomic():
            placed = _place_many(placements, gpus, now)
        return placed, set()
    except IntegrityError:
        pass
    placed, refused = [], set()
    units: dict[object, list] = {}  # a lease alone, or a lease group: placed in one savepoint, or none of it
    for lease, decision in placements:
        units.setdefault((lease.tenant_id, lease.group_key) if lease.group_key else lease.pk, []).append(
            (lease, decision))
    for unit in units.values():
        try:
            with transaction.atomic():
                placed += _place_many(unit, gpus, now)
        except IntegrityError:
            refused.update(lease.pk for lease, _ in unit)
    return placed, refused


def _place_many(placements: list, gpus: dict, now: datetime) -> list[int]:
    """Placements → PROVISIONING with their allocations and events (inside a transaction); leases no longer
    queued (released since the cycle read them) are skipped. Provisioning is enqueued per node on commit."""
    claimed = set(Lease.objects.select_for_update().filter(
        pk__in=ids_in(lease.pk for lease, _ in placements), state=LeaseState.QUEUED).order_by("pk")
        .values_list("pk", flat=True))
    partial = {(lease.tenant_id, lease.group_key) for lease, _ in placements
               if lease.group_key and lease.pk not in claimed}
    if partial:  # a member released since the cycle read it: its group is not placed without it this cycle
        raise IntegrityError(f"lease group(s) {sorted(key for _, key in partial)} changed since the cycle read them")
    rows, changed, events, by_node, warm = [], [], [], {}, []
    reasons, tiers, over_quota, covered = [], [], [], []  # per lease changed, its new column values
    provisioning, queued = LeaseState.PROVISIONING.value, LeaseState.QUEUED.value
    for lease, decision in placements:
        if lease.pk not in claimed:
            continue
        allocation = decision.allocation
        if decision.warm:  # warm pool members: bound below, no agent call
            warm.append((lease, decision))
            continue
        rows += _allocation_rows(lease.pk, decision, gpus, now)
        changed.append(lease.pk)
        reasons.append(decision.reason)
        tiers.append(allocation.tier)
        over_quota.append(allocation.preemptible)
        covered.append(lease.guarantee_covered)  # the cycle's record for a lease seen for the first time
        events.append((lease.pk, queued, provisioning, decision.reason, "scheduler", now))
        by_node.setdefault(gpus[allocation.units[0].gpu].node, []).append(lease.pk)
    # set-based: one COPY of the allocations, one UPDATE of the leases, one COPY of their events. The rows in
    # GPU key order, the order every writer of several GPUs' rows takes them in (node_inventory_sync)
    rows.sort(key=lambda row: row[1])
    insert_rows(Allocation, ALLOCATION_FIELDS, rows)
    update_columns(Lease, changed, {"state": [provisioning] * len(changed), "reason": reasons, "tier": tiers,
                                    "over_quota": over_quota, "queue_position": [None] * len(changed),
                                    "estimated_start": [None] * len(changed), "guarantee_covered": covered})
    insert_rows(LeaseEvent, EVENT_FIELDS, events)
    # a group member bound to warm instances starts only with its group: while a sibling is made the cold way it
    # stays PROVISIONING, and the sibling's instances being recorded starts them all (allocations_ready)
    cold_groups = {(lease.tenant_id, lease.group_key) for lease, decision in placements
                   if lease.group_key and lease.pk in claimed and not decision.warm}
    for lease, decision in warm:
        _bind_warm(lease, decision, gpus, now,
                   start=not (lease.group_key and (lease.tenant_id, lease.group_key) in cold_groups))
    enqueue_each("leases_provision_run", provision_batches(list(by_node.values())))
    logger.info("placed %d leases on %d nodes", len(changed), len(by_node))
    return changed


# provisioning tasks a cycle sends: one per batch of at most this many nodes (the task calls its nodes' agents at
# once: ``provisioning._create_on_nodes``), and one per node while there are few (a few nodes' leases are spread
# over the workers as before)
PROVISION_NODES_PER_TASK = 32
PROVISION_TASKS_AT_LEAST = 8


def provision_batches(per_node: list[list[int]]) -> list[list[int]]:
    """The lease ids of each provisioning task: consecutive nodes' ids together, ``max(⌈nodes / 32⌉,
    min(nodes, 8))`` tasks (1,918 nodes: 60 tasks instead of 1,918 messages)."""
    count = len(per_node)
    tasks = max(-(-count // PROVISION_NODES_PER_TASK), min(count, PROVISION_TASKS_AT_LEAST))
    batches: list[list[int]] = [[] for _ in range(tasks)]
    for position, lease_ids in enumerate(per_node):
        batches[position * tasks // count].extend(lease_ids)
    return batches


def _bind_warm(queued: QueuedLease, decision, gpus: dict, now: datetime, *, start: bool = True) -> None:
    """A placement on warm pool members: each member still warm (no lease, ready, live) becomes the lease's
    allocation by one conditional update, and the lease is ACTIVE at once — no agent call on the path. A
    member taken or removed since the cycle read it refuses the whole placement (IntegrityError: the
    caller's savepoint is undone and the lease waits for the next cycle). A lease group's member whose siblings
    are made the cold way (``start`` False) stays PROVISIONING and starts with them (``allocations_ready``)."""
    lease = Lease.objects.get(pk=queued.pk)  # locked QUEUED by the caller; the transitions take the model
    allocation = decision.allocation
    ids = [int(warm_id) for warm_id in decision.warm]
    bound = Allocation.objects.filter(pk__in=ids, lease__isnull=True, state=AllocationState.WARM,
                                      freed_at__isnull=True).update(
        lease=lease, tier=allocation.tier, preemptible=allocation.preemptible, state=AllocationState.READY,
        bound_at=now)
    if bound != len(ids):
        raise IntegrityError(f"warm instance(s) {decision.warm} were taken or removed since the cycle read them")
    extra = _allocation_rows(lease.pk, decision, gpus, now)[len(ids):]
    if extra:  # units beyond the warm members (a gang): placed the cold way, the lease provisions
        insert_rows(Allocation, ALLOCATION_FIELDS, extra)
    node = gpus[allocation.units[0].gpu].node
    reason = f"{decision.reason}; bound warm instance(s) {', '.join(f'alloc-{i}' for i in ids)}"
    lease_transition(lease=lease, to=LeaseState.PROVISIONING, reason=reason, actor="scheduler", now=now,
                     tier=allocation.tier, over_quota=allocation.preemptible, queue_position=None,
                     estimated_start=None)
    if extra:
        enqueue("leases_provision_run", [lease.pk])
        return
    if not start:
        return  # a lease group's member: it starts with the members still being provisioned
    lease_transition(lease=lease, to=LeaseState.ACTIVE, reason=f"running on {node} (warm instance)",
                     actor="scheduler", now=now, active_at=now, ends_at=now + timedelta(seconds=lease.duration_seconds))
    workloads_start_after([lease.pk])


def _preempt(decision, now: datetime) -> int:
    """Victims get a notice and a deadline — the notice their tenant's SLO contract promises, else
    ``LEASE_PREEMPTION_NOTICE_SECONDS`` — and at the deadline they are released and requeued."""
    longest = settings.LEASE_PREEMPTION_NOTICE_SECONDS
    claimant = Lease.objects.filter(pk=int(decision.request)).values_list("tenant_id", flat=True).first()
    for victim_id in decision.victims:
        victim = Lease.objects.select_for_update().filter(pk=int(victim_id)).first()
        if victim is None or victim.state != LeaseState.ACTIVE:
            continue
        # the victim learns which of its own tenant's leases claimed the GPU, never another tenant's
        whose = f"lease {decision.request}" if claimant == victim.tenant_id else "another tenant"
        notice = lease_preempt(lease=victim, actor="scheduler", now=now, why=f"for in-quota work ({whose})")
        longest = max(longest, notice)
    transaction.on_commit(lambda: task("lease_expire_due").apply_async(countdown=longest + 0.5))
    return longest


def lease_notice_seconds(*, tenant_id: int, now: datetime) -> int:
    """The preemption notice a tenant is promised: its SLO contract's, else ``LEASE_PREEMPTION_NOTICE_SECONDS``."""
    from tenants.models import SloContract

    contract = (SloContract.objects.filter(tenant_id=tenant_id, effective_from__lte=now)
                .filter(Q(effective_to__isnull=True) | Q(effective_to__gt=now)).first())
    return contract.preemption_notice_seconds if contract else settings.LEASE_PREEMPTION_NOTICE_SECONDS


def lease_preempt(*, lease: Lease, actor: str, now: datetime, why: str, notice_seconds: int | None = None) -> int:
    """An ACTIVE lease (locked by the caller, inside its transaction) becomes PREEMPTED with a deadline —
    ``notice_seconds`` or the tenant's promised notice — and the agent tells its instances; at the deadline
    ``lease_preempt_due`` releases and requeues it. Returns the notice given, in seconds."""
    notice = lease_notice_seconds(tenant_id=lease.tenant_id, now=now) if notice_seconds is None else notice_seconds
    deadline = now + timedelta(seconds=notice)
    until = f"notice until {deadline.isoformat(timespec='seconds')}"
    lease_transition(lease=lease, to=LeaseState.PREEMPTED, actor=actor, now=now, notice_deadline=deadline,
                     reason=f"preempted {why}; {until}")
    enqueue("lease_notice_run", lease.pk)
    if lease.group_key:
        # a lease group runs together or not at all: its other active members get the same notice and deadline
        # (``lease_preempt_due`` requeues them together, to be placed together again), and a member still
        # provisioning is requeued now rather than started alone (``groups.group_preempted``)
        for sibling_id in group_preempted(lease=lease, actor=actor, now=now, why=why, deadline=deadline):
            enqueue("lease_notice_run", sibling_id)
    return notice


def lease_suspend(*, lease: Lease, actor: str, now: datetime, why: str) -> int:
    """Suspend an idle ACTIVE lease whose workload can resume (locked by the caller, inside its transaction): it
    becomes PREEMPTED with the tenant's promised preemption notice as the workload's grace to checkpoint, and the
    agent tells its instances (SIGTERM now, the deadline in ``GPUB_DEADLINE_FILE``, SIGKILL at it). When the
    workload stops, or at the deadline, the lease is freed and requeued ("suspended while idle: resumes when
    capacity frees"); placed again, its workload restarts from its checkpoint directory (``RESTART_COUNT`` + 1).
    Metering stops where it leaves PREEMPTED: nothing is billed while it waits. Returns the grace, in seconds."""
    grace = lease_notice_seconds(tenant_id=lease.tenant_id, now=now)
    deadline = now + timedelta(seconds=grace)
    lease_transition(lease=lease, to=LeaseState.PREEMPTED, actor=actor, now=now, notice_deadline=deadline,
                     reason=f"{SUSPENDED} ({why}): the workload checkpoints until "
                            f"{deadline.isoformat(timespec='seconds')}, then the lease goes back to the queue")
    enqueue("lease_notice_run", lease.pk)
    return grace


def lease_preempt_due(*, now: datetime | None = None) -> int:
    """Preempted leases past their notice deadline: instances destroyed, lease back in the queue."""
    now = now or timezone.now()
    due = list(Lease.objects.filter(state=LeaseState.PREEMPTED, notice_deadline__lte=now).order_by("pk")[:500])
    for lease in due:
        release_instances_quietly(lease)
        allocations_free(lease=lease, now=timezone.now(), to=LeaseState.QUEUED, actor="broker",
                         reason=requeue_reason(lease, "preempted: requeued, restarts when capacity frees"))
    return len(due)


def schedule_cycle_wait() -> None:
    """Inside a transaction: wait until no schedule cycle runs, and keep cycles out until it commits (the
    cycle's advisory lock). Whatever a running cycle placed is committed when this returns."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ADVISORY_LOCK])


