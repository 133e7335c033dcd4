"""Builders for scheduler tests (fleets, quotas, requests) and the checker of docs/architecture.md §7 rules 1 and 2.

Everything here is plain data: the scheduling core needs no database. ``outcome`` turns a snapshot and
the decisions ``plan`` returned into the allocations that hold capacity afterwards (the snapshot's,
less the victims, plus the placed ones); ``invariant_problems`` lists every broken rule in words, warm
instances included (an unbound one still occupies its slots; a bound one is bound once, exactly).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from broker.scheduler import (
    Allocation,
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
    TenantQuotaSpec,
    Unit,
    WarmInstance,
)
from gpus.catalogue import model_get
from gpus.mig import MigPlacement, layout_problem, profile_get

H100 = "H100-80GB"
A100 = "A100-40GB"
L4 = "L4"
FULL = 1000


def node_gpus(node: str, model: str, count: int, mode: GpuMode = GpuMode.WHOLE) -> tuple[Gpu, ...]:
    """``count`` GPUs of one model and mode on ``node``, ids ``<node>-g<index>``."""
    return tuple(Gpu(f"{node}-g{index}", node, model, mode, index) for index in range(count))


def fleet(*specs: tuple[str, str, int, GpuMode], cordoned: tuple[str, ...] = ()) -> tuple[tuple, tuple]:
    """Nodes and GPUs from ``(node, model, count, mode)`` specs."""
    nodes = tuple(Node(node, cordoned=node in cordoned) for node, *_ in specs)
    gpus = tuple(gpu for node, model, count, mode in specs for gpu in node_gpus(node, model, count, mode))
    return nodes, gpus


def snapshot(
    *specs, cordoned=(), allocations=(), quotas=(), tenant_quotas=(), prices=None, min_runtime_seconds=0.0, warm=()
) -> Snapshot:
    nodes, gpus = fleet(*specs, cordoned=cordoned)
    return Snapshot(
        nodes,
        gpus,
        tuple(allocations),
        tuple(quotas),
        tuple(tenant_quotas),
        dict(prices or {}),
        min_runtime_seconds=min_runtime_seconds,
        warm=tuple(warm),
    )


def quota(project: str, tier: str, deserved: int, limit: int, weight: int = 1, tenant: str = "acme") -> QuotaSpec:
    return QuotaSpec(project, tenant, tier, deserved, limit, weight)


def tenant_quota(tenant: str, tier: str, deserved: int, limit: int) -> TenantQuotaSpec:
    return TenantQuotaSpec(tenant, tier, deserved, limit)


def whole(
    request_id: str,
    project: str,
    count: int = 1,
    *,
    models=(H100,),
    tenant: str = "acme",
    submitted_at: float = 0.0,
    priority: int = 0,
    gang: bool = True,
    memory_mib: int = 0,
    cpu_milli: int = 0,
    min_count: int = 0,
) -> Request:
    shape = Shape(Kind.WHOLE, count, models=tuple(models), gang=gang, memory_mib=memory_mib, cpu_milli=cpu_milli,
                  min_count=min_count)
    return Request(request_id, project, tenant, shape, submitted_at, priority)


def mig(
    request_id: str,
    project: str,
    profile: str,
    count: int = 1,
    *,
    models=(H100,),
    tenant: str = "acme",
    submitted_at: float = 0.0,
    priority: int = 0,
    gang: bool = True,
    memory_mib: int = 0,
) -> Request:
    shape = Shape(Kind.MIG, count, profile=profile, models=tuple(models), gang=gang, memory_mib=memory_mib)
    return Request(request_id, project, tenant, shape, submitted_at, priority)


def share(
    request_id: str,
    project: str,
    milli: int,
    memory_mib: int,
    count: int = 1,
    *,
    models=(H100,),
    tenant: str = "acme",
    submitted_at: float = 0.0,
    priority: int = 0,
    gang: bool = True,
    min_count: int = 0,
) -> Request:
    shape = Shape(Kind.SHARE, count, milli=milli, memory_mib=memory_mib, models=tuple(models), gang=gang,
                  min_count=min_count)
    return Request(request_id, project, tenant, shape, submitted_at, priority)


def held(
    allocation_id: str,
    project: str,
    gpu_ids,
    *,
    tier: str = H100,
    preemptible: bool = True,
    started_at: float = 0.0,
    priority: int = 0,
    tenant: str = "acme",
    min_units: int = 0,
    grow_to: int = 0,
    cpu_milli: int = 0,
) -> Allocation:
    """An existing whole-GPU allocation on ``gpu_ids`` (all on one node, ``<node>-g<i>`` ids); ``min_units``: an
    elastic one's minimum; ``grow_to``: the count it asked for (it grows back toward it)."""
    gpu_ids = (gpu_ids,) if isinstance(gpu_ids, str) else tuple(gpu_ids)
    memory = model_get(tier).memory_mib
    units = tuple(Unit(gpu_id, FULL, memory) for gpu_id in gpu_ids)
    node = gpu_ids[0].rsplit("-g", 1)[0]
    return Allocation(allocation_id, project, tenant, tier, node, units, preemptible, started_at, priority,
                      cpu_milli=cpu_milli, min_units=min_units, grow_to=grow_to)


