"""Reservations and conservative backfill from lease durations (issue 32 item 2; Slurm's conservative backfill).

A lease's requested duration, and a running lease's expiry, is a promise the plan counts on. Each cycle (with
``Scheduler(reservations=True)``; the broker's ``LEASE_RESERVATIONS``, default on):

1. **Who**: the oldest (submission time, then id) requests that are in quota on some tier and fit on none of those
   now, and lease groups (``Request.group``) in quota whose members do not fit together now (``holders``; a group's
   age is its oldest member's submission, and it stands in that order among the requests), up to
   ``Scheduler.reservation_limit`` (4) of them together, each once it has waited ``Scheduler.reserve_after_seconds``
   (the broker's ``LEASE_RESERVE_AFTER_SECONDS``, 600; Slurm's ``bf_min_age_reserve``: a request that would start
   within minutes anyway idles no GPUs for a reservation): those that would otherwise starve behind smaller work that
   keeps taking each GPU as it frees. Each later one is computed with the GPUs of the earlier ones closed, so no two
   count on the same GPUs. A group is in quota on the tiers where all its members that may run there, together, stay
   within their projects' and tenant's guarantee and limit (``group_tiers``: a member that may run on several tiers
   counts on each); a group that ageing placed this cycle holds none, one that ageing left waiting may hold one.
2. **Where and when** (``earliest``): the running allocations leave at their expected ends (``Scheduler.ends``: the
   snapshot's ``ends_at``, the simulator's own; those placed this cycle at ``now`` + their request's duration;
   unknown: never), earliest first, ties by id. After each batch of ends the nodes they touched are checked with
   their over-quota work on the tier taken out (the holder, in quota, reclaims it once it is past its minimum
   runtime and not protected by the back-off); the first time a node holds the request (its lowest id among those
   that do at that time) is the reservation: that node's GPUs the request's units would take there (every GPU of
   the node when it asks for host CPU or memory), from that time. A request that may spread over nodes is checked
   with the whole tier's reclaimable work out and the placement search itself. A lease group (``earliest_group``):
   after each batch of ends that touches a node of its tiers, with the reclaimable over-quota work of those tiers
   out, its members are placed in turn by the placement search (each on the first of its in-quota tiers where it
   fits, the earlier members holding their capacity); when all fit, the group is tried as the cycle would try it
   then (``_group_starts``: each member in its try order placed within its guarantee or reclaiming, with the
   reclaimable work in place); the first time it starts so, the GPUs its members take (a member that asks for host
   CPU or memory: its whole node) are the group's reservation from that time. No known end makes
   room: no reservation (the decisions are those without reservations).
3. **Backfill**: the reserved GPUs are closed to every other request for the rest of the cycle (``Gpu.closed``:
   nothing new fits there, other GPUs of the node stay open, over quota as well), except for a request whose own
   duration ends by the reservation's start, which is tried on them when it fits nowhere else. Work without a
   known duration never backfills onto reserved capacity. So nothing placed this cycle delays the reservation.
   A group's reservation is open to its members only while the group is tried (``Held.group``), all or nothing.
4. **Released**: when its holder is placed (or reclaims) in this cycle the GPUs open again; a group's when the group
   is placed (or its members reclaim). A reservation lives in one cycle's plan only and is recomputed from the next
   snapshot, so it leaves with its request.

A holder's waiting reason names it ("reserved 8 V100-32GB GPUs on node n0003 from … (in 3600 s)"; every member of
a group: "group train reserved 16 L4 GPUs on nodes n1, n2 from …"), and its estimated start is the reservation's
time (``broker.scheduler.estimate``; every member of a group the same). Pure: the what-ifs are undone, the GPUs
closed are opened again before ``schedule`` returns; without groups in the input the decisions are those before
group reservations.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime

from broker.scheduler.placement import Need
from broker.scheduler.types import Allocation, Decision, DecisionMode, Request


@dataclass(frozen=True, slots=True)
class Reservation:
    """GPUs held for one waiting request (or one lease group) from ``start`` on: within the cycle, nothing that ends
    later goes there."""

    request: str
    tier: str
    start: float
    node: str  # where it will fit (the first of ``nodes`` for a request spread over nodes)
    nodes: tuple[str, ...]
    gpus: tuple[str, ...]
    # a lease group's: its name and every member's id (``request`` is its oldest member; ``tier`` names each tier
    # its members take, joined by "+", in ``tiers``)
    group: str = ""
    members: tuple[str, ...] = ()
    tiers: tuple[str, ...] = ()

    @property
    def requests(self) -> tuple[str, ...]:
        """The requests that hold it: the group's members, or the one request."""
        return self.members or (self.request,)

    @property
    def where(self) -> str:
        """The nodes a waiting request's reason names: a group's all, a request's the first."""
        return ", ".join(self.nodes) if self.group else self.node

    def words(self, now: float) -> str:
        when = _when(self.start)
        where = f"node {self.node}" if len(self.nodes) == 1 else f"nodes {', '.join(self.nodes)}"
        count = len(self.gpus)
        who = f"group {self.group} " if self.group else ""
        return (f"{who}reserved {count} {self.tier} GPU{'s' if count > 1 else ''} on {where} from {when} "
                f"(in {max(self.start - now, 0):.0f} s, when the running leases there end); younger work backfills "
                "there only if it ends by then")


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def holders(scheduler, requests: list[Request], *, now: float, aged: frozenset[str] = frozenset()):
    """The requests that are in quota on some tier and fit on none of those now, and the lease groups whose members
    are all in quota and do not fit together now, oldest first (a group's age is its oldest member's submission).
    A request is yielded as ``(request, its tiers, ())``, a group as ``(its oldest member, each member's tiers, its
    members)``. ``aged``: the groups ageing served and left waiting this cycle (``Scheduler._serve_aged_groups``)
    among those; any other group ageing decided is not a holder. Whether a request's need fits now is looked up
    once until ``fits.clear()`` (the generator's ``send`` is not used: the caller clears the dict it gets first,
    after it has closed GPUs)."""
    fits: dict = {}
    yield fits
    reserved = scheduler._reserved
    since = now - scheduler.reserve_after_seconds
    candidates: list[tuple[float, str, Request, list[Request]]] = []
    groups: dict[str, list[Request]] = {}
    for request in requests:
        if not request.group:
            if request.submitted_at <= since:
                candidates.append((request.submitted_at, request.id, request, []))
        else:
            groups.setdefault(request.group, []).append(request)
    for group, members in groups.items():
        if group in scheduler._decided_groups and group not in aged:
            continue  # ageing placed it (or it reclaims) in this cycle
        members.sort(key=lambda r: (-r.priority, r.submitted_at, r.id))  # the order the cycle tries them in
        oldest = min(members, key=lambda r: (r.submitted_at, r.id))
        if oldest.submitted_at <= since:
            candidates.append((oldest.submitted_at, oldest.id, oldest, members))
    candidates.sort(key=lambda item: (item[0], item[1]))
    for _submitted, _id, request, members in candidates:
        if members:
            tiers = group_tiers(scheduler, members)
            if tiers is not None and not _group_fits_now(scheduler, members, tiers, now=now):
                yield request, tiers, tuple(members)
            continue
        shape = request.shape
        if not shape.gang and shape.count > 1 and (shape.cpu_milli or shape.host_memory_mib):
            continue  # it can never be placed (``Scheduler._try``): nothing to reserve for
        tiers = []
        for tier, need in scheduler.tiers_for(request):
            held_since = reserved.get(tier)
            if held_since is not None and request.submitted_at > held_since:
                continue  # an aged lease group holds the tier against it
            blocked, in_quota = scheduler.quota_check(request, tier, need)
            if blocked is None and in_quota:
                tiers.append((tier, need))
        if not tiers:
            continue
        fit = False
        for _tier, need in tiers:
            key = need.key()
            if key not in fits:
                fits[key] = scheduler._find(need) is not None
            if fits[key]:
                fit = True
                break
        if not fit:
            yield request, tiers, ()


