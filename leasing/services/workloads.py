"""Workloads on leases (docs/leasing.md, "Workloads"): starting a lease's workload on its node once the lease is
ACTIVE, recording what the agent reports as lease events, ending or requeueing the lease when its workload
ends, stopping it on release, and reading its logs.

Each placement of a lease runs the workload under its own agent workload id, ``lease-<lease>-a<first
allocation>``, so a start task that runs twice asks the agent for the same thing (the agent answers it as
it is). The first placement runs with ``RESTART_COUNT=0``; a placement after a preemption with the last
reported ``RESTART_COUNT`` + 1 and the same checkpoint directory. Agent calls happen outside transactions.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from config.errors import NotFound
from leasing.choices import AllocationState, LeaseState
from leasing.models import Lease, LeaseEvent, Node, Workload
from leasing.services.provisioning import agent_client, release_instances_quietly
from leasing.services.transitions import allocations_free, lease_release
from leasing.services.triggers import enqueue

logger = logging.getLogger(__name__)
RUNNING = ("starting", "running", "backoff")
ENDED = ("succeeded", "failed", "stopped", "preempted")


def workloads_start_after(lease_ids: list[int]) -> None:
    """Ask for the workload start of these (now ACTIVE) leases that have one, after commit."""
    for lease_id in Workload.objects.filter(lease_id__in=lease_ids).values_list("lease_id", flat=True):
        enqueue("lease_workload_start_run", lease_id)


def lease_workload_start(*, lease_id: int) -> str:
    """Start the lease's workload on its node (idempotent per placement). Returns the workload's state. A
    refusal by the agent (4xx: a path outside the node's roots, an image on a process node) fails the lease
    with the reason; an unreachable node raises ``AgentUnreachable`` (the task retries)."""
    from agent.client import AgentHTTPError

    workload = Workload.objects.select_related("lease").filter(lease_id=lease_id).first()
    if workload is None or workload.lease.state != LeaseState.ACTIVE:
        return workload.state if workload else "none"
    allocations = list(workload.lease.allocations.filter(freed_at__isnull=True, state=AllocationState.READY)
                       .select_related("gpu__node").order_by("pk"))
    if not allocations:
        return workload.state
    node = allocations[0].gpu.node
    agent_id = f"lease-{lease_id}-a{allocations[0].pk}"
    if workload.agent_workload_id != agent_id:  # a new placement: claim it once
        restart_count = workload.restart_count + 1 if workload.placements else 0
        Workload.objects.filter(pk=workload.pk, agent_workload_id=workload.agent_workload_id).update(
            agent_workload_id=agent_id, node=node, placements=workload.placements + 1, restart_count=restart_count,
            state="starting", reported_seq=0, exit_code=None, signal=None, ended_at=None)
        workload.refresh_from_db()
        if workload.agent_workload_id != agent_id:
            return workload.state  # another run of this task claimed it
    body = {**workload.spec, "instances": [a.instance_id for a in allocations], "restart_count": workload.restart_count}
    try:
        answer = agent_client(node).workload_start(agent_id, body)
    except AgentHTTPError as error:
        detail = error.problem.get("detail") or str(error)
        Workload.objects.filter(pk=workload.pk).update(state="failed", ended_at=timezone.now())
        lease_release(lease=workload.lease, actor=f"agent:{node.node_id}", final=LeaseState.FAILED,
                      reason=f"the node refused the workload ({detail})")
        return "failed"
    logger.info("lease %s: workload %s on %s: %s", lease_id, agent_id, node.node_id, answer["state"])
    return answer["state"]


def _at(seconds: object) -> datetime:
    return datetime.fromtimestamp(float(seconds), tz=UTC)


def describe(event: dict) -> str:
    """One agent event as a lease event's reason."""
    kind, run = event.get("kind"), event.get("run")
    if kind in ("started", "restarted"):
        why = " after a failure" if kind == "restarted" else ""
        return (f"workload {kind}{why} (run {run}, pid {event.get('pid')}, "
                f"RESTART_COUNT={event.get('restart_count')})")
    if kind == "exited":
        how = (f"with status {event['exit_code']}" if event.get("exit_code") is not None
               else f"killed by signal {event['signal']}" if event.get("signal") else "without a status")
        return f"workload exited {how} (run {run}){': ' + event['detail'] if event.get('detail') else ''}"
    if kind == "notice":
        return (f"workload notified: SIGTERM now, SIGKILL at "
                f"{_at(event['deadline']).isoformat(timespec='seconds')}")
    if kind == "signalled":
        return f"workload sent {event.get('signal')} (run {run})"
    if kind == "killed":
        return f"workload killed with SIGKILL at the deadline (run {run})"
    if kind == "backoff":
        return f"workload restarts in {event.get('seconds')} s (failure restart {event.get('restart')})"
    if kind == "stop_requested":
        return f"workload stop requested ({event.get('detail', '')}), grace {event.get('grace_seconds')} s"
    detail = event.get("detail")
    return f"workload {kind}{': ' + detail if detail else ''}"


def workloads_report(*, node: Node, reports: object, now: datetime | None = None) -> dict[str, int]:
    """Record what a node's agent reports of its workloads (``POST /api/v1/agents/{node}/workloads``): each
    event not yet recorded becomes a lease event (at the agent's time), the workload row follows the report,
    and a workload that ended ends or requeues its lease. Returns the last recorded event per workload id
    (the agent's acknowledgement). Only this node's current placements are recorded; another node's or a
    stale placement's reports are acknowledged and ignored."""
    now = now or timezone.now()
    acked: dict[str, int] = {}
    if not isinstance(reports, list):
        return acked
    for report in reports[:100]:
        if not isinstance(report, dict) or not isinstance(report.get("workload_id"), str):
            continue
        agent_id = report["workload_id"]
        events = sorted((e for e in report.get("events") or []
                         if isinstance(e, dict) and isinstance(e.get("seq"), int) and "at" in e),
                        key=lambda e: e["seq"])
        acked[agent_id] = max((e["seq"] for e in events), default=0)
        with transaction.atomic(durable=True):
            workload = (Workload.objects.select_for_update().select_related("lease")
                        .filter(agent_workload_id=agent_id, node=node).first())
            if workload is None:
                continue
            new = [e for e in events if e["seq"] > workload.reported_seq]
            if not new:
                continue
            lease = workload.lease
            LeaseEvent.objects.bulk_create(
                LeaseEvent(lease=lease, from_state=lease.state, to_state=lease.state, reason=describe(e)[:2000],
                           actor=f"agent:{node.node_id}", at=min(_at(e["at"]), now)) for e in new)
            runs = [r for r in report.get("runs") or [] if isinstance(r, dict)]
            last = runs[-1] if runs else {}
            state = report.get("state") if report.get("state") in (*RUNNING, *ENDED) else workload.state
            workload.state, workload.reported_seq = state, new[-1]["seq"]
            if isinstance(report.get("restart_count"), int):
                workload.restart_count = max(workload.restart_count, report["restart_count"])
            if runs and workload.started_at is None and runs[0].get("started_at"):
                workload.started_at = _at(runs[0]["started_at"])
            if state in ENDED:
                workload.exit_code, workload.signal = last.get("exit_code"), last.get("signal")
                workload.ended_at = _at(last["ended_at"]) if last.get("ended_at") else now
            workload.save(update_fields=["state", "reported_seq", "restart_count", "started_at", "exit_code",
                                         "signal", "ended_at"])
        if state in ENDED:
            _workload_ended(workload, node)
    return acked


def _workload_ended(workload: Workload, node: Node) -> None:
    """A workload that ended ends its lease at its end (billing stops there); one that stopped at a notice
    frees the capacity at once and requeues the lease (or ends it, with ``restart_policy: never``)."""
    lease = Lease.objects.get(pk=workload.lease_id)
    at = min(workload.ended_at or timezone.now(), timezone.now())
    actor = f"agent:{node.node_id}"
    if workload.state == "preempted" and lease.state == LeaseState.PREEMPTED:
        if workload.spec.get("restart_policy") == "never":
            lease_release(lease=lease, actor=actor, now=at, reason="the workload stopped at its preemption notice; "
                          "restart_policy never: the lease ends")
            return
        release_instances_quietly(lease)
        allocations_free(lease=lease, now=at, to=LeaseState.QUEUED, actor=actor,
                         reason="preempted: the workload stopped; requeued, it restarts when capacity frees")
    elif workload.state in ("succeeded", "failed") and lease.state == LeaseState.ACTIVE:
        code = (f"status {workload.exit_code}" if workload.exit_code is not None
                else f"signal {workload.signal}" if workload.signal else "no status")
        final = LeaseState.RELEASED if workload.state == "succeeded" else LeaseState.FAILED
        lease_release(lease=lease, actor=actor, now=at, final=final,
                      reason=f"the workload {workload.state} (exit {code}); the lease ends")


def workload_stop_for_release(*, lease: Lease) -> None:
    """Before a lease's instances are destroyed: a running workload gets SIGTERM and the grace
    (``WORKLOAD_STOP_GRACE_SECONDS``) to end, then the destroy kills whatever is left."""
    from agent.client import AgentHTTPError, AgentUnreachable

    workload = Workload.objects.filter(lease=lease).select_related("node").first()
    if workload is None or workload.state not in RUNNING or workload.node is None:
        return
    client = agent_client(workload.node)
    grace = settings.WORKLOAD_STOP_GRACE_SECONDS
    try:
        client.workload_stop(workload.agent_workload_id, grace_seconds=grace, reason=lease.reason or "released")
        deadline = time.monotonic() + grace + 1
        while time.monotonic() < deadline and client.workload(workload.agent_workload_id)["state"] in RUNNING:
            time.sleep(0.2)
    except (AgentHTTPError, AgentUnreachable) as error:
        logger.warning("lease %s: workload not stopped gracefully (%s)", lease.pk, error)


def workload_logs(*, lease: Lease, stream: str = "stdout", offset: int | None = None, tail: int | None = None,
                  limit: int = 64 * 1024, follow_seconds: float = 0) -> dict:
    """A range of the lease's workload log (its current placement) from its node: from ``offset`` or the
    last ``tail`` bytes. With ``follow_seconds`` it waits (bounded by ``WORKLOAD_LOG_FOLLOW_SECONDS``) until
    there are bytes beyond ``offset`` or the workload has ended. ``lease`` is the caller's (selectors
    restrict it to the tenant), so a tenant only ever reads its own workloads' bytes."""
    from agent.client import AgentHTTPError

    workload = Workload.objects.filter(lease=lease).select_related("node").first()
    if workload is None:
        raise NotFound("This lease has no workload.", field="id")
    if not workload.agent_workload_id or workload.node is None:
        return {"lease": lease.pk, "stream": stream, "offset": 0, "next_offset": 0, "size": 0, "data": "",
                "state": workload.state, "node": None}
    client = agent_client(workload.node)
    deadline = time.monotonic() + min(follow_seconds, settings.WORKLOAD_LOG_FOLLOW_SECONDS)
    while True:
        try:
            answer = client.workload_logs(workload.agent_workload_id, stream=stream, offset=offset, tail=tail,
                                          limit=limit)
        except AgentHTTPError as error:
            if error.status == 404:
                raise NotFound("The workload's node no longer has its log.", field="id") from None
            raise
        if answer["data"] or answer["state"] not in ("running", "backoff") or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    answer.pop("workload_id", None)
    return {"lease": lease.pk, **answer, "node": workload.node.node_id, "restart_count": workload.restart_count}
