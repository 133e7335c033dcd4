"""Closed-loop benchmark of the capacity planner: ``python -m bench.sim capacity --setting all``.

Replays the Philly job list (arrival times, durations, GPU counts, virtual clusters as projects) for a
window (default 30 days) through the scheduling core (``broker.scheduler.plan.Scheduler``, the code the live
service runs) on a fleet of 8-GPU H100 nodes, and every ``--tick`` seconds runs the capacity planner
(``capacity.planner.plan_capacity``, the same code) on a snapshot of the replay.

Model (assumptions, stated in docs/capacity.md):
- classes from the trace's own fields (``classify``): 1 GPU and under an hour: interactive; 1 GPU and a day or
  more: inference (a long-lived single-GPU service); anything else (2+ GPUs, or 1 GPU for 1 to 24 h): training.
  The published Philly job list has no status column, so status cannot enter the rule;
- shapes: Philly jobs of 2+ GPUs stay whole-GPU gangs; 1-GPU jobs take the shape of the openb tasks in order
  (``gpu_milli`` < 1000: the smallest H100 MIG profile with that many slices; whole: a whole GPU);
- utilisation: each lease replays one GenAI container series (``agent/data/genai_series.json.gz``, 60 s
  samples, chosen and offset by the job index), continuing across preemptions;
- quotas (static's partitions, every other setting's guarantee) are set ahead of the month they serve: each
  project's share of the GPU-time of the 30 days before the window (as many as the trace has; ``--quotas
  window``: the window's own GPU-time, an oracle no operator has, wave 16's rule), at least its largest job;
- the fleet starts with a static split: whole nodes in MIG mode in proportion to the window's MIG demand
  (what an operator would configure by hand), the rest whole;
- time to GPU = queue wait + provisioning: a cold MIG create ``--cold-mig`` s, a cold whole GPU ``--cold-whole``
  s, a warm bind ``--warm-bind`` s; preemptions take effect at once (no notice period in this replay);
- settings (``SETTINGS``), all on the same arrivals and the same starting fleet: ``static`` (each project owns
  its quota: deserved = limit, no borrowing), ``fifo`` (no quotas, the whole fleet in submission order),
  ``off`` (quotas with over-quota borrowing, no loop), ``advise`` (every kind advised; a person applies a
  proposal still open ``--human-delay`` s after the planner first made it), ``default`` (the shipped policy,
  ``capacity.planner.types.DEFAULT_MODES``: its ``auto`` kinds applied, its advice left unread), ``auto``
  (every kind applied, idle training suspended: checkpoint, requeue, resume when capacity frees). Applied
  proposals pass the live service's conditional checks (a GPU must still be idle, a lease still held);
- reclaim across modes, as the live cycle does with the capacity loop installed: where mode switch or MIG layout is
  ``auto`` (``default``, ``auto``), an in-quota request that fits nowhere in its mode empties a GPU of another mode
  (idle, or held by over-quota work only) and has it switched (``Scheduler._switch_for``, ``DecisionMode.SWITCH``);
  the switch is made at once, as every switch here, and the request placed by the next cycle (``--cycle`` s later);
- the planner also runs on a wait, as the live service does (issue 30): where mode switch or MIG layout is
  ``auto``, a cycle that leaves a request waiting for a mode an idle GPU could be switched to
  (``broker.scheduler.pool_wait``) runs it, at most once per ``--plan-on-wait`` s counting every run;
- preemption (the scheduler's reclaim, a drain, a suspension) keeps the work up to the last checkpoint
  (``--checkpoint`` s) and loses the rest; an idle interactive lease the loop releases ends there.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import gzip
import heapq
import json
import math
import re
import sys
import time
from collections import Counter, deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from bench.sim import quota as quota_sim
from bench.sim.philly import DEFAULT_TRACE, load
from broker.scheduler.placement import need_for
from broker.scheduler.plan import Scheduler
from broker.scheduler.pool_wait import pool_waits
from broker.scheduler.types import (
    Allocation,
    DecisionMode,
    Gpu,
    GpuMode,
    Kind,
    Node,
    QuotaSpec,
    Request,
    Shape,
    Snapshot,
    Unit,
    WorkloadClass,
)
from capacity.planner import (
    AdjustmentKind,
    Arrivals,
    CapacityGpu,
    CapacitySnapshot,
    DemandShape,
    History,
    IdleRule,
    Instance,
    Mode,
    Policy,
    Price,
    ReclaimClass,
    Utilisation,
    Waiting,
    WarmInstance,
    plan_capacity,
)
from capacity.planner.types import DEFAULT_IDLE_RULES

ROOT = Path(__file__).resolve().parents[2]
MODEL = "H100-80GB"
TENANT = "philly"
WARM = "_warm"
PER_NODE = 8
FULL = 1000
IDLE_PCT = 5  # a sample under 5 % engine activity is idle (the planner's default interactive threshold)
SETTINGS = ("static", "fifo", "off", "advise", "default", "auto")
LOOPS = SETTINGS  # the former name of the settings
PLANNED = ("advise", "default", "auto")  # the settings that run the capacity planner
INTERACTIVE_MAX_S = 3600  # a 1-GPU job shorter than this is interactive (a session, a debugging run)
INFERENCE_MIN_S = 86400  # a 1-GPU job running a day or more is inference (a long-lived service)
BURST_S = 60  # a 1-GPU job with another of its project this close is part of a sweep, not a session
CHECKPOINT_S = 600  # a preempted or suspended job keeps its work up to its last checkpoint
RESERVE_AFTER_S = 600  # a job reserves once it has waited this long (the broker's LEASE_RESERVE_AFTER_SECONDS)
QUOTA_HISTORY_DAYS = 30  # the history an operator sizes quotas from (the days before the window, as many as there are)
RESERVE_LIMIT = 4  # the core's holders per cycle (``Scheduler(reservation_limit=4)``)
SAMPLE_S = 3600  # the month's time series: one point per hour
HEADLINE_LOAD = 0.8
PRICE_MINOR = 420  # the seeded list price of an H100-80GB GPU-hour (billing seed_prices: 4.20 USD)
MIG_BY_MILLI = ((142, "1g.10gb"), (285, "2g.20gb"), (428, "3g.40gb"), (571, "4g.40gb"))
_COMPLETE, _READY, _TICK, _ARRIVE, _WAKE = 0, 1, 2, 3, 4
SLOW_IN_QUOTA_S = 60  # issue 30's target for the in-quota p95 time to GPU
PLAN_ON_WAIT_S = 10.0  # the planner runs at most this often on a wait a pool change could end (the live default)


def _series() -> list[tuple[list[int], list[int], list[int]]]:
    """(util %, prefix sum of util, prefix count of idle samples) per GenAI container."""
    with gzip.open(ROOT / "agent" / "data" / "genai_series.json.gz") as handle:
        data = json.loads(handle.read())
    out = []
    for entry in data["series"]:
        util = entry["util_pct"]
        total, idle = [0], [0]
        for value in util:
            total.append(total[-1] + value)
            idle.append(idle[-1] + (value < IDLE_PCT))
        out.append((util, total, idle))
    return out


def _openb_single_gpu_shapes() -> list[Shape]:
    shapes = []
    with (ROOT / "bench" / "traces" / "openb" / "openb_pod_list_default.csv").open() as handle:
        for row in csv.DictReader(handle):
            count, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            if count != 1:
                continue
            if milli >= FULL:
                shapes.append(Shape(Kind.WHOLE, 1, models=(MODEL,)))
                continue
            profile = next((name for limit, name in MIG_BY_MILLI if milli <= limit), "")
            shapes.append(Shape(Kind.MIG, 1, profile=profile, models=(MODEL,)) if profile
                          else Shape(Kind.WHOLE, 1, models=(MODEL,)))
    return shapes


def classify(jobs) -> list[WorkloadClass]:
    """The workload class of each Philly job (in submission order) from the trace's own fields:

    - **interactive**: one GPU, under ``INTERACTIVE_MAX_S`` (an hour), and submitted alone — no other 1-GPU
      job of its project within ``BURST_S`` (60 s) either side. A person's session or debugging run; a burst of
      short 1-GPU jobs is a sweep (hundreds at once in this trace), which is batch work;
    - **inference**: one GPU running ``INFERENCE_MIN_S`` (a day) or more: a long-lived single-GPU service;
    - **training**: the rest (gangs of 2+ GPUs, sweeps, single-GPU runs of an hour to a day).

    The published job list has no status column (``timestamp,duration,num_gpus,gpu_time,cluster``), so status
    cannot enter the rule."""
    singles: dict[str, list[float]] = {}
    for job in jobs:
        if job.gpus == 1:
            singles.setdefault(job.project, []).append(job.arrival)
    out = []
    for job in jobs:
        if job.gpus == 1 and job.duration >= INFERENCE_MIN_S:
            out.append(WorkloadClass.INFERENCE)
            continue
        if job.gpus == 1 and job.duration < INTERACTIVE_MAX_S:
            times = singles[job.project]
            near = bisect.bisect_right(times, job.arrival + BURST_S) - bisect.bisect_left(times, job.arrival - BURST_S)
            if near == 1:
                out.append(WorkloadClass.INTERACTIVE)
                continue
        out.append(WorkloadClass.TRAINING)
    return out


class ReplayScheduler(Scheduler):
    """The scheduling core, with what one cycle asks again and again remembered while the working state has not
    changed: the same decisions, fewer what-ifs (issue 30: a month of ``off`` took 323 CPU s).

    In a congested cycle most in-quota candidates of one shape fail to reclaim, each after trying every node's
    over-quota work as victims (``_reclaim``: remove, check, put back), and each waiting request words the same
    reason (``_no_fit_reason``: a pass over every GPU). A failed reclaim leaves the state as it found it, and its
    answer depends only on the state, the tier, the need, the request's group and ``now``; a reason on the state,
    the tier and the need. So both are kept per (tier, need[, group]) with the state's version (a counter that every
    ``apply`` / ``remove`` / ``replace_gpus`` of the working state moves), and forgotten at every ``schedule`` call
    (``now`` moves).
    A failed reclaim puts the version back where it was: its what-ifs undid themselves. ``tests/sim`` replays a
    window with and without the memo and compares every figure."""

    def __init__(self, snapshot: Snapshot, *, reservations: bool = False, ends: dict[str, float] | None = None):
        super().__init__(snapshot, reservations=reservations, ends=ends,
                         reserve_after_seconds=RESERVE_AFTER_S if reservations else 0.0)
        self.version = 0
        self._failed_reclaim: dict[tuple, int] = {}
        self._reasons: dict[tuple, tuple[int, str]] = {}
        self.memo_hits = 0
        cluster = self.cluster
        # ``replace_gpus`` too: a reservation closes and opens GPUs with it, which changes what a reclaim finds
        for name in ("apply", "remove", "apply_warm", "remove_warm", "replace_gpus"):
            setattr(cluster, name, self._counted(getattr(cluster, name)))

    def _counted(self, method):
        def changed(argument):
            self.version += 1
            return method(argument)

        return changed

    def schedule(self, requests, *, now):
        self._failed_reclaim.clear()
        self._reasons.clear()
        return super().schedule(requests, now=now)

    def _reclaim(self, request, tier, need, *, now):
        if request.id in self.cluster.allocations:  # it holds capacity itself (excluded as a victim): no memo
            return super()._reclaim(request, tier, need, now=now)
        key = (tier, need, request.group)
        if self._failed_reclaim.get(key) == self.version:
            self.memo_hits += 1
            return None
        before = self.version
        found = super()._reclaim(request, tier, need, now=now)
        if found is None:
            self.version = before  # the what-ifs put everything back: the state is the one it was
            self._failed_reclaim[key] = before
        return found

    def _switch_for(self, request, tier, need, *, now):
        """A reclaim across modes that found nothing, kept as a failed reclaim is (its answer depends on the same)."""
        if request.id in self.cluster.allocations:
            return super()._switch_for(request, tier, need, now=now)
        key = ("switch", tier, need, request.group)
        if self._failed_reclaim.get(key) == self.version:
            self.memo_hits += 1
            return None
        before = self.version
        found = super()._switch_for(request, tier, need, now=now)
        if found is None:
            self.version = before  # what it tried was put back
            self._failed_reclaim[key] = before
        return found

    def _no_fit_reason(self, tier, need):
        key = (tier, need)
        known = self._reasons.get(key)
        if known is not None and known[0] == self.version:
            return known[1]
        text = super()._no_fit_reason(tier, need)
        self._reasons[key] = (self.version, text)
        return text


def _demand_shape(shape: Shape) -> DemandShape:
    if shape.kind == Kind.MIG:
        return DemandShape(MODEL, Kind.MIG, shape.profile)
    return DemandShape(MODEL, Kind.WHOLE)


def _reason_kind(reason: str) -> str:
    """A waiting reason without its numbers and names: what kind of wait it was ("(started in its first cycle)" when
    the job never waited in a cycle: it started in the first cycle that saw it, after the cycle's debounce or a cold
    start)."""
    text = reason.removeprefix("waiting: ").split(";")[0]
    return re.sub(r"\d[\d,.]*|j\d+|[0-9a-f]{6}", "N", text)[:90] or "(started in its first cycle)"


class Job:
    __slots__ = (
        "arrival",
        "completed_at",
        "done",
        "first_start",
        "held",
        "in_quota",
        "in_quota_alone",
        "index",
        "klass",
        "last_reason",
        "milli",
        "noticed_at",
        "offset",
        "over",
        "project",
        "remaining",
        "request",
        "seg_start",
        "series",
        "shape",
        "token",
        "waiting_since",
        "warm",
    )

    def __init__(self, index, project, arrival, duration, shape, klass, series, offset):
        self.index, self.project, self.arrival, self.remaining = index, project, arrival, duration
        self.shape, self.klass, self.series, self.offset = shape, klass, series, offset
        # the run time stands for the lease's requested duration (reservations and backfill plan with it)
        self.request = Request(f"j{index:06d}", project, TENANT, shape, submitted_at=arrival, workload_class=klass,
                               duration_seconds=math.ceil(duration))
        self.held = 0.0  # seconds held in earlier segments (the series position)
        self.seg_start = None
        self.token = 0
        self.milli = 0
        self.first_start = None
        self.noticed_at = None
        self.waiting_since = arrival
        self.over = False
        self.done = False
        self.warm = False
        # covered by its project's guarantee at arrival, as the service records it for billing's SLO
        # (``Scheduler.covered``): the project's guaranteed (in-quota) holdings, plus every job of the project already
        # waiting (the core serves a project's own requests in submission order, so all of them come first), plus
        # it, within the deserved share
        self.in_quota = False
        # the first rule (waves 12-14): all the project's holdings (borrowed too) plus it alone, the backlog ignored
        self.in_quota_alone = False
        self.completed_at = None
        self.last_reason = ""  # the core's last waiting reason for it (what held a slow in-quota start)


class Replay:
    def __init__(self, *, loop: str, days: float, load_factor: float, tick: float, cold_mig: float,
                 cold_whole: float, warm_bind: float, price_minor: int, history_hours: float, queue_cap: int,
                 start_day: float = 0.0, cycle: float = 60.0, human_delay: float = 1800.0,
                 checkpoint: float = CHECKPOINT_S, plan_on_wait: float = PLAN_ON_WAIT_S, reservations: bool = False,
                 quotas: str = "before"):
        if loop not in SETTINGS:
            raise ValueError(f"unknown setting {loop!r}; use {', '.join(SETTINGS)}")
        self.loop, self.tick, self.cold_mig = loop, tick, cold_mig
        self.cold_whole, self.warm_bind, self.cycle = cold_whole, warm_bind, cycle
        self.price_minor, self.history_seconds, self.queue_cap = price_minor, history_hours * 3600, queue_cap
        self.human_delay, self.checkpoint = human_delay, checkpoint
        self.plan_on_wait = plan_on_wait
        # the core's reservations and backfill from durations, as the broker ships them (LEASE_RESERVATIONS), on
        # request only: a month with them took over three times the CPU (docs/capacity.md); ``ends``: each running
        # job's end (its start + what is left of its run time), which the core plans with
        self.reservations = reservations and loop not in ("static", "fifo")
        self.ends: dict[str, float] = {}
        self.reserved_jobs: set[str] = set()
        self.load_factor = load_factor
        trace = load(DEFAULT_TRACE, days=start_day + days)
        skip = start_day * 86400
        # quotas are set ahead of the month they serve: from the GPU-time of the days before the window (up to
        # QUOTA_HISTORY_DAYS); "window": from the window's own GPU-time, an oracle no operator has (wave 16's rule)
        if quotas not in ("before", "window"):
            raise ValueError(f"unknown quota sizing {quotas!r}; use before or window")
        history = [job for job in trace.jobs if skip - QUOTA_HISTORY_DAYS * 86400 <= job.arrival < skip]
        self.quotas_from = "before" if quotas == "before" and history else "window"
        trace.jobs = [replace(job, index=i, arrival=job.arrival - skip)
                      for i, job in enumerate(j for j in trace.jobs if j.arrival >= skip)]
        self.end = days * 86400
        self.series = _series()
        singles = _openb_single_gpu_shapes()
        self.jobs: list[Job] = []
        single_i = 0
        classes = classify(trace.jobs)
        for job, klass in zip(trace.jobs, classes, strict=True):
            if job.gpus > 1:
                shape = Shape(Kind.WHOLE, job.gpus, models=(MODEL,), gang=job.gpus <= PER_NODE)
            else:
                shape = singles[single_i % len(singles)]
                single_i += 1
            pick = (job.index * 7919) % len(self.series)
            offset = (job.index * 104729) % len(self.series[pick][0])
            self.jobs.append(Job(job.index, job.project, job.arrival, job.duration, shape, klass, pick, offset))
        self.classes = Counter(j.klass.value for j in self.jobs)
        # fleet size: offered milli-seconds over the window / load, in whole nodes
        self.offered_gpus = sum(self._unit_milli(j.shape) * j.shape.count * min(j.remaining, self.end - j.arrival)
                                for j in self.jobs) / self.end / FULL
        gpus = max(math.ceil(self.offered_gpus / load_factor / PER_NODE) * PER_NODE, 32)
        mig_work = sum(self._unit_milli(j.shape) * min(j.remaining, self.end - j.arrival)
                       for j in self.jobs if j.shape.kind == Kind.MIG) / self.end / FULL
        mig_nodes = max(1, round(mig_work / load_factor / PER_NODE))
        nodes, devices = [], []
        for n in range(gpus // PER_NODE):
            nodes.append(Node(f"n{n:04d}"))
            mode = GpuMode.MIG if n >= gpus // PER_NODE - mig_nodes else GpuMode.WHOLE
            for g in range(PER_NODE):
                devices.append(Gpu(f"n{n:04d}/{g}", f"n{n:04d}", MODEL, mode, g))
        self.gpus = gpus
        parts = quota_sim.partitions(trace, gpus, sized_from=history if self.quotas_from == "before" else None)
        self.partitions = parts
        self.deserved = {p: n * FULL for p, n in parts.items()}
        if loop == "static":  # each project owns its partition: deserved = limit, no borrowing
            quotas = tuple(QuotaSpec(p, TENANT, MODEL, n * FULL, n * FULL, 0) for p, n in parts.items())
        else:
            quotas = tuple(QuotaSpec(p, TENANT, MODEL, n * FULL, gpus * FULL, 1) for p, n in parts.items())
        quotas += (QuotaSpec(WARM, "_platform", MODEL, 0, gpus * FULL, 1),)
        self.policy = self._policy()
        # reclaim across modes (``Scheduler._switch_for``): where the loop switches modes on its own (the pool kinds
        # on ``auto``), an in-quota request that fits nowhere in its mode empties a GPU of another mode and has it
        # switched, as the live cycle does with the capacity loop installed
        switch_modes = frozenset(
            (MODEL, mode) for mode, kind in ((GpuMode.MIG, self.policy.mig_layout),
                                             (GpuMode.WHOLE, self.policy.mode_switch),
                                             (GpuMode.SHARED, self.policy.mode_switch))
            if loop in PLANNED and kind == Mode.AUTO)
        self.base = Snapshot(nodes=tuple(nodes), gpus=tuple(devices), quotas=quotas,
                             enforce_quotas=loop != "fifo", switch_modes=switch_modes)
        self.scheduler = ReplayScheduler(self.base, reservations=self.reservations, ends=self.ends)
        self.by_id = {j.request.id: j for j in self.jobs}
        self.queue: dict[str, Job] = {}
        self.heap: list = []
        self.seq = 0
        self.history: deque = deque()
        self.warm: dict[str, tuple[float, str]] = {}  # warm allocation id -> (ready at, profile)
        self.warm_seq = 0
        self.mode_since: dict[str, float] = {}
        self.proposed: Counter = Counter()
        self.applied: Counter = Counter()
        self.refused: Counter = Counter()
        self.stats = Counter()
        self.slow_in_quota: Counter = Counter()  # (shape label, class) -> in-quota starts over SLOW_IN_QUOTA_S
        self.slow_in_quota_reasons: Counter = Counter()  # the kind of their last waiting reason (``_reason_kind``)
        self.ttg: dict[str, list[float]] = {"cold": [], "warm": [], "mig": [], "whole": [], "in_quota": [],
                                            "over_quota": [], "in_quota_alone": []}
        self.waits: list[float] = []
        self.touched: set[str] = set()
        self.violations = 0
        self.mig_gpus_initial = sum(1 for d in devices if d.mode == GpuMode.MIG)
        self.held: Counter = Counter()  # project -> milli its jobs hold now
        self.guaranteed: Counter = Counter()  # project -> milli its jobs hold within quota (not preemptible) now
        self.backlog: Counter = Counter()  # project -> milli its waiting jobs ask for
        self.held_total = 0
        self.open_advice: dict[tuple, float] = {}  # advise: a proposal's decision -> when first made
        self.freed = True  # capacity may have grown since the last cycle: every waiting group is a candidate
        self.fresh: list[Job] = []  # arrived or requeued since the last cycle
        self.timeline: list[tuple[float, float, int]] = []  # (hour, allocated % of the fleet, waiting jobs)
        # the planner on a wait (issue 30): where the pool kinds apply on their own, a request left waiting that an
        # idle GPU of another mode would serve asks for a planner run, at most one per ``plan_on_wait`` s
        self.wait_modes = frozenset(
            mode for mode, kind in ((GpuMode.MIG, self.policy.mig_layout), (GpuMode.WHOLE, self.policy.mode_switch),
                                    (GpuMode.SHARED, self.policy.mode_switch))
            if self.loop in PLANNED and plan_on_wait > 0 and kind == Mode.AUTO)
        self.wait_seen = False  # such a wait seen since the last planner run
        self.last_plan = -math.inf
        self.wake_at = -math.inf  # a wake-up event is pushed for then (the debounce's end)
        self._last_warm_milli = {}
        # the planner snapshot's records kept from one run to the next (``_snapshot``)
        self._instances: dict[str, tuple] = {}
        self._gpu_records: dict[str, tuple] = {}

    @staticmethod
    def _unit_milli(shape: Shape) -> int:
        return need_for(shape, MODEL).milli

    def push(self, when, kind, key, token=0):
        self.seq += 1
        heapq.heappush(self.heap, (when, kind, self.seq, key, token))

    # -- holding and metering ---------------------------------------------------------------------------
    def _start(self, job: Job, allocation: Allocation, now: float, warm: bool) -> None:
        job.milli = allocation.milli
        job.over = allocation.preemptible
        job.seg_start = now
        job.token += 1
        job.noticed_at = None
        if self.queue.pop(job.request.id, None) is not None:
            self.backlog[job.project] -= self._ask(job)
        self.held[job.project] += job.milli
        if not job.over:
            self.guaranteed[job.project] += job.milli
        self.held_total += job.milli
        if job.first_start is None:
            job.first_start = now
            wait = now - job.arrival
            provision = self.warm_bind if warm else (self.cold_mig if job.shape.kind == Kind.MIG else self.cold_whole)
            self.waits.append(wait)
            self.ttg["warm" if warm else "cold"].append(wait + provision)
            self.ttg["mig" if job.shape.kind == Kind.MIG else "whole"].append(wait + provision)
            self.ttg["in_quota" if job.in_quota else "over_quota"].append(wait + provision)
            if job.in_quota_alone:
                self.ttg["in_quota_alone"].append(wait + provision)
            if job.in_quota and wait + provision > SLOW_IN_QUOTA_S:  # what holds the in-quota p95 (issue 30)
                shape = job.shape
                label = f"mig {shape.profile}" if shape.kind == Kind.MIG else f"whole x{shape.count}"
                self.slow_in_quota[(label, job.klass.value)] += 1
                self.slow_in_quota_reasons[_reason_kind(job.last_reason)] += 1
            self.stats["warm_binds" if warm else "cold_starts"] += 1
        self.push(now + job.remaining, _COMPLETE, job.request.id, job.token)
        self.ends[job.request.id] = now + job.remaining

    def _ask(self, job: Job) -> int:
        """The milli ``job`` asks for (every unit)."""
        return self._unit_milli(job.shape) * job.shape.count

    def _release_hold(self, job: Job) -> None:
        self.held[job.project] -= job.milli
        if not job.over:
            self.guaranteed[job.project] -= job.milli
        self.held_total -= job.milli
        self.freed = True

    def _meter(self, job: Job, until: float) -> float:
        """Close the running segment at ``until``: allocated, engine-active and idle GPU-seconds."""
        ran = max(0.0, min(until, self.end) - job.seg_start)
        util, total, idle = self.series[job.series]
        length = len(util)
        first = job.offset + int(job.held // 60)
        minutes = int(ran // 60)
        cycles, rest = divmod(minutes, length)
        start = first % length

        def span(prefix):
            whole = cycles * prefix[length]
            end = start + rest
            if end <= length:
                return whole + prefix[end] - prefix[start]
            return whole + prefix[length] - prefix[start] + prefix[end - length]

        gpu = job.milli / FULL
        self.stats["allocated_s"] += gpu * ran
        self.stats["active_s"] += gpu * 60 * span(total) / 100
        self.stats["idle_s"] += gpu * 60 * span(idle)
        job.held += until - job.seg_start
        job.seg_start = None
        return ran

    def _stop(self, job: Job, now: float, *, requeue: bool) -> None:
        """End the running segment: the job completed (``requeue`` False) or goes back to the queue keeping the
        work up to its last checkpoint (preempted, drained, suspended)."""
        ran = now - job.seg_start
        self._meter(job, now)
        self.scheduler.cluster.remove(job.request.id)
        self.ends.pop(job.request.id, None)
        self._release_hold(job)
        job.token += 1
        if requeue:
            self._requeue(job, ran, now)
        else:
            job.remaining -= ran

    def _requeue(self, job: Job, ran: float, now: float) -> None:
        saved = math.floor(ran / self.checkpoint) * self.checkpoint if self.checkpoint > 0 else ran
        saved = min(saved, job.remaining)
        job.remaining -= saved
        self.stats["lost_s"] += (ran - saved) * job.milli / FULL
        self.stats["preemptions"] += 1
        job.waiting_since = now
        self.queue[job.request.id] = job
        self.backlog[job.project] += self._ask(job)
        self.fresh.append(job)

    # -- the loop ------------------------------------------------------------------------------------
    def run(self) -> dict:
        wall, cpu = time.perf_counter(), time.process_time()
        for job in self.jobs:
            self.push(job.arrival, _ARRIVE, job.request.id)
        self.push(self.tick, _TICK, "")  # every setting ticks, so the scheduling cycles are the same
        next_sample = 0.0
        last_cycle = -math.inf
        while self.heap and self.heap[0][0] < self.end:
            now = max(self.heap[0][0], last_cycle + self.cycle)
            while next_sample <= now and next_sample < self.end:
                self.timeline.append((round(next_sample / 3600, 2), round(100 * self.held_total / FULL / self.gpus, 2),
                                      len(self.queue)))
                next_sample += SAMPLE_S
            last_cycle = now
            tick = False
            while self.heap and self.heap[0][0] <= now:
                when, kind, _, key, token = heapq.heappop(self.heap)
                if kind == _ARRIVE:
                    job = self.by_id[key]
                    deserved = self.deserved.get(job.project, 0)
                    job.in_quota_alone = self.held[job.project] + self._ask(job) <= deserved
                    job.in_quota = (self.guaranteed[job.project] + self.backlog[job.project] + self._ask(job)
                                    <= deserved)
                    self.history.append((when, _demand_shape(job.shape), job.shape.count))
                    if not self._bind_warm(job, now):
                        self.queue[key] = job
                        self.backlog[job.project] += self._ask(job)
                        self.fresh.append(job)
                elif kind == _COMPLETE:
                    job = self.by_id[key]
                    if token == job.token and job.seg_start is not None:
                        self._stop(job, now, requeue=False)
                        self._finish(job, now)
                elif kind == _TICK:
                    tick = True
            self._schedule(now)
            # the planner on a wait: as soon as the debounce allows (a wake-up at its end, as the live cycle
            # that runs every 10 s would see the wait again then)
            on_wait = not tick and self.wait_seen
            if on_wait and now < self.last_plan + self.plan_on_wait:
                on_wait = False
                if self.wake_at < self.last_plan + self.plan_on_wait:
                    self.wake_at = self.last_plan + self.plan_on_wait
                    self.push(self.wake_at, _WAKE, "")
            if tick or on_wait:
                if self.loop in PLANNED:
                    self.stats["plans_on_wait" if on_wait else "plans_on_timer"] += 1
                    self._plan(now)
                self._schedule(now)
                if tick:
                    self.push(now + self.tick, _TICK, "")
        while next_sample < self.end:  # the quiet end of the window: the state as the last event left it
            self.timeline.append((round(next_sample / 3600, 2), round(100 * self.held_total / FULL / self.gpus, 2),
                                  len(self.queue)))
            next_sample += SAMPLE_S
        for job in self.jobs:
            if job.seg_start is not None:
                self._meter(job, self.end)
        for allocation_id, (ready, _) in self.warm.items():
            self.stats["warm_held_s"] += self._warm_milli(allocation_id) / FULL * max(0.0, self.end - ready)
        return self._result(time.perf_counter() - wall, time.process_time() - cpu)

    def _finish(self, job: Job, now: float) -> None:
        job.done = True
        job.completed_at = now
        self.stats["completed"] += 1

    def _warm_milli(self, allocation_id: str) -> int:
        allocation = self.scheduler.cluster.allocations.get(allocation_id)
        return allocation.milli if allocation else 0

    def _candidates(self) -> list[Request]:
        """What one cycle may place. After capacity grew (a completion, a preemption, a loop change), per
        (project, shape) the oldest waiting: as many as the project's guarantee still covers (its deserved share
        less its guaranteed holdings, in requests of that shape: the live cycle, which reads the whole queue,
        places all of them at once, reclaiming where it must), plus two: what one cycle can place of a group
        beyond that is a prefix, and a cycle that placed something is followed by another. Otherwise only what
        arrived or was requeued since the last cycle: capacity only shrank, so what waited then waits now (the
        scheduler would say so again). Wave 16 passed two per (project, shape) whatever the guarantee, so a
        sweep of a project with a large guarantee started two requests per cycle, in quota or not."""
        out = self._holders()
        if not self.freed:
            held = {request.id for request in out}
            return out + [job.request for job in self.fresh if job.request.id in self.queue
                          and job.request.id not in held]
        seen: Counter = Counter()
        for request in out:
            seen[(request.project, request.shape)] += 1
        chosen = {request.id for request in out}
        limits: dict[tuple, int] = {}
        for job in sorted(self.queue.values(), key=lambda j: (j.waiting_since, j.index)):
            key = (job.project, job.shape)
            limit = limits.get(key)
            if limit is None:
                covered = self.deserved.get(job.project, 0) - self.guaranteed[job.project]
                limit = limits[key] = 2 + max(0, covered) // max(self._ask(job), 1)
            if seen[key] < limit and job.request.id not in chosen:
                seen[key] += 1
                out.append(job.request)
        return out

    def _holders(self) -> list[Request]:
        """With reservations: the oldest waiting requests by submission (what the core's holders are chosen from,
        ``broker.scheduler.reserve``: the oldest, at most four), passed to every cycle as the live cycle passes the
        whole queue, so a reservation is not lost in a cycle that would otherwise see only the new arrivals."""
        if not self.reservations or not self.queue:
            return []
        oldest = sorted(self.queue.values(), key=lambda j: (j.request.submitted_at, j.request.id))[:2 * RESERVE_LIMIT]
        return [job.request for job in oldest]

    def _schedule(self, now: float) -> None:
        if not self.freed and not self.fresh:
            return
        requests = self._candidates()
        self.freed, self.fresh = False, []
        if not requests:
            return
        placed = False
        decisions = self.scheduler.schedule(requests, now=now)
        if self.scheduler.reserved:
            self.stats["reservation_cycles"] += 1
            self.reserved_jobs.update(job for r in self.scheduler.reserved for job in r.requests)
        if self.wait_modes and not self.wait_seen:
            self.wait_seen = any(mode in self.wait_modes for _, mode in pool_waits(self.scheduler, requests, decisions))
        switches = {}
        for decision in decisions:
            if decision.mode == DecisionMode.WAITING:
                self.by_id[decision.request].last_reason = decision.reason
                continue
            for victim in decision.victims:
                self._lose(victim, now)
                if decision.switch:
                    self.stats["switch_victims"] += 1
            if decision.mode == DecisionMode.SWITCH:  # reclaim across modes: emptied, switched, placed next cycle
                self.by_id[decision.request].last_reason = decision.reason
                switches[decision.switch[0]] = GpuMode(decision.switch[1])
                continue
            self._start(self.by_id[decision.request], decision.allocation, now, warm=False)
            placed = True
        if switches:
            # the switch as the capacity loop carries it out (at once here, as every switch and preemption of this
            # replay); its request is placed by the next cycle, woken for it
            self._switch_all(switches)
            for gpu_id in switches:
                self.mode_since[gpu_id] = now
            self.stats["mode_switches"] += len(switches)
            self.stats["switches_for_in_quota"] += len(switches)
            self.push(now + self.cycle, _WAKE, "")
        if placed or switches:
            self.freed = True  # more of a group may fit: the next cycle looks at every group again

    def _lose(self, allocation_id: str, now: float) -> None:
        """The scheduler preempted ``allocation_id`` (it already removed it from its state)."""
        if allocation_id in self.warm:
            ready, _ = self.warm.pop(allocation_id)
            self.stats["warm_held_s"] += max(0.0, now - ready) * self._last_warm_milli.pop(allocation_id, 0) / FULL
            return
        job = self.by_id[allocation_id]
        self.ends.pop(allocation_id, None)
        if not job.over:
            self.violations += 1  # an in-quota lease preempted: a guarantee broken
        ran = now - job.seg_start
        self._meter(job, now)
        self._release_hold(job)
        job.token += 1
        self._requeue(job, ran, now)
        self.stats["preempted_by_scheduler"] += 1

    # -- warm pools -------------------------------------------------------------------------------------
    _last_warm_milli: dict

    def _bind_warm(self, job: Job, now: float) -> bool:
        if job.shape.kind != Kind.MIG or not self.warm:
            return False
        need = need_for(job.shape, MODEL)
        reason, in_quota = self.scheduler.quota_check(job.request, MODEL, need)
        if reason:
            return False
        for allocation_id in sorted(self.warm):
            ready, profile = self.warm[allocation_id]
            if profile != job.shape.profile or ready > now:
                continue
            warm = self.scheduler.cluster.remove(allocation_id)
            del self.warm[allocation_id]
            self.stats["warm_held_s"] += warm.milli / FULL * (now - ready)
            self._last_warm_milli.pop(allocation_id, None)
            unit = warm.units[0]
            allocation = Allocation(job.request.id, job.project, TENANT, MODEL, warm.node, (unit,),
                                    preemptible=not in_quota, started_at=now)
            self.scheduler.cluster.apply(allocation)
            self._start(job, allocation, now, warm=True)
            return True
        return False

    # -- the planner ------------------------------------------------------------------------------------
    def _snapshot(self, now: float) -> CapacitySnapshot:
        """The planner's snapshot of the replay now. The records of what did not change since the last one are
        the same objects: an allocation's instances while its segment and notice are the same, a GPU's record
        while its mode and what it holds are (most of the fleet from one planner run to the next)."""
        cluster = self.scheduler.cluster
        instances: dict[str, list] = {}
        warm: dict[str, list] = {}
        made_before, made = self._instances, {}
        utilisation = []
        training = self.loop == "auto"  # training series only where its reclaim (suspension) is on
        window = 3600 if training else 1800
        for allocation in cluster.allocations.values():
            if allocation.id in self.warm:
                ready, profile = self.warm[allocation.id]
                unit = allocation.units[0]
                warm.setdefault(unit.gpu, []).append(WarmInstance(allocation.id, profile, unit.mig_start,
                                                                  ready <= now))
                continue
            job = self.by_id[allocation.id]
            key = (job.seg_start, job.noticed_at, allocation.preemptible, allocation.units)
            entry = made_before.get(allocation.id)
            if entry is None or entry[0] != key:
                entry = (key, [(unit.gpu, Instance(allocation.id, job.project, not allocation.preemptible, job.klass,
                                                   unit.mig_profile, unit.mig_start, unit.milli,
                                                   started_at=job.seg_start, noticed_at=job.noticed_at))
                               for unit in allocation.units])
            made[allocation.id] = entry
            for gpu_id, instance in entry[1]:
                instances.setdefault(gpu_id, []).append(instance)
            if job.seg_start is not None and now - job.seg_start >= window and (
                    job.klass != WorkloadClass.TRAINING or allocation.preemptible or training):
                utilisation.append(self._trailing(job, now, window))
        self._instances = made
        records, gpus, no = self._gpu_records, [], ()
        for gpu_id, state in cluster.gpus.items():
            held = tuple(instances.get(gpu_id, no))
            warm_here = tuple(warm.get(gpu_id, no))
            # the instances by identity: a cached record holds them, so their ids are not reused meanwhile
            key = (state.gpu.mode, self.mode_since.get(gpu_id, 0.0), tuple(map(id, held)), warm_here)
            entry = records.get(gpu_id)
            if entry is None or entry[0] != key:
                entry = records[gpu_id] = (key, CapacityGpu(gpu_id, state.gpu.node, MODEL, state.gpu.mode, held,
                                                            warm_here, key[1]))
            gpus.append(entry[1])
        gpus = tuple(gpus)
        while self.history and self.history[0][0] < now - self.history_seconds:
            self.history.popleft()
        arrivals: Counter = Counter()
        for _, shape, count in self.history:
            arrivals[shape] += count
        queue = []
        used_in = {p: u[0] for (p, _), u in cluster.project_usage.items()}
        for job in sorted(self.queue.values(), key=lambda j: (j.waiting_since, j.index))[: self.queue_cap]:
            need = self._unit_milli(job.shape) * job.shape.count
            queue.append(Waiting(job.request.id, job.project, _demand_shape(job.shape), job.shape.count,
                                 used_in.get(job.project, 0) + need <= self.deserved.get(job.project, 0),
                                 waited_seconds=int(now - job.waiting_since)))
        return CapacitySnapshot(gpus=gpus, queue=tuple(queue),
                                history=History(now - self.history_seconds, now,
                                                tuple(Arrivals(s, n) for s, n in sorted(arrivals.items()))),
                                utilisation=tuple(utilisation), prices=(Price(MODEL, self.price_minor),),
                                policies=(self.policy,))

    def _policy(self) -> Policy:
        """The planner's policy in this setting."""
        if self.loop == "default":  # the shipped policy: DEFAULT_MODES and DEFAULT_IDLE_RULES
            return Policy(cold_provision_seconds=int(self.cold_mig))
        mode = Mode.AUTO if self.loop == "auto" else Mode.ADVISE
        rules = DEFAULT_IDLE_RULES
        if self.loop == "auto":  # idle training is suspended too (1 h under 5 %, 30 min notice)
            rules = tuple((c, IdleRule(True, 50, 3600, 1800) if c == ReclaimClass.TRAINING else r)
                          for c, r in DEFAULT_IDLE_RULES)
        return Policy(mode_switch=mode, mig_layout=mode, warm_pool=mode, idle_reclaim=mode,
                      cold_provision_seconds=int(self.cold_mig), idle_rules=rules)

    def _trailing(self, job: Job, now: float, window: int) -> Utilisation:
        util = self.series[job.series][0]
        held = job.held + (now - job.seg_start)
        last = job.offset + int(held // 60)
        samples = [util[(last - window // 60 + i) % len(util)] * 10 for i in range(window // 60)]
        return Utilisation(job.request.id, now - window, 60, tuple(samples), (0,) * len(samples))

    def _plan(self, now: float) -> None:
        """Run the planner; apply what the setting applies. ``advise``: a person applies a proposal that is
        still open (made again by this run) ``human_delay`` s after the planner first made it, as the live
        service keeps one open row per decision (``capacity.services``' proposal identity)."""
        self.last_plan, self.wait_seen = now, False
        snapshot = self._snapshot(now)
        adjustments = plan_capacity(snapshot, now=now)
        still_open = {}
        for adjustment in adjustments:
            self.proposed[adjustment.kind.value] += 1
            if self.loop == "advise":
                decision = _decision(adjustment)
                since = self.open_advice.get(decision, now)
                still_open[decision] = since
                if now - since < self.human_delay:
                    continue
                del still_open[decision]
            elif adjustment.mode != Mode.AUTO:
                continue
            if self._apply(adjustment, now):
                self.applied[adjustment.kind.value] += 1
                self.freed = True
            else:
                self.refused[adjustment.kind.value] += 1
        self.open_advice = still_open

    def _apply(self, adjustment, now: float) -> bool:
        """Apply with the live service's conditional checks; False when the world moved on."""
        cluster = self.scheduler.cluster
        change = adjustment.change
        holders = {gpu_id: [] for gpu_id in cluster.gpus}
        for allocation in cluster.allocations.values():
            for unit in allocation.units:
                holders[unit.gpu].append(allocation)
        if adjustment.kind in (AdjustmentKind.MODE_SWITCH, AdjustmentKind.MIG_LAYOUT):
            held = holders[change.gpu]
            if any(not a.preemptible and a.id not in self.warm for a in held):
                self.violations += 1  # the planner proposed touching an in-quota holder: must never happen
                return False
            if held and not change.drain:
                return False
            if {a.id for a in held} - set(adjustment.risk):
                return False
            for allocation in held:
                cluster.remove(allocation.id)
                self._lose(allocation.id, now)
                self.touched.add(allocation.id)
            self._switch(change.gpu, GpuMode(change.to_mode))
            self.mode_since[change.gpu] = now
            self.stats["mode_switches"] += 1
            return True
        if adjustment.kind == AdjustmentKind.WARM_POOL:
            for warm_id in change.remove:
                if warm_id in self.warm:
                    ready, _ = self.warm.pop(warm_id)
                    allocation = cluster.remove(warm_id)
                    self.stats["warm_held_s"] += allocation.milli / FULL * max(0.0, now - ready)
            for slot in change.slots:
                state = cluster.gpus[slot.gpu]
                if state.gpu.mode != GpuMode.MIG or any(a.id not in self.warm for a in holders[slot.gpu]):
                    continue
                profile = next(p for p in _profiles() if p.name == slot.profile)
                if slot.start not in state.mig_starts(profile):
                    continue
                self.warm_seq += 1
                warm_id = f"{WARM}{self.warm_seq:07d}"
                unit = Unit(slot.gpu, profile.gpu_milli, profile.memory_mib, profile.name, slot.start)
                cluster.apply(Allocation(warm_id, WARM, "_platform", MODEL, state.gpu.node, (unit,), True,
                                         started_at=now))
                self.warm[warm_id] = (now + self.cold_mig, profile.name)
                self._last_warm_milli[warm_id] = profile.gpu_milli
            return True
        if adjustment.kind == AdjustmentKind.IDLE_RECLAIM:
            job = self.by_id.get(change.lease)
            if job is None or job.seg_start is None:
                return False
            if change.step in ("notice", "cancel"):
                job.noticed_at = now if change.step == "notice" else None
                return True
            suspend = change.step == "release" and job.klass == WorkloadClass.TRAINING
            self._stop(job, now, requeue=change.step == "preempt" or suspend)
            if suspend:  # resumable training: checkpoint, requeue, resume when capacity frees
                self.stats["suspended_idle"] += 1
            elif change.step == "release":  # an idle interactive session ends
                self._finish(job, now)
                self.stats["released_idle"] += 1
            else:
                self.stats["preempted_idle"] += 1
            self.touched.add(job.request.id)
            return True
        return False

    def _switch(self, gpu_id: str, mode: GpuMode) -> None:
        """Change a GPU's mode: a new scheduler state from the snapshot with the current allocations."""
        self._switch_all({gpu_id: mode})

    def _switch_all(self, modes: dict[str, GpuMode]) -> None:
        """Change GPUs' modes (GPU id -> its new mode) in one new scheduler state."""
        gpus = tuple(replace(g, mode=modes[g.id]) if g.id in modes else g for g in self.base.gpus)
        self.base = replace(self.base, gpus=gpus)
        allocations = tuple(self.scheduler.cluster.allocations.values())
        self.scheduler = ReplayScheduler(replace(self.base, allocations=allocations), reservations=self.reservations,
                                         ends=self.ends)

    # -- figures -------------------------------------------------------------------------------------
    def _result(self, wall: float, cpu: float) -> dict:
        s = self.stats
        capacity_s = self.gpus * self.end
        hours = 3600
        idle_h = s["idle_s"] / hours
        useful_h = s["active_s"] / hours
        pct = quota_sim._pct
        done = [j for j in self.jobs if j.completed_at is not None]
        jct = [j.completed_at - j.arrival for j in done]
        fleet_cost = self.gpus * self.end / hours * self.price_minor
        return {
            "setting": self.loop,
            "loop": self.loop,
            "offered_load": round(self.offered_gpus / self.gpus, 3),
            "jobs": len(self.jobs),
            "classes": {k: {"jobs": n, "share_pct": round(100 * n / max(len(self.jobs), 1), 1)}
                        for k, n in sorted(self.classes.items())},
            "gpus": self.gpus,
            "quotas_from": self.quotas_from,
            "partitions": self.partitions,
            "mig_gpus_at_start": self.mig_gpus_initial,
            "window_days": round(self.end / 86400, 2),
            "fleet_gpu_hours": round(capacity_s / hours, 1),
            "fleet_allocation_pct": round(100 * s["allocated_s"] / capacity_s, 2),
            "allocated_gpu_hours": round(s["allocated_s"] / hours, 1),
            "useful_gpu_hours": round(useful_h, 1),
            "useful_share_pct": round(100 * s["active_s"] / capacity_s, 2),
            "engine_active_share_pct": round(100 * s["active_s"] / max(s["allocated_s"], 1e-9), 2),
            "idle_allocated_gpu_hours": round(idle_h, 1),
            "idle_allocated_cost_minor": round(idle_h * self.price_minor),
            "warm_held_gpu_hours": round(s["warm_held_s"] / hours, 1),
            "warm_holding_cost_minor": round(s["warm_held_s"] / hours * self.price_minor),
            "cost_per_useful_gpu_hour_minor": round(fleet_cost / max(useful_h, 1e-9)),
            "ttg_p95_s": {k: round(pct(v, 0.95), 1) for k, v in self.ttg.items()},
            "ttg_p50_s": {k: round(pct(v, 0.50), 1) for k, v in self.ttg.items()},
            "ttg_n": {k: len(v) for k, v in self.ttg.items()},
            # in-quota requests whose time to GPU passed the 60 s target, by shape and class
            "in_quota_over_60s": {f"{label} ({klass})": n for (label, klass), n in sorted(self.slow_in_quota.items())},
            "in_quota_over_60s_by_reason": dict(self.slow_in_quota_reasons.most_common()),
            "queue_wait_s": {"mean": round(sum(self.waits) / max(len(self.waits), 1), 1),
                             "p50": round(pct(self.waits, 0.50), 1),
                             "p95": round(pct(self.waits, 0.95), 1)},
            "jct_s": {"mean": round(sum(jct) / max(len(jct), 1), 1), "p95": round(pct(jct, 0.95), 1)},
            "started": len(self.waits),
            "completed": s["completed"],
            "preemptions": s["preemptions"],
            "gpu_hours_lost_to_preemption": round(s["lost_s"] / hours, 1),
            "leases_touched_by_reclaim": len(self.touched),
            "released_idle": s["released_idle"],
            "suspended_idle": s["suspended_idle"],
            "preempted_idle": s["preempted_idle"],
            "preempted_by_scheduler": s["preempted_by_scheduler"],
            "mode_switches": s["mode_switches"],
            # reclaim across modes: the GPUs the scheduler had switched for in-quota work, the leases it preempted so
            "switches_for_in_quota": s["switches_for_in_quota"],
            "switch_victims": s["switch_victims"],
            "planner_runs": {"timer": s["plans_on_timer"], "on_wait": s["plans_on_wait"]},
            "warm_binds": s["warm_binds"],
            "in_quota_violations": self.violations,
            "reservations": self.reservations,
            "reservation_cycles": s["reservation_cycles"],
            "reserved_jobs": len(self.reserved_jobs),
            "proposed": dict(sorted(self.proposed.items())),
            "applied": dict(sorted(self.applied.items())),
            "refused_by_conditional_checks": dict(sorted(self.refused.items())),
            "timeline": {"hour": [t[0] for t in self.timeline], "allocated_pct": [t[1] for t in self.timeline],
                         "waiting": [t[2] for t in self.timeline]},
            "wall_seconds": round(wall, 1),
            "cpu_seconds": round(cpu, 1),
        }


def _decision(adjustment) -> tuple:
    """What a person decides on (the live service's proposal identity): kind, target and direction."""
    change = adjustment.change
    return (adjustment.kind.value, adjustment.target, change.to_mode, change.drain, change.step,
            change.size_after > change.size_before)


def _profiles():
    from gpus.mig import profiles_for

    return profiles_for(MODEL)


def _run(job: tuple) -> tuple[str, float, dict]:
    setting, load_factor, kwargs = job
    replay = Replay(loop=setting, load_factor=load_factor, **kwargs)
    return setting, load_factor, replay.run()


def results_name(setting: str, load_factor: float) -> str:
    """``capacity_<setting>`` at the headline load (0.8), ``capacity_load<pct>_<setting>`` at the others."""
    if load_factor == HEADLINE_LOAD:
        return f"capacity_{setting}"
    return f"capacity_load{round(load_factor * 100)}_{setting}"


def main_capacity(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sim capacity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", "--loop", dest="setting", default="all",
                        help=f"{', '.join(SETTINGS)}, a comma list, or all")
    parser.add_argument("--days", type=float, default=30.0, help="replay window (days of Philly arrivals)")
    parser.add_argument("--start-day", type=float, default=20.0,
                        help="skip this many days of the trace first (before day 19 it holds a few jobs a day)")
    parser.add_argument("--load", default="0.8",
                        help="mean offered load as a fraction of the fleet (sizes the fleet); a comma list runs each")
    parser.add_argument("--tick", type=float, default=300.0, help="seconds between planner runs")
    parser.add_argument("--cycle", type=float, default=10.0, help="at most one scheduling cycle per this many s")
    parser.add_argument("--plan-on-wait", type=float, default=PLAN_ON_WAIT_S,
                        help="where the pool kinds are auto, a request waiting for a mode an idle GPU could be "
                             "switched to runs the planner, at most once per this many s (0: on the timer only)")
    parser.add_argument("--reservations", choices=("on", "off"), default="off",
                        help="the core's reservations and backfill from durations in every setting with quotas "
                             "(the broker ships LEASE_RESERVATIONS on; here off by default: a month with them "
                             "takes over three times the CPU; static and fifo never reserve)")
    parser.add_argument("--cold-mig", type=float, default=30.0, help="seconds of a cold MIG create + start")
    parser.add_argument("--cold-whole", type=float, default=10.0, help="seconds of a cold whole-GPU start")
    parser.add_argument("--warm-bind", type=float, default=0.5, help="seconds of a warm bind")
    parser.add_argument("--price", type=int, default=PRICE_MINOR,
                        help="minor units per H100 GPU-hour (default: the seeded list price, seed_prices)")
    parser.add_argument("--history-hours", type=float, default=6.0, help="request history the planner reads")
    parser.add_argument("--queue-cap", type=int, default=64, help="oldest waiting requests the planner reads")
    parser.add_argument("--human-delay", type=float, default=1800.0,
                        help="advise: seconds until a person applies a proposal that is still open")
    parser.add_argument("--checkpoint", type=float, default=float(CHECKPOINT_S),
                        help="seconds between checkpoints: a preempted or suspended job keeps the work up to the last")
    parser.add_argument("--quotas", choices=("before", "window"), default="before",
                        help="what sizes the projects' quotas (static's partitions, everyone's guarantee): the "
                             f"GPU-time of the {QUOTA_HISTORY_DAYS} days before the window, as an operator sets them "
                             "ahead (default; the window's own when none are before it), or the window's own "
                             "GPU-time (an oracle: every partition fits the month it serves)")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes)")
    parser.add_argument("--json-dir", type=Path, default=None,
                        help="write capacity_<setting>.json (load 0.8) or capacity_load<pct>_<setting>.json here")
    parser.add_argument("--plot", type=Path, default=None,
                        help="PNG of allocation and waiting jobs over the window, one line per setting (load 0.8)")
    args = parser.parse_args(argv)
    settings = SETTINGS if args.setting == "all" else tuple(x.strip() for x in args.setting.split(","))
    for setting in settings:
        if setting not in SETTINGS:
            print(f"unknown setting {setting!r}; use {', '.join(SETTINGS)}", file=sys.stderr)
            return 2
    try:
        loads = [float(x) for x in args.load.split(",")]
    except ValueError:
        print(f"--load: not a number or a comma list of numbers: {args.load!r}", file=sys.stderr)
        return 2
    if any(not 0 < x <= 1.5 for x in loads):
        print("--load: each load must be in (0, 1.5]", file=sys.stderr)
        return 2
    from bench.record import command_line, write  # the benchmarks' one results format

    command = command_line(["-m bench.sim", "capacity", *(sys.argv[2:] if argv is None else argv)])
    kwargs = dict(days=args.days, tick=args.tick, cold_mig=args.cold_mig, cold_whole=args.cold_whole,
                  warm_bind=args.warm_bind, price_minor=args.price, history_hours=args.history_hours,
                  queue_cap=args.queue_cap, start_day=args.start_day, cycle=args.cycle,
                  human_delay=args.human_delay, checkpoint=args.checkpoint, plan_on_wait=args.plan_on_wait,
                  reservations=args.reservations == "on", quotas=args.quotas)
    work = [(setting, load_factor, kwargs) for load_factor in loads for setting in settings]
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            done = list(pool.map(_run, work))
    else:
        done = [_run(item) for item in work]
    for setting, load_factor, result in done:
        if args.json_dir:
            write(results_name(setting, load_factor), result, settings={**vars(args), "load": load_factor},
                  command=command, directory=args.json_dir)
        print(f"  {setting} at load {load_factor}: {result['wall_seconds']} s wall, {result['cpu_seconds']} CPU s",
              flush=True)
    print(table([result for _, _, result in done]))
    if args.plot:
        plot([result for _, load_factor, result in done if load_factor == loads[0]], args.plot)
    return 0


def table(results: list[dict]) -> str:
    columns = (
        ("setting", lambda r: r["setting"]),
        ("load", lambda r: r["offered_load"]),
        ("alloc %", lambda r: r["fleet_allocation_pct"]),
        ("useful %", lambda r: r["useful_share_pct"]),
        ("idle GPUh", lambda r: r["idle_allocated_gpu_hours"]),
        ("inQ p95 s", lambda r: r["ttg_p95_s"]["in_quota"]),
        ("overQ p95 s", lambda r: r["ttg_p95_s"]["over_quota"]),
        ("wait p50 s", lambda r: r["queue_wait_s"]["p50"]),
        ("wait p95 s", lambda r: r["queue_wait_s"]["p95"]),
        ("JCT mean s", lambda r: r["jct_s"]["mean"]),
        ("preempt", lambda r: r["preemptions"]),
        ("GPUh lost", lambda r: r["gpu_hours_lost_to_preemption"]),
        ("warm cost", lambda r: r["warm_holding_cost_minor"]),
        ("violations", lambda r: r["in_quota_violations"]),
        ("cost/useful h", lambda r: r["cost_per_useful_gpu_hour_minor"]),
    )
    rows = [[name for name, _ in columns]] + [[str(get(r)) for _, get in columns] for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)


def plot(results: list[dict], path: Path) -> None:
    """Allocated share of the fleet and waiting jobs per hour of the window, one line per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), dpi=110, sharex=True)
    for result in results:
        line = result["timeline"]
        days = [h / 24 for h in line["hour"]]
        top.plot(days, line["allocated_pct"], label=result["setting"], linewidth=0.9)
        bottom.plot(days, line["waiting"], label=result["setting"], linewidth=0.9)
    top.set_ylabel("fleet allocated (%)")
    top.set_ylim(0, 100)
    bottom.set_ylabel("jobs waiting")
    bottom.set_xlabel("day of the window")
    for axis in (top, bottom):
        axis.grid(alpha=0.3)
    top.legend(loc="lower right", ncol=3, fontsize=8)
    first = results[0] if results else {}
    top.set_title(f"capacity replay: {first.get('gpus', '?')} H100 GPUs, offered load {first.get('offered_load', '?')}")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