def group_tiers(scheduler, members: list[Request]) -> list[list[tuple[str, Need]]] | None:
    """Each member's (tier, need) pairs on which the whole group is in quota, or None when a member has none (the
    group is not in quota: it reserves nothing). A tier counts for the group when the needs of every member that may
    run there, together, stay within the guarantee (``deserved``) and the ``limit`` of each of their projects and
    tenants on it (a member that may run on several tiers is counted on each, so a group that spreads its members
    over tiers may be left out: conservative). A tier an aged lease group holds against the group's oldest member
    is left out, as for a request alone."""
    reserved = scheduler._reserved
    oldest = min(member.submitted_at for member in members)
    options: list[list[tuple[str, Need]]] = []
    need_on: dict[str, dict[tuple[str, str], int]] = {}
    for member in members:
        shape = member.shape
        if not shape.gang and shape.count > 1 and (shape.cpu_milli or shape.host_memory_mib):
            return None  # a member that can never be placed: the group never starts
        mine = []
        for tier, need in scheduler.tiers_for(member):
            held_since = reserved.get(tier)
            if held_since is not None and oldest > held_since:
                continue  # an older aged lease group holds the tier against it
            mine.append((tier, need))
            by_owner = need_on.setdefault(tier, {})
            for owner in (("project", member.project), ("tenant", member.tenant)):
                by_owner[owner] = by_owner.get(owner, 0) + need.total_milli
        options.append(mine)
    if scheduler.snapshot.enforce_quotas:
        usable = {tier for tier, by_owner in need_on.items() if _in_quota(scheduler, tier, by_owner)}
        options = [[(tier, need) for tier, need in mine if tier in usable] for mine in options]
    if not all(options):
        return None
    return options


