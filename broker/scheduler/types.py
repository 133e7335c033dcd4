"""Inputs and outputs of the scheduling core: frozen dataclasses, integer quantities.

Units: GPU capacity in milli-GPU (a whole GPU 1000, a MIG instance compute_slices/7 of 1000, a share its
milli), memory in MiB, CPU in milli-cores, time in seconds (``now`` and timestamps are floats of seconds
on any epoch the caller chooses, as long as it is one epoch).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum


def _quick_init(cls):
    """Give a frozen slotted dataclass an ``__init__`` that sets each slot through its descriptor: the same
    signature, defaults and frozenness (``__setattr__`` still refuses), at about half the cost of the generated
    one, whose ``object.__setattr__`` per field made building a fleet-sized snapshot (100,000 ``Gpu``, ~64,000
    ``Unit``) and a cycle's candidate units a large part of a schedule cycle's CPU."""
    params, body, env = [], [], {}
    for spec in fields(cls):
        if spec.default_factory is not MISSING:
            raise TypeError(f"{cls.__name__}.{spec.name}: a default factory needs the generated __init__")
        env[f"_set_{spec.name}"] = cls.__dict__[spec.name].__set__
        if spec.default is MISSING:
            params.append(spec.name)
        else:
            env[f"_default_{spec.name}"] = spec.default
            params.append(f"{spec.name}=_default_{spec.name}")
        body.append(f"    _set_{spec.name}(self, {spec.name})")
    exec(f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body), env)  # noqa: S102 (names of fields)
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init
    return cls


class GpuMode(StrEnum):
    WHOLE = "whole"  # one lease at a time
    MIG = "mig"  # MIG instances following the model's placement rules
    SHARED = "shared"  # fractional shares (milli) with memory caps; a whole lease when empty


class Kind(StrEnum):
    WHOLE = "whole"
    MIG = "mig"
    SHARE = "share"


class WorkloadClass(StrEnum):
    INTERACTIVE = "interactive"
    TRAINING = "training"
    INFERENCE = "inference"


class DecisionMode(StrEnum):
    PLACED = "placed"
    PREEMPT = "preempt-then-place"
    # an elastic over-quota allocation gives back units (``Decision.shrunk``); the request starts once they are freed
    SHRINK = "shrink-then-place"
    # reclaim across modes: a GPU of another mode, idle or held only by reclaimable over-quota work, is emptied
    # (``Decision.victims`` given notice) and switched to the mode the request needs (``Decision.switch``); the
    # request starts once the switch is done (``Scheduler._switch_for``)
    SWITCH = "switch-then-place"
    WAITING = "waiting"
    # an elastic allocation that was shrunk takes units back toward its ``count`` on capacity the cycle left idle
    # (``Decision.grown``; not a request's decision: ``Scheduler.grown``)
    GROW = "grow"


@_quick_init
@dataclass(frozen=True, slots=True)
class Node:
    id: str
    cpu_milli: int = 0  # 0: CPU not tracked
    memory_mib: int = 0  # host memory; 0: not tracked
    cordoned: bool = False
    pool: str = ""  # the node pool it belongs to (``Node.pool``); a request bound to pools is placed only in them


@_quick_init
@dataclass(frozen=True, slots=True)
class Gpu:
    id: str
    node: str
    model: str
    mode: GpuMode = GpuMode.WHOLE
    index: int = 0
    nvlink_domain: str = ""
    closed: bool = False  # takes no new work (its mode is being changed); what it holds stays
    # the memory processes can have, as the node's agent reports it (its inventory's ``memory_mib``: the nameplate
    # less the driver's reservation, docs/agent-protocol.md); shares are sized on it. 0: the catalogue's figure
    memory_mib: int = 0


@_quick_init
@dataclass(frozen=True, slots=True)
class Shape:
    """What a request asks for: ``count`` units of one kind.

    ``models``: allowed GPU models; empty means ``auto``: the cheapest model that satisfies
    ``memory_mib`` (per unit) and ``min_compute_slices`` for MIG. ``gang``: all units on one node
    (all-or-nothing either way). ``cpu_milli`` / ``host_memory_mib`` are per request, on the node.
    """

    kind: Kind
    count: int = 1
    profile: str = ""  # MIG profile name, e.g. "3g.40gb"; with auto: its compute size, e.g. "3g"
    milli: int = 0  # shares: GPU fraction
    memory_mib: int = 0  # shares: memory cap; auto: memory needed per unit
    models: tuple[str, ...] = ()
    gang: bool = True
    cpu_milli: int = 0
    host_memory_mib: int = 0
    # nodes this request must not be placed on (a workload that kept failing there is placed elsewhere)
    avoid_nodes: tuple[str, ...] = ()
    # node pools it may be placed in (empty: any; a project bound to pools gets them: ``Snapshot.project_pools``)
    pools: tuple[str, ...] = ()
    # an elastic request (whole GPUs or shares): it runs with ``count`` units and, under reclaim while over quota,
    # may be shrunk to no fewer than ``min_count`` instead of being preempted whole (0: not elastic)
    min_count: int = 0


@_quick_init
@dataclass(frozen=True, slots=True)
class Request:
    id: str
    project: str
    tenant: str
    shape: Shape
    submitted_at: float = 0.0
    priority: int = 0
    workload_class: WorkloadClass = WorkloadClass.TRAINING
    # requests with the same non-empty ``group`` are placed together in one decision or not at all
    # (a pipeline's stages, a model split's GPUs); each member keeps its own shape, node and quota check
    group: str = ""
    # what it asked for (seconds); the estimated start of the requests queued behind it counts on it ending then
    duration_seconds: int = 0


@_quick_init
@dataclass(frozen=True, slots=True)
class Unit:
    """One placed unit of a request on one GPU."""

    gpu: str
    milli: int  # quota units
    memory_mib: int
    mig_profile: str = ""
    mig_start: int = -1


@_quick_init
@dataclass(frozen=True, slots=True)
class Allocation:
    """Capacity held by a request: its units, the tier counted, and whether it may be preempted."""

    id: str
    project: str
    tenant: str
    tier: str
    node: str
    units: tuple[Unit, ...]
    preemptible: bool
    started_at: float = 0.0
    priority: int = 0
    cpu_milli: int = 0
    host_memory_mib: int = 0
    group: str = ""  # the lease group it was placed with (informational: reasons name it)
    # an elastic lease's minimum number of units (``Shape.min_count``): reclaim may take units from it down to this
    # many instead of preempting it whole (0: not elastic). Out of the repr, so that the decisions digests of the
    # benchmarks (SHA-256 of each decision's repr) stay comparable with those recorded before it existed
    min_units: int = field(default=0, repr=False)
    # an elastic lease's requested number of units (``Shape.count``): holding fewer (it was shrunk), it grows back
    # toward it on idle capacity (``DecisionMode.GROW``; 0: it never grows). ``grow_spread``: its units may be on
    # other nodes than those it holds (a request that is not a gang). Both out of the repr, as ``min_units``
    grow_to: int = field(default=0, repr=False)
    grow_spread: bool = field(default=False, repr=False)

    @property
    def milli(self) -> int:
        return sum(unit.milli for unit in self.units)


@_quick_init
@dataclass(frozen=True, slots=True)
class QuotaSpec:
    project: str
    tenant: str
    tier: str
    deserved_milli: int
    limit_milli: int
    weight: int = 1


@_quick_init
@dataclass(frozen=True, slots=True)
class TenantQuotaSpec:
    """A tenant's bound on one tier. Within a cohort (``Snapshot.cohorts``): ``lending_limit_milli`` caps how much
    of its idle guarantee (``deserved`` less its use) the other members may borrow, ``borrowing_limit_milli`` how
    far its use may go beyond its ``deserved`` (-1: no limit; both are read only for cohort members)."""

    tenant: str
    tier: str
    deserved_milli: int
    limit_milli: int
    lending_limit_milli: int = -1
    borrowing_limit_milli: int = -1


@_quick_init
@dataclass(frozen=True, slots=True)
class WarmInstance:
    """A MIG instance created ahead of demand and held by no lease (a warm pool).

    It occupies its slots like an allocation: nothing else is placed over it. A queued request of its
    profile on its tier binds it (``Decision.warm``) instead of a new placement, so no agent call is
    needed. It is never a preemption victim and counts toward no project's or tenant's quota.
    """

    id: str
    gpu: str
    profile: str  # MIG profile name of the GPU's model, e.g. "1g.10gb"
    start: int  # MIG start slot
    ready: bool = True  # False while its node is still creating it: it holds its slots but is not bound


@_quick_init
@dataclass(frozen=True, slots=True)
class UsageHistory:
    """A project's borrowed (over-quota) use of one tier in the past, decayed with the snapshot's half-life
    (Slurm's multifactor fair share): milli-GPU x seconds, each second's use counting half as much one half-life
    later (``broker.scheduler.fairshare.usage_decayed``)."""

    project: str
    tier: str
    decayed_milli_seconds: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    nodes: tuple[Node, ...]
    gpus: tuple[Gpu, ...]
    allocations: tuple[Allocation, ...] = ()
    quotas: tuple[QuotaSpec, ...] = ()
    tenant_quotas: tuple[TenantQuotaSpec, ...] = ()
    # price per GPU-hour per tier, in any currency's minor units; used by `auto` and shown in reasons
    prices: dict[str, int] = field(default_factory=dict)
    enforce_quotas: bool = True
    min_runtime_seconds: float = 0.0  # before an over-quota allocation may be preempted
    warm: tuple[WarmInstance, ...] = ()  # pre-created MIG instances no lease holds
    # a lease group whose oldest member has waited this long is served first and, when it does not fit, reserves
    # the tiers it needs against younger requests (0: groups reserve nothing; ``Scheduler._serve_aged_groups``)
    group_reserve_after_seconds: float = 0.0
    # the same prices as people read them ("0.80 USD"), for the reasons; a tier without one shows its integer
    price_labels: dict[str, str] = field(default_factory=dict)
    # fair share with history (``broker.scheduler.fairshare``): the half-life of past borrowed use (0: the
    # over-quota order and the victim order read current use only, as before) and each project's decayed use
    usage_half_life_seconds: int = 0
    usage_history: tuple[UsageHistory, ...] = ()
    # preemption back-off: a lease preempted ``backoff_preemptions`` times (0: off) within
    # ``backoff_window_seconds`` before its latest start is not reclaimed for ``backoff_protect_seconds`` after it;
    # ``preempted_at``: the times each lease (allocation or request id) was preempted, recent ones
    backoff_preemptions: int = 0
    backoff_window_seconds: int = 0
    backoff_protect_seconds: int = 0
    preempted_at: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # when each running allocation's lease expires (its ``ends_at``), for estimated starts; absent: not known
    ends_at: dict[str, float] = field(default_factory=dict)
    # cohorts (Kueue's): tenant -> its cohort's name. A member's idle guarantee is lent only to the members of its
    # cohort (up to its ``TenantQuotaSpec.lending_limit_milli``); capacity no cohort member is guaranteed stays
    # borrowable by all. Empty: every tenant borrows any idle capacity (``Scheduler.cohort_check``)
    cohorts: dict[str, str] = field(default_factory=dict)
    # node pools a project is bound to (project -> pools); absent or empty: any pool
    project_pools: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # minimum runtime per tenant (its SLO contract's), seconds before its over-quota work may be reclaimed;
    # absent: ``min_runtime_seconds``
    min_runtime_by_tenant: dict[str, float] = field(default_factory=dict)
    # reclaim across modes (``Scheduler._switch_for``): the (GPU model, mode) pairs to which a GPU may be emptied of
    # over-quota work and switched for an in-quota request that fits nowhere in its own mode (where the capacity
    # loop's mode switch or MIG layout is ``auto``: it carries the switch out). Empty: reclaim stays within a mode
    switch_modes: frozenset[tuple[str, GpuMode]] = frozenset()
    # GPUs whose mode is being changed (closed to new work): GPU id -> the mode they are switched to
    switching: dict[str, str] = field(default_factory=dict)


@_quick_init
@dataclass(frozen=True, slots=True)
class Decision:
    request: str
    mode: DecisionMode
    reason: str
    allocation: Allocation | None = None
    victims: tuple[str, ...] = ()  # allocation ids that get a preemption notice
    queue_position: int = 0
    warm: tuple[str, ...] = ()  # ids of the warm instances the allocation binds (its units sit on them)
    # a shrink (``DecisionMode.SHRINK``): each elastic allocation shrunk and the units it gives back (out of the repr
    # as ``Allocation.min_units``; equality compares it)
    shrunk: tuple[tuple[str, tuple[Unit, ...]], ...] = field(default=(), repr=False)
    # a growth (``DecisionMode.GROW``, ``request`` the allocation's id, ``allocation`` it grown): the units added
    grown: tuple[Unit, ...] = field(default=(), repr=False)
    # a switch (``DecisionMode.SWITCH``): (the GPU's id, the mode it is switched to); no allocation yet
    switch: tuple[str, str] = ()
