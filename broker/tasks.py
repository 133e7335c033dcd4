"""Celery tasks of the leasing flow: thin, idempotent, ids in, one service call each (STYLE.md)."""

from __future__ import annotations

import logging

from celery import shared_task
from django.utils import timezone

from agent.protocol import AgentUnreachable
from broker import services
from broker.choices import LeaseState, NodeStatus
from broker.models import Lease
from core.task_registry import tasks_register

logger = logging.getLogger(__name__)
AGENT_RETRIES = 4


def _backoff(retries: int) -> float:
    return min(30.0, 0.5 * 2**retries)


@shared_task(name="broker.schedule_cycle", acks_late=True)
def schedule_cycle() -> dict:
    return services.schedule_cycle()


@shared_task(name="broker.leases_provision_run", bind=True, acks_late=True, max_retries=AGENT_RETRIES)
def leases_provision_run(self, lease_ids: list[int]) -> dict:
    """The leases one schedule cycle placed on a batch of nodes (``cycle.provision_batches``): one agent call per
    node, the calls made at once, then one transaction."""
    try:
        return services.leases_provision(lease_ids=lease_ids)
    except AgentUnreachable as error:
        if self.request.retries < AGENT_RETRIES:
            raise self.retry(countdown=_backoff(self.request.retries)) from error
        return {"requeued": services.leases_provision_give_up(
            lease_ids=lease_ids, reason=f"the node did not answer ({error}); requeued")}


@shared_task(name="broker.lease_provision_run", bind=True, acks_late=True, max_retries=AGENT_RETRIES)
def lease_provision_run(self, lease_id: int) -> str:
    try:
        return services.lease_provision(lease_id=lease_id)
    except AgentUnreachable as error:
        if self.request.retries < AGENT_RETRIES:
            raise self.retry(countdown=_backoff(self.request.retries)) from error
        services.leases_provision_give_up(lease_ids=[lease_id], reason=f"the node did not answer ({error}); requeued")
        return Lease.objects.values_list("state", flat=True).get(pk=lease_id)


@shared_task(name="broker.lease_release_run", bind=True, acks_late=True, max_retries=AGENT_RETRIES)
def lease_release_run(self, lease_id: int, final: str = LeaseState.RELEASED) -> str:
    try:
        return services.lease_release_finish(lease_id=lease_id, final=final)
    except AgentUnreachable as error:
        if self.request.retries < AGENT_RETRIES:
            raise self.retry(countdown=_backoff(self.request.retries)) from error
        # give the capacity back anyway; the reconcile destroys the instance when the node answers again
        lease = Lease.objects.get(pk=lease_id)
        return services.allocations_free(lease=lease, now=timezone.now(), to=final,
                                         reason=f"released; the node did not answer ({error})").state


@shared_task(name="broker.allocations_destroy_run", acks_late=True)
def allocations_destroy_run(allocation_ids: list[int]) -> int:
    """The instances of a group member requeued while it was provisioning (best effort: the reconcile)."""
    return services.allocations_destroy(allocation_ids=allocation_ids)


@shared_task(name="broker.lease_shrink_run", acks_late=True)
def lease_shrink_run(lease_id: int, allocation_ids: list[int]) -> int:
    """The instances an elastic lease gave back: destroyed with its workload told its new size (best effort)."""
    return services.lease_shrink_apply(lease_id=lease_id, allocation_ids=allocation_ids)


@shared_task(name="broker.lease_grow_run", bind=True, acks_late=True, max_retries=AGENT_RETRIES)
def lease_grow_run(self, lease_id: int, allocation_ids: list[int]) -> int:
    """The instances of the units an elastic lease took back: created on their nodes, its workload told its new
    size. A node that does not answer: retried; after the last retry the units still pending are freed again."""
    try:
        return services.lease_grow_apply(lease_id=lease_id, allocation_ids=allocation_ids)
    except AgentUnreachable as error:
        if self.request.retries < AGENT_RETRIES:
            raise self.retry(countdown=_backoff(self.request.retries)) from error
        logger.warning("lease %s: the units it took back were not made (%s); freed again", lease_id, error)
        return services.lease_grow_give_up(lease_id=lease_id, allocation_ids=allocation_ids)


