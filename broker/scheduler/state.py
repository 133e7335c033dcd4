"""Mutable working state of one planning cycle, built from a frozen ``Snapshot``.

Nodes in the same *class* are interchangeable for every placement policy, so the state keeps an index
``class -> node ids``; a request is evaluated once per class, not once per node. A node's class is its
canonical signature interned to an integer: its totals and free host capacity, and each GPU's model, mode
and use *in the node's GPU order*, with the NVLink domain named by its rank within the node (domain names
are per node, so the names themselves would make every node its own class). Two nodes of one class evaluate
identically under a policy that reads the node's state, so the search's result is the same as evaluating
every node (the brute force ``tests/scheduler/test_search_equivalence.py`` checks). That is what makes a
cycle over 100,000 GPUs cheap: a fleet has few distinct node states. ``apply`` / ``remove`` keep the index
exact, and undo each other (what-if evaluation).

Warm instances (pre-created MIG instances no lease holds) occupy their slots on the GPUs but are kept
apart from ``allocations``: they are never preemption victims and never count toward quota usage.
``apply_warm`` / ``remove_warm`` keep the same index exact; binding one is ``remove_warm`` then
``apply`` of the request's allocation at the same unit.
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass, field
from heapq import heappop, heappush
from operator import attrgetter

from broker.scheduler.types import Allocation, Gpu, GpuMode, Node, Snapshot, Unit, WarmInstance
from gpus.catalogue import model_get
from gpus.mig import COMPUTE_SLICES, MigPlacement, MigProfile, layout_problem, profile_get

FULL = 1000
# module constants: an enum member read through its class costs a descriptor call
_MIG, _SHARED = GpuMode.MIG, GpuMode.SHARED


@dataclass(slots=True)
class GpuState:
    gpu: Gpu
    memory_mib: int
    used_milli: int = 0
    used_memory_mib: int = 0
    slot_mask: int = 0  # MIG: memory slots in use
    compute_used: int = 0  # MIG: compute slices in use
    media_used: int = 0  # MIG: +me instances
    units: int = 0  # number of units held (whole/shared)
    position: int = 0  # place in its node's GPU order (node, index, id)
    domain_rank: int = 0  # its NVLink domain's rank within its node (first appearance in that order)
    key: tuple = ()  # canonical state (``canonical()``), kept current by ``ClusterState``

    @property
    def free_milli(self) -> int:
        if self.gpu.mode == _MIG:
            return (COMPUTE_SLICES - self.compute_used) * FULL // COMPUTE_SLICES
        return FULL - self.used_milli

    def signature(self) -> tuple:
        if self.gpu.closed:  # nothing fits a closed GPU, whatever it holds
            return ("C", self.gpu.model, self.gpu.nvlink_domain)
        if self.gpu.mode == GpuMode.MIG:
            return ("M", self.gpu.model, self.gpu.nvlink_domain, self.slot_mask, self.compute_used, self.media_used)
        signature = (self.gpu.mode.value[0].upper(), self.gpu.model, self.gpu.nvlink_domain, self.used_milli,
                     self.used_memory_mib, self.units)
        # GPUs of one model whose nodes report different usable memory fit different shares
        return (*signature, self.gpu.memory_mib) if self.gpu.memory_mib else signature

    def canonical(self) -> tuple:
        """Everything a policy can read of this GPU, with the NVLink domain's rank within the node instead of
        its name (a closed GPU keeps its use: what it holds still counts in a node's free capacity)."""
        gpu = self.gpu
        if gpu.mode == _MIG:
            return ("M", gpu.closed, gpu.model, self.domain_rank, self.slot_mask, self.compute_used, self.media_used)
        key = (gpu.mode, gpu.closed, gpu.model, self.domain_rank, self.used_milli, self.used_memory_mib, self.units)
        return (*key, gpu.memory_mib) if gpu.memory_mib else key

    # -- fit --------------------------------------------------------------------------------------
    def fits_whole(self) -> bool:
        if self.gpu.mode == _MIG or self.gpu.closed:
            return False
        return self.used_milli == 0 and self.units == 0

    def fits_share(self, milli: int, memory_mib: int) -> bool:
        return (
            self.gpu.mode == _SHARED
            and not self.gpu.closed
            and self.used_milli + milli <= FULL
            and self.used_memory_mib + memory_mib <= self.memory_mib
        )

    def mig_starts(self, profile: MigProfile) -> tuple[int, ...]:
        """Start slots where new work of ``profile`` may go: none on a closed GPU, else the free ones."""
        return () if self.gpu.closed else self.free_starts(profile)

    def free_starts(self, profile: MigProfile) -> tuple[int, ...]:
        """Valid start slots for ``profile`` given this GPU's layout (bit arithmetic, no allocation)."""
        if self.gpu.mode != _MIG or profile.model != self.gpu.model:
            return ()
        if self.compute_used + profile.compute_slices > COMPUTE_SLICES:
            return ()
        if profile.shape.media_extensions and self.media_used:
            return ()
        width = (1 << profile.memory_slots) - 1
        return tuple(start for start in profile.starts if not (self.slot_mask >> start) & width)


@dataclass(slots=True)
class NodeState:
    node: Node
    gpus: list[GpuState]
    free_cpu_milli: int = 0
    free_memory_mib: int = 0

    def signature(self) -> tuple:
        """The free-capacity signature the ``random`` policy groups nodes by (GPU states as a sorted multiset)."""
        # totals are part of the state: policies normalise by them, and 0 means "not tracked"
        return (self.node.cordoned, self.node.cpu_milli, self.free_cpu_milli, self.node.memory_mib,
                self.free_memory_mib, tuple(sorted(g.signature() for g in self.gpus)), self.node.pool)

    def class_key(self) -> tuple:
        """The canonical signature: what a policy can see of the node, GPUs in the node's order."""
        return (self.node.cordoned, self.node.cpu_milli, self.free_cpu_milli, self.node.memory_mib,
                self.free_memory_mib, tuple([g.key for g in self.gpus]), self.node.pool)

    @property
    def models(self) -> frozenset[str]:
        return frozenset(g.gpu.model for g in self.gpus)

    @property
    def free_milli(self) -> int:
        return sum(g.free_milli for g in self.gpus)


@dataclass(frozen=True, slots=True)
class ClassInfo:
    """What every node of a class has, for a placer to skip classes a need cannot fit without evaluating them
    (a necessary condition of ``Policy.node_options`` finding anything; see ``placement.may_fit``)."""

    models: frozenset[str]
    cordoned: bool
    whole_free: int  # GPUs open to new work with nothing on them, not MIG
    shared_open: int  # shared GPUs open to new work
    mig_open: int  # MIG GPUs open to new work
    pool: str = ""  # the nodes' pool (part of the class key: a class never mixes pools)
    # ((model, mode), GPUs) of the node's idle GPUs: open, nothing on them (no unit, no warm instance)
    idle: tuple[tuple[tuple[str, str], int], ...] = ()


@dataclass
class ClusterState:
    nodes: dict[str, NodeState]
    gpus: dict[str, GpuState]
    allocations: dict[str, Allocation] = field(default_factory=dict)
    # class id -> its nodes, and node -> its class id (see the module's docstring)
    by_signature: dict[int, set[str]] = field(default_factory=dict)
    node_signature: dict[str, int] = field(default_factory=dict)
    # every class that came into existence (or whose lowest node id fell), in order: placers catch up on it
    signature_log: list[int] = field(default_factory=list)
    log_generation: int = 0  # bumped when the log is compacted; placers then rebuild their heaps
    # interned classes: canonical signature -> id (ids are never reused), and per live id what a placer
    # may check before evaluating it (``ClassInfo``)
    class_ids: dict[tuple, int] = field(default_factory=dict)
    class_info: dict[int, ClassInfo] = field(default_factory=dict)
    # per class a min-heap of node ids, stale entries dropped lazily: ``lowest`` without scanning the class
    class_lowest: dict[int, list[str]] = field(default_factory=dict)
    # the ``random`` policy draws among the nodes grouped by ``NodeState.signature`` (kept only for it)
    legacy_by_signature: dict[tuple, set[str]] | None = None
    legacy_node_signature: dict[str, tuple] = field(default_factory=dict)
    _next_class: int = 0
    LOG_SLACK = 4096  # (a class constant) log entries beyond 4 per live class before the log is compacted
    _bulk: bool = False  # from_snapshot: index once at the end, not after each allocation
    capacity_milli_by_model: dict[str, int] = field(default_factory=dict)
    # usage: (project, tier) -> [in-quota milli, over-quota milli]; (tenant, tier) likewise
    project_usage: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    tenant_usage: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    # warm instances not bound yet: by id, the unit each occupies, and per (model, profile name) their
    # sort keys (node, GPU index, start, id) in order: the first that a node accepts is bound
    warm: dict[str, WarmInstance] = field(default_factory=dict)
    warm_units: dict[str, Unit] = field(default_factory=dict)
    warm_index: dict[tuple[str, str], list[tuple[str, int, int, str]]] = field(default_factory=dict)
    # the ids of the elastic allocations holding fewer units than they asked for (``Allocation.grow_to``): the
    # growth pass's candidates, kept as allocations come and go so that a cycle without any skips it at no cost
    growable: dict[str, None] = field(default_factory=dict)
    # bumped by every change of a GPU's use or record: what a cycle derives from the whole fleet's GPUs (the idle
    # GPUs of another mode that a waiting reason names) is kept while it stands still
    changes: int = 0

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot, *, legacy_classes: bool = False) -> ClusterState:
        """The working state of ``snapshot``; ``legacy_classes`` also keeps the grouping the ``random`` policy
        draws from. Allocations and warm instances are checked as they are applied (ValueError when one does
        not fit), and every node is indexed once, after all of them."""
        nodes: dict[str, NodeState] = {}
        for node in snapshot.nodes:
            nodes[node.id] = NodeState(node, [], node.cpu_milli, node.memory_mib)
        gpus: dict[str, GpuState] = {}
        capacity: dict[str, int] = {}
        memory: dict[str, int] = {}
        node_id, node_gpus, ranks = None, [], {}
        for gpu in sorted(snapshot.gpus, key=attrgetter("node", "index", "id")):  # C-level keys: 100,000 GPUs
            model_memory = memory.get(gpu.model)
            if model_memory is None:
                model_memory = memory[gpu.model] = model_get(gpu.model).memory_mib
                capacity[gpu.model] = 0
            capacity[gpu.model] += FULL
            if gpu.node != node_id:  # sorted: one node's GPUs are together
                node_id, node_gpus, ranks = gpu.node, nodes[gpu.node].gpus, {}
            rank = ranks.setdefault(gpu.nvlink_domain, len(ranks))
            # fields in order: gpu, memory, use (six counters at 0), position in the node, NVLink domain rank; the
            # memory is what the node reported where it did (usable: less the driver's reservation)
            state = GpuState(gpu, gpu.memory_mib or model_memory, 0, 0, 0, 0, 0, 0, len(node_gpus), rank)
            gpus[gpu.id] = state
            node_gpus.append(state)
        cluster = cls(nodes=nodes, gpus=gpus, capacity_milli_by_model=capacity,
                      legacy_by_signature={} if legacy_classes else None)
        cluster._bulk = True
        apply = cluster.apply
        for allocation in snapshot.allocations:
            apply(allocation)
        for warm in snapshot.warm:
            cluster.apply_warm(warm)
        cluster._bulk = False
        for gpu_state in gpus.values():
            gpu_state.key = gpu_state.canonical()
        for node_id in nodes:
            cluster._index(node_id)
        return cluster

    # -- class index ------------------------------------------------------------------------------
    def lowest(self, class_id: int) -> str:
        """The lowest node id of a live class."""
        heap = self.class_lowest[class_id]
        members = self.by_signature[class_id]
        while heap[0] not in members:
            heappop(heap)
        return heap[0]

    def _intern(self, key: tuple, node: NodeState) -> int:
        class_id = self._next_class
        self._next_class += 1
        self.class_ids[key] = class_id
        whole = shared = mig = 0
        idle: dict[tuple[str, str], int] = {}
        for gpu in node.gpus:
            if gpu.gpu.closed:
                continue
            if gpu.gpu.mode == _MIG:
                mig += 1
            else:
                shared += gpu.gpu.mode == _SHARED
                whole += gpu.used_milli == 0 and gpu.units == 0
            if gpu.units == 0 and gpu.used_milli == 0 and gpu.compute_used == 0:
                key = (gpu.gpu.model, gpu.gpu.mode.value)
                idle[key] = idle.get(key, 0) + 1
        self.class_info[class_id] = ClassInfo(node.models, node.node.cordoned, whole, shared, mig, node.node.pool,
                                              tuple(idle.items()))
        return class_id

    def _index(self, node_id: str) -> None:
        if self._bulk:
            return
        node = self.nodes[node_id]
        if self.legacy_by_signature is not None:
            self._index_legacy(node_id, node)
        key = node.class_key()
        new = self.class_ids.get(key)
        if new is None:
            new = self._intern(key, node)
        old = self.node_signature.get(node_id)
        if old == new:
            return
        if old is not None:
            members = self.by_signature[old]
            members.discard(node_id)
            if not members:
                del self.by_signature[old]
                del self.class_lowest[old]
        self.node_signature[node_id] = new
        members = self.by_signature.get(new)
        if members is None:
            self.by_signature[new] = {node_id}
            self.class_lowest[new] = [node_id]
            self.signature_log.append(new)
        else:
            if node_id < self.lowest(new):
                self.signature_log.append(new)  # its lowest node id changed: placers re-rank it
            members.add(node_id)
            heappush(self.class_lowest[new], node_id)
        if len(self.signature_log) > self.LOG_SLACK + 4 * len(self.by_signature):
            # a long-lived state (the simulator, a warm scheduler) would otherwise grow without bound:
            # the log restarts from the live classes, and classes no node is in are forgotten (ids are not reused)
            self.signature_log = list(self.by_signature)
            self.log_generation += 1
            self.class_ids = {key: class_id for key, class_id in self.class_ids.items()
                              if class_id in self.by_signature}
            self.class_info = {class_id: self.class_info[class_id] for class_id in self.class_ids.values()}

    def _index_legacy(self, node_id: str, node: NodeState) -> None:
        """The ``random`` policy's grouping (``NodeState.signature``), kept as it always was."""
        by_signature = self.legacy_by_signature
        old = self.legacy_node_signature.get(node_id)
        if old is not None:
            members = by_signature[old]
            members.discard(node_id)
            if not members:
                del by_signature[old]
        new = node.signature()
        self.legacy_node_signature[node_id] = new
        by_signature.setdefault(new, set()).add(node_id)

    # -- changes ------------------------------------------------------------------------------------
    def apply(self, allocation: Allocation) -> None:
        """Hold the capacity of ``allocation`` (raises ValueError if it does not fit: a bug upstream)."""
        node = self.nodes[allocation.node]
        gpus, apply_unit, milli = self.gpus, self._apply_unit, 0
        for unit in allocation.units:
            apply_unit(gpus[unit.gpu], unit, 1)
            milli += unit.milli  # ``allocation.milli``, summed on the way
        node.free_cpu_milli -= allocation.cpu_milli
        node.free_memory_mib -= allocation.host_memory_mib
        self.allocations[allocation.id] = allocation
        if allocation.grow_to:
            if allocation.grow_to > len(allocation.units):
                self.growable[allocation.id] = None
            else:
                self.growable.pop(allocation.id, None)
        column = 1 if allocation.preemptible else 0
        tier = allocation.tier
        usage = self.project_usage.get((allocation.project, tier))
        if usage is None:
            usage = self.project_usage[(allocation.project, tier)] = [0, 0]
        usage[column] += milli
        usage = self.tenant_usage.get((allocation.tenant, tier))
        if usage is None:
            usage = self.tenant_usage[(allocation.tenant, tier)] = [0, 0]
        usage[column] += milli
        if not self._bulk:
            for node_id in self._nodes_of(allocation):
                self._index(node_id)

    def remove(self, allocation_id: str) -> Allocation:
        allocation = self.allocations.pop(allocation_id)
        if allocation.grow_to:
            self.growable.pop(allocation_id, None)
        node = self.nodes[allocation.node]
        for unit in allocation.units:
            self._apply_unit(self.gpus[unit.gpu], unit, sign=-1)
        node.free_cpu_milli += allocation.cpu_milli
        node.free_memory_mib += allocation.host_memory_mib
        column = 1 if allocation.preemptible else 0
        self.project_usage[(allocation.project, allocation.tier)][column] -= allocation.milli
        self.tenant_usage[(allocation.tenant, allocation.tier)][column] -= allocation.milli
        for node_id in self._nodes_of(allocation):
            self._index(node_id)
        return allocation

    def apply_warm(self, warm: WarmInstance) -> None:
        """Occupy the slots of a warm instance (raises ValueError when it is not a valid free MIG slot)."""
        gpu = self.gpus.get(warm.gpu)
        if gpu is None:
            raise ValueError(f"warm instance {warm.id}: unknown GPU {warm.gpu}")
        if gpu.gpu.mode != GpuMode.MIG:
            raise ValueError(f"warm instance {warm.id}: GPU {warm.gpu} is not in MIG mode")
        if warm.id in self.warm:
            raise ValueError(f"warm instance {warm.id} given twice")
        try:
            profile = profile_get(gpu.gpu.model, warm.profile)
        except KeyError as error:
            raise ValueError(f"warm instance {warm.id}: {error.args[0]}") from None
        unit = Unit(warm.gpu, profile.gpu_milli, profile.memory_mib, profile.name, warm.start)
        self._apply_unit(gpu, unit, sign=1)
        self.warm[warm.id] = warm
        self.warm_units[warm.id] = unit
        if warm.ready:  # one still being created holds its slots, but a lease waiting on it would wait longer
            insort(self.warm_index.setdefault((gpu.gpu.model, profile.name), []),
                   (gpu.gpu.node, gpu.gpu.index, warm.start, warm.id))
        self._index(gpu.gpu.node)

    def remove_warm(self, warm_id: str) -> WarmInstance:
        """Free the slots of a warm instance (it is being bound, or a what-if is undone)."""
        warm = self.warm.pop(warm_id)
        unit = self.warm_units.pop(warm_id)
        gpu = self.gpus[warm.gpu]
        self._apply_unit(gpu, unit, sign=-1)
        key = (gpu.gpu.model, unit.mig_profile)
        if warm.ready:
            entries = self.warm_index[key]
            entries.remove((gpu.gpu.node, gpu.gpu.index, warm.start, warm.id))
            if not entries:
                del self.warm_index[key]
        self._index(gpu.gpu.node)
        return warm

    def replace_gpus(self, gpus: list[Gpu]) -> list[Gpu]:
        """Swap the records of ``gpus`` (same ids, e.g. ``closed`` set) into the state, the nodes re-indexed; the
        records they replace, to swap back (a reservation closes the GPUs it holds for younger work this way:
        ``broker.scheduler.reserve``)."""
        before, nodes = [], {}
        for gpu in gpus:
            state = self.gpus[gpu.id]
            before.append(state.gpu)
            state.gpu = gpu
            state.key = state.canonical()
            self.changes += 1
            nodes[gpu.node] = None
        for node_id in nodes:
            self._index(node_id)
        return before

    def _nodes_of(self, allocation: Allocation) -> list[str]:
        """The allocation's node first, then any other node its units are on (spread requests)."""
        nodes = [allocation.node]
        for unit in allocation.units:
            node_id = self.gpus[unit.gpu].gpu.node
            if node_id not in nodes:
                nodes.append(node_id)
        return nodes

    def _apply_unit(self, gpu: GpuState, unit: Unit, sign: int) -> None:
        if gpu.gpu.mode == _MIG:
            profile = profile_get(gpu.gpu.model, unit.mig_profile)
            start = unit.mig_start
            if sign > 0:
                # ``start in gpu.free_starts(profile)``, inline (what is held stays, closed or not)
                if (start not in profile.starts or (gpu.slot_mask >> start) & ((1 << profile.memory_slots) - 1)
                        or gpu.compute_used + profile.compute_slices > COMPUTE_SLICES
                        or (profile.shape.media_extensions and gpu.media_used)):
                    layout = self.mig_layout(gpu)
                    problem = layout_problem((*layout, MigPlacement(unit.mig_start, profile)))
                    raise ValueError(f"MIG unit {profile.name}@{unit.mig_start} does not fit {gpu.gpu.id}: "
                                     f"{problem or 'layout of this cycle conflicts'}")
                gpu.slot_mask |= ((1 << profile.memory_slots) - 1) << start
            else:
                gpu.slot_mask &= ~(((1 << profile.memory_slots) - 1) << start)
            gpu.compute_used += sign * profile.compute_slices
            gpu.media_used += sign * int(profile.shape.media_extensions)
        else:
            # a unit of the whole GPU's compute on an empty GPU fits whatever memory it was recorded with (a whole
            # lease placed before its node reported usable memory holds the catalogue's nameplate)
            whole_of_empty = unit.milli == FULL and gpu.units == 0
            if sign > 0 and (gpu.used_milli + unit.milli > FULL
                             or (gpu.used_memory_mib + unit.memory_mib > gpu.memory_mib and not whole_of_empty)):
                raise ValueError(f"unit does not fit {gpu.gpu.id}")
            gpu.used_milli += sign * unit.milli
            gpu.used_memory_mib += sign * unit.memory_mib
        gpu.units += sign
        self.changes += 1
        if not self._bulk:  # from_snapshot keys every GPU once at the end
            gpu.key = gpu.canonical()

    def mig_layout(self, gpu: GpuState) -> tuple[MigPlacement, ...]:
        """The MIG instances on ``gpu``: allocations' units and warm instances."""
        units = [unit for allocation in self.allocations.values() for unit in allocation.units]
        units += self.warm_units.values()
        return tuple(
            MigPlacement(unit.mig_start, profile_get(gpu.gpu.model, unit.mig_profile))
            for unit in units
            if unit.gpu == gpu.gpu.id and unit.mig_profile
        )
