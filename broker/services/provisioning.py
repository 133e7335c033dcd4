"""Agent work, outside transactions: creating the instances of placed leases, recording what the agents made,
destroying instances on release, and preemption notices."""

from __future__ import annotations

import contextvars
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from broker.choices import (
    FINAL_STATES,
    AllocationState,
    GpuKind,
    LeaseState,
)
from broker.models import Allocation, Lease, LeaseEvent, Node, Workload
from broker.services.groups import allocations_free
from broker.services.transitions import insert_rows, lease_transition, update_each
from broker.services.triggers import enqueue

logger = logging.getLogger(__name__)
_GPU, _NODE = Allocation._meta.get_field("gpu"), Allocation._meta.get_field("gpu").related_model._meta.get_field("node")


# -- allocations -----------------------------------------------------------------------------------------
def allocation_spec(allocation: Allocation) -> dict:
    """The agent's ``PUT /v1/instances/{id}`` body for ``allocation``."""
    if allocation.kind == GpuKind.MIG:
        return {"kind": "mig", "gpu": allocation.gpu.uuid, "profile": allocation.mig_profile,
                "start": allocation.mig_start}
    if allocation.kind == GpuKind.SHARE:
        return {"kind": "share", "gpu": allocation.gpu.uuid, "milli": allocation.milli,
                "memory_mib": allocation.memory_mib}
    return {"kind": "whole", "gpu": allocation.gpu.uuid}


_AGENT_NAMES = re.compile(r"\b(allocation|workload) '([^']*)'")


def agent_detail_seen(detail: str, lease: Lease) -> str:
    """An agent's refusal (``detail`` of its problem) as the lease's tenant may read it in the lease's reason and
    events: the agent names what holds a GPU or a port ("GPU 0 is held by allocation 'alloc-7'", "host port 8080
    is taken by workload 'lease-41-a9'"), which may be another tenant's; a name not of this lease becomes "another
    lease's". The raw text stays in the log (staff)."""
    if not detail or not _AGENT_NAMES.search(detail):
        return detail
    own = {f"alloc-{pk}" for pk in Allocation.objects.filter(lease=lease).values_list("pk", flat=True)}  # instance_id

    def seen(match: re.Match) -> str:
        name = match.group(2)
        if name in own or name.startswith(f"lease-{lease.pk}-a"):  # its own instance, its own workload's runs
            return match.group(0)
        return f"{match.group(1)} of another lease"

    return _AGENT_NAMES.sub(seen, detail)


def agent_client(node: Node):
    from agent.protocol import AgentClient

    return AgentClient(node.address, node.node_id, node.secret, timeout=settings.AGENT_TIMEOUT_SECONDS, retries=1)


def allocation_ready(*, allocation: Allocation, instance: dict, now: datetime) -> bool:
    """Record what the agent created; when every allocation of the lease is ready, the lease is ACTIVE.
    False when the allocation was no longer pending (recorded before, or freed)."""
    return allocations_ready(items=[(allocation, instance)], now=now)["ready"] == 1