def _in_quota(scheduler, tier: str, by_owner: dict[tuple[str, str], int]) -> bool:
    for (kind, owner), amount in by_owner.items():
        quotas, usage = ((scheduler.quotas, scheduler.cluster.project_usage) if kind == "project"
                         else (scheduler.tenant_quotas, scheduler.cluster.tenant_usage))
        quota = quotas.get((owner, tier))
        if quota is None:
            if kind == "project":
                return False  # no quota for the tier: nothing to run on
            continue  # no tenant bound
        used_in, used_over = usage.get((owner, tier), (0, 0))
        if used_in + used_over + amount > quota.limit or used_in + amount > quota.deserved:
            return False
    return True


def _place_members(scheduler, members: tuple[Request, ...] | list[Request], tiers, *, at: float) -> list | None:
    """Place every member in turn (each on the first of its tiers where it fits, the members placed before it
    holding their capacity) on the working state: the allocations, applied, or None (nothing left applied)."""
    cluster = scheduler.cluster
    placed: list[Allocation] = []
    for member, options in zip(members, tiers, strict=True):
        for tier, need in options:
            found = scheduler._find(need)
            if found is not None:
                allocation = scheduler._allocation(member, tier, need, found, preemptible=False, now=at)
                cluster.apply(allocation)
                placed.append(allocation)
                break
        else:
            for allocation in reversed(placed):
                cluster.remove(allocation.id)
            return None
    return placed


def _group_starts(scheduler, members, *, at: float) -> list[Allocation] | None:
    """The members' allocations when the group, tried at ``at`` on the working state as ``Scheduler._try_group``
    tries it in its in-quota pass, is placed or reclaims: every member in turn placed within its guarantee or
    reclaiming over-quota work (``Scheduler._try_now``); None when a member waits or is over quota. Tiers held by
    an aged lease group no older than this one do not count (ageing serves this one first then). The working state
    is as it was afterwards."""
    cluster = scheduler.cluster
    allocations_before, warm_before = dict(cluster.allocations), dict(cluster.warm)
    vacating, held_tiers = set(scheduler._vacating), scheduler._reserved
    oldest = min(member.submitted_at for member in members)
    scheduler._reserved = {tier: since for tier, since in held_tiers.items() if since < oldest}
    done: list[Decision] = []
    try:
        for member in members:
            decision = scheduler._try_now(member, now=at, allow_over_quota=False)
            if decision is None or decision.mode == DecisionMode.WAITING:
                return None
            done.append(decision)
        return [decision.allocation for decision in done]
    finally:
        scheduler._undo(done, allocations_before, warm_before)
        scheduler._vacating, scheduler._reserved = vacating, held_tiers