def warm(warm_id: str, gpu_id: str, profile: str, start: int) -> WarmInstance:
    return WarmInstance(warm_id, gpu_id, profile, start)


def by_request(decisions: list[Decision]) -> dict[str, Decision]:
    return {decision.request: decision for decision in decisions}


# -- outcome and invariants -------------------------------------------------------------------------


@dataclass
class Outcome:
    allocations: dict[str, Allocation]
    victims: set[str]


def outcome(snap: Snapshot, decisions: list[Decision]) -> Outcome:
    """Allocations that hold capacity after the decisions are carried out, in decision order (a shrunk allocation
    less the units it gives back)."""
    live = {allocation.id: allocation for allocation in snap.allocations}
    victims: set[str] = set()
    for decision in decisions:
        for victim in decision.victims:
            victims.add(victim)
            live.pop(victim, None)
        for shrunk, units in decision.shrunk:
            left = list(live[shrunk].units)
            for unit in units:
                left.remove(unit)
            live[shrunk] = replace(live[shrunk], units=tuple(left))
        if decision.mode in (DecisionMode.PLACED, DecisionMode.PREEMPT, DecisionMode.SHRINK):
            assert decision.allocation is not None
            live[decision.allocation.id] = decision.allocation
    return Outcome(live, victims)


def gpu_problems(snap: Snapshot, allocations) -> list[str]:
    """Rule 1: no two allocations overlap on a GPU; every unit is legal for its GPU's mode."""
    gpus = {gpu.id: gpu for gpu in snap.gpus}
    per_gpu: dict[str, list] = defaultdict(list)
    problems = []
    for allocation in allocations:
        for unit in allocation.units:
            if unit.gpu not in gpus:
                problems.append(f"{allocation.id}: unknown GPU {unit.gpu}")
                continue
            per_gpu[unit.gpu].append((allocation.id, unit))
    for gpu_id, held_units in per_gpu.items():
        gpu = gpus[gpu_id]
        memory = model_get(gpu.model).memory_mib
        ids = [allocation_id for allocation_id, _ in held_units]
        if gpu.mode == GpuMode.MIG:
            if any(not unit.mig_profile for _, unit in held_units):
                problems.append(f"{gpu_id} (mig) holds a non-MIG unit: {ids}")
                continue
            layout = tuple(
                MigPlacement(unit.mig_start, profile_get(gpu.model, unit.mig_profile)) for _, unit in held_units
            )
            problem = layout_problem(layout)
            if problem:
                problems.append(f"{gpu_id}: invalid MIG layout {ids}: {problem}")
            continue
        if any(unit.mig_profile for _, unit in held_units):
            problems.append(f"{gpu_id} ({gpu.mode}) holds a MIG unit: {ids}")
        whole_units = [unit for _, unit in held_units if unit.milli == FULL]
        if gpu.mode == GpuMode.WHOLE and (len(held_units) > 1 or any(u.milli != FULL for _, u in held_units)):
            problems.append(f"{gpu_id} (whole) held by {ids}")
        if whole_units and len(held_units) > 1:
            problems.append(f"{gpu_id}: a whole unit shares the GPU with others: {ids}")
        if sum(unit.milli for _, unit in held_units) > FULL:
            problems.append(f"{gpu_id}: shares over {FULL} milli: {ids}")
        if sum(unit.memory_mib for _, unit in held_units) > memory:
            problems.append(f"{gpu_id}: memory over {memory} MiB: {ids}")
    return problems


