"""Placement policies behind one interface, and the search that applies them.

A policy scores a candidate placement of one request on one node (lower is better). The search
evaluates each distinct node state once (``ClusterState.by_signature``) and memoises scores by
(node signature, request shape), so a policy is pure in the node's free capacity. Ties break on the
node id, so runs are deterministic for a given seed.

Policies: ``random``, ``best-fit``, ``dot-product``, ``packing``, ``fgd`` (fragmentation gradient
descent, Weng et al., USENIX ATC 2023, as published) and ``default`` (ours; see ``docs/scheduling.md``).
"""

from __future__ import annotations

import heapq
import math
import random as _random
from dataclasses import dataclass, replace

from broker.scheduler.state import FULL, ClassInfo, ClusterState, GpuState, NodeState
from broker.scheduler.types import GpuMode, Kind, Shape, Unit
from gpus.catalogue import model_get
from gpus.mig import COMPUTE_SLICES, MigProfile, profile_get


@dataclass(frozen=True, slots=True)
class Need:
    """A request shape resolved to one GPU model: what each unit takes."""

    kind: Kind
    count: int  # 0: no GPU at all (CPU-only work, as in the openb trace)
    models: tuple[str, ...]  # allowed GPU models; empty: any
    milli: int  # per unit, quota units
    memory_mib: int  # per unit
    profile: MigProfile | None
    gang: bool
    cpu_milli: int
    host_memory_mib: int
    avoid: frozenset[str] = frozenset()  # node ids it must not be placed on
    pools: frozenset[str] = frozenset()  # node pools it may be placed in; empty: any

    @property
    def total_milli(self) -> int:
        return self.milli * self.count

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models

    def key(self) -> tuple:
        return (self.kind, self.count, self.models, self.milli, self.memory_mib,
                self.profile.name if self.profile else "", self.gang, self.cpu_milli, self.host_memory_mib,
                tuple(sorted(self.avoid)), tuple(sorted(self.pools)))


def need_for(shape: Shape, model: str) -> Need | None:
    """Resolve ``shape`` on ``model``; None when the model cannot serve it at all."""
    gpu_model = model_get(model)
    if shape.kind == Kind.WHOLE:
        if shape.memory_mib and gpu_model.memory_mib < shape.memory_mib:
            return None
        return Need(Kind.WHOLE, shape.count, (model,), FULL, gpu_model.memory_mib, None, shape.gang,
                    shape.cpu_milli, shape.host_memory_mib, frozenset(shape.avoid_nodes), frozenset(shape.pools))
    if shape.kind == Kind.SHARE:
        if shape.memory_mib > gpu_model.memory_mib or not 0 < shape.milli <= FULL:
            return None
        return Need(Kind.SHARE, shape.count, (model,), shape.milli, shape.memory_mib, None, shape.gang,
                    shape.cpu_milli, shape.host_memory_mib, frozenset(shape.avoid_nodes), frozenset(shape.pools))
    # MIG: a full profile name on that model, or a compute size ("3g") for auto
    try:
        profile = profile_get(model, shape.profile)
    except KeyError:
        from gpus.mig import profiles_for

        sized = [p for p in profiles_for(model) if p.name.split(".")[0] == shape.profile
                 and not p.shape.media_extensions and p.memory_mib >= shape.memory_mib]
        if not sized:
            return None
        profile = min(sized, key=lambda p: p.memory_mib)
    if shape.memory_mib and profile.memory_mib < shape.memory_mib:
        return None
    return Need(Kind.MIG, shape.count, (model,), profile.gpu_milli, profile.memory_mib, profile, shape.gang,
                shape.cpu_milli, shape.host_memory_mib, frozenset(shape.avoid_nodes), frozenset(shape.pools))


# -- candidate units on one node -------------------------------------------------------------------


def node_accepts(node: NodeState, need: Need) -> bool:
    """Whether ``node`` takes work of ``need`` at all: not cordoned, not one the need avoids, in one of the need's
    pools (when it names any), and its host CPU and memory free."""
    if node.node.cordoned or node.node.id in need.avoid:
        return False
    if need.pools and node.node.pool not in need.pools:
        return False
    if node.node.cpu_milli and node.free_cpu_milli < need.cpu_milli:
        return False
    return not (node.node.memory_mib and node.free_memory_mib < need.host_memory_mib)


def gpu_options(gpu: GpuState, need: Need) -> list[Unit]:
    """Every distinct way one unit of ``need`` fits on ``gpu``."""
    if not need.allows(gpu.gpu.model):
        return []
    if need.kind == Kind.WHOLE:
        return [Unit(gpu.gpu.id, FULL, gpu.memory_mib)] if gpu.fits_whole() else []
    if need.kind == Kind.SHARE:
        if gpu.fits_share(need.milli, need.memory_mib):
            return [Unit(gpu.gpu.id, need.milli, need.memory_mib)]
        return []
    assert need.profile is not None
    return [Unit(gpu.gpu.id, need.milli, need.memory_mib, need.profile.name, start)
            for start in gpu.mig_starts(need.profile)]


# added to a placement's score per extra NVLink domain it spans: above any policy's score difference (the largest,
# ``best-fit``'s and ``default``'s, are a few hundred), so it only orders placements by how many domains they span
DOMAIN_SPREAD = 1_000_000.0