def _group_fits_now(scheduler, members, tiers, *, now: float) -> bool:
    placed = _place_members(scheduler, members, tiers, at=now)
    if placed is None:
        return False
    for allocation in reversed(placed):
        scheduler.cluster.remove(allocation.id)
    return True


def expected_ends(scheduler, durations: dict[str, int], now: float) -> list[tuple[float, str]]:
    """(expected end, allocation id) of every allocation whose end is known, earliest first (an end already past
    counts as now)."""
    ends = scheduler.ends
    out = []
    for allocation_id, allocation in scheduler.cluster.allocations.items():
        end = ends.get(allocation_id)
        if end is None and allocation.started_at == now and durations.get(allocation_id):
            end = now + durations[allocation_id]  # placed by this cycle
        if end is not None:
            out.append((max(end, now), allocation_id))
    out.sort()
    return out


def earliest(scheduler, request: Request, tier: str, need: Need, events: list[tuple[float, str]], *,
             now: float) -> Reservation | None:
    """Where and when ``need`` fits first as the running work leaves at its expected end (module doc, step 2).
    The working state is as it was afterwards."""
    if not events:
        return None
    cluster = scheduler.cluster
    min_runtime = scheduler.snapshot.min_runtime_seconds
    spread = not need.gang and need.count > 1
    borrowed: dict[str, list[Allocation]] = {}  # node -> over-quota allocations of the tier there
    for allocation in cluster.allocations.values():
        if allocation.preemptible and allocation.tier == tier and allocation.id != request.id:
            for node_id in cluster._nodes_of(allocation):
                borrowed.setdefault(node_id, []).append(allocation)

    def reclaimable(allocation: Allocation, at: float) -> bool:
        return (allocation.id in cluster.allocations and allocation.started_at + min_runtime <= at
                and scheduler.protected(allocation, at) is None)

    removed: list[Allocation] = []
    found: tuple[float, str, tuple[str, ...], tuple[str, ...]] | None = None
    try:
        index, count = 0, len(events)
        while index < count and found is None:
            at = events[index][0]
            touched: dict[str, None] = {}
            while index < count and events[index][0] == at:
                allocation = cluster.allocations.get(events[index][1])
                index += 1
                if allocation is None:
                    continue
                removed.append(cluster.remove(allocation.id))
                for node_id in cluster._nodes_of(allocation):
                    touched[node_id] = None
            if spread:
                found = _fits_spread(scheduler, need, borrowed, reclaimable, at)
            else:
                for node_id in sorted(touched):
                    gpus = _fits_node(scheduler, node_id, need, borrowed.get(node_id, ()), reclaimable, at)
                    if gpus:
                        found = (at, node_id, (node_id,), gpus)
                        break
    finally:
        for allocation in reversed(removed):
            cluster.apply(allocation)
    if found is None:
        return None
    at, node_id, nodes, gpus = found
    return Reservation(request.id, tier, at, node_id, nodes, gpus)


