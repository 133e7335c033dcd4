"""The capacity planner: a snapshot of the fleet, its demand and its use in, proposed adjustments out.

``plan_capacity(snapshot, now=...)`` is pure (no I/O, nothing changed) and deterministic: the same snapshot
and ``now`` give the same list in the same order (kind, then target). Each kind is skipped where its policy
is ``off``; an adjustment carries the policy's mode (``advise``: a proposal, ``auto``: to be applied).

Invariants (``tests/capacity``):
- no adjustment but idle reclaim of that very lease touches a GPU holding a live in-quota instance: mode
  switches, layouts and warm instances go on GPUs no lease holds; a drain-then-switch only on a GPU whose
  every instance is over-quota, and only when the in-quota queue gains more milli than the drain takes;
- every proposed MIG layout (with what is already on the GPU) is valid under ``gpus.mig.layout_problem``.
"""

from __future__ import annotations

import math
from collections import defaultdict

from broker.scheduler.types import GpuMode, Kind, WorkloadClass
from capacity.planner.types import (
    COLD_CREATE_FALLBACK_SECONDS,
    Adjustment,
    AdjustmentKind,
    CapacityGpu,
    CapacitySnapshot,
    Change,
    DemandShape,
    Evidence,
    Gain,
    Mode,
    Policy,
    ReclaimClass,
    ReclaimStep,
    Slot,
    Utilisation,
)
from gpus.catalogue import model_get
from gpus.mig import MigPlacement, free_starts, layout_problem, profile_get, profiles_for

FULL = 1000
KIND_ORDER = {kind: index for index, kind in enumerate(AdjustmentKind)}


# -- policies, prices, layouts ---------------------------------------------------------------------------


class _Policies:
    def __init__(self, snapshot: CapacitySnapshot):
        self.by_scope = {}
        for policy in snapshot.policies:
            self.by_scope.setdefault(policy.scope, policy)
        self.default = self.by_scope.get("", Policy())

    def pool(self, model: str) -> Policy:
        return self.by_scope.get(f"pool:{model}", self.default)

    def project(self, project: str) -> Policy:
        return self.by_scope.get(f"project:{project}", self.default)


def price_per_hour(snapshot: CapacitySnapshot, model: str, profile: str = "", milli: int = FULL) -> int | None:
    """Minor units per hour of what a unit holds: the profile's own price, else the model's pro rata."""
    by_model = None
    for price in snapshot.prices:
        if price.model != model:
            continue
        if profile and price.profile == profile:
            return price.minor_per_gpu_hour
        if not price.profile and not price.share:
            by_model = price.minor_per_gpu_hour
    if by_model is None:
        return None
    return by_model * milli // FULL


def layout_of(gpu: CapacityGpu, extra: tuple[Slot, ...] | list[Slot] = ()) -> tuple[MigPlacement, ...]:
    """The MIG placements on ``gpu``: live instances, warm instances, and ``extra`` proposed slots."""
    placements = [MigPlacement(i.start, profile_get(gpu.model, i.profile)) for i in gpu.instances if i.profile]
    placements += [MigPlacement(w.start, profile_get(gpu.model, w.profile)) for w in gpu.warm]
    placements += [MigPlacement(s.start, profile_get(gpu.model, s.profile)) for s in extra]
    return tuple(placements)


def _mig_capable(model: str) -> bool:
    return bool(profiles_for(model))


def _shape_milli(shape: DemandShape) -> int:
    if shape.kind == Kind.MIG:
        return profile_get(shape.model, shape.profile).gpu_milli
    return shape.milli if shape.kind == Kind.SHARE else FULL


def _pct(values: list[int], q_permille: int) -> int:
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q_permille * len(ordered) / 1000) - 1))]


# -- 1. modes and layouts ----------------------------------------------------------------------------------


def _free_share_milli(gpu: CapacityGpu) -> int:
    return FULL - sum(i.milli for i in gpu.instances)


def _modes_and_layouts(snapshot: CapacitySnapshot, policies: _Policies, now: float) -> list[Adjustment]:
    out: list[Adjustment] = []
    models = sorted({gpu.model for gpu in snapshot.gpus})
    for model in models:
        policy = policies.pool(model)
        if policy.mode_switch == Mode.OFF and policy.mig_layout == Mode.OFF:
            continue
        out += _pool_modes(snapshot, model, policy, now, policies)
    return out


