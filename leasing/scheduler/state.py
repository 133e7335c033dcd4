"""Mutable working state of one planning cycle, built from a frozen ``Snapshot``.

Nodes with the same free-capacity signature are interchangeable for every placement policy, so the
state keeps an index ``signature -> node ids``; a request is evaluated once per distinct signature,
not once per node. That is what makes a cycle over 10,000 GPUs cheap: a fleet has few distinct node
states. ``apply`` / ``remove`` keep the index exact, and undo each other (what-if evaluation).

Warm instances (pre-created MIG instances no lease holds) occupy their slots on the GPUs but are kept
apart from ``allocations``: they are never preemption victims and never count toward quota usage.
``apply_warm`` / ``remove_warm`` keep the same index exact; binding one is ``remove_warm`` then
``apply`` of the request's allocation at the same unit.
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass, field

from gpus.catalogue import model_get
from gpus.mig import COMPUTE_SLICES, MigPlacement, MigProfile, layout_problem, profile_get
from leasing.scheduler.types import Allocation, Gpu, GpuMode, Node, Snapshot, Unit, WarmInstance

FULL = 1000


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

    @property
    def free_milli(self) -> int:
        if self.gpu.mode == GpuMode.MIG:
            return (COMPUTE_SLICES - self.compute_used) * FULL // COMPUTE_SLICES
        return FULL - self.used_milli

    def signature(self) -> tuple:
        if self.gpu.closed:  # nothing fits a closed GPU, whatever it holds
            return ("C", self.gpu.model, self.gpu.nvlink_domain)
        if self.gpu.mode == GpuMode.MIG:
            return ("M", self.gpu.model, self.gpu.nvlink_domain, self.slot_mask, self.compute_used, self.media_used)
        return (self.gpu.mode.value[0].upper(), self.gpu.model, self.gpu.nvlink_domain, self.used_milli,
                self.used_memory_mib, self.units)

    # -- fit --------------------------------------------------------------------------------------
    def fits_whole(self) -> bool:
        if self.gpu.mode == GpuMode.MIG or self.gpu.closed:
            return False
        return self.used_milli == 0 and self.units == 0

    def fits_share(self, milli: int, memory_mib: int) -> bool:
        return (
            self.gpu.mode == GpuMode.SHARED
            and not self.gpu.closed
            and self.used_milli + milli <= FULL
            and self.used_memory_mib + memory_mib <= self.memory_mib
        )

    def mig_starts(self, profile: MigProfile) -> tuple[int, ...]:
        """Start slots where new work of ``profile`` may go: none on a closed GPU, else the free ones."""
        return () if self.gpu.closed else self.free_starts(profile)

    def free_starts(self, profile: MigProfile) -> tuple[int, ...]:
        """Valid start slots for ``profile`` given this GPU's layout (bit arithmetic, no allocation)."""
        if self.gpu.mode != GpuMode.MIG or profile.model != self.gpu.model:
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
        # totals are part of the state: policies normalise by them, and 0 means "not tracked"
        return (self.node.cordoned, self.node.cpu_milli, self.free_cpu_milli, self.node.memory_mib,
                self.free_memory_mib, tuple(sorted(g.signature() for g in self.gpus)))

    @property
    def models(self) -> frozenset[str]:
        return frozenset(g.gpu.model for g in self.gpus)

    @property
    def free_milli(self) -> int:
        return sum(g.free_milli for g in self.gpus)