def _fits_node(scheduler, node_id: str, need: Need, borrowed, reclaimable, at: float) -> tuple[str, ...]:
    """The GPUs ``need`` would take on the node at ``at`` with the node's reclaimable borrowed work gone (every GPU
    of the node when it asks for host CPU or memory); () when it does not fit."""
    cluster = scheduler.cluster
    gone = [cluster.remove(a.id) for a in borrowed if reclaimable(a, at)]
    try:
        node = cluster.nodes[node_id]
        options = scheduler.placer.policy.node_options(node, need)
        if not options:
            return ()
        if need.cpu_milli or need.host_memory_mib:
            return tuple(gpu.gpu.id for gpu in node.gpus)
        return tuple(dict.fromkeys(unit.gpu for unit in options[0]))
    finally:
        for allocation in reversed(gone):
            cluster.apply(allocation)


def _fits_spread(scheduler, need: Need, borrowed, reclaimable, at: float):
    cluster = scheduler.cluster
    seen: dict[str, Allocation] = {}
    for allocations in borrowed.values():
        for allocation in allocations:
            if allocation.id not in seen and reclaimable(allocation, at):
                seen[allocation.id] = allocation
    gone = [cluster.remove(allocation_id) for allocation_id in sorted(seen)]
    try:
        placed = scheduler._find(need)
    finally:
        for allocation in reversed(gone):
            cluster.apply(allocation)
    if placed is None:
        return None
    node_id, units = placed
    if node_id == "multi":
        units = tuple(unit for temp in units for unit in temp.units)
    gpus = tuple(dict.fromkeys(unit.gpu for unit in units))
    nodes = tuple(dict.fromkeys(cluster.gpus[gpu].gpu.node for gpu in gpus))
    return at, nodes[0], nodes, gpus


def earliest_group(scheduler, request: Request, members: tuple[Request, ...], tiers, events: list[tuple[float, str]],
                   *, now: float) -> Reservation | None:
    """When and where every member of a lease group fits together first as the running work leaves at its expected
    end: after each batch of ends that touches a node of the group's tiers (every batch when over-quota work there
    may turn reclaimable), the reclaimable over-quota work of those tiers taken out (as for a request that may
    spread over nodes), the members are placed in turn through the placement search. ``request``: the oldest
    member, whose id the reservation carries. The working state is as it was afterwards."""
    if not events:
        return None
    cluster = scheduler.cluster
    min_runtime = scheduler.snapshot.min_runtime_seconds
    mine = {member.id for member in members}
    wanted = {tier for options in tiers for tier, _ in options}
    borrowed = sorted((a for a in cluster.allocations.values()
                       if a.preemptible and a.tier in wanted and a.id not in mine), key=lambda a: a.id)
    group_nodes = {gpu.gpu.node for gpu in cluster.gpus.values() if gpu.gpu.model in wanted}

    def reclaimable(allocation: Allocation, at: float) -> bool:
        return (allocation.id in cluster.allocations and allocation.started_at + min_runtime <= at
                and scheduler.protected(allocation, at) is None)

    removed: list[Allocation] = []
    found: tuple[float, list[Allocation]] | None = None
    before: list[str] | None = None  # the reclaimable borrowed work the last try took out (None: not tried yet)
    try:
        index, count = 0, len(events)
        while index < count and found is None:
            at = events[index][0]
            touched = False
            while index < count and events[index][0] == at:
                allocation = cluster.allocations.get(events[index][1])
                index += 1
                if allocation is None:
                    continue
                removed.append(cluster.remove(allocation.id))
                touched = touched or not group_nodes.isdisjoint(cluster._nodes_of(allocation))
            out = [a.id for a in borrowed if reclaimable(a, at)]
            if not touched and out == before:
                continue  # nothing the group could use changed since the last try
            before = out
            gone = [cluster.remove(allocation_id) for allocation_id in out]
            try:  # a cheap test first: room for every member with all reclaimable work gone
                placed = _place_members(scheduler, members, tiers, at=at)
                if placed is not None:
                    for allocation in reversed(placed):
                        cluster.remove(allocation.id)
            finally:
                for allocation in reversed(gone):
                    cluster.apply(allocation)
            if placed is not None:  # then the group as the cycle tries it then: it starts, or reclaims to
                started = _group_starts(scheduler, members, at=at)
                if started is not None:
                    found = (at, started)
    finally:
        for allocation in reversed(removed):
            cluster.apply(allocation)
    if found is None:
        return None
    at, placed = found
    gpus = tuple(dict.fromkeys(unit.gpu for allocation in placed for unit in allocation.units))
    for allocation in placed:
        if allocation.cpu_milli or allocation.host_memory_mib:  # host CPU or memory: the whole node, as alone
            gpus += tuple(gpu.gpu.id for gpu in cluster.nodes[allocation.node].gpus if gpu.gpu.id not in gpus)
    nodes = tuple(dict.fromkeys(cluster.gpus[gpu].gpu.node for gpu in gpus))
    taken = tuple(dict.fromkeys(allocation.tier for allocation in placed))
    return Reservation(request.id, "+".join(taken), at, nodes[0], nodes, gpus, group=request.group,
                       members=tuple(sorted(mine)), tiers=taken)