class Policy:
    """Base class: subclasses implement ``score`` (lower is better) and may override unit choice."""

    name = "base"
    uses_random = False

    def __init__(self, *, seed: int = 0, workload: list[tuple[Need, float]] | None = None):
        self.rng = _random.Random(seed)
        self.workload = list(workload or [])  # a copy: later changes by the caller do not leak in
        self._demand: dict[str, list[tuple[MigProfile, float]]] = {}
        self._stranding_of: dict[tuple[str, int, int], float] = {}  # ``_mig_stranding``'s memo

    # How a node's units are chosen for a multi-unit need: by default tightest GPUs first.
    def unit_order(self, gpu: GpuState, unit: Unit) -> tuple:
        return (gpu.free_milli, unit.mig_start, gpu.gpu.index)

    def node_options(self, node: NodeState, need: Need) -> list[tuple[Unit, ...]]:
        """Candidate unit sets on one node (one per distinct GPU choice for single units)."""
        if not node_accepts(node, need):
            return []
        if need.count == 0:
            return [()] if not node.gpus or not need.models or not node.models.isdisjoint(need.models) else []
        if need.count == 1:
            # one option per distinct GPU state (``GpuState.key``: within a node, two GPUs of one key offer the
            # same units), the first GPU of each in the node's order; a GPU whose state was seen is not evaluated
            options: list[tuple[Unit, ...]] = []
            seen: set[tuple] = set()
            for gpu in node.gpus:
                key = gpu.key or gpu.canonical()  # kept current by ``ClusterState``; a bare GpuState has none
                if key not in seen:
                    seen.add(key)
                    options += [(unit,) for unit in gpu_options(gpu, need)]
            return options
        per_gpu = [(gpu, gpu_options(gpu, need)) for gpu in node.gpus]
        per_gpu = [(gpu, units) for gpu, units in per_gpu if units]
        if need.kind == Kind.MIG:
            return self._multi_mig(per_gpu, need)
        ranked = sorted(per_gpu, key=lambda item: self.unit_order(item[0], item[1][0]))
        if len(ranked) < need.count:
            return []
        # Prefer one NVLink domain when the node has several.
        domains: dict[str, list] = {}
        for gpu, units in ranked:
            domains.setdefault(gpu.gpu.nvlink_domain, []).append(units[0])
        for units in domains.values():
            if len(units) >= need.count:
                return [tuple(units[: need.count])]
        return [tuple(units[0] for _, units in ranked[: need.count])]

    def _multi_mig(self, per_gpu, need: Need) -> list[tuple[Unit, ...]]:
        chosen: list[Unit] = []
        for gpu, _ in sorted(per_gpu, key=lambda item: self.unit_order(item[0], item[1][0])):
            slots = gpu.slot_mask
            compute = gpu.compute_used
            profile = need.profile
            assert profile is not None
            width = (1 << profile.memory_slots) - 1
            media = gpu.media_used
            for start in profile.starts:
                if len(chosen) == need.count:
                    break
                if compute + profile.compute_slices > COMPUTE_SLICES:
                    break
                if profile.shape.media_extensions and media:
                    break  # at most one +me instance per GPU
                if not (slots >> start) & width:
                    slots |= width << start
                    compute += profile.compute_slices
                    media += int(profile.shape.media_extensions)
                    chosen.append(Unit(gpu.gpu.id, need.milli, need.memory_mib, profile.name, start))
            if len(chosen) == need.count:
                return [tuple(chosen)]
        return []

    def score(self, cluster: ClusterState, node: NodeState, units: tuple[Unit, ...], need: Need) -> float:
        raise NotImplementedError

    def placement_score(self, cluster: ClusterState, node: NodeState, units: tuple[Unit, ...], need: Need) -> float:
        """What the search ranks by: ``score`` plus ``DOMAIN_SPREAD`` for each NVLink domain beyond the first that
        the units span, so a multi-GPU request goes to a node where one domain holds it whenever any node has that
        room, whatever the policy's score (within a node, ``node_options`` already prefers one domain)."""
        score = self.score(cluster, node, units, need)
        if len(units) > 1:
            gpus = cluster.gpus
            first = gpus[units[0].gpu].gpu.nvlink_domain
            spread = {gpus[unit.gpu].gpu.nvlink_domain for unit in units if gpus[unit.gpu].gpu.nvlink_domain != first}
            if spread:
                score += DOMAIN_SPREAD * len(spread)
        return score


def _after(node: NodeState, units: tuple[Unit, ...]) -> list[int]:
    """Free milli per GPU of ``node`` after placing ``units``."""
    taken: dict[str, int] = {}
    for unit in units:
        taken[unit.gpu] = taken.get(unit.gpu, 0) + unit.milli
    return [gpu.free_milli - taken.get(gpu.gpu.id, 0) for gpu in node.gpus]


class RandomPolicy(Policy):
    name = "random"
    uses_random = True

    def score(self, cluster, node, units, need):
        return 0.0


class BestFitPolicy(Policy):
    """The node left with the least free capacity (GPU and CPU, normalised) after placement."""

    name = "best-fit"

    def score(self, cluster, node, units, need):
        gpu_total = FULL * max(1, len(node.gpus))
        # ``sum(_after(node, units))``, without the per-GPU list: integers, so the same sum
        score = (sum([gpu.free_milli for gpu in node.gpus]) - sum([unit.milli for unit in units])) / gpu_total
        if node.node.cpu_milli:
            score += (node.free_cpu_milli - need.cpu_milli) / node.node.cpu_milli
        return score