def allocations_ready(*, items: list[tuple[Allocation, dict]], now: datetime) -> dict[str, int]:
    """Record what the agents created, in one transaction: each allocation still pending becomes READY
    with its device; each lease still PROVISIONING whose live allocations are now all ready becomes ACTIVE
    until ``now`` + its duration, with its event. A member of a lease group waits at that point for its
    whole group: the members become ACTIVE together, in the transaction that records the last of their
    instances (one node's task may finish before another's), so a group never runs partly. The leases and
    their group siblings are locked first, in key order (as ``allocations_free`` does), so a release or a
    requeue racing this waits or wins cleanly. Returns how many allocations were recorded (``ready``) and
    how many leases became ACTIVE (``active``)."""
    instances = {allocation.pk: instance for allocation, instance in items}
    lease_ids = sorted({allocation.lease_id for allocation, _ in items})
    with transaction.atomic(durable=True):
        lock_ids = sorted(set(lease_ids) | _group_sibling_ids(lease_ids))
        leases = {lease.pk: lease for lease in Lease.objects.select_for_update().filter(pk__in=lock_ids)
                  .order_by("pk").only("pk", "state", "duration_seconds", "tenant_id", "group_key")}
        # the allocations still pending become READY with their devices: one statement, which names them
        made = [Allocation(pk=pk, state=AllocationState.READY, ready_at=now, device_uuid=one.get("device_uuid", ""),
                           gpu_instance_id=one.get("gpu_instance_id"), access=one.get("access", {}))
                for pk, one in sorted(instances.items())]
        recorded = update_each(Allocation, made, ["state", "ready_at", "device_uuid", "gpu_instance_id", "access"],
                               returning=True, state=AllocationState.PENDING)
        if not recorded:
            return {"ready": 0, "active": 0}
        unfinished = set(Allocation.objects.filter(lease_id__in=lock_ids, freed_at__isnull=True)
                         .exclude(state=AllocationState.READY).values_list("lease_id", flat=True))
        # a group waits while a member is still waiting to be placed or has instances not yet made
        # (or a member preempted meanwhile: the group is leaving, not starting)
        waiting_groups = {(lease.tenant_id, lease.group_key) for lease in leases.values() if lease.group_key and (
            lease.state in (LeaseState.REQUESTED, LeaseState.QUEUED, LeaseState.PREEMPTED)
            or (lease.state == LeaseState.PROVISIONING and lease.pk in unfinished))}
        starting = [lease for lease in leases.values()
                    if lease.state == LeaseState.PROVISIONING and lease.pk not in unfinished
                    and (lease.pk in lease_ids or lease.group_key)
                    and (lease.tenant_id, lease.group_key) not in waiting_groups]
        # the node of each lease starting: from the items where the caller read it (leases_provision does),
        # else one query (a group's siblings on other nodes, callers that did not read it)
        node_of = {allocation.lease_id: allocation.gpu.node.node_id for allocation, _ in items
                   if _GPU.is_cached(allocation) and _NODE.is_cached(allocation.gpu)}
        unknown = [lease.pk for lease in starting if lease.pk not in node_of]
        if unknown:
            node_of.update(Allocation.objects.filter(lease_id__in=unknown, freed_at__isnull=True)
                           .values_list("lease_id", "gpu__node__node_id"))
        # a group starts at the instant its last instance was recorded: another node's task may have taken the
        # locks before this one with a later clock reading than this one's ``now``
        group_of = {lease.pk: (lease.tenant_id, lease.group_key) for lease in starting if lease.group_key}
        latest: dict[tuple, datetime] = {}
        if group_of:
            for lease_id, ready_at in Allocation.objects.filter(lease_id__in=group_of, freed_at__isnull=True) \
                    .values_list("lease_id", "ready_at"):
                key = group_of[lease_id]
                latest[key] = max(latest.get(key, ready_at), ready_at)
        active, events = [], []
        for lease in starting:
            reason = f"running on {node_of.get(lease.pk, 'its node')}"
            at = now
            if lease.group_key:
                reason += f" (lease group '{lease.group_key}': every member running)"
                at = max(now, latest.get((lease.tenant_id, lease.group_key), now))
            active.append(Lease(pk=lease.pk, state=LeaseState.ACTIVE, reason=reason, active_at=at,
                                ends_at=at + timedelta(seconds=lease.duration_seconds)))
            events.append((lease.pk, LeaseState.PROVISIONING.value, LeaseState.ACTIVE.value, reason, "worker", at))
        update_each(Lease, active, ["state", "reason", "active_at", "ends_at"])
        insert_rows(LeaseEvent, ["lease", "from_state", "to_state", "reason", "actor", "at"], events)
    if active:
        workloads_start_after([lease.pk for lease in active])
    logger.info("%d instances recorded, %d leases active", len(recorded), len(active))
    return {"ready": len(recorded), "active": len(active)}


def _group_sibling_ids(lease_ids: list[int]) -> set[int]:
    """The other members of the lease groups these leases belong to (not locked: the caller locks them)."""
    keys = set(Lease.objects.filter(pk__in=lease_ids, group_key__isnull=False).values_list("tenant_id", "group_key"))
    if not keys:
        return set()
    found = Lease.objects.none()
    for tenant_id, key in sorted(keys):
        found = found | Lease.objects.filter(tenant_id=tenant_id, group_key=key)
    return set(found.exclude(state__in=FINAL_STATES).values_list("pk", flat=True))