def reserve(scheduler, requests: list[Request], *, now: float, limit: int,
            aged: frozenset[str] = frozenset()) -> Held | None:
    """The cycle's reservations (module doc, steps 1-2), at most ``limit``, in force (their GPUs closed), or None.
    Each is computed with the GPUs of the older ones closed, so none counts on another's GPUs. ``aged``: the lease
    groups ageing left waiting in this cycle (``holders``)."""
    found = holders(scheduler, requests, now=now, aged=aged)
    fits = next(found)
    durations = {r.id: r.duration_seconds for r in requests if r.duration_seconds}
    events: list | None = None
    held: Held | None = None
    for request, tiers, members in found:
        if events is None:
            events = expected_ends(scheduler, durations, now)
        best: Reservation | None = None
        if members:
            best = earliest_group(scheduler, request, members, tiers, events, now=now)
        for tier, need in () if members else tiers:  # the earliest over its in-quota tiers; ties: the first tried
            reservation = earliest(scheduler, request, tier, need, events, now=now)
            if reservation is not None and (best is None or reservation.start < best.start):
                best = reservation
        if best is None:
            continue
        if held is None:
            held = Held(scheduler)
        held.add(best)
        fits.clear()  # fewer GPUs are open now
        if len(held.by_request) >= limit:
            break
    return held


