"""Elastic leases (``Lease.min_count``): a shrink decided by the schedule cycle (``DecisionMode.SHRINK``) applied to
the database — the units given back freed at once, a ``LeaseEvent`` active → active naming the old and new size,
audited — and, after commit, on the node: the workload told its new size (``GPUBROKER_UNITS`` file and SIGUSR1) and
the freed instances destroyed (docs/leasing.md "Elastic leases"). A growth (``DecisionMode.GROW``: a shrunk lease
takes units back when capacity frees) likewise: its allocations made, a ``resized`` event, audited; after commit the
instances made on the node and the workload told its new size and devices."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from broker.choices import AllocationState, LeaseState
from broker.models import Allocation, Lease, LeaseEvent
from broker.services.triggers import enqueue
from tenants.audit import audit_record

logger = logging.getLogger(__name__)

RESIZED = "resized"  # the first word of a resize event's reason (metering cuts the held interval there)


def lease_shrink(*, lease_id: int, units: tuple, claimant: int, now: datetime) -> list[int] | None:
    """Inside the cycle's transaction: the ACTIVE elastic lease ``lease_id`` gives back ``units`` (the core's
    ``Unit``s: GPU ``g<pk>``, milli, memory), its last placed allocations on those GPUs first, never below its
    ``min_count``. Returns the allocation ids freed, or None when nothing was done (the lease left ACTIVE, or what
    the cycle planned on is no longer what it holds: the claimant waits for the next cycle)."""
    lease = Lease.objects.select_for_update().filter(pk=lease_id).first()
    if lease is None or lease.state != LeaseState.ACTIVE or not lease.min_count:
        return None
    live = list(lease.allocations.filter(freed_at__isnull=True).order_by("-pk"))
    taken: list[Allocation] = []
    for unit in units:
        match = next((row for row in live if row not in taken and row.gpu_id == int(unit.gpu[1:])
                      and row.milli == unit.milli and row.memory_mib == unit.memory_mib), None)
        if match is None:
            return None
        taken.append(match)
    left = len(live) - len(taken)
    if left < lease.min_count:
        return None
    ids = sorted(row.pk for row in taken)
    Allocation.objects.filter(pk__in=ids).update(state=AllocationState.FREED, freed_at=now)
    whose = f"lease {claimant}" if Lease.objects.filter(pk=claimant, tenant_id=lease.tenant_id).exists() else (
        "another tenant")
    reason = (f"{RESIZED}: {len(live)} → {left} units for in-quota work ({whose}); gave back "
              f"{', '.join(f'alloc-{pk}' for pk in ids)}; its minimum is {lease.min_count}")
    LeaseEvent.objects.create(lease=lease, from_state=lease.state, to_state=lease.state, reason=reason,
                              actor="scheduler", at=now)
    Lease.objects.filter(pk=lease.pk).update(reason=f"running, {reason}")
    audit_record(tenant=lease.tenant, by=None, action="lease.resize", target=f"lease {lease.pk}",
                 data={"from_units": len(live), "to_units": left, "min_count": lease.min_count,
                       "allocations_freed": ids, "for": whose})
    enqueue("lease_shrink_run", lease.pk, ids)
    logger.info("lease %s shrunk from %d to %d units (%s)", lease.pk, len(live), left, ids)
    return ids


def lease_shrink_apply(*, lease_id: int, allocation_ids: list[int]) -> int:
    """After commit: each node of the freed instances is told to destroy them with ``resize`` — the workload that
    still holds other instances of the lease is told its new size and devices and signalled (SIGUSR1), not stopped
    (the node denies it the freed device and kills a process of it still holding it after its shrink grace:
    docs/agent-protocol.md);
    then a cycle is asked for, to place the claimant. Returns the
    destroy calls answered (best effort: an unreachable node's instance is an orphan the reconcile destroys)."""
    from agent.protocol import AgentUnreachable
    from broker.services.provisioning import agent_client
    from broker.services.triggers import schedule_cycle_request

    done = 0
    rows = (Allocation.objects.filter(pk__in=allocation_ids, lease_id=lease_id).exclude(freed_at__isnull=True)
            .select_related("gpu__node").order_by("pk"))
    for allocation in rows:
        try:
            agent_client(allocation.gpu.node).destroy(allocation.instance_id, resize=True)
            done += 1
        except AgentUnreachable as error:
            logger.warning("allocation %s: not given back on its node now (%s); the reconcile will", allocation.pk,
                           error)
    schedule_cycle_request()
    return done


def leases_shrunk_exist() -> bool:
    """Whether an ACTIVE elastic lease holds fewer units than its ``count`` (one the growth pass may grow back)."""
    live = Count("allocations", filter=Q(allocations__freed_at__isnull=True))
    return (Lease.objects.filter(state=LeaseState.ACTIVE, min_count__gt=0).annotate(live=live)
            .filter(live__lt=F("count")).exists())


def lease_grow(*, lease_id: int, decision, gpus: dict, now: datetime, fields: tuple, rows) -> list[int] | None:
    """Inside the cycle's transaction: the ACTIVE elastic lease ``lease_id``, shrunk below its ``count``, takes
    units back (``decision``: the core's ``DecisionMode.GROW``, its ``grown`` units; ``gpus``: the snapshot's GPUs by
    the core's id):
    their allocations made PENDING, as a placement makes them (over quota: preemptible), a ``LeaseEvent`` active →
    active "resized: 6 → 8 units (capacity freed); …" (metering cuts the held interval there: the units held after
    it are the new count), the lease's reason, audited ``lease.resize``; after commit the node creates the instances
    and the workload is told its new size and devices (``lease_grow_apply``). Returns the allocation ids made, or
    None when nothing was done (the lease left ACTIVE, it was resized since the cycle read it, or the database
    refuses a GPU: planned on capacity not yet vacated; the next cycle tries again)."""
    from broker.services.transitions import insert_rows

    # ``fields`` / ``rows``: the cycle's allocation columns and row builder, passed in (this module is imported by
    # the cycle, never the other way)

    lease = Lease.objects.select_for_update().filter(pk=lease_id).first()
    if lease is None or lease.state != LeaseState.ACTIVE or not lease.min_count:
        return None
    held = lease.allocations.filter(freed_at__isnull=True).count()
    units = decision.grown
    if not units or held + len(units) > lease.count:
        return None
    before = set(lease.allocations.values_list("pk", flat=True))
    added = replace(decision, allocation=replace(decision.allocation, units=units, preemptible=True))
    try:
        with transaction.atomic():
            insert_rows(Allocation, fields, sorted(rows(lease.pk, added, gpus, now), key=lambda row: row[1]))
    except IntegrityError:
        logger.info("lease %s: growth refused by the database (capacity not yet vacated)", lease.pk)
        return None
    ids = sorted(set(lease.allocations.values_list("pk", flat=True)) - before)
    size = held + len(ids)
    reason = (f"{RESIZED}: {held} → {size} units (capacity freed); took back "
              f"{', '.join(f'alloc-{pk}' for pk in ids)}; over quota, preemptible; it asked for {lease.count}")
    LeaseEvent.objects.create(lease=lease, from_state=lease.state, to_state=lease.state, reason=reason,
                              actor="scheduler", at=now)
    Lease.objects.filter(pk=lease.pk).update(reason=f"running, grew: {reason}")
    audit_record(tenant=lease.tenant, by=None, action="lease.resize", target=f"lease {lease.pk}",
                 data={"from_units": held, "to_units": size, "count": lease.count, "min_count": lease.min_count,
                       "allocations_added": ids, "for": "capacity freed"})
    enqueue("lease_grow_run", lease.pk, ids)
    logger.info("lease %s grew from %d to %d units (%s)", lease.pk, held, size, ids)
    return ids


def lease_grow_apply(*, lease_id: int, allocation_ids: list[int]) -> int:
    """After commit: the instances of the units a lease took back are created on their nodes (one batch call per
    node) and recorded READY; then the lease's workload, on its node, is told its new size and devices
    (``AgentClient.workload_grow``: its units file and SIGUSR1, the same path as a shrink). An instance the node
    refuses is freed again (the lease keeps what it had). Returns the instances recorded. A node that does not
    answer raises ``AgentUnreachable`` (the task retries; creating again is harmless)."""
    from agent.protocol import AgentHTTPError, AgentUnreachable
    from broker.models import WorkloadPlacement
    from broker.services.provisioning import _create_on_nodes, agent_client, allocations_ready

    pending = list(Allocation.objects.filter(pk__in=allocation_ids, lease_id=lease_id, freed_at__isnull=True,
                                             state=AllocationState.PENDING).select_related("gpu__node")
                   .order_by("pk"))
    by_node: dict[int, list[Allocation]] = {}
    for allocation in pending:
        by_node.setdefault(allocation.gpu.node_id, []).append(allocation)
    ready, refused, unreachable = [], [], []
    for node, allocations, answers in _create_on_nodes(by_node):
        if isinstance(answers, AgentUnreachable):
            unreachable.append(str(answers))
            continue
        if isinstance(answers, AgentHTTPError):
            answers = {a.instance_id: {"status": answers.status, "problem": answers.problem} for a in allocations}
        for allocation in allocations:
            answer = answers.get(allocation.instance_id) or {"status": 502, "problem": {"detail": "no answer"}}
            if answer["status"] < 300:
                ready.append((allocation, answer["instance"]))
            elif answer["status"] < 500:
                refused.append(allocation.pk)
            else:
                unreachable.append(f"{node.node_id}: {allocation.instance_id}")
    done = allocations_ready(items=ready, now=timezone.now())["ready"] if ready else 0
    if refused:
        Allocation.objects.filter(pk__in=refused, freed_at__isnull=True).update(state=AllocationState.FREED,
                                                                               freed_at=timezone.now())
    if unreachable:
        raise AgentUnreachable("; ".join(unreachable))
    # the workload (on its node) gets the new instances of that node
    placement = (WorkloadPlacement.objects.filter(workload__lease_id=lease_id, ended_at__isnull=True)
                 .select_related("node").order_by("-pk").first())
    if placement is not None:
        added = [allocation.instance_id for allocation, _ in ready if allocation.gpu.node_id == placement.node_id]
        if added:
            try:
                agent_client(placement.node).workload_grow(placement.agent_workload_id, added)
            except (AgentUnreachable, AgentHTTPError) as error:
                logger.warning("lease %s: workload not told of its new units (%s)", lease_id, error)
    return done



def lease_grow_give_up(*, lease_id: int, allocation_ids: list[int]) -> int:
    """After the last retry of ``lease_grow_apply``: the units still pending are freed again (the lease keeps what it
    held; the node's reconcile destroys any instance it made meanwhile). Returns how many."""
    return Allocation.objects.filter(pk__in=allocation_ids, lease_id=lease_id, freed_at__isnull=True,
                                     state=AllocationState.PENDING).update(state=AllocationState.FREED,
                                                                           freed_at=timezone.now())
