"""Elastic leases (``Lease.min_count``): a shrink decided by the schedule cycle (``DecisionMode.SHRINK``) applied to
the database — the units given back freed at once, a ``LeaseEvent`` active → active naming the old and new size,
audited — and, after commit, on the node: the workload told its new size (``GPUBROKER_UNITS`` file and SIGUSR1) and
the freed instances destroyed (docs/leasing.md "Elastic leases")."""

from __future__ import annotations

import logging
from datetime import datetime

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
