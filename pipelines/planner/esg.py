r"""The ESG planner: a DNN inference pipeline under an end-to-end latency SLO on shareable GPUs.

After Hui, Xu, Guo and Shen, "ESG: Pipeline-Conscious Efficient Scheduling of DNN Workflows on Serverless
Platforms with Shareable GPUs" (HPDC 2024, arXiv:2404.16812). A pipeline is a DAG of stages; each stage
chooses a **configuration** (a GPU slice, a batch size; the instance count follows from the arrival rate).
Choosing one configuration per stage, in topological order, is a path through a search tree; the path's
cost is the pipeline's GPU cost and it is valid when its end-to-end latency (the DAG's critical path) meets
the SLO. ESG finds the cheapest valid path with:

* **A\* search**: ``f = g + h`` where ``g`` is the cost of the stages chosen so far and ``h`` the sum of the
  cheapest configuration of every stage still open (admissible: it never overestimates), so the first
  complete path taken off the open list is the cheapest valid one;
* **dual-blade pruning**, cutting the tree from both sides: the *latency blade* drops a partial path whose
  critical path, completed with each open stage's fastest configuration, already exceeds the SLO (no
  completion can meet it); the *cost blade* drops a partial path whose ``f`` reaches the cost of the best
  complete plan known (the incumbent, first from a look-ahead greedy pass). Before the search, a stage's
  configurations that another beats on both latency and cost are removed (they can never be in a cheapest
  plan). None of the cuts removes an optimal plan, which the property tests check against exhaustive search;
* **dominator-based SLO distribution** for long pipelines: the stages every path crosses (the dominators of
  the sink in the DAG's dominator tree) cut the pipeline into segments that run one after the other; runs of
  segments are grouped up to ``group_stages`` stages, the SLO is split over the groups in proportion to each
  group's latency at its fastest configurations (``weighting``; the cheapest configurations' latency is the
  other choice, measured worse in docs/pipelines.md), and A\* plans each group against its share, the time a
  group leaves unused passing on to the next. Search then grows linearly with the pipeline's length. A last
  sweep (``reclaim``, ours) offers the slack the groups left to each group in turn and keeps a cheaper plan.

The latency model of a configuration, with ``λ`` requests/s reaching the stage and ``L(b)`` the time of one
batch of ``b`` on the slice: a request waits at most ``(b - 1) / λ`` for its batch to fill, then ``L(b)``;
``ceil(λ L(b) / (b U))`` instances keep each busy at most ``U`` (0.8) of the time, and a batch may queue for
its instance: ``ρ L(b) / (2 (1 - ρ))`` at the instance's load ``ρ`` (M/D/1). Cost: instances × the
slice's GPU units × the tier's price per GPU-hour, in integer minor units × 1/1000 per hour, so costs compare
exactly; per 1,000 requests it is that hourly cost over ``3.6 λ``.

Baselines in this module: ``plan_even_greedy`` (the SLO split evenly over the stages of the longest path,
each stage the cheapest configuration within its share) and ``plan_exhaustive`` (every combination: the
optimum, for small pipelines). Pure Python, no Django, no I/O.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pipelines.planner.profiles import Candidate

UTILISATION = 0.8


class PipelineError(ValueError):
    """A pipeline that cannot be planned as given; ``field`` names the input at fault."""

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    candidates: tuple[Candidate, ...]


@dataclass(frozen=True, slots=True)
class Pipeline:
    stages: tuple[Stage, ...]
    edges: tuple[tuple[str, str], ...]
    slo_ms: float
    rate_rps: float


@dataclass(frozen=True, slots=True)
class Option:
    """A configuration of a stage at the pipeline's arrival rate."""

    candidate: Candidate
    instances: int
    latency_ms: float
    cost: int  # instances x milli x price per GPU-hour: minor units per 1000 hours

    @property
    def batch(self) -> int:
        return self.candidate.batch


@dataclass(frozen=True, slots=True)
class StageChoice:
    stage: str
    option: Option
    budget_ms: float  # the stage's group's share of the SLO (ESG), or its even share (baseline)
    cost_per_1k: float