def quota_problems(snap: Snapshot, allocations) -> list[str]:
    """Rule 2: non-preemptible use ≤ deserved and all use ≤ limit, per project and per tenant (per tier)."""
    problems = []
    project_use: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    tenant_use: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for allocation in allocations:
        project = project_use[(allocation.project, allocation.tier)]
        for use in (project, tenant_use[(allocation.tenant, allocation.tier)]):
            use[1] += allocation.milli
            if not allocation.preemptible:
                use[0] += allocation.milli
    for spec in snap.quotas:
        in_quota, total = project_use.get((spec.project, spec.tier), (0, 0))
        if in_quota > spec.deserved_milli:
            problems.append(
                f"project {spec.project} {spec.tier}: non-preemptible {in_quota} > deserved {spec.deserved_milli}"
            )
        if total > spec.limit_milli:
            problems.append(f"project {spec.project} {spec.tier}: use {total} > limit {spec.limit_milli}")
    for spec in snap.tenant_quotas:
        in_quota, total = tenant_use.get((spec.tenant, spec.tier), (0, 0))
        if in_quota > spec.deserved_milli:
            problems.append(
                f"tenant {spec.tenant} {spec.tier}: non-preemptible {in_quota} > deserved {spec.deserved_milli}"
            )
        if total > spec.limit_milli:
            problems.append(f"tenant {spec.tenant} {spec.tier}: use {total} > limit {spec.limit_milli}")
    if snap.enforce_quotas:
        quoted = {(spec.project, spec.tier) for spec in snap.quotas}
        for key, (_, total) in project_use.items():
            if total and key not in quoted:
                problems.append(f"project {key[0]} uses {total} milli of {key[1]} without a quota")
    return problems


def placement_problems(snap: Snapshot, requests: list[Request], decisions: list[Decision]) -> list[str]:
    """What a placed allocation must respect of its request and of the fleet."""
    nodes = {node.id: node for node in snap.nodes}
    gpus = {gpu.id: gpu for gpu in snap.gpus}
    requests_by_id = {request.id: request for request in requests}
    problems = []
    for decision in decisions:
        allocation = decision.allocation
        if allocation is None:
            continue
        request = requests_by_id[decision.request]
        shape = request.shape
        label = f"{decision.request}"
        if len(allocation.units) != shape.count:
            problems.append(f"{label}: {len(allocation.units)} units for count {shape.count}")
        if len({unit.gpu for unit in allocation.units}) != len(allocation.units) and shape.kind == Kind.WHOLE:
            problems.append(f"{label}: one GPU twice in a whole request")
        unit_nodes = {gpus[unit.gpu].node for unit in allocation.units}
        if shape.gang and unit_nodes - {allocation.node}:
            problems.append(f"{label}: gang spread over {sorted(unit_nodes | {allocation.node})}")
        for node_id in unit_nodes | {allocation.node}:
            if nodes[node_id].cordoned:
                problems.append(f"{label}: placed on cordoned node {node_id}")
        for unit in allocation.units:
            gpu = gpus[unit.gpu]
            if gpu.model != allocation.tier:
                problems.append(f"{label}: unit on {gpu.model} counted as tier {allocation.tier}")
            if shape.models and gpu.model not in shape.models:
                problems.append(f"{label}: on {gpu.model}, allowed {shape.models}")
            if shape.kind == Kind.WHOLE and (unit.milli != FULL or gpu.mode == GpuMode.MIG):
                problems.append(f"{label}: whole request got {unit}")
            if shape.kind == Kind.SHARE and (
                gpu.mode != GpuMode.SHARED or unit.milli != shape.milli or unit.memory_mib != shape.memory_mib
            ):
                problems.append(f"{label}: share request got {unit} on a {gpu.mode} GPU")
            if shape.kind == Kind.MIG:
                if gpu.mode != GpuMode.MIG or not unit.mig_profile:
                    problems.append(f"{label}: MIG request got {unit} on a {gpu.mode} GPU")
                elif not unit.mig_profile.startswith(shape.profile.split(".")[0] + ".") or (
                    "." in shape.profile and unit.mig_profile != shape.profile
                ):
                    problems.append(f"{label}: MIG {shape.profile} got {unit.mig_profile}")
                elif unit.memory_mib < shape.memory_mib:
                    problems.append(f"{label}: MIG unit with {unit.memory_mib} MiB < {shape.memory_mib}")
            if shape.memory_mib and shape.kind == Kind.WHOLE and unit.memory_mib < shape.memory_mib:
                problems.append(f"{label}: whole GPU with {unit.memory_mib} MiB < {shape.memory_mib}")
    return problems