class DotProductPolicy(Policy):
    """The node whose free (CPU, GPU) vector is most aligned with the request's (largest dot product)."""

    name = "dot-product"

    def score(self, cluster, node, units, need):
        gpu_total = FULL * max(1, len(node.gpus))
        dot = (need.total_milli / gpu_total) * (node.free_milli / gpu_total)
        if node.node.cpu_milli:
            dot += (need.cpu_milli / node.node.cpu_milli) * (node.free_cpu_milli / node.node.cpu_milli)
        return -dot


class PackingPolicy(Policy):
    """GPU packing: shares go to partly used GPUs first, then to nodes already in use, then idle ones."""

    name = "packing"

    def score(self, cluster, node, units, need):
        gpus = {gpu.gpu.id: gpu for gpu in node.gpus}
        partly = any(FULL - gpus[u.gpu].free_milli > 0 for u in units)
        node_used = any(gpu.free_milli < FULL for gpu in node.gpus)
        tier = 0 if partly else (1 if node_used else 2)
        return tier * 10 + BestFitPolicy.score(self, cluster, node, units, need)


def workload_from_needs(needs: list[Need], coverage: float = 0.95) -> list[tuple[Need, float]]:
    """FGD's "typical" shapes: the most frequent needs that together cover ``coverage`` of them."""
    counts: dict[tuple, tuple[Need, int]] = {}
    for need in needs:
        # FGD's shape: (CPU, GPU count, GPU milli, GPU model); host memory does not split shapes
        need = Need(need.kind, need.count, need.models, need.milli, need.memory_mib, need.profile, need.gang,
                    need.cpu_milli, 0)
        key = need.key()
        counts[key] = (need, counts.get(key, (need, 0))[1] + 1)
    ranked = sorted(counts.values(), key=lambda item: (-item[1], item[0].key()))
    total = len(needs)
    out: list[tuple[Need, float]] = []
    covered = 0
    for need, count in ranked:
        out.append((need, count / total))
        covered += count
        if covered >= coverage * total:
            break
    return out


def node_fragmentation(node: NodeState, free: list[int], free_cpu: int, workload: list[tuple[Need, float]],
                       gpus: list[GpuState] | None = None) -> float:
    """Expected GPU capacity (milli) of ``node`` that the typical workload cannot use (FGD's measure).

    ``free`` is the free milli per GPU (in ``node.gpus`` order), ``free_cpu`` the free CPU. For each
    typical need m: if m cannot run on the node at all (model, CPU, too few GPUs) or needs no GPU, all
    free GPU capacity is a fragment; otherwise the free capacity of the GPUs too small for m is.
    """
    total_free = sum(free)
    if total_free == 0:
        return 0.0
    model = node.gpus[0].gpu.model if node.gpus else ""
    result = 0.0
    for need, probability in workload:
        if need.total_milli == 0 or not need.allows(model) or (
            node.node.cpu_milli and free_cpu < need.cpu_milli
        ):
            result += probability * total_free
            continue
        if need.kind == Kind.SHARE or (need.kind == Kind.WHOLE and need.count == 1):
            small = sum(f for f in free if f < need.milli)
            if need.kind == Kind.WHOLE:
                small = sum(f for f in free if f < FULL)
            result += probability * (total_free if small == total_free else small)
        elif need.kind == Kind.WHOLE:
            whole_free = sum(1 for f in free if f == FULL)
            if whole_free < need.count:
                result += probability * total_free
            else:
                result += probability * sum(f for f in free if f < FULL)
        else:  # MIG: a GPU is a fragment for m when m has no free start on it
            frag = 0
            for gpu, f in zip(gpus or node.gpus, free, strict=False):
                if f and not gpu.mig_starts(need.profile):  # type: ignore[arg-type]
                    frag += f
            result += probability * frag
    return result


class FgdPolicy(Policy):
    """Fragmentation gradient descent: the placement that least increases the node's fragmentation, scored as
    the authors' simulator (hkust-adsl/kubernetes-scheduler-simulator) does: the typical shapes' frequencies
    renormalised to sum to 1, and a node's score the integer ``int(100 * sigmoid(-Δfragmentation / 1000))``,
    so that placements within a few tens of milli-GPU of each other tie (ties go to the lowest node id, the
    first in the simulator's shuffled node order) and, on a node, to the lowest GPU index."""

    name = "fgd"

    def __init__(self, *, seed: int = 0, workload: list[tuple[Need, float]] | None = None):
        super().__init__(seed=seed, workload=workload)
        total = sum(p for _, p in self.workload)
        if total > 0:
            self.workload = [(n, p / total) for n, p in self.workload]
        self._pure = not any(n.kind == Kind.MIG for n, _ in self.workload)
        self._memo: dict[tuple, float] = {}

    def _fragmentation(self, node: NodeState, free: list[int], free_cpu: int) -> float:
        if not self._pure or any(g.gpu.mode == GpuMode.MIG for g in node.gpus):
            return node_fragmentation(node, free, free_cpu, self.workload)
        key = (node.gpus[0].gpu.model if node.gpus else "", bool(node.node.cpu_milli), free_cpu, *sorted(free))
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = node_fragmentation(node, free, free_cpu, self.workload)
        return value

    def score(self, cluster, node, units, need):
        before = self._fragmentation(node, [g.free_milli for g in node.gpus], node.free_cpu_milli)
        after = self._fragmentation(node, _after(node, units), node.free_cpu_milli - need.cpu_milli)
        return -int(100 / (1 + math.exp((after - before) / 1000)))