def lease_group_requeue(*, lease: Lease, reason: str, now: datetime) -> int:
    """A member of a lease group could not be provisioned (its node refused the instance, or never answered):
    the whole group goes back to the queue together, so a pipeline or a model split never runs partly. Every
    member still PROVISIONING has its instances destroyed (best effort: the reconcile destroys what an
    unreachable node keeps), then, in one transaction, its allocations freed and the lease QUEUED with a reason
    naming the member at fault; the next cycle places the group again whole or not at all. Members already
    past provisioning are left alone (none is ACTIVE while a member provisions: ``allocations_ready``).
    Returns how many leases were requeued."""
    members = list(Lease.objects.filter(tenant_id=lease.tenant_id, group_key=lease.group_key,
                                        state=LeaseState.PROVISIONING).order_by("pk"))
    for member in members:
        release_instances_quietly(member)
    requeued = 0
    with transaction.atomic(durable=True):
        for member in Lease.objects.select_for_update().filter(
                pk__in=[m.pk for m in members], state=LeaseState.PROVISIONING).order_by("pk"):
            member.allocations.filter(freed_at__isnull=True).update(state=AllocationState.FREED, freed_at=now)
            why = reason if member.pk == lease.pk else (
                f"requeued with lease {lease.pk} of its group '{lease.group_key}', which could not be provisioned "
                f"({reason})")
            lease_transition(lease=member, to=LeaseState.QUEUED, reason=why, actor="worker", now=now, queued_at=now,
                             tier="", over_quota=False, active_at=None, ends_at=None, notice_deadline=None)
            requeued += 1
        if requeued:
            enqueue("schedule_cycle")
    return requeued


# -- agent work (outside transactions) ----------------------------------------------------------------
def lease_provision(*, lease_id: int) -> str:
    """Create every pending instance of the lease on its node (idempotent). Returns the lease state."""
    leases_provision(lease_ids=[lease_id])
    return Lease.objects.values_list("state", flat=True).get(pk=lease_id)


# a provisioning task's agent calls made at once (one per node; a cycle sends a task per batch of nodes)
PROVISION_CONCURRENCY = 16


def _create_on_nodes(by_node: dict[int, list]) -> list[tuple[object, list, object]]:
    """(node, its allocations, the agent's answers or the exception its call raised) per node, in ``by_node``'s
    order: one ``create_many`` call per node, the calls made concurrently (threads: they wait on the network)
    when there are several nodes, each in a copy of this context (a trace's spans keep their parent). No
    database access in the threads."""
    from agent.protocol import AgentHTTPError, AgentUnreachable

    def call(allocations: list) -> object:
        node = allocations[0].gpu.node
        try:
            return agent_client(node).create_many({a.instance_id: allocation_spec(a) for a in allocations})
        except (AgentUnreachable, AgentHTTPError) as error:
            return error

    groups = list(by_node.values())
    if len(groups) <= 1:
        answers = [call(allocations) for allocations in groups]
    else:
        with ThreadPoolExecutor(max_workers=min(len(groups), PROVISION_CONCURRENCY)) as pool:
            futures = [pool.submit(contextvars.copy_context().run, call, allocations) for allocations in groups]
            answers = [future.result() for future in futures]
    return [(allocations[0].gpu.node, allocations, answer) for allocations, answer in zip(groups, answers,
                                                                                         strict=True)]


