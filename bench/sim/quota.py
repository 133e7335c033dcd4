"""Trace-driven replay of quota policies through the scheduling core (the Philly job list).

The replay drives ``broker.scheduler.plan.Scheduler`` — the code the live service runs — with one
event loop: a heap of arrivals, completions and requeues of preempted jobs. After each batch of events
it calls ``Scheduler.schedule(queue, now=t)`` once with the waiting jobs and applies the decisions.

Policies (all on one pool of 8-GPU ``V100-32GB`` nodes, whole GPUs):

``static``  static partitioning: each project (virtual cluster) only ever uses its partition
            (QuotaSpec deserved == limit == partition, over-quota weight 0: no borrowing).
``fifo``    no quotas (``Snapshot(enforce_quotas=False)``), jobs in submission order. The core does
            not block the queue on a job that does not fit: later jobs that fit are placed (greedy
            backfill without reservations). ``--hol`` gives strict FIFO (head-of-line blocking).
``ours``    guaranteed quotas (deserved = partition, limit = the whole cluster), borrowing of idle
            capacity (weight 1), reclaim: a ``preempt-then-place`` decision's victims get ``notice``
            seconds, lose the work since their last checkpoint, and go back to the queue with their
            original submission time; the reclaiming job starts ``notice`` seconds after the decision.
            ``--reservations on`` (the default, as the broker ships: ``LEASE_RESERVATIONS`` on): the core's
            reservations and backfill from durations (``broker.scheduler.reserve``; the trace's run times stand
            for the requested durations and the running jobs' ends are the replay's own); ``off``: none;
            ``both``: the two side by side (``philly_quota_ours_reserve.json``, with them, beside
            ``philly_quota_ours``, without).

Partitions (= deserved): proportional to each project's share of the trace's GPU-time, by largest
remainder to whole GPUs summing to the cluster size, with a floor of the project's largest job (else
static partitioning could never run it; ``--no-floor`` drops the floor for ``ours``/``fifo``).

Metrics: see ``Result``. "In-quota" (for time-to-GPU, violations and fairness): the core's view for
``static`` and ``ours`` (an allocation is in-quota when it is not preemptible; a waiting request when
its project's in-quota use plus the request stays within deserved). ``fifo`` has no quotas, so there
the same partitions serve as a *reference*: an allocation counts as over-quota when its project
already held its reference share when it was placed.

Estimated starts (``--estimate-every N``): every N-th job (by submission), at the first cycle that leaves it
waiting after it arrives, gets the core's estimated start (``broker.scheduler.estimate``, the live cycle's
function) over the whole queue (this cycle's waiting decisions in their order, then the jobs not passed to the
core, in submission order) and the running jobs' ends; ``estimate_error_s`` summarises |estimated - actual first
start| (the trace's run times stand for the requested durations: a job ends exactly when its lease would).
``estimate_unknown``: sampled jobs for which the budget ran out or no expiry made room. The estimate undoes itself:
the decisions are the same with or without it.

Speed: waiting requests that provably cannot be placed this cycle are not passed to the core (see
``Replay._candidates``); ``--no-prune`` passes the whole queue every cycle (same decisions, slower).
``--tick`` schedules at most once per that many simulated seconds.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import math
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.sim.philly import DEFAULT_TRACE, Job, Trace, job_id, job_index, load
from broker.scheduler.estimate import estimated_starts
from broker.scheduler.placement import need_for, workload_from_needs
from broker.scheduler.plan import Scheduler
from broker.scheduler.types import (
    Decision,
    DecisionMode,
    Gpu,
    GpuMode,
    Kind,
    Node,
    QuotaSpec,
    Request,
    Shape,
    Snapshot,
)

MODEL = "V100-32GB"
GPUS_PER_NODE = 8
TENANT = "philly"
POLICIES = ("static", "fifo", "ours")
FULL = 1000

# event kinds, in the order they are handled at one instant
_COMPLETE, _REQUEUE, _ARRIVE = 0, 1, 2


# -- cluster and quotas ------------------------------------------------------------------------------


def cluster_size(trace: Trace, load_factor: float) -> int:
    """GPUs so that the mean offered load (trace GPU-time / submission span) is ``load_factor`` of them,
    in whole nodes, and at least the largest job."""
    span = trace.span_seconds
    if span <= 0:
        raise ValueError("the trace needs at least two submissions at different times to size a cluster")
    wanted = trace.gpu_seconds / span / load_factor
    largest = max(job.gpus for job in trace.jobs)
    return max(math.ceil(wanted / GPUS_PER_NODE), math.ceil(largest / GPUS_PER_NODE)) * GPUS_PER_NODE


def partitions(trace: Trace, gpus: int, *, floor: bool = True, sized_from: list | None = None) -> dict[str, int]:
    """Whole GPUs per project proportional to its GPU-time (largest remainder), summing to ``gpus``;
    with ``floor`` each project gets at least its largest job. ``sized_from``: the jobs whose GPU-time sets the
    shares (an operator's history) instead of the trace's own; a project of the trace absent from them has its
    floor, one present only in them keeps its share (a quota set for a team that went quiet)."""
    share: dict[str, float] = {}
    largest: dict[str, int] = {}
    for job in trace.jobs if sized_from is None else sized_from:
        share[job.project] = share.get(job.project, 0.0) + job.gpu_seconds
    for job in trace.jobs:
        share.setdefault(job.project, 0.0)
        largest[job.project] = max(largest.get(job.project, 0), job.gpus)
    largest = {project: largest.get(project, 0) for project in share}
    minimum = largest if floor else dict.fromkeys(share, 0)
    if sum(minimum.values()) > gpus:
        raise ValueError(f"{gpus} GPUs cannot hold every project's largest job ({sum(minimum.values())} needed)")
    fixed: dict[str, int] = {}
    while True:
        free = [p for p in share if p not in fixed]
        room = gpus - sum(fixed.values())
        weight = sum(share[p] for p in free)
        exact = {p: share[p] / weight * room for p in free}
        short = [p for p in free if exact[p] < minimum[p]]
        if not short:
            break
        for p in short:
            fixed[p] = minimum[p]
    out = dict(fixed)
    for p, value in exact.items():
        out[p] = int(value)
    rest = gpus - sum(out.values())
    for p in sorted(exact, key=lambda p: (-(exact[p] - int(exact[p])), p))[:rest]:
        out[p] += 1
    assert sum(out.values()) == gpus
    return dict(sorted(out.items()))


def build_snapshot(gpus: int, policy: str, parts: dict[str, int], min_runtime: float = 0.0) -> Snapshot:
    nodes, devices = [], []
    for n in range(gpus // GPUS_PER_NODE):
        node = f"n{n:04d}"
        nodes.append(Node(node))
        for g in range(GPUS_PER_NODE):
            devices.append(Gpu(f"{node}/{g}", node, MODEL, GpuMode.WHOLE, g))  # one NVLink domain per node
    quotas: tuple[QuotaSpec, ...] = ()
    if policy == "static":
        quotas = tuple(QuotaSpec(p, TENANT, MODEL, n * FULL, n * FULL, 0) for p, n in parts.items())
    elif policy == "ours":
        quotas = tuple(QuotaSpec(p, TENANT, MODEL, n * FULL, gpus * FULL, 1) for p, n in parts.items())
    return Snapshot(nodes=tuple(nodes), gpus=tuple(devices), quotas=quotas, enforce_quotas=policy != "fifo",
                    min_runtime_seconds=min_runtime)


def shape_for(gpus: int) -> Shape:
    # up to a node: one node (gang); larger: any nodes, all-or-nothing
    return Shape(Kind.WHOLE, count=gpus, models=(MODEL,), gang=gpus <= GPUS_PER_NODE)


# -- results ---------------------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _summary(values: list[float]) -> dict:
    return {
        "n": len(values),
        "mean": round(sum(values) / len(values), 1) if values else 0.0,
        "p50": round(_pct(values, 0.50), 1),
        "p95": round(_pct(values, 0.95), 1),
        "p99": round(_pct(values, 0.99), 1),
        "max": round(max(values), 1) if values else 0.0,
    }


@dataclass
class Result:
    policy: str
    jobs: int
    dropped: dict[str, int]
    gpus: int
    offered_load: float  # trace GPU-time / span / GPUs
    partitions: dict[str, int]
    notice_s: float
    checkpoint_s: float
    tick_s: float
    hol: bool
    prune: bool
    reservations: bool = False  # the core's reservations and backfill from durations (``broker.scheduler.reserve``)
    # utilisation: busy GPU-seconds (jobs actually running, preempted work included) / GPU-seconds
    utilisation_window: float = 0.0  # over first..last submission (the window the load refers to)
    utilisation_makespan: float = 0.0  # over first submission..last completion
    makespan_days: float = 0.0
    queueing_delay_s: dict = field(default_factory=dict)  # first start - submission, all jobs
    in_quota_ttg_s: dict = field(default_factory=dict)  # start - in-quota since, in-quota placements
    jct_s: dict = field(default_factory=dict)  # completion - submission
    completed: int = 0
    stuck: int = 0  # jobs still waiting when nothing else could happen
    preemptions: int = 0  # victims that lost their GPUs (and were requeued)
    preemptions_finished_in_notice: int = 0  # victims that completed within the notice period anyway
    preempted_jobs: int = 0
    max_preemptions_per_job: int = 0
    # victims whose project held no more than its deserved in total (in + over quota) when preempted:
    # over-quota allocations stay preemptible for life, even once the project is back within its share
    preemptions_within_deserved: int = 0
    gpu_hours_lost: float = 0.0  # GPU-time since the last checkpoint, thrown away by preemptions
    gpu_hours_useful: float = 0.0
    reclaim_decisions: int = 0
    jain_over_quota: float | None = None  # time-averaged over contended intervals; None: never contended
    contended_fraction: float = 0.0  # of the makespan, share of time with >= 2 contending projects
    # in-quota requests kept waiting > notice + tick while over-quota allocations of other projects held
    # GPUs they could use (with the free ones; for a gang, on one node); counted once per waiting episode
    guarantee_violations: int = 0
    # ... the same, but only in total, not on one node: gangs behind fragmentation (not violations)
    in_quota_fragmented_waits: int = 0
    violation_jobs: int = 0
    violations_by_shape: dict = field(default_factory=dict)
    schedule_calls: int = 0
    requests_passed: int = 0  # summed over calls
    max_queue: int = 0
    seconds_in_schedule: float = 0.0
    wall_seconds: float = 0.0
    # estimated starts (``--estimate-every``): |estimated - actual first start| of the sampled jobs, and how many
    # sampled jobs got no estimate
    estimate_every: int = 0
    estimate_error_s: dict = field(default_factory=dict)
    estimate_unknown: int = 0
    seconds_in_estimate: float = 0.0
    # in-quota time-to-GPU of multi-GPU jobs (gangs on one node and jobs spread over nodes): the waits reservations
    # are for; cycles that ended with a reservation held and the jobs that held one
    in_quota_gang_ttg_s: dict = field(default_factory=dict)
    reservation_cycles: int = 0
    reserved_jobs: int = 0


# -- the replay ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _State:
    job: Job
    request: Request
    key: tuple  # (project, gpus, gang)
    remaining: float
    enqueued_at: float
    first_start: float | None = None
    completed_at: float | None = None
    seg_start: float = 0.0
    token: int = 0
    running: bool = False
    in_core: bool = False  # holds an allocation in the core's state
    over: bool = False  # current allocation counts as over-quota
    nodes: dict | None = None  # node index -> GPUs of the current allocation
    preemptions: int = 0
    violated: bool = False
    fragmented: bool = False


class Replay:
    def __init__(self, trace: Trace, *, policy: str, gpus: int, parts: dict[str, int], notice: float = 30.0,
                 checkpoint: float = 600.0, tick: float = 0.0, hol: bool = False, prune: bool = True,
                 placement: str = "default", window: float | None = None,
                 min_runtime: float = 0.0, estimate_every: int = 0, estimate_budget: int = 20_000,
                 reservations: bool = False, reserve_after: float = 600.0):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
        self.trace = trace
        self.policy = policy
        self.gpus = gpus
        self.parts = parts
        self.notice = notice
        self.checkpoint = checkpoint
        self.tick = tick
        self.hol = hol and policy == "fifo"
        self.prune = prune
        self.window = trace.span_seconds if window is None else window
        self.snapshot = build_snapshot(gpus, policy, parts, min_runtime)
        needs = [need_for(shape_for(n), MODEL) for n in sorted({job.gpus for job in trace.jobs})]
        counts = Counter(job.gpus for job in trace.jobs)
        workload = workload_from_needs([need for need in needs for _ in range(counts[need.count])])
        self.ends: dict[str, float] = {}  # running job id -> when it ends (for estimates and reservations)
        self.reservations = reservations
        self.scheduler = Scheduler(self.snapshot, policy=placement, workload=workload, reservations=reservations,
                                   ends=self.ends, reserve_after_seconds=reserve_after)
        self.weight = {p: (0 if policy == "static" else 1) for p in parts}
        self.estimate_every, self.estimate_budget = estimate_every, estimate_budget
        self.reserved_jobs: set[str] = set()
        self.gang_ttg: list[float] = []
        self.arrived: list[int] = []  # jobs that arrived in the current event batch
        self.estimates: dict[int, float | None] = {}
        self.threshold = notice + tick + 1e-6
        # bookkeeping mirrored from the decisions (GPUs, not milli)
        self.node_of = {gpu.id: int(gpu.node[1:]) for gpu in self.snapshot.gpus}
        nodes = gpus // GPUS_PER_NODE
        self.node_free = [GPUS_PER_NODE] * nodes
        self.node_over = [0] * nodes
        self.node_over_p: dict[str, list[int]] = {p: [0] * nodes for p in parts}
        self.free_total = gpus
        self.used_in = dict.fromkeys(parts, 0)
        self.used_over = dict.fromkeys(parts, 0)
        self.over_total = 0
        self.over_sizes: Counter = Counter()
        # queue: (project, gpus, gang) -> job indices in submission order
        self.groups: dict[tuple, list[int]] = {}
        self.waiting = 0
        self.inq_since: dict[tuple, float] = {}
        self.viol_since: dict[tuple, float] = {}
        self.frag_since: dict[tuple, float] = {}
        self.states: list[_State] = []
        for job in trace.jobs:
            shape = shape_for(job.gpus)
            request = Request(job_id(job.index), job.project, TENANT, shape, submitted_at=job.arrival,
                              duration_seconds=math.ceil(job.duration))
            self.states.append(_State(job, request, (job.project, job.gpus, shape.gang), job.duration, job.arrival))
        self.heap: list[tuple] = []
        self._seq = 0
        r = self.result = Result(policy, len(trace.jobs), dict(trace.dropped), gpus,
                                 round(trace.gpu_seconds / max(trace.span_seconds, 1e-9) / gpus, 4), dict(parts),
                                 notice, checkpoint, tick, self.hol, prune, reservations)
        r.gpu_hours_useful = round(trace.gpu_seconds / 3600, 1)
        self.busy_window = 0.0
        self.busy_total = 0.0
        self.lost = 0.0
        self.ttg: list[float] = []
        self.violation_shapes: Counter = Counter()
        self.jain_area = 0.0
        self.jain_time = 0.0
        self.jain_now: float | None = None
        self.batch_start = 0.0

    # -- events -------------------------------------------------------------------------------------
    def _push(self, when: float, kind: int, index: int, token: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (when, kind, self._seq, index, token))

    def _enqueue(self, index: int, when: float) -> None:
        state = self.states[index]
        state.enqueued_at = when
        state.violated = state.fragmented = False
        bisect.insort(self.groups.setdefault(state.key, []), index)
        self.waiting += 1

    def _dequeue(self, index: int) -> None:
        group = self.groups[self.states[index].key]
        del group[bisect.bisect_left(group, index)]
        self.waiting -= 1

    def _busy(self, start: float, end: float, gpus: int) -> None:
        self.busy_total += (end - start) * gpus
        overlap = min(end, self.window) - max(start, 0.0)
        if overlap > 0:
            self.busy_window += overlap * gpus

    # -- bookkeeping of holdings ----------------------------------------------------------------------
    def _hold(self, state: _State, allocation, sign: int) -> None:
        project = state.job.project
        if sign > 0:
            nodes: dict[int, int] = {}
            for unit in allocation.units:
                n = self.node_of[unit.gpu]
                nodes[n] = nodes.get(n, 0) + 1
            state.nodes = nodes
        gpus = state.job.gpus
        for n, count in state.nodes.items():
            self.node_free[n] -= sign * count
            if state.over:
                self.node_over[n] += sign * count
                self.node_over_p[project][n] += sign * count
        self.free_total -= sign * gpus
        if state.over:
            self.used_over[project] += sign * gpus
            self.over_total += sign * gpus
            self.over_sizes[gpus] += sign
        else:
            self.used_in[project] += sign * gpus
        if sign < 0:
            state.nodes = None
        state.in_core = sign > 0

    # -- candidates -----------------------------------------------------------------------------------
    def _candidates(self) -> list[Request]:
        """The waiting requests that might be placed this cycle, in any order (the core sorts).

        Pruning that changes no decision (``--no-prune`` passes everything; the tests compare). Within a
        cycle the core tries the requests of one (project, shape) in submission order, and what it places
        of them is a prefix: capacity only fills up (free + over-quota GPUs of a node never grow; reclaims
        run before any over-quota admission), so once one fails the later ones fail too. So only the
        first ``n`` of each (project, shape) are passed, ``n`` bounding what the cycle can place of them:

        - in quota at most ``(deserved - in-quota use) // gpus``; over quota (weight > 0) at most
          ``idle // gpus``, ``idle`` being the free GPUs plus what reclaims could set free beyond their
          own need (at most ``8 - gpus`` on their node, plus over-quota allocations spread over nodes);
        - a gang of at most a node: no more than fit, node by node, into the GPUs free or held by
          over-quota work (placement and reclaim both need one such node);
        - a request larger than a node reclaims across nodes: its victims' leftovers may become idle for
          over-quota work of the same cycle, so while one is in quota every over-quota GPU counts as idle.

        FIFO without quotas: per shape, the earliest ``free // gpus`` over all projects (none for a gang
        when no node has that many free).
        """
        states = self.states
        if not self.prune:
            return [states[i].request for group in self.groups.values() for i in group]
        out: list[Request] = []
        free_node = max(self.node_free)
        if self.policy == "fifo":
            by_count: dict[tuple, list[list[int]]] = {}
            for key, group in self.groups.items():
                if group:
                    by_count.setdefault(key[1:], []).append(group)
            for (gpus, gang), groups in by_count.items():
                n = self.free_total // gpus if not gang or gpus <= free_node else 0
                if n:
                    merged = heapq.merge(*groups) if len(groups) > 1 else iter(groups[0])
                    for _, index in zip(range(n), merged, strict=False):
                        out.append(states[index].request)
            return out
        reclaimable = [f + o for f, o in zip(self.node_free, self.node_over, strict=True)]
        slots: dict[int, int] = {}  # gpus -> how many such gangs fit, node by node, in free + over-quota GPUs
        groups = []
        extra, reclaimers = 0, False
        for key, group in self.groups.items():
            if not group:
                continue
            project, gpus, gang = key
            n_in = max(0, self.parts[project] - self.used_in[project]) // gpus
            if gpus <= GPUS_PER_NODE:
                if gpus not in slots:
                    slots[gpus] = sum(x // gpus for x in reclaimable)
                limit = slots[gpus]
                reclaiming = min(n_in, limit, len(group))
                if reclaiming:
                    reclaimers = True
                    extra += (GPUS_PER_NODE - gpus) * reclaiming
            else:
                limit = len(group)
                if n_in:
                    reclaimers = True
                    extra += self.over_total
            groups.append((gpus, gang, group, n_in, limit, self.weight[project] > 0))
        idle = self.free_total
        if reclaimers and self.over_total:
            spread = sum(size * count for size, count in self.over_sizes.items() if size > GPUS_PER_NODE)
            idle += min(self.over_total, extra + spread)
        for gpus, gang, group, n_in, limit, borrows in groups:
            n_over = idle // gpus if borrows else 0
            if gang and gpus > free_node and idle == self.free_total:
                n_over = 0
            n = min(n_in + n_over, limit)
            if self.reservations and n_in and not n:
                n = 1  # the oldest in-quota job of its kind: the core reserves for it when it is the oldest of all
            for index in group[:n]:
                out.append(states[index].request)
        return out

    def _schedule(self, now: float) -> None:
        r = self.result
        if self.hol:
            decisions = []
            queue = sorted(i for group in self.groups.values() for i in group)
            for index in queue:
                started = time.perf_counter()
                decision = self.scheduler.schedule([self.states[index].request], now=now)[0]
                r.seconds_in_schedule += time.perf_counter() - started
                r.schedule_calls += 1
                r.requests_passed += 1
                if decision.mode == DecisionMode.WAITING:
                    break
                decisions.append(decision)
                self._apply(decision, now)
            return
        requests = self._candidates()
        if not requests:
            return
        started = time.perf_counter()
        decisions = self.scheduler.schedule(requests, now=now)
        r.seconds_in_schedule += time.perf_counter() - started
        r.schedule_calls += 1
        r.requests_passed += len(requests)
        if self.scheduler.reserved:
            r.reservation_cycles += 1
            self.reserved_jobs.update(job for r in self.scheduler.reserved for job in r.requests)
        for decision in decisions:
            if decision.mode != DecisionMode.WAITING:
                self._apply(decision, now)
        if self.estimate_every:
            self._estimate(requests, decisions, now)

    def _estimate(self, requests: list[Request], decisions: list, now: float) -> None:
        """The estimated start of the sampled jobs that arrived in this batch and wait (see the module's doc)."""
        targets = [i for i in self.arrived if i % self.estimate_every == 0 and self.states[i].first_start is None]
        if not targets:
            return
        started = time.perf_counter()
        order = [d.request for d in sorted((d for d in decisions if d.mode == DecisionMode.WAITING),
                                           key=lambda d: d.queue_position)]
        passed = set(order)
        rest = sorted(i for group in self.groups.values() for i in group if job_id(i) not in passed)
        order += [job_id(i) for i in rest]
        queue = [Decision(request_id, DecisionMode.WAITING, "", queue_position=position)
                 for position, request_id in enumerate(order, 1)]
        estimates = estimated_starts(self.scheduler, [self.states[job_index(i)].request for i in order], queue,
                                     now=now, budget=self.estimate_budget, ends=self.ends)
        for index in targets:
            self.estimates[index] = estimates.get(job_id(index))
        self.result.seconds_in_estimate += time.perf_counter() - started

    def _apply(self, decision, now: float) -> None:
        index = job_index(decision.request)
        state = self.states[index]
        self._dequeue(index)
        for victim in decision.victims:
            self._preempt(job_index(victim), now)
        if decision.mode == DecisionMode.PREEMPT:
            self.result.reclaim_decisions += 1
            start = now + self.notice
        else:
            start = now
        allocation = decision.allocation
        project = state.job.project
        if self.policy == "fifo":  # reference quotas
            state.over = self.used_in[project] + state.job.gpus > self.parts[project]
        else:
            state.over = allocation.preemptible
        self._hold(state, allocation, +1)
        self.ends[decision.request] = start + state.remaining
        if not state.over:
            since = max(state.enqueued_at, self.inq_since.get(state.key, self.batch_start))
            self.ttg.append(start - since)
            if state.job.gpus > 1:
                self.gang_ttg.append(start - since)
        for since_by_key, kind in ((self.viol_since, "violated"), (self.frag_since, "fragmented")):
            since = since_by_key.get(state.key)
            if since is not None and start - max(since, state.enqueued_at) > self.threshold:
                self._flag(state, kind)
        if state.first_start is None:
            state.first_start = start
        state.seg_start = start
        state.running = True
        state.token += 1
        self._push(start + state.remaining, _COMPLETE, index, state.token)

    def _preempt(self, index: int, now: float) -> None:
        state = self.states[index]
        project = state.job.project
        if self.used_in[project] + self.used_over[project] <= self.parts[project]:
            self.result.preemptions_within_deserved += 1
        self._hold(state, None, -1)  # the core already removed the allocation
        self.ends.pop(state.request.id, None)
        stop = now + self.notice
        end = state.seg_start + state.remaining
        if end <= stop:  # finishes within the notice anyway; its completion event stands
            self.result.preemptions_finished_in_notice += 1
            return
        ran = stop - state.seg_start
        saved = math.floor(ran / self.checkpoint) * self.checkpoint if self.checkpoint > 0 else 0.0
        state.remaining -= saved
        self.lost += (ran - saved) * state.job.gpus
        self._busy(state.seg_start, stop, state.job.gpus)
        state.running = False
        state.token += 1  # cancels its completion
        state.preemptions += 1
        self.result.preemptions += 1
        self._push(stop, _REQUEUE, index)

    def _flag(self, state: _State, kind: str) -> None:
        """Count a waiting episode of an in-quota request: a guarantee violation, or a wait behind
        fragmentation (enough free + over-quota GPUs in total, but not on one node for a gang)."""
        if getattr(state, kind):
            return
        setattr(state, kind, True)
        if kind == "violated":
            self.result.guarantee_violations += 1
            self.violation_shapes[f"{state.job.gpus}{'' if state.key[2] else ' (spread)'}"] += 1
        else:
            self.result.in_quota_fragmented_waits += 1

    # -- per-cycle observations ---------------------------------------------------------------------
    def _could_use(self, project: str, gpus: int, gang: bool) -> int:
        """Could the GPUs that over-quota allocations of *other* projects hold, with the free ones, hold
        this request (without touching in-quota work)? 2: yes; 1: only in total, not on one node (a
        gang behind fragmentation); 0: no."""
        others = self.over_total - self.used_over[project]
        if others <= 0 or self.free_total + others < gpus:
            return 0
        if gpus == 1 or not gang:
            return 2
        mine = self.node_over_p[project]
        free, over = self.node_free, self.node_over
        return 2 if any(free[n] + over[n] - mine[n] >= gpus for n in range(len(free))) else 1

    def _observe(self, now: float) -> None:
        contended: list[str] = []
        for key, group in self.groups.items():
            project, gpus, gang = key
            if not group:
                self.inq_since.pop(key, None)
                self.viol_since.pop(key, None)
                self.frag_since.pop(key, None)
                continue
            contended.append(project)
            in_quota = self.used_in[project] + gpus <= self.parts[project]
            if in_quota:
                self.inq_since.setdefault(key, self.batch_start)
            else:
                self.inq_since.pop(key, None)
            usable = self._could_use(project, gpus, gang) if in_quota else 0
            for since_by_key, level, kind in ((self.viol_since, 2, "violated"), (self.frag_since, 1, "fragmented")):
                if usable == level:
                    since_by_key.setdefault(key, self.batch_start)
                elif key in since_by_key:
                    self._close(group, since_by_key.pop(key), now, kind)
        # fairness: Jain's index of over-quota use / weight over the projects with waiting work
        self.jain_now = None
        if self.policy != "static":
            projects = set(contended)
            if len(projects) >= 2:
                shares = [self.used_over[p] / max(self.weight[p], 1e-9) for p in projects]
                total = sum(shares)
                if total > 0:
                    self.jain_now = total * total / (len(shares) * sum(s * s for s in shares))
                else:
                    self.jain_now = None

    def _close(self, group: list[int], since: float, now: float, kind: str) -> None:
        for index in group:
            state = self.states[index]
            if now - max(since, state.enqueued_at) > self.threshold:
                self._flag(state, kind)

    # -- main loop -----------------------------------------------------------------------------------
    def run(self) -> Result:
        wall = time.perf_counter()
        r = self.result
        for state in self.states:
            self._push(state.job.arrival, _ARRIVE, state.job.index)
        last_cycle = -math.inf
        last_time = 0.0
        heap = self.heap
        while heap:
            first = heap[0][0]
            now = max(first, last_cycle + self.tick) if self.tick > 0 else first
            # fairness integral over the interval since the last cycle (state as the last cycle left it)
            if self.jain_now is not None:
                self.jain_area += self.jain_now * (now - last_time)
                self.jain_time += now - last_time
            self.batch_start = first
            while heap and heap[0][0] <= now:
                when, kind, _, index, token = heapq.heappop(heap)
                state = self.states[index]
                if kind in (_ARRIVE, _REQUEUE):
                    self._enqueue(index, when)
                    if kind == _ARRIVE:
                        self.arrived.append(index)
                elif token == state.token:  # completion still valid
                    if state.in_core:
                        self.scheduler.cluster.remove(state.request.id)
                        self._hold(state, None, -1)
                    self.ends.pop(state.request.id, None)
                    self._busy(state.seg_start, when, state.job.gpus)
                    state.running = False
                    state.completed_at = when
                    r.completed += 1
            self._schedule(now)
            self.arrived = []
            r.max_queue = max(r.max_queue, self.waiting)
            self._observe(now)
            last_cycle = last_time = now
        # anything still waiting can never be placed
        for key, group in self.groups.items():
            for since_by_key, kind in ((self.viol_since, "violated"), (self.frag_since, "fragmented")):
                if key in since_by_key:
                    self._close(group, since_by_key[key], last_time, kind)
        r.stuck = self.waiting
        self._finish(time.perf_counter() - wall)
        return r

    def _finish(self, wall: float) -> None:
        r = self.result
        done = [s for s in self.states if s.completed_at is not None]
        end = max((s.completed_at for s in done), default=0.0)
        r.makespan_days = round(end / 86400, 2)
        r.utilisation_window = round(self.busy_window / (self.gpus * max(self.window, 1e-9)), 4)
        r.utilisation_makespan = round(self.busy_total / (self.gpus * max(end, 1e-9)), 4)
        r.queueing_delay_s = _summary([s.first_start - s.job.arrival for s in done])
        r.jct_s = _summary([s.completed_at - s.job.arrival for s in done])
        r.in_quota_ttg_s = _summary(self.ttg)
        r.in_quota_gang_ttg_s = _summary(self.gang_ttg)
        r.reserved_jobs = len(self.reserved_jobs)
        r.preempted_jobs = sum(1 for s in self.states if s.preemptions)
        r.max_preemptions_per_job = max((s.preemptions for s in self.states), default=0)
        r.gpu_hours_lost = round(self.lost / 3600, 1)
        r.jain_over_quota = round(self.jain_area / self.jain_time, 4) if self.jain_time > 0 else None
        r.contended_fraction = round(self.jain_time / max(end, 1e-9), 4)
        r.violation_jobs = sum(1 for s in self.states if s.violated)
        r.violations_by_shape = dict(sorted(self.violation_shapes.items()))
        r.seconds_in_schedule = round(r.seconds_in_schedule, 2)
        if self.estimate_every:
            r.estimate_every = self.estimate_every
            errors = [abs(at - self.states[i].first_start) for i, at in self.estimates.items()
                      if at is not None and self.states[i].first_start is not None]
            r.estimate_error_s = {**_summary(errors), "p90": round(_pct(errors, 0.90), 1)}
            r.estimate_unknown = sum(1 for at in self.estimates.values() if at is None)
            r.seconds_in_estimate = round(r.seconds_in_estimate, 2)
        r.wall_seconds = round(wall, 2)


def replay(trace: Trace, *, policy: str, load_factor: float = 0.8, gpus: int | None = None, floor: bool = True,
           **kwargs) -> Result:
    size = gpus or cluster_size(trace, load_factor)
    if size % GPUS_PER_NODE:
        raise ValueError(f"--gpus must be a multiple of {GPUS_PER_NODE} (nodes of {GPUS_PER_NODE} GPUs)")
    parts = partitions(trace, size, floor=floor or policy == "static")
    return Replay(trace, policy=policy, gpus=size, parts=parts, **kwargs).run()


# -- command line ----------------------------------------------------------------------------------

_COLUMNS = (
    ("policy", lambda r: r.policy + (" +resv" if r.reservations else "")),
    ("GPUs", lambda r: r.gpus),
    ("util", lambda r: f"{r.utilisation_window:.3f}"),
    ("util(all)", lambda r: f"{r.utilisation_makespan:.3f}"),
    ("wait mean", lambda r: _duration(r.queueing_delay_s["mean"])),
    ("p50", lambda r: _duration(r.queueing_delay_s["p50"])),
    ("p95", lambda r: _duration(r.queueing_delay_s["p95"])),
    ("p99", lambda r: _duration(r.queueing_delay_s["p99"])),
    ("inQ ttg p50", lambda r: _duration(r.in_quota_ttg_s["p50"])),
    ("p95", lambda r: _duration(r.in_quota_ttg_s["p95"])),
    ("p99", lambda r: _duration(r.in_quota_ttg_s["p99"])),
    ("inQ gang p95", lambda r: _duration(r.in_quota_gang_ttg_s["p95"])),
    ("max", lambda r: _duration(r.in_quota_gang_ttg_s["max"])),
    ("JCT mean", lambda r: _duration(r.jct_s["mean"])),
    ("preempt", lambda r: r.preemptions),
    ("GPUh lost", lambda r: r.gpu_hours_lost),
    ("Jain", lambda r: "-" if r.jain_over_quota is None else f"{r.jain_over_quota:.3f}"),
    ("violations", lambda r: r.guarantee_violations),
    ("stuck", lambda r: r.stuck),
    ("resv jobs", lambda r: r.reserved_jobs),
    ("wall s", lambda r: r.wall_seconds),
)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def table(results: list[Result]) -> str:
    rows = [[name for name, _ in _COLUMNS]] + [[str(get(r)) for _, get in _COLUMNS] for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.sim quota", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=Path, default=DEFAULT_TRACE, help="the Philly job list (CSV)")
    parser.add_argument("--policy", default="all", help="static, fifo, ours, a comma list, or all")
    parser.add_argument("--load", type=float, default=0.8, help="mean offered load as a fraction of the GPUs")
    parser.add_argument("--gpus", type=int, default=None, help="cluster size (overrides --load); multiple of 8")
    parser.add_argument("--days", type=float, default=None, help="only jobs submitted in the first D days")
    parser.add_argument("--from-day", dest="from_day", type=float, default=0.0,
                        help="start the window D days after the trace's first job (the fleet starts empty there)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N jobs")
    parser.add_argument("--notice", type=float, default=30.0, help="preemption notice, simulated seconds")
    parser.add_argument("--checkpoint", type=float, default=600.0,
                        help="checkpoint interval, simulated seconds (0: no checkpoints)")
    parser.add_argument("--min-runtime", type=float, default=0.0,
                        help="ours: seconds an over-quota allocation runs before it may be preempted (the core's "
                             "Snapshot.min_runtime_seconds)")
    parser.add_argument("--tick", type=float, default=0.0,
                        help="schedule at most once per this many simulated seconds (0: after every event batch)")
    parser.add_argument("--hol", action="store_true", help="fifo: strict FIFO, the head of the queue blocks")
    parser.add_argument("--no-floor", action="store_true",
                        help="partitions purely proportional (no floor of each project's largest job); not static")
    parser.add_argument("--no-prune", action="store_true", help="pass the whole queue to the core every cycle")
    parser.add_argument("--placement", default="default", help="placement policy of the core")
    parser.add_argument("--estimate-every", type=int, default=0,
                        help="estimate the start of every N-th job when it first waits and measure the error, under "
                             "the policy ours (0: off)")
    parser.add_argument("--reservations", choices=("on", "off", "both"), default="on",
                        help="ours: the core's reservations and backfill from durations (the broker's "
                             "LEASE_RESERVATIONS, default on); both: ours replayed with and without, side by side")
    parser.add_argument("--reserve-after", type=float, default=600.0,
                        help="a job reserves once it has waited this long (the broker's "
                             "LEASE_RESERVE_AFTER_SECONDS, 600)")
    parser.add_argument("--json-dir", type=Path, default=None,
                        help="write philly_quota_<policy>.json here, one per policy (bench/record.py's format)")
    return parser


def main_quota(argv: list[str] | None = None) -> int:
    from bench.record import command_line, write  # the benchmarks' one results format (the tree as found now)

    args = _parser().parse_args(argv)
    policies = POLICIES if args.policy == "all" else tuple(p.strip() for p in args.policy.split(","))
    for policy in policies:
        if policy not in POLICIES:
            print(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}", file=sys.stderr)
            return 2
    trace = load(args.jobs, days=args.days, limit=args.limit, from_day=args.from_day)
    if len(trace.jobs) < 2:
        print("the trace selection has fewer than two jobs", file=sys.stderr)
        return 2
    dropped = ", ".join(f"{k}: {v}" for k, v in trace.dropped.items() if v) or "none"
    print(f"{len(trace.jobs)} jobs over {trace.span_seconds / 86400:.1f} days from {args.jobs} (dropped {dropped})")
    results = []
    runs = []
    for policy in policies:
        if policy != "ours":  # static partitions and FIFO stay the baselines they are: no reservations
            runs.append((policy, False))
        else:
            runs += [(policy, False)] * (args.reservations in ("off", "both")) + [(policy, True)] * (
                args.reservations in ("on", "both"))
    for policy, reservations in runs:
        try:
            result = replay(trace, policy=policy, load_factor=args.load, gpus=args.gpus, floor=not args.no_floor,
                            notice=args.notice, checkpoint=args.checkpoint, tick=args.tick, hol=args.hol,
                            prune=not args.no_prune, placement=args.placement,
                            min_runtime=args.min_runtime, reservations=reservations,
                            reserve_after=args.reserve_after,
                            # the estimate is what a tenant of the shipped policy is told; under static partitions
                            # and FIFO the queues are days deep and each estimate walks them all (tens of minutes)
                            estimate_every=args.estimate_every if policy == "ours" else 0)
        except (KeyError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        results.append(result)
        print(f"  {policy}{' +resv' if reservations else ''}: {result.wall_seconds:.1f}s wall, "
              f"{result.schedule_calls} schedule calls", flush=True)
    print(table(results))
    for result in results:
        if result.estimate_every:
            error = result.estimate_error_s
            print(f"estimated start, {result.policy}: {error['n']} jobs (every {result.estimate_every}th), "
                  f"|estimated - actual| p50 {_duration(error['p50'])}, p90 {_duration(error['p90'])}, "
                  f"mean {_duration(error['mean'])}; {result.estimate_unknown} not estimated; "
                  f"{result.seconds_in_estimate:.1f} s estimating")
    if args.json_dir:
        command = command_line(["-m bench.sim", "quota", *(sys.argv[2:] if argv is None else argv)])
        both = args.reservations == "both"
        for result in results:
            # without reservations: the plain name; with them (as shipped since wave 14), beside it: _reserve
            on = both and result.policy == "ours" and result.reservations
            name = f"philly_quota_{result.policy}{'_reserve' if on else ''}"
            write(name, {"trace": str(args.jobs), **asdict(result)},
                  settings=vars(args), command=command, directory=args.json_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main_quota())
