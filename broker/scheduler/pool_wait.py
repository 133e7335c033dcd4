"""Which waiting requests a change of the pool could serve (issue 30: the capacity planner on arrival).

A request left waiting for capacity (not held back by its quota) that a GPU of its model in another mode would
serve, while such a GPU is idle, waits for the capacity loop: the planner switches idle GPUs of other modes to
serve the queue that fits no GPU as it is (mode switch to whole or shared, MIG layout to MIG;
``capacity.planner``). Without a word from the cycle it would wait for the planner's timer. The live schedule
cycle (``broker.services.cycle``) and the capacity replay (``bench.sim.capacity``) both ask this module, so the
replay models the rule the service runs.

Pure like the rest of the scheduling core: it reads a ``Scheduler``'s working state after ``schedule``.
"""

from __future__ import annotations

from broker.scheduler.types import Decision, DecisionMode, GpuMode, Kind, Request, WorkloadClass

# the GPU mode a request's kind runs in
WANTED_MODE = {Kind.WHOLE: GpuMode.WHOLE, Kind.MIG: GpuMode.MIG, Kind.SHARE: GpuMode.SHARED}


def idle_modes(cluster) -> dict[str, frozenset[GpuMode]]:
    """Per GPU model, the modes in which at least one GPU is idle: open to new work (not closed, its node not
    cordoned) with nothing on it (no lease, no warm pool member). One look per node class, not per node: the
    nodes of a class have the same GPUs in the same state (``broker.scheduler.state``)."""
    found: dict[str, set[GpuMode]] = {}
    for members in cluster.by_signature.values():
        node = cluster.nodes[next(iter(members))]
        if node.node.cordoned:
            continue
        for gpu in node.gpus:
            if gpu.gpu.closed:
                continue
            if gpu.gpu.mode == GpuMode.MIG:
                idle = gpu.slot_mask == 0 and gpu.compute_used == 0
            else:
                idle = gpu.used_milli == 0 and gpu.units == 0
            if idle:
                found.setdefault(gpu.gpu.model, set()).add(gpu.gpu.mode)
    return {model: frozenset(modes) for model, modes in found.items()}


def pool_waits(scheduler, requests: list[Request], decisions: list[Decision]) -> tuple[tuple[str, GpuMode], ...]:
    """The (model, mode) pairs for which some request of ``decisions`` was left waiting, that a GPU of ``model``
    switched to ``mode`` would serve, while a GPU of that model is idle in another mode. A request its quota holds
    back (over its limit, or interactive beyond its guarantee: interactive work never borrows) is not one: no
    switch would start it. Read on ``scheduler``'s working state after the ``schedule`` call that made
    ``decisions``. Sorted by model then mode; empty when nothing waits so."""
    waiting = [decision.request for decision in decisions if decision.mode == DecisionMode.WAITING]
    if not waiting:
        return ()
    idle = idle_modes(scheduler.cluster)
    possible = {(model, mode) for model, modes in idle.items() for mode in GpuMode if modes - {mode}}
    if not possible:
        return ()
    by_id = {request.id: request for request in requests}
    found: set[tuple[str, GpuMode]] = set()
    for request_id in waiting:
        request = by_id.get(request_id)
        wanted = WANTED_MODE.get(request.shape.kind) if request is not None and request.shape else None
        if wanted is None:
            continue
        for tier, need in scheduler.tiers_for(request):
            pair = (tier, wanted)
            if pair not in possible or pair in found:
                continue
            refused, in_quota = scheduler.quota_check(request, tier, need)
            if refused or (not in_quota and request.workload_class == WorkloadClass.INTERACTIVE):
                continue
            found.add(pair)
        if found == possible:
            break
    return tuple(sorted(found, key=lambda pair: (pair[0], pair[1].value)))