def node_stranding(node: NodeState, free: list[int], free_cpu: int, free_memory: int,
                   workload: list[tuple[Need, float]], *, host_weight: float = 0.25) -> float:
    """Expected GPU capacity (milli) of a node that the typical workload could *not* consume if it kept
    arriving. For each typical need m: all free GPU when m cannot run there at all (model, CPU, memory,
    or m needs no GPU); otherwise the free GPU minus what as many copies of m as the free GPUs hold would
    take (an 810-milli share leaves 190 of a GPU behind), plus ``host_weight`` times the GPU capacity of
    the copies that the free CPU / host memory could not feed (GPUs stranded behind exhausted CPU).

    ``DefaultPolicy`` weights that last part by the kind of task it places (``host_weight_*``, chosen on the
    openb traces, docs/scheduling.md: a uniform 0.25 over-weights CPU stranding where multi-GPU tasks
    dominate, none ignores it where CPU-only and CPU-heavy tasks compete for the GPU nodes' cores)."""
    total_free = sum(free)
    if total_free == 0:
        return 0.0
    result = 0.0
    tracks_cpu, tracks_memory = bool(node.node.cpu_milli), bool(node.node.memory_mib)
    for need, probability in workload:
        usable = [f for gpu, f in zip(node.gpus, free, strict=True) if need.allows(gpu.gpu.model)]
        if (need.total_milli == 0 or not usable or (tracks_cpu and free_cpu < need.cpu_milli)
                or (tracks_memory and free_memory < need.host_memory_mib)):
            result += probability * total_free
            continue
        if need.kind == Kind.WHOLE:
            copies_gpu = sum(1 for f in usable if f == FULL) // need.count
        else:
            copies_gpu = sum(f // need.milli for f in usable)
        copies_host = min(
            free_cpu // need.cpu_milli if tracks_cpu and need.cpu_milli else copies_gpu,
            free_memory // need.host_memory_mib if tracks_memory and need.host_memory_mib else copies_gpu,
        )
        unfed = max(0, copies_gpu - copies_host)
        result += probability * (total_free - copies_gpu * need.total_milli + host_weight * unfed * need.total_milli)
    return result


def mig_copies(slot_mask: int, compute_used: int, profile: MigProfile) -> int:
    """How many more instances of ``profile`` fit a MIG GPU with this layout (lowest starts first, which
    is optimal for one profile: its starts are aligned to its size)."""
    count = 0
    width = (1 << profile.memory_slots) - 1
    for start in profile.starts:
        if compute_used + profile.compute_slices > COMPUTE_SLICES:
            break
        if not (slot_mask >> start) & width:
            slot_mask |= width << start
            compute_used += profile.compute_slices
            count += 1
    return count


def mig_stranding(slot_mask: int, compute_used: int, demand: list[tuple[MigProfile, float]]) -> float:
    """Expected compute (milli) of one MIG GPU that the MIG demand could not use."""
    free = (COMPUTE_SLICES - compute_used) * FULL // COMPUTE_SLICES
    result = 0.0
    for profile, probability in demand:
        result += probability * (free - mig_copies(slot_mask, compute_used, profile) * profile.gpu_milli)
    return result


def mig_demand(model: str, workload: list[tuple[Need, float]]) -> list[tuple[MigProfile, float]]:
    """The MIG profiles in demand on ``model`` with normalised probabilities; with no history, every
    profile of the model (but +me) equally likely."""
    demand = [(n.profile, p) for n, p in workload
              if n.kind == Kind.MIG and n.profile is not None and n.profile.model == model]
    if not demand:
        from gpus.mig import profiles_for

        offered = [p for p in profiles_for(model) if not p.shape.media_extensions]
        demand = [(p, 1.0) for p in offered]
    total = sum(p for _, p in demand)
    return [(profile, p / total) for profile, p in demand]


def remainder_waste(workload: list[tuple[Need, float]], *, stop: float = 0.05) -> list[float]:
    """Expected capacity (milli) a GPU with ``f`` milli free ends up wasting, for ``f`` in 0..FULL (the index).

    A look-ahead over *mixtures* of the typical one-GPU shapes (whole GPUs and shares), where
    ``node_stranding`` counts copies of one shape at a time: a hole of ``f`` either receives no further task
    (probability ``stop``: ``f`` is wasted) or the next task is one of the shapes that fit it, drawn by their
    frequencies, and what it leaves is a smaller hole. A 350 hole is worth little waste (a 320 leaves 30), a
    210 hole much (only the rare 160 and smaller fit); a fresh GPU's waste is what its likely fillings leave
    (an 810 share, 190). Without one-GPU shapes every free milli is waste, so the difference between two
    placements of one task is the same everywhere and the term decides nothing."""
    sizes: dict[int, float] = {}
    for need, probability in workload:
        if need.count == 1 and need.kind in (Kind.WHOLE, Kind.SHARE) and 0 < need.milli <= FULL:
            sizes[need.milli] = sizes.get(need.milli, 0.0) + probability
    ordered = sorted(sizes.items())
    waste = [0.0] * (FULL + 1)
    for free in range(1, FULL + 1):
        fitting = [(milli, p) for milli, p in ordered if milli <= free]
        total = sum(p for _, p in fitting)
        if not fitting or total <= 0:
            waste[free] = float(free)
            continue
        waste[free] = stop * free + (1 - stop) * sum(p * waste[free - milli] for milli, p in fitting) / total
    return waste


class DefaultPolicy(Policy):
    """Ours: minimise the increase of the node's *stranded* capacity (``node_stranding``): FGD's idea,
    measured by how many copies of each typical need the node could still take given its free GPU,
    CPU and memory together, with GPUs stranded behind exhausted CPU or memory weighted 0.1 when the task
    placed takes whole GPUs, 0.05 when it takes a share and 1 when it takes no GPU (``host_weight_*``: a
    CPU-only task should spend the cores of nodes whose GPUs cannot use them).
    The increase is counted in steps of ``quantum`` milli-GPU, and placements within one step tie; ties go
    to the lowest node id (in the openb replay, the seed's node order), which spreads near-equal
    placements over the fleet instead of packing them (best-fit tie-breaking cost 0.1-0.4 points on the
    openb traces, docs/scheduling.md). For MIG, the same measure per GPU over its slot layout picks start
    slots that keep larger profiles possible (a 3g goes to slot 4 so that a 4g can still start at 0), with
    best-fit among equal layouts.

    A second term (weight ``remainder_weight``) adds the change of the expected waste of the GPUs the
    placement touches (``remainder_waste``: what mixtures of the typical one-GPU shapes would leave of each
    GPU's free capacity), so that a share goes where the hole it leaves is likely to be filled (a 320 into
    a 350 hole rather than a 530 one, which a 470 can still fill). A hole is valued by the shapes its GPU's
    model and the node's free CPU and memory can still take (``_remainder_table``): on a node whose cores are
    spent it is all waste, so a placement that spends the cores some shape needed (a CPU-only task too) pays
    for every hole of the node it starves. Both terms are summed before the quantisation; with this term the
    step is 60 milli-GPU (docs/scheduling.md: the openb traces).

    A third term (weight ``balance_weight``, in its own steps of ``quantum``) is the change of the node's GPU
    capacity that its free CPU could not feed at the demand mix's CPU per GPU (``_balance``): stranding counts
    one shape's copies at a time, this term the mixture, so CPU-heavy tasks go where cores are plentiful beside
    the GPUs and CPU-light ones where they are scarce. Without a demand mix that asks for CPU it is skipped."""

    name = "default"
    # weight of GPUs stranded behind exhausted CPU / memory, by the kind of the task placed: whole GPUs, and
    # shares, and CPU-only work; chosen on the openb traces, docs/scheduling.md
    host_weight_whole = 0.1  # 0.25 before the balance term, which now carries most of the CPU stranding
    host_weight_share = 0.05
    host_weight_cpu_only = 1.0
    quantum = 60.0  # milli-GPU
    mig_best_fit_weight = 1.0
    remainder_weight = 1.0  # the look-ahead over one-GPU shape mixtures (``remainder_waste``)
    remainder_stop = 0.05  # its probability that a hole receives no further task
    # the CPU balance term (``_balance``): GPU capacity of a node that its free CPU could not feed at the demand
    # mix's CPU per GPU, weighted by this, in its own steps of ``quantum``; chosen on the openb traces
    balance_weight = 1.5

    def __init__(self, *, seed: int = 0, workload: list[tuple[Need, float]] | None = None):
        super().__init__(seed=seed, workload=workload)
        self._memo: dict[tuple, tuple[float, float]] = {}
        # the workload as plain tuples for the one-model fast path of ``_stranding``
        self._compiled = [(p, n.total_milli, frozenset(n.models), n.cpu_milli, n.host_memory_mib,
                           n.kind == Kind.WHOLE, n.count, n.milli) for n, p in self.workload if n.kind != Kind.MIG]
        self._has_mig = len(self._compiled) != len(self.workload)
        # without one-GPU shapes in the workload (the live cycle with no demand history) the term is the same
        # for every placement of a task: skipped
        one_gpu = any(n.count == 1 and n.kind != Kind.MIG for n, _ in self.workload)
        self._remainder = remainder_waste(self.workload, stop=self.remainder_stop) if one_gpu else None
        # the look-ahead per GPU model and free host capacity: only the one-GPU shapes that model and the node's
        # free CPU and memory can still take (``_remainder_table``)
        self._one_gpu = [(n, p) for n, p in self.workload
                         if n.count == 1 and n.kind in (Kind.WHOLE, Kind.SHARE) and 0 < n.milli <= FULL]
        self._tables: dict[tuple, list[float]] = {}  # by the indices of the shapes that still fit
        self._table_of: dict[tuple, list[float]] = {}  # by (model, free CPU, free memory)
        # the demand mix's CPU per milli-GPU (the tasks that take GPUs, by their frequencies); None without a mix
        # that asks for both (the live cycle with no demand history): no balance term
        gpu_needs = [(n, p) for n, p in self.workload if n.total_milli > 0 and n.kind != Kind.MIG]
        gpu_milli = sum(p * n.total_milli for n, p in gpu_needs)
        cpu_milli = sum(p * n.cpu_milli for n, p in gpu_needs)
        self._cpu_per_gpu_milli = cpu_milli / gpu_milli if gpu_milli > 0 and cpu_milli > 0 else None

    def _stranding(self, node: NodeState, free: list[int], free_cpu: int, free_memory: int) -> tuple[float, float]:
        """``node_stranding``, memoised: it depends only on the free capacity per GPU model (and whether CPU
        and memory are tracked), so nodes in the same state, before or after a placement, share it. A node
        of one GPU model (the usual case) takes a fast path that computes the same sum."""
        models = {g.gpu.model for g in node.gpus}
        tracks_cpu, tracks_memory = bool(node.node.cpu_milli), bool(node.node.memory_mib)
        if len(models) != 1 or self._has_mig:
            key = (tracks_cpu, tracks_memory, free_cpu, free_memory,
                   *sorted(zip([g.gpu.model for g in node.gpus], free, strict=True)))
            value = self._memo.get(key)
            if value is None:
                value = self._memo[key] = (node_stranding(node, free, free_cpu, free_memory, self.workload,
                                                          host_weight=0.0),
                                           node_stranding(node, free, free_cpu, free_memory, self.workload,
                                                          host_weight=1.0)
                                           - node_stranding(node, free, free_cpu, free_memory, self.workload,
                                                            host_weight=0.0))
            return value
        (model,) = models
        key = (model, tracks_cpu, tracks_memory, free_cpu, free_memory, *sorted(free))
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = self._stranding_one_model(model, free, free_cpu, free_memory, tracks_cpu,
                                                                tracks_memory)
        return value

    def _stranding_one_model(self, model: str, free: list[int], free_cpu: int, free_memory: int, tracks_cpu: bool,
                             tracks_memory: bool) -> tuple[float, float]:
        total_free = sum(free)
        if total_free == 0:
            return 0.0, 0.0
        full = free.count(FULL)
        share_copies: dict[int, int] = {}
        result = host = 0.0
        for probability, total_milli, models, cpu, memory, whole, count, milli in self._compiled:
            if (total_milli == 0 or (models and model not in models) or (tracks_cpu and free_cpu < cpu)
                    or (tracks_memory and free_memory < memory)):
                result += probability * total_free
                continue
            if whole:
                copies_gpu = full // count
            else:
                copies_gpu = share_copies.get(milli)
                if copies_gpu is None:
                    copies_gpu = share_copies[milli] = sum(f // milli for f in free)
            copies_host = min(free_cpu // cpu if tracks_cpu and cpu else copies_gpu,
                              free_memory // memory if tracks_memory and memory else copies_gpu)
            result += probability * (total_free - copies_gpu * total_milli)
            if copies_gpu > copies_host:
                host += probability * (copies_gpu - copies_host) * total_milli
        return result, host

    def score(self, cluster, node, units, need):
        if need.kind == Kind.MIG:
            return self._mig_score(node, units) + self.mig_best_fit_weight * BestFitPolicy.score(
                self, cluster, node, units, need)
        before = [g.free_milli for g in node.gpus]
        after = _after(node, units)
        gpu_before, host_before = self._stranding(node, before, node.free_cpu_milli, node.free_memory_mib)
        gpu_after, host_after = self._stranding(node, after, node.free_cpu_milli - need.cpu_milli,
                                                node.free_memory_mib - need.host_memory_mib)
        if need.count == 0:
            host_weight = self.host_weight_cpu_only
        else:
            host_weight = self.host_weight_whole if need.kind == Kind.WHOLE else self.host_weight_share
        delta = (gpu_after - gpu_before) + host_weight * (host_after - host_before)
        if self._remainder is not None and self.remainder_weight:
            delta += self.remainder_weight * self._remainder_delta(node, before, after, need)
        score = round(delta / self.quantum) if self.quantum else delta
        if self._cpu_per_gpu_milli is not None and self.balance_weight and node.node.cpu_milli:
            balance = self.balance_weight * (self._balance(sum(after), node.free_cpu_milli - need.cpu_milli)
                                             - self._balance(sum(before), node.free_cpu_milli))
            score += round(balance / self.quantum) if self.quantum else balance
        return score

    def _balance(self, free_milli: int, free_cpu: int) -> float:
        """GPU capacity (milli) of a node that its free CPU could not feed if the demand mix filled it: the free
        GPU beyond what the free CPU buys at the mix's CPU per GPU. Stranding counts copies of one shape at a time
        (a node's cores feed seven 11-core tasks *or* five 18-core ones); this term sees the mixture, so a
        CPU-heavy task goes where cores are plentiful beside its GPUs and a CPU-light one where they are scarce."""
        assert self._cpu_per_gpu_milli is not None
        return max(0.0, free_milli - free_cpu / self._cpu_per_gpu_milli)

    def _remainder_table(self, model: str, free_cpu: int | None, free_memory: int | None) -> list[float]:
        """``remainder_waste`` over the one-GPU shapes that a GPU of ``model`` on a node with this much free CPU
        and memory (None: not tracked) can still take; memoised by that set of shapes. With none left every
        free milli is waste: a hole on a node whose cores are spent is lost whatever its size."""
        key = (model, free_cpu, free_memory)
        table = self._table_of.get(key)
        if table is None:
            fitting = tuple(index for index, (need, _) in enumerate(self._one_gpu)
                            if need.allows(model) and (free_cpu is None or need.cpu_milli <= free_cpu)
                            and (free_memory is None or need.host_memory_mib <= free_memory))
            table = self._tables.get(fitting)
            if table is None:
                table = self._tables[fitting] = remainder_waste([self._one_gpu[index] for index in fitting],
                                                                stop=self.remainder_stop)
            self._table_of[key] = table
        return table

    def _remainder_delta(self, node: NodeState, before: list[int], after: list[int], need: Need) -> float:
        """The change of the look-ahead's expected waste over the node's GPUs: each GPU's hole valued by the
        shapes that its model and the node's free CPU and memory can still take, before and after the placement.
        When the placement leaves the node's host capacity for the same shapes, only the GPUs it touches change;
        when it spends CPU or memory that some shape needed (a CPU-only task too), every GPU's hole is revalued."""
        tracks_cpu, tracks_memory = bool(node.node.cpu_milli), bool(node.node.memory_mib)
        cpu_before = node.free_cpu_milli if tracks_cpu else None
        memory_before = node.free_memory_mib if tracks_memory else None
        cpu_after = cpu_before - need.cpu_milli if tracks_cpu else None
        memory_after = memory_before - need.host_memory_mib if tracks_memory else None
        total = 0.0
        tables: dict[str, tuple[list[float], list[float]]] = {}
        for gpu, a, b in zip(node.gpus, after, before, strict=True):
            pair = tables.get(gpu.gpu.model)
            if pair is None:
                pair = tables[gpu.gpu.model] = (self._remainder_table(gpu.gpu.model, cpu_before, memory_before),
                                                self._remainder_table(gpu.gpu.model, cpu_after, memory_after))
            table_before, table_after = pair
            if a != b or table_before is not table_after:
                total += table_after[a] - table_before[b]
        return total

    def _mig_score(self, node: NodeState, units: tuple[Unit, ...]) -> float:
        if len(units) == 1:  # the common case, without the maps below (the same value: 0.0 + x is x)
            unit = units[0]
            gpu = next(gpu for gpu in node.gpus if gpu.gpu.id == unit.gpu)
            model, mask, compute = gpu.gpu.model, gpu.slot_mask, gpu.compute_used
            profile = profile_get(model, unit.mig_profile)
            return (self._mig_stranding(model, mask | (((1 << profile.memory_slots) - 1) << unit.mig_start),
                                        compute + profile.compute_slices)
                    - self._mig_stranding(model, mask, compute))
        gpus = {gpu.gpu.id: gpu for gpu in node.gpus}
        layout: dict[str, list[int]] = {}
        for unit in units:
            gpu = gpus[unit.gpu]
            mask, compute = layout.get(unit.gpu, [gpu.slot_mask, gpu.compute_used])
            profile = profile_get(gpu.gpu.model, unit.mig_profile)
            layout[unit.gpu] = [mask | (((1 << profile.memory_slots) - 1) << unit.mig_start),
                                compute + profile.compute_slices]
        delta = 0.0
        for gpu_id, (mask, compute) in layout.items():
            gpu = gpus[gpu_id]
            delta += (self._mig_stranding(gpu.gpu.model, mask, compute)
                      - self._mig_stranding(gpu.gpu.model, gpu.slot_mask, gpu.compute_used))
        return delta

    def _mig_stranding(self, model: str, slot_mask: int, compute_used: int) -> float:
        """``mig_stranding`` of a ``model`` GPU with this layout under the policy's demand, memoised: the workload
        is fixed for the policy's life and a GPU has few layouts (8 memory slots, 7 compute slices)."""
        key = (model, slot_mask, compute_used)
        value = self._stranding_of.get(key)
        if value is None:
            demand = self._demand.get(model)
            if demand is None:
                demand = self._demand[model] = mig_demand(model, self.workload)
            value = self._stranding_of[key] = mig_stranding(slot_mask, compute_used, demand)
        return value


POLICIES: dict[str, type[Policy]] = {
    policy.name: policy
    for policy in (RandomPolicy, BestFitPolicy, DotProductPolicy, PackingPolicy, FgdPolicy, DefaultPolicy)
}


def policy_get(name: str, **kwargs) -> Policy:
    try:
        return POLICIES[name](**kwargs)
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None


# -- search ------------------------------------------------------------------------------------------


def may_fit(info: ClassInfo, need: Need) -> bool:
    """False only when ``Policy.node_options`` finds nothing for ``need`` on a node of this class (a cheap
    necessary condition: each whole or share unit takes one GPU of its kind, a MIG one an open MIG GPU)."""
    if info.cordoned or (need.models and info.models.isdisjoint(need.models)):
        return False
    if need.pools and info.pool not in need.pools:
        return False
    if need.count == 0:
        return True
    if need.kind == Kind.WHOLE:
        return info.whole_free >= need.count
    if need.kind == Kind.SHARE:
        return info.shared_open >= need.count
    return info.mig_open > 0


class Placer:
    """Finds the best node and units for a need under a policy, one evaluation per node class.

    Per need it keeps a heap of (score, lowest node id, class, units by GPU position) over the live classes,
    caught up from ``ClusterState.signature_log`` at each search; scores are memoised per (need, class). The
    result is the one a search of every node would give: the lowest score, ties on the lowest node id."""

    def __init__(self, cluster: ClusterState, policy: Policy):
        self.cluster = cluster
        self.policy = policy
        self._memo: dict[tuple, tuple[float, tuple] | None] = {}  # the random policy's, by legacy signature
        # per need: [heap of (score, lowest node id, class id, units), log position, {class id: best or None}]
        self._heaps: dict[tuple, list] = {}
        self._generation = cluster.log_generation
        # the class prefilter is exact for the base class's node_options only
        self._prefilter = type(policy).node_options is Policy.node_options

    def _best_on_signature(self, node: NodeState, signature: tuple, need: Need):
        key = (signature, need.key())
        if key in self._memo:
            return self._memo[key]
        best = None
        for units in self.policy.node_options(node, need):
            score = self.policy.placement_score(self.cluster, node, units, need)
            if best is None or score < best[0]:
                best = (score, units)
        if best is not None:
            best = (best[0], _relative(node, best[1]))
        self._memo[key] = best
        return best

    def _best_on_class(self, node: NodeState, need: Need):
        """(score rounded, units as (GPU position, milli, memory, profile, start)) of the best option on
        ``node``, the first of equal scores in ``node_options`` order; None when nothing fits."""
        best = None
        policy, cluster = self.policy, self.cluster
        for units in policy.node_options(node, need):
            score = policy.placement_score(cluster, node, units, need)
            if best is None or score < best[0]:
                best = (score, units)
        if best is None:
            return None
        gpus = cluster.gpus
        # scores are sums of float terms: round so that equal placements tie exactly
        return round(best[0], 6), tuple((gpus[unit.gpu].position, unit.milli, unit.memory_mib, unit.mig_profile,
                                         unit.mig_start) for unit in best[1])

    def find(self, need: Need) -> tuple[str, tuple[Unit, ...]] | None:
        """The chosen node and units, or None when nothing fits."""
        if self.policy.uses_random:
            return self._find_random(need)
        if need.avoid:
            return self._find_avoiding(need)
        cluster = self.cluster
        if cluster.log_generation != self._generation:  # the log was compacted: rebuild from live classes
            self._heaps.clear()
            self._generation = cluster.log_generation
        key = need.key()
        entry = self._heaps.get(key)
        if entry is None:
            entry = self._heaps[key] = [[], 0, {}]
        heap, position, memo = entry
        log = cluster.signature_log
        if position < len(log):
            # catch up with the classes that appeared (or whose lowest node id fell) since this need was placed
            by_class, nodes, info = cluster.by_signature, cluster.nodes, cluster.class_info
            prefilter = self._prefilter
            for class_id in log[position:]:
                members = by_class.get(class_id)
                if not members:
                    continue
                best = memo.get(class_id, False)
                if best is False:
                    if prefilter and not may_fit(info[class_id], need):
                        best = None
                    elif need.models and info[class_id].models.isdisjoint(need.models):
                        continue
                    else:
                        best = self._best_on_class(nodes[next(iter(members))], need)
                    memo[class_id] = best
                if best is not None:
                    heapq.heappush(heap, (best[0], cluster.lowest(class_id), class_id, best[1]))
            entry[1] = len(log)
        # the best class that still has nodes, ties broken on the lowest node id; entries whose class has
        # no nodes any more are dropped, and those whose lowest node id rose are re-ranked
        by_class = cluster.by_signature
        while heap:
            score, lowest, class_id, relative = heap[0]
            if class_id not in by_class:
                heapq.heappop(heap)
                continue
            node_id = cluster.lowest(class_id)
            if node_id != lowest:
                heapq.heapreplace(heap, (score, node_id, class_id, relative))
                continue
            gpus = cluster.nodes[node_id].gpus
            return node_id, tuple(Unit(gpus[index].gpu.id, milli, memory, profile, start)
                                  for index, milli, memory, profile, start in relative)
        return None

    def _find_avoiding(self, need: Need) -> tuple[str, tuple[Unit, ...]] | None:
        """``find`` for a need that avoids some nodes (rare: a workload re-placed after failures): every node
        class evaluated once, as for any need, then the best score on a node it does not avoid, the lowest
        such node id on ties. Nothing is memoised under the avoiding need."""
        cluster = self.cluster
        anywhere = replace(need, avoid=frozenset())
        best: tuple[tuple, tuple] | None = None
        for class_id, members in cluster.by_signature.items():
            allowed = [node_id for node_id in members if node_id not in need.avoid]
            if not allowed:
                continue
            if need.models and cluster.class_info[class_id].models.isdisjoint(need.models):
                continue
            found = self._best_on_class(cluster.nodes[next(iter(members))], anywhere)
            if found is not None and (best is None or (found[0], min(allowed)) < best[0]):
                best = ((found[0], min(allowed)), found[1])
        if best is None:
            return None
        node_id = best[0][1]
        gpus = cluster.nodes[node_id].gpus
        return node_id, tuple(Unit(gpus[index].gpu.id, milli, memory, profile, start)
                              for index, milli, memory, profile, start in best[1])

    def _find_random(self, need: Need) -> tuple[str, tuple[Unit, ...]] | None:
        cluster = self.cluster
        scored: list[tuple[tuple, tuple, int]] = []
        anywhere = replace(need, avoid=frozenset())
        for signature, members in cluster.legacy_by_signature.items():
            sample = cluster.nodes[next(iter(members))]
            if need.models and sample.models.isdisjoint(need.models):
                continue
            if need.avoid and members <= need.avoid:
                continue
            best = self._best_on_signature(sample, signature, anywhere)
            if best is not None:
                scored.append((signature, best[1], len(members - need.avoid)))
        if not scored:
            return None
        signature, relative, _ = self.policy.rng.choices(scored, weights=[s[2] for s in scored])[0]
        members = sorted(cluster.legacy_by_signature[signature] - need.avoid)
        node_id = members[self.policy.rng.randrange(len(members))]
        return node_id, _materialise(cluster.nodes[node_id], relative)


def _relative(node: NodeState, units: tuple[Unit, ...]) -> tuple:
    """Units described by GPU state and rank among equal GPUs, valid on any node of the same signature."""
    signatures = {gpu.gpu.id: gpu.signature() for gpu in node.gpus}
    out = []
    for unit in units:
        signature = signatures[unit.gpu]
        rank = [gpu_id for gpu_id, other in signatures.items() if other == signature].index(unit.gpu)
        out.append((signature, rank, unit.milli, unit.memory_mib, unit.mig_profile, unit.mig_start))
    return tuple(out)


def _materialise(node: NodeState, relative: tuple) -> tuple[Unit, ...]:
    signatures = [(gpu, gpu.signature()) for gpu in node.gpus]
    units = []
    for signature, rank, milli, memory, profile, start in relative:
        same = [gpu for gpu, other in signatures if other == signature]
        units.append(Unit(same[rank].gpu.id, milli, memory, profile, start))
    return tuple(units)
