"""Lease groups (a pipeline plan's stages, a model split's GPUs) run together or not at all. The cycle places a
group whole (``broker.scheduler.plan``), provisioning starts it whole (``provisioning.allocations_ready``) and
requeues it whole when a member cannot be provisioned (``provisioning.lease_group_requeue``). This module is the
other half: a member that stops while its siblings go on — preempted, or failed (its node lost, its instance
vanished) — takes them with it, whatever state they are in, so no part of a group is left running or billed:

- **preempted** (``lease_preempt``): the active siblings get the same notice and deadline; the siblings still
  provisioning are requeued at once (their allocations freed, their instances destroyed after commit), and the
  cycle places none of the group while a member is still leaving (``group_leaving``); at the deadline the
  preempted members are requeued and the group is placed again whole;
- **failed** (``allocations_free`` to FAILED): every other member is released — the queued ones at once, the
  holding ones through RELEASING (their instances destroyed by the worker), with a reason naming the member that
  failed.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import Q

from broker.choices import FINAL_STATES, AllocationState, LeaseState
from broker.models import Allocation, Lease
from broker.services.transitions import lease_transition, release_locked
from broker.services.triggers import enqueue


def group_siblings(lease: Lease):
    """The other members of the lease's group not yet final, locked in key order (inside a transaction)."""
    return (Lease.objects.select_for_update()
            .filter(tenant_id=lease.tenant_id, group_key=lease.group_key)
            .exclude(pk=lease.pk).exclude(state__in=FINAL_STATES).order_by("pk"))


def _requeue_provisioning(member: Lease, *, reason: str, actor: str, now: datetime) -> None:
    """A sibling still provisioning goes back to the queue now: its allocations freed in this transaction, the
    instances its node may have made destroyed after commit (what a node makes later is an orphan the reconcile
    destroys)."""
    live = list(member.allocations.filter(freed_at__isnull=True).values_list("pk", flat=True))
    Allocation.objects.filter(pk__in=live).update(state=AllocationState.FREED, freed_at=now)
    lease_transition(lease=member, to=LeaseState.QUEUED, reason=reason, actor=actor, now=now, queued_at=now,
                     tier="", over_quota=False, active_at=None, ends_at=None, notice_deadline=None,
                     queue_position=None)
    if live:
        enqueue("allocations_destroy_run", live)


def group_preempted(*, lease: Lease, actor: str, now: datetime, why: str, deadline: datetime) -> list[int]:
    """``lease`` (a group member) was just preempted with ``deadline``: the active siblings get the same notice
    and deadline (returned: their notices are to be sent), the provisioning ones are requeued now. Inside the
    caller's transaction."""
    noticed, requeued = [], 0
    with_group = f"with lease {lease.pk} of its group '{lease.group_key}'"
    until = f"notice until {deadline.isoformat(timespec='seconds')}"
    for sibling in group_siblings(lease):
        if sibling.state == LeaseState.ACTIVE:
            lease_transition(lease=sibling, to=LeaseState.PREEMPTED, actor=actor, now=now, notice_deadline=deadline,
                             reason=f"preempted {with_group} ({why}); {until}")
            noticed.append(sibling.pk)
        elif sibling.state == LeaseState.PROVISIONING:
            _requeue_provisioning(sibling, actor=actor, now=now, reason=(
                f"requeued {with_group}, preempted while this member was provisioning ({why}); the group is placed "
                "again whole once every member has left"))
            requeued += 1
    if requeued:
        enqueue("schedule_cycle")
    return noticed


def group_failed(*, lease: Lease, actor: str, now: datetime, why: str) -> int:
    """``lease`` (a group member) has failed: every other member is released (queued ones at once, holding ones
    through RELEASING and the worker). Inside the caller's transaction. Returns how many were released."""
    reason = f"released with lease {lease.pk} of its group '{lease.group_key}', which failed ({why})"
    count = 0
    for sibling in group_siblings(lease):
        if sibling.state != LeaseState.RELEASING:  # one already leaving is left to finish
            release_locked(lease=sibling, actor=actor, reason=reason, now=now)
            count += 1
    return count


def group_leaving(queued: list[Lease]) -> dict[tuple[int, str], int]:
    """Of the groups these queued leases belong to, those with a member still preempted (serving its notice):
    (tenant id, group key) -> that member's id. The cycle places none of such a group until it has left."""
    keys = {(lease.tenant_id, lease.group_key) for lease in queued if lease.group_key}
    if not keys:
        return {}
    where = Q()
    for tenant_id, key in keys:
        where |= Q(tenant_id=tenant_id, group_key=key)
    found: dict[tuple[int, str], int] = {}
    for pk, tenant_id, key in (Lease.objects.filter(where, state=LeaseState.PREEMPTED).order_by("pk")
                               .values_list("pk", "tenant_id", "group_key")):
        found.setdefault((tenant_id, key), pk)
    return found


def allocations_free(*, lease: Lease, now: datetime, to: str, reason: str, actor: str = "worker") -> Lease:
    """Free every live allocation of the lease and move it to ``to`` (QUEUED to retry, FAILED, RELEASED,
    EXPIRED) in one transaction; then trigger a schedule cycle."""
    with transaction.atomic(durable=True):
        lease = Lease.objects.select_for_update().get(pk=lease.pk)
        if lease.state in FINAL_STATES:
            return lease
        lease.allocations.filter(freed_at__isnull=True).update(state=AllocationState.FREED, freed_at=now)
        extra = {"finished_at": now} if to in FINAL_STATES else {"queued_at": now, "tier": "", "over_quota": False}
        if to == LeaseState.QUEUED:
            extra.update(active_at=None, ends_at=None, notice_deadline=None)
        lease_transition(lease=lease, to=to, reason=reason, actor=actor, now=now, **extra)
        if to == LeaseState.FAILED and lease.group_key:  # a group does not run on without a failed member
            group_failed(lease=lease, actor=actor, now=now, why=reason)
        enqueue("schedule_cycle")
    return lease