@dataclass(slots=True)
class Plan:
    method: str
    feasible: bool  # its end-to-end latency meets the SLO by its own model
    choices: tuple[StageChoice, ...]
    latency_ms: float
    cost: int
    cost_per_1k: float
    slo_ms: float
    split: tuple[dict, ...] = ()  # the SLO distribution: groups of stages with their share and use
    expanded: int = 0  # search nodes taken off the open list
    seconds: float = 0.0
    reason: str = ""
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "method": self.method, "feasible": self.feasible,
            "latency_ms": round(self.latency_ms, 4) if math.isfinite(self.latency_ms) else None,
            "slo_ms": self.slo_ms, "cost_per_1k": round(self.cost_per_1k, 6), "cost": self.cost,
            "reason": self.reason, "expanded": self.expanded, "seconds": round(self.seconds, 6),
            "split": list(self.split),
            "stages": [{
                "stage": c.stage, "tier": c.option.candidate.slice.model, "kind": c.option.candidate.slice.kind,
                "profile": c.option.candidate.slice.profile, "milli": c.option.candidate.slice.milli,
                "slice": c.option.candidate.slice.key, "batch": c.option.batch, "instances": c.option.instances,
                "exec_ms": c.option.candidate.exec_ms, "latency_ms": round(c.option.latency_ms, 4),
                "budget_ms": round(c.budget_ms, 4), "cost_per_1k": round(c.cost_per_1k, 6),
                **({"ttft_ms": c.option.candidate.ttft_ms, "tokens_per_s": c.option.candidate.tokens_per_s}
                   if c.option.candidate.ttft_ms is not None else {}),
            } for c in self.choices],
        }


# ---------------------------------------------------------------------------------------------- the model

def option_for(candidate: Candidate, rate_rps: float, prices: Mapping[str, int]) -> Option | None:
    price = prices.get(candidate.tier)
    if price is None or candidate.exec_ms <= 0:
        return None
    wait = (candidate.batch - 1) / rate_rps * 1000.0
    instances = max(1, math.ceil(rate_rps * candidate.exec_ms / 1000.0 / (candidate.batch * UTILISATION) - 1e-9))
    # a batch queues for a busy instance: M/D/1 at the instance's load (batches dealt out in turn queue less)
    load = rate_rps * candidate.exec_ms / 1000.0 / (candidate.batch * instances)
    queueing = load / (2.0 * (1.0 - load)) * candidate.exec_ms
    return Option(candidate, instances, candidate.exec_ms + wait + queueing, instances * candidate.slice.milli * price)


def cost_per_1k(cost: int, rate_rps: float) -> float:
    """Minor units per 1,000 requests of an hourly cost in minor units / 1000."""
    return cost / 1000.0 / (rate_rps * 3600.0) * 1000.0


def _order(pipeline: Pipeline) -> tuple[list[str], dict[str, list[str]]]:
    """Stage names in a topological order (stable: the order given where free) and each stage's predecessors."""
    names = [s.name for s in pipeline.stages]
    if len(set(names)) != len(names):
        raise PipelineError("stage names must be unique", "stages")
    preds: dict[str, list[str]] = {n: [] for n in names}
    succs: dict[str, list[str]] = {n: [] for n in names}
    for index, (a, b) in enumerate(pipeline.edges):
        if a not in preds or b not in preds:
            raise PipelineError(f"edge {a!r} -> {b!r} names an unknown stage", f"edges[{index}]")
        if a == b:
            raise PipelineError(f"edge {a!r} -> {b!r} is a loop", f"edges[{index}]")
        if a not in preds[b]:
            preds[b].append(a)
            succs[a].append(b)
    indegree = {n: len(preds[n]) for n in names}
    ready = [n for n in names if indegree[n] == 0]
    order: list[str] = []
    position = {n: i for i, n in enumerate(names)}
    while ready:
        ready.sort(key=position.__getitem__)
        current = ready.pop(0)
        order.append(current)
        for nxt in succs[current]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    if len(order) != len(names):
        raise PipelineError("the edges make a cycle", "edges")
    return order, preds


def options_of(pipeline: Pipeline, prices: Mapping[str, int], *, pareto: bool) -> dict[str, list[Option]]:
    if pipeline.rate_rps <= 0:
        raise PipelineError("the arrival rate must be positive", "rate_rps")
    if pipeline.slo_ms <= 0:
        raise PipelineError("the SLO must be positive", "slo_ms")
    found: dict[str, list[Option]] = {}
    for index, stage in enumerate(pipeline.stages):
        options = [o for c in stage.candidates if (o := option_for(c, pipeline.rate_rps, prices)) is not None]
        if not options:
            raise PipelineError(f"stage {stage.name!r} has no configuration with a price", f"stages[{index}]")
        found[stage.name] = pareto_front(options) if pareto else options
    return found


