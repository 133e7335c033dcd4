"""The split planner: a model too big for one GPU, cut into contiguous layer groups over several GPUs.

After Shridhar and Nadig, "Heuristic-based Resource Allocation for Cloud-native Machine Learning Workloads"
(Purdue): instead of a hand-made partition, the planner assigns layer groups to GPUs so that the end-to-end
latency of a batch (each group's compute on its GPU, plus the activations handed between consecutive GPUs:
NVLink or PCIe inside a node, the network between nodes) and the GPU memory left idle on the GPUs used are
low, and every group fits in its GPU's free memory. The objective is one figure:
``latency_ms + idle_weight * idle_GiB`` (``idle_weight`` ms per idle GiB, 0.25 by default).

The heuristic (``plan_split``):

1. **Order the candidates** so consecutive groups share a node: GPUs grouped by node, nodes that can hold the
   whole model alone first, then by their total compute; inside a node the fastest GPU (then the largest) first.
2. **One GPU** when one holds the model (the best fit); a **first fit** along the order (each GPU filled in turn,
   one too small for the next layer skipped); and **for each count** ``k`` of GPUs (a prefix of that order with
   enough memory), **cut by speed under a memory cap**: each GPU's share of the model's FLOPs follows its
   share of the prefix's compute; a GPU takes layers until its share is reached or its memory is full; the
   last takes the rest. A second cut fills each GPU to its memory first (fewest GPUs, least idle memory).
3. **Refine the boundaries**: each cut moves a few layers either way where that lowers the objective and every
   group still fits (a cut lands on a small activation when it can: less to transfer); then **swap GPUs**: a
   GPU of the split gives its layers to an unused candidate that lowers the objective (a better fit idles less
   memory).
4. The best objective over the counts and cuts wins.

Baselines: ``plan_equal_layers`` (the first ``k`` GPUs in the order given, the layers cut into ``k`` equal runs,
the smallest ``k`` that fits) and ``plan_split_optimal`` (dynamic programming over layers x the set of GPUs used x
the last GPU: the optimum of the same objective, exponential in the GPU count, for small cases). Pure Python.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from gpus.catalogue import model_get
from gpus.layers import LAYER_CONTEXT_MIB as CONTEXT_MIB
from gpus.layers import STEP_OVERHEAD_MS, Layer, layer_ms
from gpus.performance import peak_tflops, spec_get

BYTES_FP16 = 2
# links between GPUs (GB/s, and a fixed latency per transfer in ms): NVLink 3 (A100: 600 GB/s both ways, 300 one
# way), PCIe 4.0 x16 (about 25 GB/s achieved), 100 Gb/s Ethernet / InfiniBand EDR between nodes
NVLINK_GBPS = 300.0
PCIE_GBPS = 25.0
NETWORK_GBPS = 12.5
NETWORK_LATENCY_MS = 0.05
INTRA_LATENCY_MS = 0.01
IDLE_WEIGHT_MS_PER_GIB = 0.25
MIB = 1024 * 1024


class SplitError(ValueError):
    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class SplitGpu:
    """A candidate GPU: where it is, its model and the memory free on it now."""

    id: str
    node: str
    model: str
    free_mib: int
    nvlink: bool = True

    @property
    def tflops(self) -> float:
        """Dense FP16 peak (``gpus.performance``): the order of the candidates and the speed cut follow it."""
        return peak_tflops(spec_get(self.model), "fp16")


@dataclass(frozen=True, slots=True)
class Group:
    gpu: SplitGpu
    first: int  # layer indices, inclusive
    last: int
    memory_mib: int
    compute_ms: float
    transfer_in_ms: float  # receiving the previous group's activations (0 for the first)

    @property
    def idle_mib(self) -> int:
        return self.gpu.free_mib - self.memory_mib


@dataclass(slots=True)
class Split:
    method: str
    feasible: bool
    groups: tuple[Group, ...]
    latency_ms: float
    idle_mib: int
    objective: float
    batch: int
    reason: str = ""
    seconds: float = 0.0
    evaluated: int = 0

    def as_dict(self, layers: Sequence[Layer] = ()) -> dict:
        return {
            "method": self.method, "feasible": self.feasible,
            "latency_ms": round(self.latency_ms, 4) if math.isfinite(self.latency_ms) else None,
            "idle_mib": self.idle_mib, "objective": round(self.objective, 4) if math.isfinite(self.objective) else None,
            "batch": self.batch,
            "reason": self.reason, "seconds": round(self.seconds, 6), "evaluated": self.evaluated,
            "groups": [{
                "gpu": g.gpu.id, "node": g.gpu.node, "model": g.gpu.model, "first": g.first, "last": g.last,
                "layers": [layers[i].name for i in range(g.first, g.last + 1)] if layers else [],
                "memory_mib": g.memory_mib, "free_mib": g.gpu.free_mib, "idle_mib": g.idle_mib,
                "compute_ms": round(g.compute_ms, 4), "transfer_in_ms": round(g.transfer_in_ms, 4),
            } for g in self.groups],
        }


class _Model:
    """Prefix sums over the layers, per GPU model, so a group's memory and time cost O(1)-ish to evaluate."""

    def __init__(self, layers: Sequence[Layer], batch: int, gpus: Sequence[SplitGpu], idle_weight: float):
        if not layers:
            raise SplitError("the model has no layers", "layers")
        if batch < 1:
            raise SplitError("the batch size must be at least 1", "batch")
        self.layers, self.batch, self.idle_weight = list(layers), batch, idle_weight
        n = len(layers)
        self.weight_prefix = [0] * (n + 1)
        previous = 0
        self.act = []  # per layer: bytes in + out for the batch
        for i, layer in enumerate(layers):
            self.weight_prefix[i + 1] = self.weight_prefix[i] + layer.params * BYTES_FP16
            self.act.append(batch * ((layer.in_bytes or previous) + layer.out_bytes))
            previous = layer.out_bytes
        self.time_prefix: dict[str, list[float]] = {}
        for gpu in gpus:
            if gpu.model in self.time_prefix:
                continue
            prefix = [0.0] * (n + 1)
            previous = 0
            for i, layer in enumerate(layers):
                prefix[i + 1] = prefix[i] + layer_ms(layer, gpu.model, batch=batch, in_bytes=previous)
                previous = layer.out_bytes
            self.time_prefix[gpu.model] = prefix
        self.flops_prefix = [0.0] * (n + 1)
        for i, layer in enumerate(layers):
            self.flops_prefix[i + 1] = self.flops_prefix[i] + layer.flops
        self.evaluated = 0

    def memory(self, first: int, last: int) -> int:
        weights = self.weight_prefix[last + 1] - self.weight_prefix[first]
        return -(-(weights + max(self.act[first:last + 1])) // MIB) + CONTEXT_MIB

    def compute(self, gpu: SplitGpu, first: int, last: int) -> float:
        prefix = self.time_prefix[gpu.model]
        return STEP_OVERHEAD_MS + prefix[last + 1] - prefix[first]

    def transfer(self, source: SplitGpu | None, target: SplitGpu, boundary: int) -> float:
        """Handing layer ``boundary - 1``'s output for the batch from ``source`` to ``target``."""
        if source is None:
            return 0.0
        size = self.batch * self.layers[boundary - 1].out_bytes
        if source.node != target.node:
            return size / (NETWORK_GBPS * 1e9) * 1000.0 + NETWORK_LATENCY_MS
        speed = NVLINK_GBPS if source.nvlink and target.nvlink else PCIE_GBPS
        return size / (speed * 1e9) * 1000.0 + INTRA_LATENCY_MS

    def build(self, method: str, gpus: Sequence[SplitGpu], cuts: Sequence[int]) -> Split | None:
        """The split with ``gpus[i]`` running layers ``cuts[i] .. cuts[i + 1] - 1`` (``cuts`` starts at 0 and
        ends at the layer count); None when a group is empty or does not fit."""
        self.evaluated += 1
        groups = []
        previous = None
        for i, gpu in enumerate(gpus):
            first, last = cuts[i], cuts[i + 1] - 1
            if last < first:
                return None
            memory = self.memory(first, last)
            if memory > gpu.free_mib:
                return None
            groups.append(Group(gpu, first, last, memory, self.compute(gpu, first, last),
                                self.transfer(previous, gpu, first)))
            previous = gpu
        return self.finish(method, groups)

    def finish(self, method: str, groups: Sequence[Group]) -> Split:
        latency = sum(g.compute_ms + g.transfer_in_ms for g in groups)
        idle = sum(g.idle_mib for g in groups)
        return Split(method, True, tuple(groups), latency, idle, latency + self.idle_weight * idle / 1024, self.batch)


def _infeasible(method: str, batch: int, reason: str, began: float, evaluated: int = 0) -> Split:
    return Split(method, False, (), math.inf, 0, math.inf, batch, reason, time.perf_counter() - began, evaluated)


def _check(gpus: Sequence[SplitGpu]) -> None:
    if not gpus:
        raise SplitError("no candidate GPUs", "gpus")
    seen = set()
    for index, gpu in enumerate(gpus):
        if gpu.id in seen:
            raise SplitError(f"GPU {gpu.id!r} is listed twice", f"gpus[{index}]")
        seen.add(gpu.id)
        if gpu.free_mib <= 0:
            raise SplitError(f"GPU {gpu.id!r} has no free memory", f"gpus[{index}]")
        try:
            spec_get(gpu.model)
        except KeyError as error:
            raise SplitError(str(error.args[0]), f"gpus[{index}].model") from None


def candidate_order(gpus: Sequence[SplitGpu], need_mib: int) -> list[SplitGpu]:
    """Step 1: GPUs grouped by node; nodes that hold the model alone first, then the fastest; inside a node the
    fastest GPU first, then the largest."""
    by_node: dict[str, list[SplitGpu]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node, []).append(gpu)

    def node_key(node: str):
        members = by_node[node]
        return (sum(g.free_mib for g in members) < need_mib, -sum(g.tflops for g in members), node)

    ordered = []
    for node in sorted(by_node, key=node_key):
        ordered.extend(sorted(by_node[node], key=lambda g: (-g.tflops, -g.free_mib, g.id)))
    return ordered


def _speed_cut(model: _Model, gpus: Sequence[SplitGpu], *, memory_first: bool) -> list[int] | None:
    """Step 2: the cut points for ``gpus`` by compute share under each GPU's memory cap (or memory only)."""
    n = len(model.layers)
    total_flops = model.flops_prefix[n]
    speed = sum(g.tflops for g in gpus)
    cuts = [0]
    start = 0
    for index, gpu in enumerate(gpus):
        if index == len(gpus) - 1:
            cuts.append(n)
            break
        target = model.flops_prefix[start] + total_flops * gpu.tflops / speed
        end = start
        # leave at least one layer for each GPU after this one
        while end < n - (len(gpus) - index - 1):
            if model.memory(start, end) > gpu.free_mib:
                break
            if not memory_first and model.flops_prefix[end + 1] > target and end > start:
                break
            end += 1
        if end == start:
            return None
        cuts.append(end)
        start = end
    return cuts


def _first_fit(model: _Model, ordered: Sequence[SplitGpu]) -> tuple[list[SplitGpu], list[int]] | None:
    n = len(model.layers)
    chosen, cuts, start = [], [0], 0
    for gpu in ordered:
        end = start
        while end < n and model.memory(start, end) <= gpu.free_mib:
            end += 1
        if end == start:
            continue
        chosen.append(gpu)
        cuts.append(end)
        start = end
        if start == n:
            return chosen, cuts
    return None


def _refine(model: _Model, method: str, gpus: Sequence[SplitGpu], cuts: list[int], best: Split | None,
            window: int = 3) -> Split | None:
    """Step 3: move each cut up to ``window`` layers either way while the objective drops."""
    current = model.build(method, gpus, cuts)
    if current is None:
        return best
    improved = True
    while improved:
        improved = False
        for position in range(1, len(cuts) - 1):
            for shift in range(-window, window + 1):
                if shift == 0:
                    continue
                trial = list(cuts)
                trial[position] += shift
                if not trial[position - 1] < trial[position] < trial[position + 1]:
                    continue
                candidate = model.build(method, gpus, trial)
                if candidate is not None and candidate.objective < current.objective - 1e-12:
                    cuts, current, improved = trial, candidate, True
    if best is None or current.objective < best.objective:
        return current
    return best


def _swap(model: _Model, split: Split, candidates: Sequence[SplitGpu]) -> Split:
    """Step 3b: a GPU of the split is swapped for an unused candidate where that lowers the objective (a
    better-fitting GPU leaves less memory idle; a faster one computes sooner), the cuts kept."""
    current = split
    improved = True
    while improved:
        improved = False
        chosen = [g.gpu for g in current.groups]
        cuts = [g.first for g in current.groups] + [current.groups[-1].last + 1]
        used = {g.id for g in chosen}
        for position in range(len(chosen)):
            for other in candidates:
                if other.id in used:
                    continue
                trial = list(chosen)
                trial[position] = other
                candidate = model.build(current.method, trial, cuts)
                if candidate is not None and candidate.objective < current.objective - 1e-12:
                    current, improved = candidate, True
                    break
            if improved:
                break
    return current


def plan_split(layers: Sequence[Layer], gpus: Sequence[SplitGpu], batch: int = 1,
               idle_weight: float = IDLE_WEIGHT_MS_PER_GIB) -> Split:
    began = time.perf_counter()
    _check(gpus)
    model = _Model(layers, batch, gpus, idle_weight)
    need = model.memory(0, len(layers) - 1)
    ordered = candidate_order(gpus, need)
    best: Split | None = None
    weights_mib = model.weight_prefix[-1] // MIB
    for gpu in ordered:  # one GPU: the whole model on the one that fits it best
        found = model.build("heuristic", [gpu], [0, len(layers)])
        if found is not None and (best is None or found.objective < best.objective):
            best = found
    # the order's GPUs in turn, each filled, one too small for the next layer skipped; and the same with the
    # smallest GPUs first (a tight fit first leaves the large ones for the large layers)
    for sequence in (ordered, sorted(ordered, key=lambda g: (g.free_mib, g.id))):
        skipping = _first_fit(model, sequence)
        if skipping is not None:
            best = _refine(model, "heuristic", skipping[0], skipping[1], best)
    for k in range(2, min(len(ordered), len(layers)) + 1):
        prefix = ordered[:k]
        if sum(g.free_mib for g in prefix) < weights_mib + k * CONTEXT_MIB:
            continue
        for memory_first in (False, True):
            cuts = _speed_cut(model, prefix, memory_first=memory_first)
            if cuts is not None:
                best = _refine(model, "heuristic", prefix, cuts, best)
        if best is not None and k > len(best.groups) + 1:
            break  # two more GPUs than the best so far only add transfers and idle memory
    if best is None:
        return _infeasible("heuristic", batch, "the model does not fit in the candidate GPUs' free memory", began,
                           model.evaluated)
    best = _swap(model, best, ordered)
    best.seconds, best.evaluated = time.perf_counter() - began, model.evaluated
    return best


def plan_equal_layers(layers: Sequence[Layer], gpus: Sequence[SplitGpu], batch: int = 1,
                      idle_weight: float = IDLE_WEIGHT_MS_PER_GIB) -> Split:
    began = time.perf_counter()
    _check(gpus)
    model = _Model(layers, batch, gpus, idle_weight)
    n = len(layers)
    for k in range(1, min(len(gpus), n) + 1):
        cuts = [round(i * n / k) for i in range(k + 1)]
        found = model.build("equal_layers", gpus[:k], cuts)
        if found is not None:
            found.seconds, found.evaluated = time.perf_counter() - began, model.evaluated
            return found
    return _infeasible("equal_layers", batch, "no equal split of the layers fits the GPUs in the order given",
                       began, model.evaluated)


def plan_split_optimal(layers: Sequence[Layer], gpus: Sequence[SplitGpu], batch: int = 1,
                       idle_weight: float = IDLE_WEIGHT_MS_PER_GIB, max_gpus: int = 8) -> Split:
    """The optimum by dynamic programming: ``best[i][mask][g]`` is the least objective of running layers
    ``0 .. i - 1`` on the GPUs in ``mask``, in some order, the last being ``g``."""
    began = time.perf_counter()
    _check(gpus)
    if len(gpus) > max_gpus:
        raise SplitError(f"{len(gpus)} GPUs: the exact search takes at most {max_gpus}", "gpus")
    model = _Model(layers, batch, gpus, idle_weight)
    n, count = len(layers), len(gpus)
    # reach[(i, mask, g)] = (objective so far, previous state, first layer of g's group)
    reach: dict[tuple[int, int, int], tuple[float, tuple | None, int]] = {}
    frontier: list[dict[tuple[int, int], float]] = [dict() for _ in range(n + 1)]

    def extend(start: int, mask: int, last: int, value: float) -> None:
        source = gpus[last] if last >= 0 else None
        for g in range(count):
            if mask >> g & 1:
                continue
            gpu = gpus[g]
            transfer = model.transfer(source, gpu, start)
            for end in range(start, n):
                memory = model.memory(start, end)
                if memory > gpu.free_mib:
                    break
                model.evaluated += 1
                idle = idle_weight * (gpu.free_mib - memory) / 1024
                total = value + transfer + model.compute(gpu, start, end) + idle
                key = (end + 1, mask | 1 << g, g)
                if key not in reach or total < reach[key][0] - 1e-12:
                    reach[key] = (total, (start, mask, last), start)
                    frontier[end + 1][(mask | 1 << g, g)] = total

    extend(0, 0, -1, 0.0)
    for start in range(1, n):
        for (mask, last), value in list(frontier[start].items()):
            if reach[(start, mask, last)][0] == value:
                extend(start, mask, last, value)
    finals = [(value, mask, last) for (mask, last), value in frontier[n].items()]
    if not finals:
        return _infeasible("optimal", batch, "the model does not fit in the candidate GPUs' free memory", began,
                           model.evaluated)
    _, mask, last = min(finals)
    groups = []
    state = (n, mask, last)
    while state[2] >= 0:
        value, previous, first = reach[state]
        end, _, g = state
        gpu = gpus[g]
        groups.append((gpu, first, end - 1))
        state = (previous[0], previous[1], previous[2])
    groups.reverse()
    built = model.build("optimal", [g for g, _, _ in groups], [groups[0][1]] + [last + 1 for _, _, last in groups])
    assert built is not None
    built.seconds, built.evaluated = time.perf_counter() - began, model.evaluated
    return built


def fleet_gpus(rows: Sequence[tuple[str, str, str, int]]) -> list[SplitGpu]:
    """``(id, node, model, free MiB)`` rows as candidates, with NVLink as the catalogue says."""
    return [SplitGpu(i, node, model_get(m).code, free, model_get(m).nvlink) for i, node, m, free in rows]


PLANNERS = {"heuristic": plan_split, "equal_layers": plan_equal_layers, "optimal": plan_split_optimal}
