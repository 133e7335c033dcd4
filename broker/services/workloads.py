"""Workloads on leases (docs/leasing.md, "Workloads"): starting a lease's workload on its node once the lease is
ACTIVE, recording what the agent reports as lease events, ending or requeueing the lease when its workload
ends, stopping it on release, and reading its logs.

Each placement of a lease runs the workload under its own agent workload id, ``lease-<lease>-a<first
allocation>``, so a start task that runs twice asks the agent for the same thing (the agent answers it as
it is), and has its ``WorkloadPlacement`` row: the node, the host port of an interactive workload
(allocated per node from ``WORKLOAD_HOST_PORTS``; a partial unique index refuses two live placements on one
node with the same port, so racing starts cannot share one), how it ended and, after it ended, the tail
of its logs (``workload_placement_log_keep``). The first placement runs with ``RESTART_COUNT=0``; a
placement after a preemption with the last reported ``RESTART_COUNT`` + 1 and the same checkpoint
directory. With ``restart_policy: on-failure`` the agent restarts a failing run on its node at most
``WORKLOAD_FAILED_RUNS_BEFORE_REPLACE`` - 1 times; then the lease is requeued to be placed on another
node (``Lease.avoid_nodes``), until ``max_restarts`` restarts in all are spent. Agent calls happen outside
transactions.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from django.conf import settings
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.utils import timezone

from broker.choices import AllocationState, LeaseState
from broker.models import Lease, LeaseEvent, Node, Workload, WorkloadPlacement
from broker.services.groups import allocations_free
from broker.services.provisioning import agent_client, agent_detail_seen, release_instances_quietly
from broker.services.transitions import lease_release, lease_transition, requeue_reason
from broker.services.triggers import enqueue
from broker.workload_secrets import secret_env_open
from core.errors import NotFound, TooManyRequests, ValidationFailed

logger = logging.getLogger(__name__)
RUNNING = ("starting", "running", "backoff")
ENDED = ("succeeded", "failed", "stopped", "preempted")
HOLDING = (LeaseState.PROVISIONING, LeaseState.ACTIVE, LeaseState.PREEMPTED, LeaseState.RELEASING)


def lease_workload_start(*, lease_id: int) -> str:
    """Start the lease's workload on its node (idempotent per placement). Returns the workload's state. A
    refusal by the agent (4xx: a path outside the node's roots, an image on a process node) fails the lease
    with the reason; an unreachable node raises ``AgentUnreachable`` (the task retries)."""
    from agent.protocol import AgentHTTPError

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
        try:
            if not _placement_claim(workload=workload, node=node, agent_id=agent_id):
                workload.refresh_from_db()
                return workload.state  # another run of this task claimed it
        except PortsExhausted as error:
            lease_release(lease=workload.lease, actor="worker", final=LeaseState.FAILED, reason=str(error))
            return "failed"
        workload.refresh_from_db()
    placement = workload.placement_rows.filter(number=workload.placements).first()
    # the secret values go to the node only in this signed call (the spec keeps their names)
    body = {**workload.spec, "secret_env": secret_env_open(workload.secret_env_sealed),
            "instances": [a.instance_id for a in allocations], "restart_count": workload.restart_count,
            "max_restarts": agent_max_restarts(workload)}
    if placement is not None and placement.host_port is not None:
        body["host_port"] = placement.host_port
    body.update(workload_host_ask(lease=workload.lease, units=len(allocations)))
    if workload.lease.group_key:  # a lease group's members meet through the rendezvous variables
        body["env"] = {**body.get("env", {}), **group_rendezvous_env(lease=workload.lease)}
    try:
        answer = agent_client(node).workload_start(agent_id, body)
    except AgentHTTPError as error:
        detail = error.problem.get("detail") or str(error)
        logger.info("lease %s: the node refused workload %s: %s", lease_id, agent_id, detail)
        Workload.objects.filter(pk=workload.pk).update(state="failed", ended_at=timezone.now())
        lease_release(lease=workload.lease, actor=f"agent:{node.node_id}", final=LeaseState.FAILED,
                      reason=f"the node refused the workload ({agent_detail_seen(detail, workload.lease)})")
        return "failed"
    logger.info("lease %s: workload %s on %s: %s", lease_id, agent_id, node.node_id, answer["state"])
    return answer["state"]


def group_rendezvous_env(*, lease: Lease) -> dict[str, str]:
    """The environment that lets the workloads of a lease group spread over nodes find each other, in the
    convention of ``torch.distributed`` (env://) and ``torchrun``: the group's members that hold capacity, in lease
    id order, are the ranks; ``MASTER_ADDR`` is rank 0's node host and ``MASTER_PORT`` a port of
    ``WORKLOAD_RENDEZVOUS_PORTS`` chosen by the group's first lease id (rank 0's workload listens there);
    ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK`` (its rank among the members on its node), ``NNODES``, ``NODE_RANK``
    and the node list in rank order (``GPUBROKER_GROUP_NODES``: node ids; ``GPUBROKER_GROUP_HOSTS``: hosts).
    Empty for a lease alone or whose group holds no capacity."""
    from urllib.parse import urlsplit

    from broker.models import Allocation

    members = list(Lease.objects.filter(tenant_id=lease.tenant_id, group_key=lease.group_key, state__in=HOLDING)
                   .order_by("pk").values_list("pk", flat=True))
    if lease.pk not in members:
        return {}
    node_of: dict[int, Node] = {}
    for allocation in (Allocation.objects.filter(lease_id__in=members, freed_at__isnull=True)
                       .select_related("gpu__node").order_by("lease_id", "pk")):
        node_of.setdefault(allocation.lease_id, allocation.gpu.node)
    ranks = [pk for pk in members if pk in node_of]
    if lease.pk not in node_of:
        return {}
    nodes = [node_of[pk] for pk in ranks]
    hosts = [urlsplit(node.address).hostname or node.node_id for node in nodes]
    distinct = list(dict.fromkeys(node.node_id for node in nodes))
    rank = ranks.index(lease.pk)
    first, last = settings.WORKLOAD_RENDEZVOUS_PORTS
    return {"MASTER_ADDR": hosts[0], "MASTER_PORT": str(first + ranks[0] % (last - first + 1)),
            "WORLD_SIZE": str(len(ranks)), "RANK": str(rank),
            "LOCAL_RANK": str(sum(1 for other in nodes[:rank] if other.node_id == nodes[rank].node_id)),
            "NNODES": str(len(distinct)), "NODE_RANK": str(distinct.index(nodes[rank].node_id)),
            "GPUBROKER_GROUP_NODES": ",".join(node.node_id for node in nodes),
            "GPUBROKER_GROUP_HOSTS": ",".join(hosts)}


def workload_host_ask(*, lease: Lease, units: int) -> dict[str, int]:
    """The host CPU and memory the lease asked for on its workload's node (``gpu.cpu_milli_per_unit`` /
    ``gpu.host_memory_mib_per_unit`` times the units it holds there, what the scheduler reserved against the
    node's ``host_cpu_milli`` / ``host_memory_mib``): the workload's ``cpu_milli`` / ``memory_mib``, which the
    agent enforces (its cgroup, a container's ``--cpus`` / ``--memory``). A field the lease did not ask for is
    left out: the node's share per leased GPU applies, and an agent from before these fields accepts the body."""
    ask = {"cpu_milli": lease.cpu_milli_per_unit * units, "memory_mib": lease.host_memory_mib_per_unit * units}
    return {name: value for name, value in ask.items() if value}


class PortsExhausted(Exception):
    """Every host port of ``WORKLOAD_HOST_PORTS`` on the node is held by a live workload."""


def agent_max_restarts(workload: Workload) -> int:
    """The failure restarts the agent may make on this placement: ``WORKLOAD_FAILED_RUNS_BEFORE_REPLACE`` - 1
    (then the broker places the lease elsewhere), never more than what is left of ``max_restarts``."""
    spec = workload.spec
    if spec.get("restart_policy") != "on-failure":
        return int(spec.get("max_restarts", 3))
    left = max(0, int(spec.get("max_restarts", 3)) - workload.failed_runs)
    return min(settings.WORKLOAD_FAILED_RUNS_BEFORE_REPLACE - 1, left)


def _placement_claim(*, workload: Workload, node: Node, agent_id: str) -> bool:
    """Claim the next placement of ``workload`` on ``node`` (conditional UPDATE: once) and record it, with a
    host port of the node for an interactive workload, in one transaction. False when another run of the
    start task claimed it first."""
    now = timezone.now()
    with transaction.atomic(durable=True):
        restart_count = workload.restart_count + 1 if workload.placements else 0
        claimed = Workload.objects.filter(pk=workload.pk, agent_workload_id=workload.agent_workload_id).update(
            agent_workload_id=agent_id, node=node, placements=workload.placements + 1, restart_count=restart_count,
            state="starting", reported_seq=0, exit_code=None, signal=None, ended_at=None)
        if claimed != 1:
            return False
        # an earlier placement of this workload that never reported its end is over now
        WorkloadPlacement.objects.filter(workload=workload, ended_at__isnull=True).update(ended_at=now,
                                                                                          state="lost")
        _placement_create(workload=workload, number=workload.placements + 1, node=node, agent_id=agent_id,
                          now=now)
    return True


def _placement_create(*, workload: Workload, number: int, node: Node, agent_id: str, now: datetime) -> None:
    """The placement's row; for an interactive workload with the lowest port of ``WORKLOAD_HOST_PORTS`` no
    live placement on ``node`` holds (placements of leases that no longer hold capacity give theirs back
    first). Race-safe: each try inserts in a savepoint, and the partial unique index (node, host_port) of
    live placements makes a start racing for the same port wait for the other's commit and then fail
    there, so it takes the next port."""
    values = {"workload": workload, "number": number, "node": node, "node_name": node.node_id,
              "agent_workload_id": agent_id, "started_at": now}
    if not workload.spec.get("port"):
        WorkloadPlacement.objects.create(**values)
        return
    WorkloadPlacement.objects.filter(node=node, ended_at__isnull=True).exclude(
        workload__lease__state__in=HOLDING).update(ended_at=now, state="lost")
    first, last = settings.WORKLOAD_HOST_PORTS
    taken = set(WorkloadPlacement.objects.filter(node=node, ended_at__isnull=True, host_port__isnull=False)
                .values_list("host_port", flat=True))
    for port in range(first, last + 1):
        if port in taken:
            continue
        try:
            with transaction.atomic():
                WorkloadPlacement.objects.create(**values, host_port=port)
                return
        except IntegrityError:
            continue
    raise PortsExhausted(f"no free host port on {node.node_id}: all of {first}-{last} are held by live workloads")


def _at(seconds: object) -> datetime:
    return datetime.fromtimestamp(float(seconds), tz=UTC)


def describe(event: dict) -> str:
    """One agent event as a lease event's reason."""
    kind, run = event.get("kind"), event.get("run")
    if kind in ("started", "restarted"):
        why = ""
        if kind == "restarted":  # by the agent after a growth (a container's new devices), else after a failure
            why = " with the devices its lease grew onto" if event.get("regrown") else " after a failure"
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
        failed = 0
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
                failed = sum(1 for r in runs if r.get("outcome") == "failed")
                placement = workload.placement_rows.filter(agent_workload_id=agent_id,
                                                           ended_at__isnull=True).first()
                if placement is not None:  # its end is recorded once: the port is free, its log is kept
                    placement.state, placement.ended_at, placement.failed_runs = state, workload.ended_at, failed
                    placement.save(update_fields=["state", "ended_at", "failed_runs"])
                    workload.failed_runs += failed
                    enqueue("workload_placement_log_keep_run", placement.pk)
            workload.save(update_fields=["state", "reported_seq", "restart_count", "started_at", "exit_code",
                                         "signal", "ended_at", "failed_runs"])
        if state in ENDED:
            _workload_ended(workload, node, failed_here=failed)
    return acked


def _workload_ended(workload: Workload, node: Node, *, failed_here: int = 0) -> None:
    """A workload that ended ends its lease at its end (billing stops there); one that stopped at a notice
    frees the capacity at once and requeues the lease (or ends it, with ``restart_policy: never``). One
    that failed ``WORKLOAD_FAILED_RUNS_BEFORE_REPLACE`` times on this node, with restarts of its
    ``max_restarts`` left, is requeued to be placed on another node (``Lease.avoid_nodes``)."""
    lease = Lease.objects.get(pk=workload.lease_id)
    at = min(workload.ended_at or timezone.now(), timezone.now())
    actor = f"agent:{node.node_id}"
    spec = workload.spec
    limit = int(spec.get("max_restarts", 3))
    if (workload.state == "failed" and lease.state == LeaseState.ACTIVE and spec.get("restart_policy") == "on-failure"
            and failed_here >= settings.WORKLOAD_FAILED_RUNS_BEFORE_REPLACE and workload.failed_runs <= limit):
        _lease_replace_after_failures(lease=lease, node=node, at=at, actor=actor, failed_here=failed_here,
                                      workload=workload)
        return
    if workload.state == "preempted" and lease.state == LeaseState.PREEMPTED:
        if workload.spec.get("restart_policy") == "never":
            lease_release(lease=lease, actor=actor, now=at, reason="the workload stopped at its preemption notice; "
                          "restart_policy never: the lease ends")
            return
        release_instances_quietly(lease)
        allocations_free(lease=lease, now=at, to=LeaseState.QUEUED, actor=actor, reason=requeue_reason(
            lease, "preempted: the workload stopped; requeued, it restarts when capacity frees"))
    elif workload.state in ("succeeded", "failed") and lease.state == LeaseState.ACTIVE:
        code = (f"status {workload.exit_code}" if workload.exit_code is not None
                else f"signal {workload.signal}" if workload.signal else "no status")
        final = LeaseState.RELEASED if workload.state == "succeeded" else LeaseState.FAILED
        spent = (f"; {workload.failed_runs} failed run(s), restart limit {limit} reached"
                 if workload.state == "failed" and spec.get("restart_policy") == "on-failure" else "")
        lease_release(lease=lease, actor=actor, now=at, final=final,
                      reason=f"the workload {workload.state} (exit {code}){spent}; the lease ends")


def _lease_replace_after_failures(*, lease: Lease, node: Node, at: datetime, actor: str, failed_here: int,
                                  workload: Workload) -> None:
    """Free the lease's capacity at the failure and requeue it with ``node`` among the nodes it avoids, in
    one transaction (the event says why); the next placement restarts the workload elsewhere."""
    release_instances_quietly(lease)
    reason = (f"the workload failed {failed_here} times in a row on {node.node_id}; requeued to be placed on "
              f"another node (failed runs {workload.failed_runs} of {int(workload.spec.get('max_restarts', 3)) + 1} "
              "allowed)")
    with transaction.atomic(durable=True):
        current = Lease.objects.select_for_update().get(pk=lease.pk)
        if current.state != LeaseState.ACTIVE:
            return
        current.allocations.filter(freed_at__isnull=True).update(state=AllocationState.FREED, freed_at=at)
        avoid = [*current.avoid_nodes, node.node_id] if node.node_id not in current.avoid_nodes else current.avoid_nodes
        lease_transition(lease=current, to=LeaseState.QUEUED, reason=reason, actor=actor, now=at, queued_at=at,
                         tier="", over_quota=False, active_at=None, ends_at=None, notice_deadline=None,
                         avoid_nodes=avoid)
        enqueue("schedule_cycle")


def workload_stop_for_release(*, lease: Lease) -> None:
    """Before a lease's instances are destroyed: a running workload gets SIGTERM and the grace
    (``WORKLOAD_STOP_GRACE_SECONDS``) to end, then the destroy kills whatever is left."""
    from agent.protocol import AgentHTTPError, AgentUnreachable

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


def workload_placement_log_keep(*, placement_id: int) -> bool:
    """Keep the tail of an ended placement's logs (``WORKLOAD_LOG_KEEP_BYTES`` per stream, read from its
    node) on its ``WorkloadPlacement``, so ``GET /api/v1/leases/{id}/logs?placement=N`` answers after the
    workload moved on (or the node pruned it). Idempotent; False when the node has no log to give (the
    agent answers 404) or the tail is kept already. An unreachable node raises ``AgentUnreachable``."""
    from agent.protocol import AgentHTTPError

    placement = WorkloadPlacement.objects.select_related("node").filter(pk=placement_id).first()
    if placement is None or placement.log_kept_at is not None or placement.node is None:
        return False
    client = agent_client(placement.node)
    kept: dict[str, dict] = {}
    for stream in ("stdout", "stderr"):
        try:
            answer = client.workload_logs(placement.agent_workload_id, stream=stream,
                                          tail=settings.WORKLOAD_LOG_KEEP_BYTES, limit=settings.WORKLOAD_LOG_KEEP_BYTES)
        except AgentHTTPError as error:
            if error.status == 404:
                return False
            raise
        kept[stream] = answer
    changed = WorkloadPlacement.objects.filter(pk=placement.pk, log_kept_at__isnull=True).update(
        log_stdout=kept["stdout"]["data"], log_stderr=kept["stderr"]["data"], log_kept_at=timezone.now(),
        log_offsets={stream: {"first_offset": answer["offset"], "size": answer["size"]}
                     for stream, answer in kept.items()})
    return changed == 1


def _kept_range(placement: WorkloadPlacement, stream: str, *, offset: int | None, tail: int | None,
                limit: int) -> dict:
    """A range of a kept tail, in the node's offsets (the kept bytes start at ``first_offset``)."""
    data = (placement.log_stdout if stream == "stdout" else placement.log_stderr).encode()
    offsets = placement.log_offsets.get(stream) or {}
    first = int(offsets.get("first_offset", 0))
    size = first + len(data)
    start = max(first, size - tail) if tail is not None else min(max(offset or 0, first), size)
    piece = data[start - first:start - first + limit]
    return {"stream": stream, "offset": start, "next_offset": start + len(piece), "size": size,
            "first_offset": first, "data": piece.decode("utf-8", errors="replace"), "state": placement.state}


def workload_placements(*, lease: Lease) -> list[WorkloadPlacement]:
    """The lease's workload placements, first first (``lease`` is the caller's, scoped by a selector)."""
    return list(WorkloadPlacement.objects.filter(workload__lease=lease).order_by("number"))


class TooManyFollows(TooManyRequests):
    code = "too_many_follows"


class _ProcessWaiters:
    """How many log follows wait in this web process now (at most ``WORKLOAD_LOG_FOLLOW_WAITERS``)."""

    lock = threading.Lock()
    count = 0

    @classmethod
    def take(cls) -> bool:
        with cls.lock:
            if cls.count >= settings.WORKLOAD_LOG_FOLLOW_WAITERS:
                return False
            cls.count += 1
            return True

    @classmethod
    def give_back(cls) -> None:
        with cls.lock:
            cls.count -= 1


@contextmanager
def _follow_slot(tenant_id: int) -> Iterator[None]:
    """Hold one of the tenant's ``WORKLOAD_LOG_FOLLOWS_PER_TENANT`` waiting places (keys in the shared cache, so
    the cap holds across web processes; each expires on its own, so a process killed while waiting frees its
    place within ``ttl``) and one of this process's; else ``TooManyFollows``."""
    wait = settings.WORKLOAD_LOG_FOLLOW_SECONDS
    ttl = wait + settings.AGENT_TIMEOUT_SECONDS + 5  # the longest a follow can hold it: the wait, one agent call
    slot = next((key for key in (f"log-follow:{tenant_id}:{n}" for n in range(settings.WORKLOAD_LOG_FOLLOWS_PER_TENANT))
                 if cache.add(key, 1, timeout=ttl)), None)
    if slot is None:
        raise TooManyFollows(
            f"This tenant already has {settings.WORKLOAD_LOG_FOLLOWS_PER_TENANT} log follows waiting (the most at "
            f"once); re-ask after Retry-After seconds, or read without follow.", field="follow",
            retry_after_seconds=wait, extra={"limit": settings.WORKLOAD_LOG_FOLLOWS_PER_TENANT})
    if not _ProcessWaiters.take():
        cache.delete(slot)
        raise TooManyFollows("This server's places for waiting log follows are all taken; re-ask after "
                             "Retry-After seconds, or read without follow.", field="follow", retry_after_seconds=1)
    try:
        yield
    finally:
        _ProcessWaiters.give_back()
        cache.delete(slot)


def workload_logs(*, lease: Lease, stream: str = "stdout", offset: int | None = None, tail: int | None = None,
                  limit: int = 64 * 1024, follow_seconds: float = 0, placement: int | None = None) -> dict:
    """A range of the lease's workload log: of the current placement from its node, from ``offset`` or the
    last ``tail`` bytes; of an earlier ``placement`` (1, 2, …) from the tail kept when it ended (or from its
    node while the tail is not kept yet). ``lease`` is the caller's (selectors restrict it to the tenant), so a
    tenant only ever reads its own workloads' bytes.

    With ``follow_seconds`` it is a long poll: when there are no bytes beyond ``offset`` yet and the workload
    runs, it waits (at most ``WORKLOAD_LOG_FOLLOW_SECONDS``, whatever was asked) until there are or the workload
    ends, and answers what it has; the caller re-asks from ``next_offset``. Waiting holds a web thread, so a
    follow takes a place first (``_follow_slot``: per tenant, per process) and raises ``TooManyFollows`` (429)
    when none is free, before it calls the node."""
    from agent.protocol import AgentHTTPError, AgentUnreachable

    workload = Workload.objects.filter(lease=lease).select_related("node").first()
    if workload is None:
        raise NotFound("This lease has no workload.", field="id")
    if placement is not None and not 1 <= placement <= max(workload.placements, 1):
        raise ValidationFailed(f"placement must be 1 to {max(workload.placements, 1)} (this lease's placements).",
                               field="placement")
    number = placement or workload.placements
    row = workload.placement_rows.select_related("node").filter(number=number).first() if number else None
    base = {"lease": lease.pk, "placement": number or None, "restart_count": workload.restart_count}
    if row is not None and row.log_kept_at is not None:
        return {**base, **_kept_range(row, stream, offset=offset, tail=tail, limit=limit), "node": row.node_name,
                "kept": True}
    if row is not None and number != workload.placements:
        agent_id, node = row.agent_workload_id, row.node
    else:
        agent_id, node = workload.agent_workload_id, workload.node
    if not agent_id or node is None:
        return {**base, "stream": stream, "offset": 0, "next_offset": 0, "size": 0, "first_offset": 0, "data": "",
                "state": workload.state, "node": None, "kept": False}
    client = agent_client(node)

    def read() -> dict:
        try:
            return client.workload_logs(agent_id, stream=stream, offset=offset, tail=tail, limit=limit)
        except AgentHTTPError as error:
            if error.status == 404:
                raise NotFound("The workload's node no longer has this log.", field="id") from None
            raise
        except AgentUnreachable:
            if number == workload.placements:
                raise
            raise NotFound(f"The node {node.node_id} does not answer and this placement's log was not kept.",
                           field="placement") from None

    def settled(answer: dict) -> bool:
        return bool(answer["data"]) or answer["state"] not in ("running", "backoff")

    wait = min(follow_seconds, settings.WORKLOAD_LOG_FOLLOW_SECONDS)
    if wait <= 0:
        answer = read()
    else:  # the place first: a refused follow costs no agent call
        with _follow_slot(lease.tenant_id):
            deadline = time.monotonic() + wait
            answer = read()
            while not settled(answer) and time.monotonic() < deadline:
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
                answer = read()
    answer.pop("workload_id", None)
    return {**base, **answer, "node": node.node_id, "kept": False}