def decision_problems(requests: list[Request], decisions: list[Decision], snap: Snapshot) -> list[str]:
    problems = []
    ids = [decision.request for decision in decisions]
    if sorted(ids) != sorted(request.id for request in requests):
        problems.append(f"decisions for {sorted(ids)}, requests {sorted(r.id for r in requests)}")
    snapshot_ids = {allocation.id for allocation in snap.allocations}
    preemptible = {allocation.id for allocation in snap.allocations if allocation.preemptible}
    positions = []
    for decision in decisions:
        if decision.mode == DecisionMode.WAITING:
            positions.append(decision.queue_position)
            if not decision.reason.startswith("waiting: ") or len(decision.reason) <= len("waiting: "):
                problems.append(f"{decision.request}: waiting reason {decision.reason!r}")
            if decision.allocation is not None or decision.victims:
                problems.append(f"{decision.request}: waiting with an allocation or victims")
        elif decision.mode == DecisionMode.SWITCH:  # reclaim across modes: no allocation until the GPU is switched
            if decision.allocation is not None or len(decision.switch) != 2 or decision.queue_position:
                problems.append(f"{decision.request}: switch {decision.switch} with an allocation or a position")
            gpu = next((g for g in snap.gpus if g.id == decision.switch[0]), None) if decision.switch else None
            if gpu is None or gpu.mode.value == decision.switch[1] or gpu.closed:
                problems.append(f"{decision.request}: switch of {decision.switch} (a GPU of another mode, open)")
            held_there = {a.id for a in snap.allocations for unit in a.units if gpu and unit.gpu == gpu.id}
            if held_there != set(decision.victims):
                left = held_there - set(decision.victims)
                problems.append(f"{decision.request}: switch of {gpu and gpu.id} leaves {left}")
        else:
            if decision.allocation is None or decision.allocation.id != decision.request:
                problems.append(f"{decision.request}: {decision.mode} without its allocation")
            if decision.queue_position:
                problems.append(f"{decision.request}: {decision.mode} with queue position {decision.queue_position}")
            if not decision.reason:
                problems.append(f"{decision.request}: no reason")
        if decision.mode == DecisionMode.PREEMPT:
            if not decision.victims:
                problems.append(f"{decision.request}: preempt without victims")
            if decision.allocation is not None and decision.allocation.preemptible:
                problems.append(f"{decision.request}: reclaimed capacity given to preemptible work")
        elif decision.victims and decision.mode != DecisionMode.SWITCH:
            problems.append(f"{decision.request}: {decision.mode} with victims {decision.victims}")
        for victim in decision.victims:
            if victim not in snapshot_ids:
                problems.append(f"{decision.request}: victim {victim} is not a running allocation")
            elif victim not in preemptible:
                problems.append(f"{decision.request}: victim {victim} is non-preemptible")
    if sorted(positions) != list(range(1, len(positions) + 1)):
        problems.append(f"queue positions {sorted(positions)}")
    all_victims = [victim for decision in decisions for victim in decision.victims]
    if len(all_victims) != len(set(all_victims)):
        problems.append(f"a victim preempted twice: {all_victims}")
    return problems