@dataclass
class ClusterState:
    nodes: dict[str, NodeState]
    gpus: dict[str, GpuState]
    allocations: dict[str, Allocation] = field(default_factory=dict)
    by_signature: dict[tuple, set[str]] = field(default_factory=dict)
    node_signature: dict[str, tuple] = field(default_factory=dict)
    # every signature that came into existence, in order: placers catch up on it incrementally
    signature_log: list[tuple] = field(default_factory=list)
    log_generation: int = 0  # bumped when the log is compacted; placers then rebuild their heaps
    capacity_milli_by_model: dict[str, int] = field(default_factory=dict)
    # usage: (project, tier) -> [in-quota milli, over-quota milli]; (tenant, tier) likewise
    project_usage: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    tenant_usage: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    # warm instances not bound yet: by id, the unit each occupies, and per (model, profile name) their
    # sort keys (node, GPU index, start, id) in order: the first that a node accepts is bound
    warm: dict[str, WarmInstance] = field(default_factory=dict)
    warm_units: dict[str, Unit] = field(default_factory=dict)
    warm_index: dict[tuple[str, str], list[tuple[str, int, int, str]]] = field(default_factory=dict)

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> ClusterState:
        nodes: dict[str, NodeState] = {}
        for node in snapshot.nodes:
            nodes[node.id] = NodeState(node, [], node.cpu_milli, node.memory_mib)
        gpus: dict[str, GpuState] = {}
        capacity: dict[str, int] = {}
        for gpu in sorted(snapshot.gpus, key=lambda g: (g.node, g.index, g.id)):
            state = GpuState(gpu, model_get(gpu.model).memory_mib)
            gpus[gpu.id] = state
            nodes[gpu.node].gpus.append(state)
            capacity[gpu.model] = capacity.get(gpu.model, 0) + FULL
        cluster = cls(nodes=nodes, gpus=gpus, capacity_milli_by_model=capacity)
        for node_id in nodes:
            cluster._index(node_id)
        for allocation in snapshot.allocations:
            cluster.apply(allocation)
        for warm in snapshot.warm:
            cluster.apply_warm(warm)
        return cluster

    # -- signature index --------------------------------------------------------------------------
    def _index(self, node_id: str) -> None:
        old = self.node_signature.get(node_id)
        if old is not None:
            members = self.by_signature[old]
            members.discard(node_id)
            if not members:
                del self.by_signature[old]
        new = self.nodes[node_id].signature()
        self.node_signature[node_id] = new
        members = self.by_signature.get(new)
        if members is None:
            members = self.by_signature[new] = set()
            self.signature_log.append(new)
        elif node_id < min(members):
            self.signature_log.append(new)  # its lowest node id changed: placers re-rank it
        members.add(node_id)
        if len(self.signature_log) > 4096 + 4 * len(self.by_signature):
            # a long-lived state (the simulator, a warm scheduler) would otherwise grow without bound
            self.signature_log = list(self.by_signature)
            self.log_generation += 1

    # -- changes ------------------------------------------------------------------------------------
    def apply(self, allocation: Allocation) -> None:
        """Hold the capacity of ``allocation`` (raises ValueError if it does not fit: a bug upstream)."""
        node = self.nodes[allocation.node]
        for unit in allocation.units:
            self._apply_unit(self.gpus[unit.gpu], unit, sign=1)
        node.free_cpu_milli -= allocation.cpu_milli
        node.free_memory_mib -= allocation.host_memory_mib
        self.allocations[allocation.id] = allocation
        column = 1 if allocation.preemptible else 0
        for usage, key in ((self.project_usage, (allocation.project, allocation.tier)),
                           (self.tenant_usage, (allocation.tenant, allocation.tier))):
            usage.setdefault(key, [0, 0])[column] += allocation.milli
        for node_id in self._nodes_of(allocation):
            self._index(node_id)

    def remove(self, allocation_id: str) -> Allocation:
        allocation = self.allocations.pop(allocation_id)
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

    def _nodes_of(self, allocation: Allocation) -> list[str]:
        """The allocation's node first, then any other node its units are on (spread requests)."""
        nodes = [allocation.node]
        for unit in allocation.units:
            node_id = self.gpus[unit.gpu].gpu.node
            if node_id not in nodes:
                nodes.append(node_id)
        return nodes

    def _apply_unit(self, gpu: GpuState, unit: Unit, sign: int) -> None:
        if gpu.gpu.mode == GpuMode.MIG:
            profile = profile_get(gpu.gpu.model, unit.mig_profile)
            mask = MigPlacement(unit.mig_start, profile).slot_mask
            if sign > 0:
                if unit.mig_start not in gpu.free_starts(profile):  # what is held stays, closed or not
                    layout = self.mig_layout(gpu)
                    problem = layout_problem((*layout, MigPlacement(unit.mig_start, profile)))
                    raise ValueError(f"MIG unit {profile.name}@{unit.mig_start} does not fit {gpu.gpu.id}: "
                                     f"{problem or 'layout of this cycle conflicts'}")
                gpu.slot_mask |= mask
            else:
                gpu.slot_mask &= ~mask
            gpu.compute_used += sign * profile.compute_slices
            gpu.media_used += sign * int(profile.shape.media_extensions)
        else:
            if sign > 0 and (gpu.used_milli + unit.milli > FULL
                             or gpu.used_memory_mib + unit.memory_mib > gpu.memory_mib):
                raise ValueError(f"unit does not fit {gpu.gpu.id}")
            gpu.used_milli += sign * unit.milli
            gpu.used_memory_mib += sign * unit.memory_mib
        gpu.units += sign

    def mig_layout(self, gpu: GpuState) -> tuple[MigPlacement, ...]:
        """The MIG instances on ``gpu``: allocations' units and warm instances."""
        units = [unit for allocation in self.allocations.values() for unit in allocation.units]
        units += self.warm_units.values()
        return tuple(
            MigPlacement(unit.mig_start, profile_get(gpu.gpu.model, unit.mig_profile))
            for unit in units
            if unit.gpu == gpu.gpu.id and unit.mig_profile
        )