@shared_task(name="broker.lease_notice_run", bind=True, acks_late=True, max_retries=AGENT_RETRIES)
def lease_notice_run(self, lease_id: int) -> None:
    try:
        services.lease_notice(lease_id=lease_id)
    except AgentUnreachable as error:
        if self.request.retries < AGENT_RETRIES:
            raise self.retry(countdown=_backoff(self.request.retries)) from error
        logger.warning("preemption notice for lease %s not delivered: %s", lease_id, error)


@shared_task(name="broker.lease_workload_start_run", bind=True, acks_late=True, max_retries=AGENT_RETRIES)
def lease_workload_start_run(self, lease_id: int) -> str:
    """Start an ACTIVE lease's workload on its node (idempotent per placement)."""
    try:
        return services.lease_workload_start(lease_id=lease_id)
    except AgentUnreachable as error:
        if self.request.retries < AGENT_RETRIES:
            raise self.retry(countdown=_backoff(self.request.retries)) from error
        logger.warning("workload of lease %s not started: %s", lease_id, error)
        return "unreachable"


@shared_task(name="broker.workload_placement_log_keep_run", bind=True, acks_late=True, max_retries=AGENT_RETRIES)
def workload_placement_log_keep_run(self, placement_id: int) -> bool:
    """Keep the tail of an ended workload placement's logs on the broker (idempotent)."""
    try:
        return services.workload_placement_log_keep(placement_id=placement_id)
    except AgentUnreachable as error:
        if self.request.retries < AGENT_RETRIES:
            raise self.retry(countdown=_backoff(self.request.retries)) from error
        logger.warning("logs of workload placement %s not kept: %s", placement_id, error)
        return False


@shared_task(name="broker.lease_expire_due", acks_late=True)
def lease_expire_due(schedule: bool = True) -> dict:
    """Expire and preempt what is due. The periodic run (``schedule``) also enqueues one run at each distinct
    end time of the next period (``lease_expiries_upcoming``), which schedule nothing themselves: a lease is
    expired within a worker's latency of its end, not up to a period later (issue 29; billing stops at the end
    time whatever the lag)."""
    result = {"expired": services.lease_expire_due(), "preempted": services.lease_preempt_due()}
    if schedule:
        upcoming = services.lease_expiries_upcoming(now=timezone.now(), within_seconds=EXPIRE_PERIOD_SECONDS)
        for countdown in upcoming:
            lease_expire_due.apply_async((False,), countdown=countdown)
        result["scheduled"] = len(upcoming)
    return result


EXPIRE_PERIOD_SECONDS = 15.0  # the beat period of lease-expire (config/settings.py CELERY_BEAT_SCHEDULE)


@shared_task(name="broker.reconcile", acks_late=True)
def reconcile() -> dict:
    """Periodic: resume stuck leases, check heartbeats, reconcile every answering node."""
    from broker.models import Node

    totals = {"resumed": services.leases_resume_stuck(), "silent": services.nodes_check_heartbeats(),
              "orphans": 0, "vanished": 0, "unreachable": 0}
    for node in Node.objects.filter(status=NodeStatus.READY).order_by("pk"):
        try:
            found = services.node_reconcile(node=node)
        except AgentUnreachable:
            totals["unreachable"] += 1
            continue
        totals["orphans"] += found["orphans"]
        totals["vanished"] += found["vanished"]
    return totals


# the services send these by name (broker.services.triggers), without importing this module
tasks_register(
    "broker",
    schedule_cycle=schedule_cycle, leases_provision_run=leases_provision_run, lease_provision_run=lease_provision_run,
    lease_release_run=lease_release_run, allocations_destroy_run=allocations_destroy_run,
    lease_notice_run=lease_notice_run, lease_shrink_run=lease_shrink_run, lease_grow_run=lease_grow_run,
    lease_workload_start_run=lease_workload_start_run,
    workload_placement_log_keep_run=workload_placement_log_keep_run, lease_expire_due=lease_expire_due,
    reconcile=reconcile)