class Held:
    """The reservations in force during one ``schedule``: each one's GPUs closed to everything but its holder and
    the backfill that ends by its start."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.by_request: dict[str, Reservation] = {}
        self.records: dict[str, tuple[list, list]] = {}  # request -> (open GPU records, closed ones)
        self.closed: set[str] = set()  # requests whose GPUs are closed now
        self.by_group: dict[str, str] = {}  # lease group -> the request its reservation is kept under
        self.trying: set[str] = set()  # the group reservations open to their own members now (``Held.group``)

    def add(self, reservation: Reservation) -> None:
        cluster = self.scheduler.cluster
        opened = [cluster.gpus[gpu_id].gpu for gpu_id in reservation.gpus]
        self.by_request[reservation.request] = reservation
        if reservation.group:
            self.by_group[reservation.group] = reservation.request
        self.records[reservation.request] = (opened, [replace(gpu, closed=True) for gpu in opened])
        self.close([reservation.request])

    def group(self, group: str, attempt, *, now: float) -> list[Decision] | None:
        """``attempt()`` (the scheduler's ``_try_group_now`` for the group's members) under the reservations: the
        group's own reservation open to its members while they are tried, its other members' reservations and
        everyone else's as for any request (``decide``). Placed (or reclaiming): the reservation is released.
        Waiting: closed again, and every member's reason names it."""
        key = self.by_group.get(group)
        if key is None:
            return attempt()
        mine = self.by_request[key]
        self.open([key])
        self.trying.add(key)
        released = False
        try:
            found = attempt()
            released = found is not None and any(d.mode != DecisionMode.WAITING for d in found)
        finally:
            self.trying.discard(key)
            if released:
                del self.by_request[key]  # released: its group starts (the GPUs stay open)
                del self.by_group[group]
            else:
                self.close([key])
        if found is None or released:
            return found  # None: over quota after all, the over-quota pass tries it again, still holding
        words = mine.words(now)
        return [Decision(d.request, d.mode, f"{d.reason}; {words}") for d in found]

    def words_for(self, group: str, now: float) -> str | None:
        """The words of ``group``'s reservation (None: it holds none)."""
        key = self.by_group.get(group)
        return None if key is None else self.by_request[key].words(now)

    @property
    def reservations(self) -> tuple[Reservation, ...]:
        return tuple(self.by_request.values())

    def close(self, requests) -> None:
        records = [gpu for request in requests if request not in self.closed for gpu in self.records[request][1]]
        if records:
            self.scheduler.cluster.replace_gpus(records)
            self.closed.update(requests)

    def open(self, requests) -> None:
        records = [gpu for request in requests if request in self.closed for gpu in self.records[request][0]]
        if records:
            self.scheduler.cluster.replace_gpus(records)
            self.closed.difference_update(requests)

    def open_all(self) -> None:
        self.open(list(self.closed))

    def decide(self, request: Request, attempt, *, now: float) -> Decision | None:
        """``attempt()`` (the scheduler's ``_try`` for ``request``) under the reservations (module doc, step 3)."""
        mine = self.by_request.get(request.id)
        if mine is not None and not mine.group:
            self.open([request.id])
            decision = attempt()
            if decision is not None and decision.mode != DecisionMode.WAITING:
                del self.by_request[request.id]  # released: its holder starts (the GPUs stay open)
                return decision
            self.close([request.id])
            if decision is None:
                return None  # over quota after all: the over-quota pass tries it again, still holding
            return Decision(decision.request, decision.mode, f"{decision.reason}; {mine.words(now)}")
        decision = attempt()
        if decision is None or decision.mode != DecisionMode.WAITING:
            return decision
        ends = now + request.duration_seconds if request.duration_seconds else None
        before = [r.request for r in self.by_request.values()
                  if ends is not None and ends <= r.start and r.request not in self.trying]
        if not before:
            return self._blocked(request, decision, now=now)
        self.open(before)
        try:
            backfilled = attempt()
        finally:
            self.close(before)
        if backfilled is None or backfilled.mode == DecisionMode.WAITING:
            return self._blocked(request, decision, now=now)
        used = ({unit.gpu for unit in backfilled.allocation.units} if backfilled.allocation is not None
                else {backfilled.switch[0]} if backfilled.switch else set())
        onto = [r for r in self.by_request.values() if r.request in before and used.intersection(r.gpus)]
        words = "".join(f"; backfilled: ends by the start of the reservation on {r.node} ({r.start - now:.0f} s "
                        "from now)" for r in onto)
        return replace(backfilled, reason=backfilled.reason + words)

    def _blocked(self, request: Request, decision: Decision, *, now: float) -> Decision:
        """A waiting decision that also names the reservations on its tiers it may not use (the free GPUs it may
        have seen there are held for older requests)."""
        tiers = {tier for tier, _ in self.scheduler.tiers_for(request)}
        held = [r for r in self.by_request.values()
                if r.request not in self.trying and (r.tier in tiers or not tiers.isdisjoint(r.tiers))]
        if not held:
            return decision
        why = ("it has no known duration" if not request.duration_seconds
               else f"it would end after {'that' if len(held) == 1 else 'those'}")
        # absolute times: the words stay the same from cycle to cycle, so the lease is not written again for them
        words = "; ".join(f"{len(r.gpus)} {r.tier} GPU{'s' if len(r.gpus) > 1 else ''} on {r.where} are held for an "
                          f"older {'lease group' if r.group else 'request'} from {_when(r.start)}" for r in held)
        return Decision(decision.request, decision.mode, f"{decision.reason}; {words} ({why})")


__all__ = ["Held", "Reservation", "earliest", "earliest_group", "expected_ends", "group_tiers", "holders",
           "reserve"]