def node_problems(snap: Snapshot, allocations) -> list[str]:
    """Host CPU and memory of a node that tracks them (non-zero) are never over-committed."""
    problems = []
    for node in snap.nodes:
        here = [allocation for allocation in allocations if allocation.node == node.id]
        cpu = sum(allocation.cpu_milli for allocation in here)
        memory = sum(allocation.host_memory_mib for allocation in here)
        if node.cpu_milli and cpu > node.cpu_milli:
            problems.append(f"node {node.id}: CPU {cpu} > {node.cpu_milli} milli ({[a.id for a in here]})")
        if node.memory_mib and memory > node.memory_mib:
            problems.append(f"node {node.id}: memory {memory} > {node.memory_mib} MiB ({[a.id for a in here]})")
    return problems


def unbound_warm(snap: Snapshot, decisions: list[Decision]) -> list[Allocation]:
    """The warm instances no decision bound, as allocations of nobody (for the overlap check only)."""
    bound = {warm_id for decision in decisions for warm_id in decision.warm}
    gpus = {gpu.id: gpu for gpu in snap.gpus}
    out = []
    for instance in snap.warm:
        if instance.id in bound:
            continue
        gpu = gpus[instance.gpu]
        profile = profile_get(gpu.model, instance.profile)
        unit = Unit(gpu.id, profile.gpu_milli, profile.memory_mib, profile.name, instance.start)
        out.append(Allocation(f"warm:{instance.id}", "", "", gpu.model, gpu.node, (unit,), False))
    return out


def warm_problems(snap: Snapshot, decisions: list[Decision]) -> list[str]:
    """A warm instance is bound at most once, by a placed decision whose units sit exactly on it."""
    by_id = {instance.id: instance for instance in snap.warm}
    gpus = {gpu.id: gpu for gpu in snap.gpus}
    problems = []
    seen: set[str] = set()
    for decision in decisions:
        if not decision.warm:
            continue
        if decision.mode != DecisionMode.PLACED or decision.victims or decision.allocation is None:
            problems.append(f"{decision.request}: binds warm {decision.warm} as {decision.mode}")
            continue
        wanted = []
        for warm_id in decision.warm:
            if warm_id in seen:
                problems.append(f"{decision.request}: warm instance {warm_id} bound twice")
            seen.add(warm_id)
            instance = by_id.get(warm_id)
            if instance is None:
                problems.append(f"{decision.request}: binds unknown warm instance {warm_id}")
                continue
            profile = profile_get(gpus[instance.gpu].model, instance.profile).name
            wanted.append((instance.gpu, profile, instance.start))
        got = [(unit.gpu, unit.mig_profile, unit.mig_start) for unit in decision.allocation.units]
        if sorted(got) != sorted(wanted):
            problems.append(f"{decision.request}: units {got} are not the bound warm instances {wanted}")
    return problems


def invariant_problems(snap: Snapshot, requests: list[Request], decisions: list[Decision]) -> list[str]:
    after = list(outcome(snap, decisions).allocations.values())
    return (
        decision_problems(requests, decisions, snap)
        + placement_problems(snap, requests, decisions)
        + gpu_problems(snap, after + unbound_warm(snap, decisions))
        + node_problems(snap, after)
        + quota_problems(snap, after)
        + warm_problems(snap, decisions)
    )


def mig_layouts(snap: Snapshot, allocations) -> dict[str, tuple[MigPlacement, ...]]:
    gpus = {gpu.id: gpu for gpu in snap.gpus}
    out: dict[str, list[MigPlacement]] = defaultdict(list)
    for allocation in allocations:
        for unit in allocation.units:
            if unit.mig_profile:
                out[unit.gpu].append(MigPlacement(unit.mig_start, profile_get(gpus[unit.gpu].model, unit.mig_profile)))
    return {gpu: tuple(layout) for gpu, layout in out.items()}