def pareto_front(options: Sequence[Option]) -> list[Option]:
    """The options no other beats on both latency and cost (ties keep the first), fastest first."""
    ordered = sorted(options, key=lambda o: (o.latency_ms, o.cost))
    front: list[Option] = []
    best_cost = math.inf
    for option in ordered:
        if option.cost < best_cost:
            front.append(option)
            best_cost = option.cost
    return front


def critical_path(order: Sequence[str], preds: Mapping[str, Sequence[str]], latency: Mapping[str, float]) -> float:
    finish: dict[str, float] = {}
    for name in order:
        finish[name] = max((finish[p] for p in preds[name] if p in finish), default=0.0) + latency[name]
    return max(finish.values(), default=0.0)


def _plan(method: str, pipeline: Pipeline, order, preds, chosen: Mapping[str, Option], budgets: Mapping[str, float],
          **kwargs) -> Plan:
    latency = critical_path(order, preds, {n: chosen[n].latency_ms for n in order})
    cost = sum(chosen[n].cost for n in order)
    choices = tuple(StageChoice(n, chosen[n], budgets.get(n, pipeline.slo_ms),
                                cost_per_1k(chosen[n].cost, pipeline.rate_rps)) for n in order)
    feasible = latency <= pipeline.slo_ms + 1e-9
    return Plan(method, feasible, choices, latency, cost, cost_per_1k(cost, pipeline.rate_rps), pipeline.slo_ms,
                reason=kwargs.pop("reason", "" if feasible else "the plan's latency exceeds the SLO"), **kwargs)


def _infeasible(method: str, pipeline: Pipeline, reason: str, **kwargs) -> Plan:
    return Plan(method, False, (), math.inf, 0, 0.0, pipeline.slo_ms, reason=reason, **kwargs)


# ----------------------------------------------------------------------------------------- A* on a group

@dataclass(slots=True)
class _Search:
    order: list[str]
    preds: list[list[int]]  # predecessor positions inside the group
    options: list[list[Option]]  # per position, Pareto front, fastest first
    slo: float
    expanded: int = 0

    def bound_latency(self, finish: tuple[float, ...]) -> float:
        """The critical path with the chosen stages' latencies and every open stage at its fastest."""
        done = list(finish)
        for k in range(len(finish), len(self.order)):
            done.append(max((done[p] for p in self.preds[k]), default=0.0) + self.options[k][0].latency_ms)
        return max(done, default=0.0)

    def greedy(self) -> tuple[int, tuple[int, ...]] | None:
        """Look-ahead greedy: each stage in order its cheapest option that keeps the latency blade open."""
        finish: tuple[float, ...] = ()
        picks: list[int] = []
        cost = 0
        for k in range(len(self.order)):
            best = None
            for index, option in enumerate(self.options[k]):
                start = max((finish[p] for p in self.preds[k]), default=0.0)
                trial = (*finish, start + option.latency_ms)
                if self.bound_latency(trial) <= self.slo + 1e-9 and (best is None or option.cost < best[0]):
                    best = (option.cost, index, trial)
            if best is None:
                return None
            cost += best[0]
            picks.append(best[1])
            finish = best[2]
        return cost, tuple(picks)

    def run(self) -> tuple[int, tuple[int, ...]] | None:
        n = len(self.order)
        if self.bound_latency(()) > self.slo + 1e-9:
            return None
        cheapest = [min(o.cost for o in opts) for opts in self.options]
        rest = [0] * (n + 1)
        for k in range(n - 1, -1, -1):
            rest[k] = rest[k + 1] + cheapest[k]
        incumbent = self.greedy()
        best_cost = incumbent[0] if incumbent else math.inf
        counter = itertools.count()
        heap: list = [(rest[0], 0, next(counter), (), ())]
        while heap:
            f, g, _, picks, finish = heapq.heappop(heap)
            if f >= best_cost and incumbent is not None:
                break  # the cost blade: nothing left can beat the incumbent
            self.expanded += 1
            k = len(picks)
            if k == n:
                return g, picks
            start = max((finish[p] for p in self.preds[k]), default=0.0)
            for index, option in enumerate(self.options[k]):
                trial = (*finish, start + option.latency_ms)
                if self.bound_latency(trial) > self.slo + 1e-9:
                    break  # the latency blade (options fastest first: every later one is slower)
                g2 = g + option.cost
                f2 = g2 + rest[k + 1]
                if f2 >= best_cost:
                    continue  # the cost blade
                heapq.heappush(heap, (f2, g2, next(counter), (*picks, index), trial))
        return incumbent