def _pool_modes(snapshot: CapacitySnapshot, model: str, policy: Policy, now: float,
                policies: _Policies) -> list[Adjustment]:
    gpus = sorted((g for g in snapshot.gpus if g.model == model), key=lambda g: g.id)
    mig_ok = _mig_capable(model)
    queue = sorted((w for w in snapshot.queue if w.shape.model == model),
                   key=lambda w: (-w.waited_seconds, w.request))
    # what the queue could use now, without any change: fit it on the GPUs as they are
    planned: dict[str, list[Slot]] = defaultdict(list)  # gpu -> slots the fit simulation used
    claimed: set[str] = set()  # idle GPUs the queue will take as they are
    share_used: dict[str, int] = {}
    unserved = []
    fit = _FitCache(gpus)
    for waiting in queue:
        usable = gpus if not waiting.pools else [g for g in gpus if waiting.allows(g)]
        pool_fit = fit if usable is gpus else _FitCache(usable)
        for _ in range(waiting.count):
            if _fits_as_is(waiting.shape, usable, planned, claimed, share_used, pool_fit):
                continue
            unserved.append(waiting)
    # idle GPUs by mode, and the mix the history asks for (GPU-weighted)
    idle = [g for g in gpus if g.idle and not g.warm and g.id not in claimed and not g.changing]
    idle_by_mode: dict[GpuMode, list[CapacityGpu]] = {mode: [] for mode in GpuMode}
    for gpu in idle:
        idle_by_mode[gpu.mode].append(gpu)
    demand_by_mode = dict.fromkeys(GpuMode, 0)
    for arrivals in snapshot.history.arrivals:
        if arrivals.shape.model == model:
            demand_by_mode[arrivals.shape.mode] += arrivals.units * _shape_milli(arrivals.shape)
    total_demand = sum(demand_by_mode.values())
    target_idle = {mode: (len(idle) * demand_by_mode[mode] // total_demand if total_demand else len(idle_by_mode[mode]))
                   for mode in GpuMode}
    if not mig_ok:
        target_idle[GpuMode.MIG] = 0
    donors = {mode: sorted(idle_by_mode[mode], key=lambda g: g.id, reverse=True) for mode in GpuMode}
    surplus = {mode: max(0, len(idle_by_mode[mode]) - target_idle[mode]) for mode in GpuMode}
    # GPUs no lease holds but warm pool members do (the platform's, not a tenant's): queued work that no idle
    # GPU serves may take one, its members destroyed first; never one whose members the queue would bind
    warm_only = sorted((g for g in gpus if g.idle and g.warm and g.id not in claimed and not planned[g.id]
                        and not g.changing),
                       key=lambda g: g.id, reverse=True)

    def take(wanted: GpuMode, queued: bool = True, pools: tuple[str, ...] = ()) -> CapacityGpu | None:
        """An idle GPU of another mode, from the mode with the largest surplus of idle GPUs over what the
        history asks for (ties: mode name). For the queue (real demand) any idle GPU of another mode will
        do; for a rebalance toward the history mix (``queued=False``) only a surplus one. ``pools``: only a GPU
        of one of these node pools (the waiting request's; empty: any)."""
        def ok(gpu: CapacityGpu) -> bool:
            return not pools or gpu.pool in pools

        options = [m for m in GpuMode if m != wanted and any(ok(g) for g in donors[m]) and (surplus[m] > 0 or queued)]
        if not options:
            for index, gpu in enumerate(warm_only if queued else ()):
                if gpu.mode != wanted and ok(gpu):
                    return warm_only.pop(index)
            return None
        mode = min(options, key=lambda m: (-surplus[m], m.value))
        surplus[mode] -= 1
        index = next(i for i, g in enumerate(donors[mode]) if ok(g))
        return donors[mode].pop(index)

    out: list[Adjustment] = []
    window = (snapshot.history.start, snapshot.history.end)
    # (a) the queue that does not fit as things are: switch idle GPUs of other modes to serve it
    mig_units = [w for w in unserved if w.shape.kind == Kind.MIG and mig_ok]
    whole_units = [w for w in unserved if w.shape.kind == Kind.WHOLE]
    share_units = [w for w in unserved if w.shape.kind == Kind.SHARE]
    mig_units.sort(key=lambda w: (-profile_get(model, w.shape.profile).compute_slices, -w.waited_seconds, w.request))
    still_waiting: list = []
    while mig_units:
        gpu = take(GpuMode.MIG, pools=mig_units[0].pools)
        if gpu is None:  # nothing for the first in its pools; the rest may have room elsewhere
            still_waiting.append(mig_units.pop(0))
            continue
        slots: list[Slot] = []
        served = []
        rest = []
        for waiting in mig_units:
            profile = profile_get(model, waiting.shape.profile)
            starts = free_starts(layout_of(gpu, slots), profile) if waiting.allows(gpu) else ()
            if starts:
                slots.append(Slot(gpu.id, starts[0], profile.name))
                served.append(waiting)
            else:
                rest.append(waiting)
        mig_units = rest
        out.append(_switch(snapshot, gpu, GpuMode.MIG, tuple(slots), served, policy, window, now))
    for units, mode in ((whole_units, GpuMode.WHOLE), (share_units, GpuMode.SHARED)):
        while units:
            gpu = take(mode, pools=units[0].pools)
            if gpu is None:  # nothing for the first in its pools; the rest may have room elsewhere
                still_waiting.append(units.pop(0))
                continue
            if mode == GpuMode.WHOLE:
                served, units = units[:1], units[1:]
            else:
                room, served, rest = FULL, [], []
                for waiting in units:
                    if waiting.shape.milli <= room and waiting.allows(gpu):
                        room -= waiting.shape.milli
                        served.append(waiting)
                    else:
                        rest.append(waiting)
                units = rest
            out.append(_switch(snapshot, gpu, mode, (), served, policy, window, now))
    # (b) drain-then-switch: in-quota work still waiting, a GPU held only by over-quota leases of another
    # mode, and the queue gains more than the drain takes
    in_quota_waiting = [w for w in still_waiting if w.in_quota]
    if in_quota_waiting:
        out += _drains(snapshot, gpus, model, in_quota_waiting, claimed, policy, window, now, policies)
    # (c) no queue left for a mode: move idle GPUs toward the history's mix
    switched = {a.change.gpu for a in out}
    history_units = sum(a.units for a in snapshot.history.arrivals if a.shape.model == model)
    if not unserved and history_units >= policy.rebalance_min_arrivals:
        for name in list(donors):
            donors[name] = [g for g in donors[name] if now - g.mode_since >= policy.mode_hold_seconds]
        for mode in sorted(GpuMode, key=lambda m: m.value):
            have = len([g for g in idle_by_mode[mode] if g.id not in switched])
            deficit = target_idle[mode] - have
            while deficit > 0:
                gpu = take(mode, queued=False)
                if gpu is None:
                    break
                deficit -= 1
                out.append(_switch(snapshot, gpu, mode, (), [], policy, window, now, rebalance=(
                    demand_by_mode, target_idle)))
    return out


class _FitCache:
    """What ``_fits_as_is`` needs of one pool, kept across the queue's units (issue 30: the planner runs on every
    wait a switch could end, and this fit was most of its time): the MIG GPUs with warm members, the MIG GPUs in
    packing order (partly used first, as the scheduler packs), and the (GPU, profile) pairs already found full.
    A GPU's planned slots only grow while the queue is fitted, so a profile that found no free start on it finds
    none later either: the answers are the ones a full scan gives. Likewise the idle whole and shared GPUs a whole
    unit may take, in order, with how many of them are behind: one claimed or given shares stays so (a month's
    replay asked ``idle`` 18 million times scanning them from the first for every queued whole unit)."""

    def __init__(self, gpus: list[CapacityGpu]):
        self.with_warm = [gpu for gpu in gpus if gpu.mode == GpuMode.MIG and gpu.warm]
        self.mig_packed = sorted((gpu for gpu in gpus if gpu.mode == GpuMode.MIG), key=lambda g: (g.idle, g.id))
        self.full: set[tuple[str, str]] = set()
        self.whole_idle = [gpu for gpu in gpus if gpu.idle and gpu.mode in (GpuMode.WHOLE, GpuMode.SHARED)]
        self.whole_next = 0


def _fits_as_is(shape: DemandShape, gpus: list[CapacityGpu], planned, claimed: set[str], share_used,
                fit: _FitCache | None = None) -> bool:
    """Would one unit of ``shape`` fit on the GPUs as they are (recording what it takes)?"""
    if shape.kind == Kind.MIG:
        fit = fit or _FitCache(gpus)
        profile = profile_get(shape.model, shape.profile)
        # warm instances of the profile serve it directly
        for gpu in fit.with_warm:
            taken = {(s.start, s.profile) for s in planned[gpu.id]}
            for warm in gpu.warm:
                if warm.profile == profile.name and (warm.start, "warm") not in taken:
                    planned[gpu.id].append(Slot(gpu.id, warm.start, "warm"))
                    return True
        for gpu in fit.mig_packed:  # partly used GPUs first, as the scheduler packs
            if (gpu.id, profile.name) in fit.full:
                continue
            real = [s for s in planned[gpu.id] if s.profile != "warm"]
            starts = free_starts(layout_of(gpu, real), profile)
            if starts:
                planned[gpu.id].append(Slot(gpu.id, starts[0], profile.name))
                if gpu.idle:
                    claimed.add(gpu.id)
                return True
            fit.full.add((gpu.id, profile.name))
        return False
    if shape.kind == Kind.WHOLE:
        fit = fit or _FitCache(gpus)
        candidates = fit.whole_idle
        while fit.whole_next < len(candidates):
            gpu = candidates[fit.whole_next]
            fit.whole_next += 1
            if gpu.id not in claimed and not share_used.get(gpu.id):
                claimed.add(gpu.id)
                return True
        return False
    for gpu in gpus:
        if gpu.mode != GpuMode.SHARED or gpu.id in claimed:
            continue
        free = _free_share_milli(gpu) - share_used.get(gpu.id, 0)
        if free >= shape.milli:
            share_used[gpu.id] = share_used.get(gpu.id, 0) + shape.milli
            return True
    return False


def _switch(snapshot, gpu: CapacityGpu, mode: GpuMode, slots: tuple[Slot, ...], served: list, policy: Policy,
            window, now: float, *, rebalance=None, drain: tuple[str, ...] = ()) -> Adjustment:
    kind = AdjustmentKind.MIG_LAYOUT if mode == GpuMode.MIG else AdjustmentKind.MODE_SWITCH
    served_milli = sum(_shape_milli(w.shape) for w in served)
    longest = max((w.waited_seconds for w in served), default=0)
    figures: list[tuple[str, int | str]] = [("from_mode", gpu.mode.value), ("to_mode", mode.value)]
    if served:
        labels: dict[str, int] = defaultdict(int)
        for waiting in served:
            labels[waiting.shape.label()] += 1
        figures += [(f"queued {label}", n) for label, n in sorted(labels.items())]
        figures += [("queued milli served", served_milli), ("longest wait seconds", longest)]
        why = (f"{len(served)} queued request unit(s) ({', '.join(f'{n} x {k}' for k, n in sorted(labels.items()))}) "
               f"fit no GPU as it is; {gpu.id} is idle in {gpu.mode.value} mode")
        start, end = now - longest, now
    else:
        demand, target = rebalance or ({}, {})
        figures += [(f"history milli {m.value}", demand.get(m, 0)) for m in GpuMode]
        figures += [(f"target idle {m.value}", target.get(m, 0)) for m in GpuMode]
        why = (f"the last {int(window[1] - window[0]) // 3600} h of requests ask for more idle {mode.value} GPUs "
               f"than there are; {gpu.id} is idle in {gpu.mode.value} mode")
        start, end = window
    if drain:
        why = f"drain over-quota lease(s) {', '.join(drain)}, then switch: " + why
    if gpu.warm:
        figures.append(("warm instances destroyed", len(gpu.warm)))
        why += f"; its {len(gpu.warm)} warm pool instance(s) are destroyed first"
    if slots:
        why += f"; MIG layout {', '.join(f'{s.profile}@{s.start}' for s in slots)}"
    return Adjustment(
        kind=kind,
        target=f"gpu:{gpu.id}",
        change=Change(gpu=gpu.id, from_mode=gpu.mode.value, to_mode=mode.value, drain=bool(drain), slots=slots,
                      model=gpu.model),
        evidence=Evidence(start, end, tuple(figures)),
        expected_gain=Gain(gpu_seconds=served_milli * 3600 // FULL, time_to_gpu_seconds=longest),
        risk=drain,
        mode=policy.mode_of(kind),
        reason=why,
    )


def _drains(snapshot, gpus, model, waiting, claimed, policy, window, now, policies: _Policies) -> list[Adjustment]:
    """Drain-then-switch proposals. A drain preempts tenants' leases, so the pool's ``auto`` applies it only
    where every drained lease's project has idle reclaim on ``auto`` too; otherwise it is advice."""
    out = []
    pending = list(waiting)
    # what an emptied GPU of one mode would serve depends on its mode, the model and the pending units only, not on
    # which GPU it is: worked out once per mode while nothing is taken from ``pending`` (the same answers)
    serves: dict[tuple[GpuMode, str], tuple] = {}
    for gpu in gpus:
        if not pending:
            break
        if gpu.idle or gpu.id in claimed or any(i.in_quota for i in gpu.instances):
            continue
        known = serves.get((gpu.mode, gpu.pool))
        if known is None:  # only units whose pools hold this GPU's
            known = serves[(gpu.mode, gpu.pool)] = _emptied_serves(model, gpu.mode,
                                                                    [w for w in pending if w.allows(gpu)])
        mode, served, starts, gain = known
        if mode is None:
            continue  # no queued in-quota unit of another mode
        slots = [Slot(gpu.id, start, profile) for start, profile in starts]
        loss = sum(i.milli for i in gpu.instances)
        if gain <= loss:
            continue
        serves.clear()
        for unit in served:
            pending.remove(unit)
        leases = tuple(sorted({i.lease for i in gpu.instances}))
        adjustment = _switch(snapshot, gpu, mode, tuple(slots), served, policy, window, now, drain=leases)
        figures = (*adjustment.evidence.figures, ("over-quota milli drained", loss))
        out.append(Adjustment(adjustment.kind, adjustment.target, adjustment.change,
                              Evidence(adjustment.evidence.start, adjustment.evidence.end, figures),
                              Gain(gpu_seconds=(gain - loss) * 3600 // FULL,
                                   time_to_gpu_seconds=adjustment.expected_gain.time_to_gpu_seconds),
                              leases, _drain_mode(adjustment.mode, gpu, policies),
                              adjustment.reason + f"; the queue gains {gain} milli, the drain takes {loss}"))
    return out


def _emptied_serves(model: str, gpu_mode: GpuMode, pending: list) -> tuple:
    """(mode, units served, MIG (start, profile) slots, milli gained) of a GPU now in ``gpu_mode``, emptied and
    switched for the queued in-quota units of another mode; (None, [], [], 0) when there are none."""
    wanted = [w for w in pending if w.shape.mode != gpu_mode]
    if not wanted:
        return None, [], [], 0
    mode = wanted[0].shape.mode
    served, slots, room = [], [], FULL
    empty = CapacityGpu("", "", model, mode)
    for unit in [w for w in wanted if w.shape.mode == mode]:
        if mode == GpuMode.MIG:
            profile = profile_get(model, unit.shape.profile)
            starts = free_starts(layout_of(empty, slots), profile)
            if not starts:
                continue
            slots.append(Slot("", starts[0], profile.name))
            served.append(unit)
        elif mode == GpuMode.WHOLE:
            served.append(unit)
            break
        elif unit.shape.milli <= room:
            room -= unit.shape.milli
            served.append(unit)
    gain = sum(_shape_milli(w.shape) for w in served)
    return mode, served, [(slot.start, slot.profile) for slot in slots], gain


def _drain_mode(mode: Mode, gpu: CapacityGpu, policies: _Policies) -> Mode:
    """``auto`` only where the pool says so and so does idle reclaim of every project the drain touches."""
    if mode == Mode.AUTO and any(policies.project(i.project).idle_reclaim != Mode.AUTO for i in gpu.instances):
        return Mode.ADVISE
    return mode


# -- 2. warm pools --------------------------------------------------------------------------------------


def poisson_pool_size(expected_arrivals: float, miss_permille: int) -> int:
    """The smallest N >= 1 with P(Poisson(expected_arrivals) >= N) < miss_permille / 1000: a pool of N misses
    only when N or more requests arrive while one member is being re-created (0 when none are expected)."""
    if expected_arrivals <= 0:
        return 0
    term = math.exp(-expected_arrivals)
    below = term  # P(X <= n - 1) for n = 1
    n = 1
    while 1.0 - below >= miss_permille / 1000 and n < 10_000:
        term *= expected_arrivals / n
        below += term
        n += 1
    return n


def cold_create_milliseconds(snapshot: CapacitySnapshot, policy: Policy, model: str, profile: str) -> tuple[int, str]:
    """The cold create time of ``profile`` on ``model`` and where it comes from: the policy's
    ``cold_provision_seconds`` where an operator set one, else the fleet's measured p95 for the profile, else
    for the model's MIG creates together, else ``COLD_CREATE_FALLBACK_SECONDS`` (nothing measured yet)."""
    if policy.cold_provision_seconds is not None:
        return policy.cold_provision_seconds * 1000, "the policy's cold_provision_seconds"
    for wanted in (profile, ""):
        for measured in snapshot.create_latency:
            if measured.model == model and measured.profile == wanted and measured.samples:
                what = "creates of the profile" if wanted else f"MIG creates on {model}"
                return measured.p95_milliseconds, f"p95 of {measured.samples} measured {what}"
    return COLD_CREATE_FALLBACK_SECONDS * 1000, "no create measured yet: the assumed default"


def _warm_pools(snapshot: CapacitySnapshot, policies: _Policies, now: float,
                changing: frozenset[str] = frozenset()) -> list[Adjustment]:
    """``changing``: GPUs a mode or layout adjustment takes; no warm instance goes there.

    A pool's worth, per hour: each arrival it serves saves the cold create time (``time saved``); each member
    holds its instance for the hour (``held``), both in seconds of the profile's instance. A pool is kept only
    where the time saved exceeds the time held, unless an SLO (``warm_target_p95_seconds``) needs it: the cold
    create misses the target."""
    out = []
    history = snapshot.history
    units: dict[tuple[str, str], int] = defaultdict(int)
    for arrivals in history.arrivals:
        if arrivals.shape.kind == Kind.MIG and _mig_capable(arrivals.shape.model):
            units[(arrivals.shape.model, arrivals.shape.profile)] += arrivals.units
    current: dict[tuple[str, str], list[tuple[CapacityGpu, object]]] = defaultdict(list)
    for gpu in snapshot.gpus:
        for warm in gpu.warm:
            current[(gpu.model, warm.profile)].append((gpu, warm))
    proposed: dict[str, list[Slot]] = defaultdict(list)
    for model, profile_name in sorted(set(units) | set(current)):
        policy = policies.pool(model)
        if policy.warm_pool == Mode.OFF:
            continue
        profile = profile_get(model, profile_name)
        count = units.get((model, profile_name), 0)
        seconds = max(history.seconds, 1.0)
        cold_ms, cold_source = cold_create_milliseconds(snapshot, policy, model, profile_name)
        expected = count * cold_ms / 1000 / seconds
        target = policy.warm_target_p95_seconds
        slo_needs = target is not None and cold_ms > target * 1000
        size = 0
        if count >= policy.warm_min_arrivals and (target is None or slo_needs):
            size = poisson_pool_size(expected, policy.warm_miss_probability_permille)
        # per hour, in seconds of one instance of the profile: the cold time the served arrivals save, and
        # what the pool's members hold (a miss saves nothing: at most 1 - P(miss) of the arrivals are served)
        saved_per_hour = int(count * 3600 / seconds * cold_ms / 1000 * (1000 - policy.warm_miss_probability_permille)
                             / 1000)
        if size and not slo_needs and saved_per_hour <= size * 3600:
            size = 0  # holding the pool would cost more than it saves, and no SLO asks for it
        have = sorted(current.get((model, profile_name), []), key=lambda gw: (gw[1].ready, gw[0].id, gw[1].id))
        if size == len(have):
            continue
        slots: list[Slot] = []
        removed: tuple[str, ...] = ()
        if size > len(have):
            for gpu in sorted((g for g in snapshot.gpus if g.model == model and g.mode == GpuMode.MIG and g.idle
                               and g.id not in changing and not g.changing),
                              key=lambda g: (-len(g.warm) - len(proposed[g.id]), g.id)):
                while len(have) + len(slots) < size:
                    starts = free_starts(layout_of(gpu, proposed[gpu.id]), profile)
                    if not starts:
                        break
                    slot = Slot(gpu.id, starts[0], profile.name)
                    proposed[gpu.id].append(slot)
                    slots.append(slot)
            if not slots:
                continue
        else:
            removed = tuple(w.id for _, w in have[: len(have) - size])
        after = len(have) + len(slots) - len(removed)
        price = price_per_hour(snapshot, model, profile_name, profile.gpu_milli) or 0
        rate_milli_per_hour = count * 3600 * 1000 // int(seconds)
        held_per_hour = after * 3600
        short = f" ({size - after} more wanted: no idle MIG room)" if after < size else ""
        if size == 0 and count < policy.warm_min_arrivals:
            why = f"fewer than {policy.warm_min_arrivals} arrivals"
        elif size == 0 and target is not None and not slo_needs:
            why = f"the cold create already meets the {target} s target"
        elif size == 0:
            why = "holding a pool would cost more than the time it saves"
        elif slo_needs:
            why = (f"the cold create misses the {target} s target; {size} warm instance(s) keep P(miss) under "
                   f"{policy.warm_miss_probability_permille / 10:.1f} %")
        else:
            why = (f"{size} warm instance(s) keep P(miss) under {policy.warm_miss_probability_permille / 10:.1f} % "
                   f"and save more than they hold")
        out.append(Adjustment(
            kind=AdjustmentKind.WARM_POOL,
            target=f"pool:{model}/{profile_name}",
            change=Change(model=model, profile=profile_name, size_before=len(have), size_after=after,
                          slots=tuple(slots), remove=removed),
            evidence=Evidence(history.start, history.end, (
                ("arrivals", count), ("window seconds", int(seconds)),
                ("arrivals per hour (milli)", rate_milli_per_hour),
                ("cold create milliseconds", cold_ms), ("cold create from", cold_source),
                ("expected arrivals per refill (milli)", int(expected * 1000)),
                ("miss probability (permille)", policy.warm_miss_probability_permille),
                ("time saved per hour (s)", saved_per_hour), ("held per hour (s)", held_per_hour),
                ("target size", size))),
            # per hour of the pool after the change: GPU-seconds saved less held; the holding cost's change
            expected_gain=Gain(gpu_seconds=(saved_per_hour - held_per_hour) * profile.gpu_milli // FULL,
                               money_minor=-(after - len(have)) * price,
                               time_to_gpu_seconds=round(cold_ms / 1000) if after > len(have) else 0),
            risk=(),
            mode=policy.warm_pool,
            reason=(f"{count} {profile_name} arrivals in {int(seconds) // 60} min; a cold create takes "
                    f"{cold_ms / 1000:.2f} s ({cold_source}); {why}; pool {len(have)} -> {after}{short}; saves "
                    f"{saved_per_hour} s, holds {held_per_hour} s of instance time per hour; holding cost "
                    f"{after * price} per hour (the platform's)"),
        ))
    return out


# -- 3. idle reclaim ------------------------------------------------------------------------------------


def reclaim_class(in_quota: bool, workload_class: WorkloadClass, resumable: bool = False) -> ReclaimClass:
    """The rule a lease falls under: over-quota whatever its class; in-quota training whose workload can resume
    from a checkpoint is ``resumable-training`` (suspended, not released); else its workload class."""
    if not in_quota:
        return ReclaimClass.OVER_QUOTA
    if resumable and workload_class == WorkloadClass.TRAINING:
        return ReclaimClass.RESUMABLE
    return ReclaimClass(workload_class.value)


def _trailing(series: Utilisation, since: float, now: float) -> list[tuple[int, int]] | None:
    """The (engine, framebuffer) samples whose interval lies in ``[since, now]``; None when the series
    does not cover the whole span."""
    if series.start > since + 1e-9 or series.end < now - series.interval_seconds:
        return None
    first = max(0, math.ceil((since - series.start) / series.interval_seconds - 1e-9))
    last = min(len(series.engine_active_permille), int((now - series.start) // series.interval_seconds))
    if last <= first:
        return None
    return list(zip(series.engine_active_permille[first:last], series.framebuffer_mib[first:last], strict=True))


def _lease_holdings(snapshot: CapacitySnapshot) -> dict[str, list[tuple[CapacityGpu, object]]]:
    holdings: dict[str, list] = defaultdict(list)
    for gpu in sorted(snapshot.gpus, key=lambda g: g.id):
        for instance in gpu.instances:
            holdings[instance.lease].append((gpu, instance))
    return holdings


def _waiting_units(snapshot: CapacitySnapshot) -> dict[str, int]:
    """Queued units per model: what a suspension would free its GPUs for."""
    units: dict[str, int] = defaultdict(int)
    for waiting in snapshot.queue:
        units[waiting.shape.model] += waiting.count
    return units


def _idle_reclaim(snapshot: CapacitySnapshot, policies: _Policies, now: float) -> list[Adjustment]:
    """Per lease under its class's rule: notice, then release (in quota), preempt (over quota) or suspend
    (resumable training), or cancel a notice when busy again. A suspension frees GPUs for waiting work: an idle
    resumable lease gets its notice, and is suspended, only while units wait for its model (requeued with nothing
    waiting, it would be placed straight back and restart for nothing)."""
    out = []
    holdings = _lease_holdings(snapshot)
    waiting = _waiting_units(snapshot)
    for series in sorted(snapshot.utilisation, key=lambda s: s.lease):
        held = holdings.get(series.lease)
        if not held:
            continue
        gpu, instance = held[0]
        policy = policies.project(instance.project)
        if policy.idle_reclaim == Mode.OFF:
            continue
        klass = reclaim_class(instance.in_quota, instance.workload_class, instance.resumable)
        rule = policy.idle_rule(klass)
        if not rule.enabled or now - instance.started_at < rule.window_seconds:
            continue
        samples = _trailing(series, now - rule.window_seconds, now)
        if not samples:
            continue
        mean = sum(e for e, _ in samples) // len(samples)
        if mean >= rule.threshold_permille:
            if instance.noticed_at is None:
                continue
            step = ReclaimStep.CANCEL
        elif klass == ReclaimClass.RESUMABLE and not waiting.get(gpu.model):
            continue  # nothing waits for the GPUs: a suspension would free them for no one
        elif instance.noticed_at is None:
            step = ReclaimStep.NOTICE
        elif now - instance.noticed_at >= rule.notice_seconds:
            step = {ReclaimClass.OVER_QUOTA: ReclaimStep.PREEMPT,
                    ReclaimClass.RESUMABLE: ReclaimStep.SUSPEND}.get(klass, ReclaimStep.RELEASE)
        else:
            continue
        milli = sum(i.milli for _, i in held)
        price = sum(price_per_hour(snapshot, g.model, i.profile, i.milli) or 0 for g, i in held)
        idle_seconds = rule.window_seconds
        then = {ReclaimStep.NOTICE: f"released in {rule.notice_seconds} s unless it becomes busy",
                ReclaimStep.RELEASE: "released now (notice given, still idle)",
                ReclaimStep.PREEMPT: "preempted now and requeued (over quota, notice given, still idle)",
                ReclaimStep.SUSPEND: ("suspended now (notice given, still idle): SIGTERM, checkpoint, back to the "
                                      "queue; it resumes from its checkpoint when capacity frees"),
                ReclaimStep.CANCEL: "busy again: the notice is withdrawn"}[step]
        if klass == ReclaimClass.RESUMABLE and step == ReclaimStep.NOTICE:
            then = (f"suspended in {rule.notice_seconds} s unless it becomes busy (checkpoint, back to the queue, "
                    f"resumes when capacity frees; {waiting[gpu.model]} unit(s) wait for {gpu.model})")
        out.append(Adjustment(
            kind=AdjustmentKind.IDLE_RECLAIM,
            target=f"lease:{series.lease}",
            change=Change(lease=series.lease, project=instance.project, step=step.value, gpu=gpu.id,
                          model=gpu.model),
            evidence=Evidence(now - rule.window_seconds, now, (
                ("class", klass.value), ("mean engine active (permille)", mean),
                ("max engine active (permille)", max(e for e, _ in samples)),
                ("threshold (permille)", rule.threshold_permille), ("samples", len(samples)),
                ("window seconds", rule.window_seconds), ("milli held", milli))
                + ((("queued units on the model", waiting.get(gpu.model, 0)),) if klass == ReclaimClass.RESUMABLE
                   else ())),
            expected_gain=(Gain() if step == ReclaimStep.CANCEL else
                           Gain(gpu_seconds=milli * idle_seconds // FULL, money_minor=price * idle_seconds // 3600)),
            risk=(series.lease,),
            mode=policy.idle_mode(klass),
            reason=(f"lease {series.lease} ({klass.value}) averaged {mean / 10:.1f} % engine activity over the "
                    f"last {rule.window_seconds // 60} min (threshold {rule.threshold_permille / 10:.1f} %): {then}"
                    + (" (automatic: the project opted in)" if policy.idle_mode(klass) != policy.idle_reclaim else "")),
        ))
    return out


# -- 4. right-sizing and quota advice ----------------------------------------------------------------------


def _right_size(snapshot: CapacitySnapshot, policies: _Policies, now: float) -> list[Adjustment]:
    out = []
    holdings = _lease_holdings(snapshot)
    for series in sorted(snapshot.utilisation, key=lambda s: s.lease):
        held = holdings.get(series.lease)
        if not held:
            continue
        gpu, instance = held[0]
        policy = policies.project(instance.project)
        if policy.right_size == Mode.OFF:
            continue
        span = series.end - series.start
        if span < policy.right_size_min_seconds or not series.engine_active_permille:
            continue
        p95_engine = _pct(list(series.engine_active_permille), 950)
        peak_fb = max(series.framebuffer_mib)
        head = 1000 + policy.right_size_headroom_permille
        # the GPU fraction (milli) and memory the work needs, with headroom
        current_milli = instance.milli if not instance.profile else profile_get(gpu.model, instance.profile).gpu_milli
        need_milli = p95_engine * current_milli * head // (1000 * 1000)
        need_mib = peak_fb * head // 1000
        current_price = price_per_hour(snapshot, gpu.model, instance.profile, current_milli)
        if current_price is None:
            continue
        candidates = []
        for profile in profiles_for(gpu.model):
            if profile.shape.media_extensions or profile.gpu_milli >= current_milli:
                continue
            if profile.gpu_milli >= need_milli and profile.memory_mib >= need_mib:
                price = price_per_hour(snapshot, gpu.model, profile.name, profile.gpu_milli)
                if price is not None and price < current_price:
                    candidates.append((price, profile.gpu_milli, gpu.model, profile.name))
        if need_milli * 2 <= current_milli:  # a cheaper whole GPU only for work using under half of this one
            for price_entry in snapshot.prices:
                other = price_entry.model
                if price_entry.profile or price_entry.share or other == gpu.model:
                    continue
                try:
                    memory = model_get(other).memory_mib
                except KeyError:
                    continue
                if memory >= need_mib and price_entry.minor_per_gpu_hour < current_price:
                    candidates.append((price_entry.minor_per_gpu_hour, FULL, other, ""))
        if not candidates:
            continue
        price, milli, model, profile_name = min(candidates)
        units = len(held)
        saving = (current_price - price) * units * int(span) // 3600
        what = f"MIG {profile_name} on {model}" if profile_name else f"a whole {model}"
        out.append(Adjustment(
            kind=AdjustmentKind.RIGHT_SIZE,
            target=f"lease:{series.lease}",
            change=Change(lease=series.lease, project=instance.project, model=model, profile=profile_name,
                          size_before=current_milli, size_after=milli),
            evidence=Evidence(series.start, series.end, (
                ("p95 engine active (permille)", p95_engine), ("peak framebuffer MiB", peak_fb),
                ("held milli per unit", current_milli), ("needed milli per unit", need_milli),
                ("needed MiB", need_mib), ("price per hour now", current_price),
                ("price per hour suggested", price), ("units", units))),
            expected_gain=Gain(gpu_seconds=(current_milli - milli) * units * int(span) // FULL, money_minor=saving),
            risk=(),
            mode=policy.right_size,
            reason=(f"lease {series.lease} used at most {p95_engine / 10:.1f} % (p95) of its engine and "
                    f"{peak_fb} MiB over {int(span) // 3600} h; {what} would have fitted"),
        ))
    return out


def _quota_advice(snapshot: CapacitySnapshot, policies: _Policies, now: float) -> list[Adjustment]:
    out = []
    deserved = {(q.project, q.tier): q.deserved_milli for q in snapshot.quotas}
    for use in sorted(snapshot.quota_use, key=lambda u: (u.project, u.tier)):
        policy = policies.project(use.project)
        if policy.quota_advice == Mode.OFF or (use.project, use.tier) not in deserved:
            continue
        since = now - policy.quota_window_seconds
        samples = [m for i, m in enumerate(use.milli) if use.start + i * use.interval_seconds >= since]
        if not samples:
            continue
        p95 = _pct(samples, 950)
        have = deserved[(use.project, use.tier)]
        suggested = -(-p95 // FULL) * FULL  # whole GPUs, rounded up
        if p95 > have:
            direction = "raise"
        elif p95 * 1000 < have * policy.quota_low_permille and suggested < have:
            direction = "lower"
        else:
            continue
        seconds = len(samples) * use.interval_seconds
        out.append(Adjustment(
            kind=AdjustmentKind.QUOTA_ADVICE,
            target=f"project:{use.project}/{use.tier}",
            change=Change(project=use.project, model=use.tier, size_before=have, size_after=suggested),
            evidence=Evidence(max(since, use.start), now, (
                ("deserved milli", have), ("p95 use milli", p95), ("max use milli", max(samples)),
                ("samples", len(samples)))),
            expected_gain=Gain(gpu_seconds=(have - suggested) * seconds // FULL),
            risk=(),
            mode=policy.quota_advice,
            reason=(f"project {use.project} used {p95} milli of {use.tier} at p95 over {seconds // 86400} days "
                    f"against {have} deserved: {direction} the guarantee to {suggested}"),
        ))
    return out


# -- entry point ---------------------------------------------------------------------------------------


def plan_capacity(snapshot: CapacitySnapshot, *, now: float) -> list[Adjustment]:
    """Every adjustment the snapshot calls for, ordered by kind, then target, then step. Pure."""
    policies = _Policies(snapshot)
    out: list[Adjustment] = []
    out += _modes_and_layouts(snapshot, policies, now)
    out += _warm_pools(snapshot, policies, now, frozenset(a.change.gpu for a in out))
    out += _idle_reclaim(snapshot, policies, now)
    out += _right_size(snapshot, policies, now)
    out += _quota_advice(snapshot, policies, now)
    out = [a for a in out if a.mode != Mode.OFF]
    out.sort(key=lambda a: (KIND_ORDER[a.kind], a.target, a.change.step))
    return out


def layout_problems(snapshot: CapacitySnapshot, adjustments: list[Adjustment]) -> list[str]:
    """Every proposed MIG layout that ``gpus.mig`` rejects, in words (empty: all valid). The GPU's live
    and warm instances count, less the warm ones the adjustment removes; a drain or switch starts empty."""
    by_id = {gpu.id: gpu for gpu in snapshot.gpus}
    slots_by_gpu: dict[str, list[Slot]] = defaultdict(list)
    fresh: set[str] = set()
    removed: set[str] = set()
    for adjustment in adjustments:
        for slot in adjustment.change.slots:
            slots_by_gpu[slot.gpu].append(slot)
        if adjustment.change.gpu and adjustment.change.to_mode:
            fresh.add(adjustment.change.gpu)
        removed |= set(adjustment.change.remove)
    problems = []
    for gpu_id, slots in sorted(slots_by_gpu.items()):
        gpu = by_id[gpu_id]
        base = gpu if gpu_id not in fresh else CapacityGpu(gpu.id, gpu.node, gpu.model, GpuMode.MIG)
        base = CapacityGpu(base.id, base.node, base.model, base.mode, base.instances,
                           tuple(w for w in base.warm if w.id not in removed))
        problem = layout_problem(layout_of(base, slots))
        if problem:
            problems.append(f"{gpu_id}: {problem}")
    return problems