def leases_provision(*, lease_ids: list[int]) -> dict[str, int]:
    """Create the pending instances of these leases (idempotent): one batch call per node
    (``AgentClient.create_many``; several nodes' calls at once), then one transaction records them all
    (``allocations_ready``). A
    refusal (4xx) requeues that lease with the reason, its other instances destroyed. A node that does
    not answer (or answers 5xx) raises ``AgentUnreachable`` once what the other nodes made is recorded;
    running this again is harmless (the agent returns the instances it already made)."""
    from agent.protocol import AgentHTTPError, AgentUnreachable

    pending = (Allocation.objects.filter(lease_id__in=lease_ids, lease__state=LeaseState.PROVISIONING,
                                         state=AllocationState.PENDING).select_related("gpu__node").order_by("pk"))
    by_node: dict[int, list[Allocation]] = {}
    for allocation in pending:
        by_node.setdefault(allocation.gpu.node_id, []).append(allocation)
    ready, refused, unreachable = [], {}, []
    for node, allocations, answers in _create_on_nodes(by_node):
        if isinstance(answers, AgentUnreachable):
            unreachable.append(str(answers))
            continue
        if isinstance(answers, AgentHTTPError):  # the call as a whole refused
            error = answers
            answers = {a.instance_id: {"status": error.status, "problem": error.problem} for a in allocations}
        for allocation in allocations:
            answer = answers.get(allocation.instance_id) or {"status": 502, "problem": {"detail": "no answer"}}
            if answer["status"] < 300:
                ready.append((allocation, answer["instance"]))
            elif answer["status"] < 500:  # the agent refuses: retrying will not help
                refused.setdefault(allocation.lease_id, answer["problem"].get("detail"))
            else:
                unreachable.append(f"{node.node_id}: {allocation.instance_id}: {answer['problem'].get('detail')}")
    counts = {"active": 0, "requeued": 0}
    if ready:
        counts["active"] = allocations_ready(items=ready, now=timezone.now())["active"]
    for lease_id, detail in refused.items():
        lease = Lease.objects.get(pk=lease_id)
        logger.info("lease %s: the node refused the instance: %s", lease_id, detail)
        reason = f"the node refused the instance ({agent_detail_seen(detail, lease)}); requeued"
        if lease.group_key:  # its whole group goes back with it (the siblings' instances destroyed)
            counts["requeued"] += lease_group_requeue(lease=lease, reason=reason, now=timezone.now())
            continue
        release_instances_quietly(lease)  # what was already made for this lease goes
        allocations_free(lease=lease, now=timezone.now(), to=LeaseState.QUEUED, reason=reason)
        counts["requeued"] += 1
    if unreachable:
        raise AgentUnreachable("; ".join(unreachable))
    return counts


def leases_provision_give_up(*, lease_ids: list[int], reason: str) -> int:
    """After the last retry: the leases still provisioning free their allocations and wait again; a member of a
    lease group takes its whole group back to the queue with it (``lease_group_requeue``)."""
    count = 0
    for lease in Lease.objects.filter(pk__in=lease_ids, state=LeaseState.PROVISIONING).order_by("pk"):
        if lease.group_key:
            count += lease_group_requeue(lease=lease, reason=reason, now=timezone.now())
            continue
        allocations_free(lease=lease, now=timezone.now(), to=LeaseState.QUEUED, reason=reason)
        count += 1
    return count


def lease_release_instances(*, lease: Lease) -> None:
    """Destroy the agent instances of every live allocation (already gone is success)."""
    for allocation in lease.allocations.filter(freed_at__isnull=True).select_related("gpu__node"):
        agent_client(allocation.gpu.node).destroy(allocation.instance_id)


def allocations_destroy(*, allocation_ids: list[int]) -> int:
    """Destroy the agent instances of these allocations, already freed (a group member requeued while it was
    provisioning): best effort, an unreachable node's instance is an orphan the reconcile destroys. Returns how
    many destroy calls were answered."""
    from agent.protocol import AgentUnreachable

    done = 0
    for allocation in (Allocation.objects.filter(pk__in=allocation_ids).exclude(freed_at__isnull=True)
                       .select_related("gpu__node").order_by("pk")):
        try:
            agent_client(allocation.gpu.node).destroy(allocation.instance_id)
            done += 1
        except AgentUnreachable as error:
            logger.warning("allocation %s: instance not destroyed now (%s); the reconcile will", allocation.pk, error)
    return done


def release_instances_quietly(lease: Lease) -> None:
    """Best effort: an unreachable node keeps its instance until the reconcile destroys it as an orphan."""
    from agent.protocol import AgentUnreachable

    try:
        lease_release_instances(lease=lease)
    except AgentUnreachable as error:
        logger.warning("lease %s: instances not destroyed now (%s); the reconcile will", lease.pk, error)


def lease_notice(*, lease_id: int) -> None:
    lease = Lease.objects.get(pk=lease_id)
    # a preemption, or the capacity loop's idle notice on a running lease
    if lease.state not in (LeaseState.PREEMPTED, LeaseState.ACTIVE) or lease.notice_deadline is None:
        return
    for allocation in lease.allocations.filter(freed_at__isnull=True).select_related("gpu__node"):
        agent_client(allocation.gpu.node).notice(allocation.instance_id, lease.notice_deadline.timestamp(),
                                                 lease.reason)


def workloads_start_after(lease_ids: list[int]) -> None:
    """Ask for the workload start of these (now ACTIVE) leases that have one, after commit."""
    for lease_id in Workload.objects.filter(lease_id__in=lease_ids).values_list("lease_id", flat=True):
        enqueue("lease_workload_start_run", lease_id)