def _search_group(order: list[str], preds: Mapping[str, Sequence[str]], options: Mapping[str, list[Option]],
                  slo: float) -> tuple[dict[str, Option] | None, int]:
    position = {name: i for i, name in enumerate(order)}
    search = _Search(order, [[position[p] for p in preds[n] if p in position] for n in order],
                     [options[n] for n in order], slo)
    found = search.run()
    if found is None:
        return None, search.expanded
    return {n: search.options[k][found[1][k]] for k, n in enumerate(order)}, search.expanded


# ------------------------------------------------------------------------------------------ dominators

def dominator_segments(order: Sequence[str], preds: Mapping[str, Sequence[str]]) -> list[list[str]]:
    """The stages cut into segments at the dominators of the sink: every source-to-sink path passes each
    cut stage, so the segments run one after another. A virtual source precedes the stages without
    predecessors and a virtual sink follows those without successors. Immediate dominators by the iterative
    algorithm of Cooper, Harvey and Kennedy over the topological order."""
    source, sink = "\0source", "\0sink"
    has_succ = {p for n in order for p in preds[n]}
    full_preds: dict[str, list[str]] = {source: []}
    for name in order:
        full_preds[name] = list(preds[name]) or [source]
    full_preds[sink] = [n for n in order if n not in has_succ]
    nodes = [source, *order, sink]
    rank = {n: i for i, n in enumerate(nodes)}
    idom: dict[str, str] = {source: source}

    def intersect(a: str, b: str) -> str:
        while a != b:
            while rank[a] > rank[b]:
                a = idom[a]
            while rank[b] > rank[a]:
                b = idom[b]
        return a

    for node in nodes[1:]:  # a DAG in topological order: one pass settles every immediate dominator
        dominator = None
        for p in full_preds[node]:
            dominator = p if dominator is None else intersect(p, dominator)
        idom[node] = dominator
    cuts = []
    node = idom[sink]
    while node != source:
        cuts.append(node)
        node = idom[node]
    cuts.reverse()  # dominators of the sink, first to last
    # each stage belongs to the segment of the last cut that dominates it (stages before the first cut: 0)
    dominated_by: dict[str, int] = {}
    cut_index = {c: i for i, c in enumerate(cuts)}
    segments: list[list[str]] = [[] for _ in range(len(cuts) + 1)]
    for name in order:
        node, found = name, -1
        while node != source:
            if node in cut_index:
                found = cut_index[node]
                break
            node = idom[node]
        dominated_by[name] = found
        segments[found + 1].append(name)
    return [s for s in segments if s]


# ------------------------------------------------------------------------------------------ planners

def plan_esg(pipeline: Pipeline, prices: Mapping[str, int], *, group_stages: int = 4, weighting: str = "fastest",
             reclaim: bool = True) -> Plan:
    """ESG: A* with dual-blade pruning, over groups cut at dominators when the pipeline is long."""
    began = time.perf_counter()
    order, preds = _order(pipeline)
    options = options_of(pipeline, prices, pareto=True)
    if len(order) <= group_stages:
        groups = [order]
    else:
        groups = []
        for segment in dominator_segments(order, preds):
            if groups and len(groups[-1]) + len(segment) <= group_stages:
                groups[-1].extend(segment)
            else:
                groups.append(list(segment))

    def group_latency(group: list[str], pick) -> float:
        return critical_path(group, preds, {n: pick(options[n]).latency_ms for n in group})

    fastest = [group_latency(g, lambda opts: opts[0]) for g in groups]
    cheapest = [group_latency(g, lambda opts: min(opts, key=lambda o: (o.cost, o.latency_ms))) for g in groups]
    reference = {"cheapest": cheapest, "fastest": fastest,
                 "middle": [math.sqrt(a * b) for a, b in zip(cheapest, fastest, strict=True)]}[weighting]
    if sum(fastest) > pipeline.slo_ms + 1e-9:
        return _infeasible("esg", pipeline, f"no configuration meets the SLO: the fastest takes {sum(fastest):.2f} ms",
                           seconds=time.perf_counter() - began)
    total_reference = sum(reference) or 1.0
    chosen: dict[str, Option] = {}
    budgets: dict[str, float] = {}
    split = []
    expanded = 0
    used_total = 0.0
    granted = 0.0
    for index, group in enumerate(groups):
        share = pipeline.slo_ms * reference[index] / total_reference
        granted += share
        room = pipeline.slo_ms - used_total - sum(fastest[index + 1:])  # what the later groups leave at the least
        budget = min(granted - used_total, room)  # its share plus what earlier groups left unused
        budget = max(budget, fastest[index])
        picked, count = _search_group(group, preds, options, budget)
        expanded += count
        if picked is None:  # its share was too tight for any configuration: give it all the room there is
            budget = room
            picked, count = _search_group(group, preds, options, budget)
            expanded += count
        if picked is None:
            return _infeasible("esg", pipeline, f"stages {', '.join(group)} cannot meet the SLO",
                               expanded=expanded, seconds=time.perf_counter() - began)
        chosen.update(picked)
        used = critical_path(group, preds, {n: picked[n].latency_ms for n in group})
        used_total += used
        for name in group:
            budgets[name] = budget
        split.append({"stages": list(group), "share_ms": round(share, 4), "budget_ms": round(budget, 4),
                      "used_ms": round(used, 4)})
    if reclaim and len(groups) > 1:
        # what the groups left of the SLO goes back to each group in turn: re-planned with its own use plus
        # the slack, a group keeps the cheaper plan
        for index, group in enumerate(groups):
            slack = pipeline.slo_ms - used_total
            if slack <= 1e-9:
                break
            before = split[index]["used_ms"]
            picked, count = _search_group(group, preds, options, before + slack)
            expanded += count
            if picked is not None and sum(picked[n].cost for n in group) < sum(chosen[n].cost for n in group):
                chosen.update(picked)
                used = critical_path(group, preds, {n: picked[n].latency_ms for n in group})
                used_total += used - before
                split[index]["used_ms"] = round(used, 4)
                split[index]["reclaimed_ms"] = round(slack, 4)
                for name in group:
                    budgets[name] = before + slack
    return _plan("esg", pipeline, order, preds, chosen, budgets, split=tuple(split), expanded=expanded,
                 seconds=time.perf_counter() - began)


def plan_astar(pipeline: Pipeline, prices: Mapping[str, int]) -> Plan:
    """A* with dual-blade pruning over the whole pipeline at once (no SLO distribution): the optimum."""
    plan = plan_esg(pipeline, prices, group_stages=len(pipeline.stages))
    plan.method = "astar"
    return plan


def plan_even_greedy(pipeline: Pipeline, prices: Mapping[str, int]) -> Plan:
    """Baseline: the SLO split evenly over the stages of the longest path (by stage count); each stage takes
    its cheapest configuration within its share, or its fastest when none is within it."""
    began = time.perf_counter()
    order, preds = _order(pipeline)
    options = options_of(pipeline, prices, pareto=False)
    depth: dict[str, int] = {}
    for name in order:
        depth[name] = max((depth[p] for p in preds[name]), default=0) + 1
    share = pipeline.slo_ms / max(depth.values())
    chosen = {}
    for name in order:
        within = [o for o in options[name] if o.latency_ms <= share + 1e-9]
        chosen[name] = (min(within, key=lambda o: (o.cost, o.latency_ms)) if within
                        else min(options[name], key=lambda o: (o.latency_ms, o.cost)))
    split = tuple({"stages": [n], "share_ms": round(share, 4), "budget_ms": round(share, 4),
                   "used_ms": round(chosen[n].latency_ms, 4)} for n in order)
    return _plan("even_greedy", pipeline, order, preds, chosen, {n: share for n in order}, split=split,
                 seconds=time.perf_counter() - began)


def plan_exhaustive(pipeline: Pipeline, prices: Mapping[str, int], *, limit: int = 2_000_000) -> Plan:
    """Every combination of every configuration: the cheapest that meets the SLO (small pipelines only)."""
    began = time.perf_counter()
    order, preds = _order(pipeline)
    options = options_of(pipeline, prices, pareto=False)
    size = math.prod(len(options[n]) for n in order)
    if size > limit:
        raise PipelineError(f"{size} combinations: too many to enumerate (limit {limit})", "stages")
    best = None
    for combination in itertools.product(*(options[n] for n in order)):
        cost = sum(o.cost for o in combination)
        if best is not None and cost >= best[0]:
            continue
        latency = critical_path(order, preds, {n: o.latency_ms for n, o in zip(order, combination, strict=True)})
        if latency <= pipeline.slo_ms + 1e-9:
            best = (cost, combination)
    if best is None:
        return _infeasible("exhaustive", pipeline, "no combination meets the SLO", expanded=size,
                           seconds=time.perf_counter() - began)
    chosen = dict(zip(order, best[1], strict=True))
    return _plan("exhaustive", pipeline, order, preds, chosen, {}, expanded=size, seconds=time.perf_counter() - began)


PLANNERS = {"esg": plan_esg, "astar": plan_astar, "even_greedy": plan_even_greedy, "exhaustive": plan_exhaustive}
