"""One scheduling cycle: requests in, decisions out.

Order: across projects by fair share, never by priority. Every request that is in quota is served first,
the project using the smallest part of its guarantee first; over-quota requests follow, the project with
the least over-quota usage per weight first; both re-ranked after every admission, which divides idle
capacity by weighted max-min fairness. Priority (then submission time, then id) orders the requests of
one project only. Without quotas (``enforce_quotas=False``, the simulator's baselines) one queue in
priority / submission order.

For each request:
1. Tiers: the allowed models, or for ``auto`` every model that satisfies the shape, cheapest first.
2. Quota: ``limit`` is never exceeded (project and tenant); the request is *in-quota* when the
   project's and the tenant's non-preemptible use plus the request stay within ``deserved``, else it is
   *over-quota* (preemptible, idle capacity only).
3. Placement: a MIG request binds warm instances of its profile on the tier when one node that accepts it
   has enough (``Decision.warm``), else placement through the policy (``placement.Placer``).
4. An in-quota request that does not fit **reclaims**: over-quota allocations of the tier are preempted, only
   those past the minimum runtime. The victim set taking the least GPU capacity (the least beyond the need) wins,
   then the fewest victims, then the best ranked in the victim order: the projects furthest above their fair
   share (over-quota use / weight) first, within a project the lowest priority, then the youngest. An elastic
   allocation (``Allocation.min_units``) may give back units instead, never below its minimum
   (``DecisionMode.SHRINK``). A request that may spread over nodes takes whole victims anywhere, in victim order,
   keeping only those needed. Evaluated on the state and undone when it does not help.
5. Otherwise the request waits, with the reason.

Last, elastic growth (``Scheduler._grow``): an elastic allocation shrunk below its ``count`` takes units back on
what every request left idle, over quota (``DecisionMode.GROW``, in ``Scheduler.grown``).

Lease groups (``Request.group``): the members of a group are served together where the first of them stands,
each as above; all placed in one decision, or none (everything undone: the group reserves nothing), see
``Scheduler._try_group``. Ageing: a group that has waited ``Snapshot.group_reserve_after_seconds`` is served
first and, while it does not fit, reserves the tiers it needs against younger requests
(``Scheduler._serve_aged_groups``), so a stream of small requests cannot starve it.

Reservations (``Scheduler(reservations=True)``; ``broker.scheduler.reserve``): before the passes, the oldest in-quota
requests and lease groups that fit nowhere now hold the GPUs where they will fit first (a group: all its members
together) as the running work reaches its expected end; for the rest of the cycle those GPUs take only their holder
and work that ends by then (``_try`` → ``Held.decide``; a group's members: ``_try_group`` → ``Held.group``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace

from broker.scheduler.fairshare import back_off_words, protected_until, share_key, weights_scale
from broker.scheduler.placement import Need, Placer, Policy, need_for, node_accepts, policy_get
from broker.scheduler.pool_wait import WANTED_MODE
from broker.scheduler.reserve import Held, Reservation, reserve
from broker.scheduler.state import FULL, ClusterState
from broker.scheduler.types import (
    Allocation,
    Decision,
    DecisionMode,
    GpuMode,
    Kind,
    Request,
    Snapshot,
    Unit,
    WorkloadClass,
)
from gpus.catalogue import MODELS
from gpus.mig import COMPUTE_SLICES

_RECLAIMING = (DecisionMode.PREEMPT, DecisionMode.SHRINK)  # a decision whose request starts once capacity is freed
_MODE_WORD = {GpuMode.WHOLE: "whole", GpuMode.MIG: "MIG", GpuMode.SHARED: "shared"}


class _SwitchRoom:
    """What a GPU being switched to ``mode`` has left for the waiting requests of one cycle (``Scheduler._switch_for``):
    MIG compute slices and memory slots (a count, not a layout: a sum that fits may still find no common layout, and
    then a request placed after the switch reclaims again), the one whole unit, or a share's milli and memory."""

    __slots__ = ("compute", "memory_mib", "milli", "mode", "slots", "tier")

    def __init__(self, tier: str, mode: GpuMode, memory_mib: int):
        self.tier, self.mode = tier, mode
        self.compute, self.slots, self.milli, self.memory_mib = COMPUTE_SLICES, 8, FULL, memory_mib

    def take(self, need: Need, node) -> bool:
        """Take one unit of ``need`` (False: no room left, or ``node`` does not take it)."""
        if node is not None and not node_accepts(node, need):
            return False
        if need.kind == Kind.MIG:
            profile = need.profile
            if profile is None or profile.compute_slices > self.compute or profile.memory_slots > self.slots:
                return False
            self.compute -= profile.compute_slices
            self.slots -= profile.memory_slots
            return True
        if need.kind == Kind.WHOLE:
            if self.milli < FULL:
                return False
            self.milli = 0
            return True
        if need.milli > self.milli or need.memory_mib > self.memory_mib:
            return False
        self.milli -= need.milli
        self.memory_mib -= need.memory_mib
        return True


@dataclass
class _Quota:
    deserved: int
    limit: int
    weight: int = 1


class Scheduler:
    """Holds the working state across cycles (the simulator) or for one cycle (``plan``)."""

    def __init__(self, snapshot: Snapshot, *, policy: Policy | str = "default", seed: int = 0, workload=None,
                 reservations: bool = False, ends: dict[str, float] | None = None, reservation_limit: int = 4,
                 reserve_after_seconds: float = 0.0, grow: bool = True):
        self.snapshot = snapshot
        # elastic growth (``_grow``): a shrunk elastic allocation takes units back on what the cycle left idle
        self.grow = grow
        self.grown: list[Decision] = []  # the last schedule()'s growth decisions (``DecisionMode.GROW``)
        self._vacating: set[str] = set()  # GPUs a reclaim of this cycle frees only once its victims leave
        # reclaim across modes (``_switch_for``): per GPU being switched, the room its new mode has left this cycle
        self._switch_room: dict[str, _SwitchRoom] = {}
        self._reclaimable_seen: tuple | None = None  # ((request id, tier, need), the last ``_reclaim``'s candidates)
        # (tier, wanted mode) -> the tier's GPUs in each other mode, counted once a cycle (``_other_modes``)
        self._other_mode_counts: dict[tuple[str, str], dict[str, int]] = {}
        # (tier, wanted mode) -> (``ClusterState.changes`` when worded, the words): waiting requests in a row
        # without a change between them share one count of the fleet's GPUs
        self._other_mode_text: dict[tuple[str, str], tuple[int, str]] = {}
        # reservations and conservative backfill from lease durations (``broker.scheduler.reserve``); ``ends``: the
        # running allocations' expected ends when they are not the snapshot's (the simulator keeps its own)
        self.reservations = reservations
        self.reservation_limit = reservation_limit  # how many requests reserve at most in one cycle, oldest first
        self.reserve_after_seconds = reserve_after_seconds  # and only once they have waited this long
        self.ends = snapshot.ends_at if ends is None else ends
        self.reserved: tuple[Reservation, ...] = ()  # the last schedule()'s whose holders still wait
        self._held: Held | None = None
        self.policy = policy if isinstance(policy, Policy) else policy_get(policy, seed=seed, workload=workload)
        self.cluster = ClusterState.from_snapshot(snapshot, legacy_classes=self.policy.uses_random)
        self._running_at_start: set[str] = set(self.cluster.allocations)  # reset by each schedule()
        self._reserved: dict[str, float] = {}  # tier -> since when an aged group holds it (reset by schedule())
        self._decided_groups: set[str] = set()  # the groups ageing decided in this cycle (reset by schedule())
        self.placer = Placer(self.cluster, self.policy)
        self.quotas = {(q.project, q.tier): _Quota(q.deserved_milli, q.limit_milli, q.weight) for q in snapshot.quotas}
        self.tenant_quotas = {
            (q.tenant, q.tier): _Quota(q.deserved_milli, q.limit_milli) for q in snapshot.tenant_quotas
        }
        # cohorts: members per cohort (sorted), each member's spec per tier, the guarantee of all members per tier
        self._cohort_members: dict[str, list[str]] = {}
        for tenant, cohort in sorted(snapshot.cohorts.items()):
            if cohort:
                self._cohort_members.setdefault(cohort, []).append(tenant)
        self._cohort_specs = {(q.tenant, q.tier): q for q in snapshot.tenant_quotas
                              if snapshot.cohorts.get(q.tenant)}
        self._cohort_guaranteed: dict[str, int] = {}
        for (_tenant, tier), spec in self._cohort_specs.items():
            self._cohort_guaranteed[tier] = self._cohort_guaranteed.get(tier, 0) + spec.deserved_milli
        self.models_present = sorted(self.cluster.capacity_milli_by_model)
        # tiers per shape: the models present and the prices are fixed for the scheduler's life
        self._tiers: dict = {}
        # fair share with history (``fairshare``): integer share keys on one scale, the decayed use per project
        self._half_life = max(int(snapshot.usage_half_life_seconds), 0)
        self._scale = weights_scale(q.weight for q in snapshot.quotas)
        self._history = ({(u.project, u.tier): u.decayed_milli_seconds for u in snapshot.usage_history}
                         if self._half_life else {})

    # -- tiers ------------------------------------------------------------------------------------
    def tiers_for(self, request: Request) -> list[tuple[str, Need]]:
        """The (model, resolved need) pairs the request may run on, in the order they are tried (a shared
        list: callers do not change it). A request of a project bound to node pools (``Snapshot.project_pools``)
        whose shape names none is placed in its project's pools."""
        shape = request.shape
        if not shape.pools and self.snapshot.project_pools:
            pools = self.snapshot.project_pools.get(request.project)
            if pools:
                shape = replace(shape, pools=tuple(pools))
        tiers = self._tiers.get(shape)
        if tiers is None:
            tiers = self._tiers[shape] = self._tiers_for(shape)
        return tiers

    def _tiers_for(self, shape) -> list[tuple[str, Need]]:
        models = shape.models or tuple(self.models_present)
        out = []
        for model in models:
            if model not in self.cluster.capacity_milli_by_model:
                continue
            need = need_for(shape, model)
            if need is not None:
                out.append((model, need))
        if not shape.models:  # auto: cheapest per unit of work first, then smallest model
            prices = self.snapshot.prices
            memory = {m.code: m.memory_mib for m in MODELS}
            out.sort(key=lambda item: (prices.get(item[0], 10**12) * item[1].milli, memory.get(item[0], 0), item[0]))
        return out

    @property
    def reservation(self) -> Reservation | None:
        """The oldest of the last cycle's reservations whose holder still waits (None: none)."""
        return self.reserved[0] if self.reserved else None

    # -- quota ------------------------------------------------------------------------------------
    def covered(self, requests: list[Request]) -> dict[str, bool]:
        """Whether each request is covered by its project's guarantee *counting the project's work ahead of it*
        (call before ``schedule``, on the state as read): on some tier the request may run on, the project's
        guaranteed use (its in-quota allocations), plus every request of the project ahead of it in the project's
        own order (priority, then submission time, then id: the order ``schedule`` serves one project in) that may
        run on that tier, plus the request itself, is within the project's deserved share of the tier, and its
        tenant's guaranteed use plus the request is within the tenant's deserved share where the tenant has one
        (``quota_check``'s in-quota rule, with the project's own queue added).

        A request that is in quota only once its own project's earlier requests have run is not covered: its wait
        is the project's own queue, which neither the scheduler nor the capacity loop reorders. The service records
        this once per lease, on the first cycle that sees it, and billing samples time to GPU only for covered
        leases (``billing.core.slo``); the capacity replay counts its in-quota arrivals by a like rule. Without quota
        enforcement every request is covered."""
        if not self.snapshot.enforce_quotas:
            return {request.id: True for request in requests}
        ahead: dict[tuple[str, str], int] = {}
        usage, tenant_usage = self.cluster.project_usage, self.cluster.tenant_usage
        out: dict[str, bool] = {}
        for request in sorted(requests, key=lambda r: (-r.priority, r.submitted_at, r.id)):
            tiers = self.tiers_for(request)
            covered = False
            for tier, need in tiers:
                quota = self.quotas.get((request.project, tier))
                if quota is None:
                    continue
                amount = need.total_milli
                used = usage.get((request.project, tier), (0, 0))[0] + ahead.get((request.project, tier), 0)
                if used + amount > quota.deserved:
                    continue
                tenant_quota = self.tenant_quotas.get((request.tenant, tier))
                if tenant_quota is None or tenant_usage.get((request.tenant, tier), (0, 0))[0] + amount <= (
                        tenant_quota.deserved):
                    covered = True
                    break
            out[request.id] = covered
            for tier, need in tiers:  # it may run on any of them: it is ahead of the project's later work on each
                ahead[(request.project, tier)] = ahead.get((request.project, tier), 0) + need.total_milli
        return out

    def quota_check(self, request: Request, tier: str, need: Need) -> tuple[str | None, bool]:
        """(reason it must wait, in_quota)."""
        if not self.snapshot.enforce_quotas:
            return None, True
        quota = self.quotas.get((request.project, tier))
        if quota is None:
            return f"project {request.project} has no quota for {tier}", False
        used_in, used_over = self.cluster.project_usage.get((request.project, tier), [0, 0])
        amount = need.total_milli
        if used_in + used_over + amount > quota.limit:
            return (
                f"project quota limit for {tier} exhausted ({used_in + used_over}/{quota.limit} milli in use, "
                f"request needs {amount})"
            ), False
        tenant_quota = self.tenant_quotas.get((request.tenant, tier))
        tenant_in, tenant_over = self.cluster.tenant_usage.get((request.tenant, tier), [0, 0])
        if tenant_quota is not None and tenant_in + tenant_over + amount > tenant_quota.limit:
            return (
                f"tenant quota limit for {tier} exhausted ({tenant_in + tenant_over}/{tenant_quota.limit} milli in use)"
            ), False
        in_quota = used_in + amount <= quota.deserved and (
            tenant_quota is None or tenant_in + amount <= tenant_quota.deserved
        )
        if not in_quota and quota.weight == 0:
            return (
                f"project quota for {tier} exhausted ({used_in}/{quota.deserved} milli guaranteed in use) "
                f"and the project does not borrow (over-quota weight 0)"
            ), False
        return None, in_quota

    def cohort_check(self, tenant: str, tier: str, amount: int) -> str | None:
        """Why ``tenant`` may not borrow ``amount`` milli more of ``tier`` over quota under the cohorts (None: it
        may). Kueue's cohorts on our tenant quotas, in integers:

        - the tier's capacity splits into the guarantees (``deserved``) of the tenants that are members of a
          cohort, and the rest (none when they exceed it): the *free pool*, borrowable by every tenant
          (tenants in no cohort keep their guarantee in it, as without cohorts);
        - a member's use beyond its own guarantee (its *overflow*) is served first by what its cohort's members
          lend: each member's idle guarantee (``deserved`` less its use), at most its ``lending_limit_milli``;
          what the cohort lends does not cover spills into the free pool;
        - the free pool holds the use of every tenant in no cohort plus every cohort's spill; a request whose
          admission would take it over its size waits. A member's overflow also stays within its
          ``borrowing_limit_milli``.

        One cohort holding every tenant, no lending limits: the sum of all use stays within the capacity, which
        placement guarantees anyway, so decisions equal those without cohorts."""
        usage = self.cluster.tenant_usage
        cohorts = self.snapshot.cohorts
        mine = cohorts.get(tenant, "")
        if mine:
            spec = self._cohort_specs.get((tenant, tier))
            deserved = spec.deserved_milli if spec else 0
            if spec is not None and spec.borrowing_limit_milli >= 0:
                used = sum(usage.get((tenant, tier), (0, 0)))
                if used + amount - deserved > spec.borrowing_limit_milli:
                    return (f"tenant borrowing limit for {tier} in cohort {mine} reached ({max(used - deserved, 0)}"
                            f"/{spec.borrowing_limit_milli} milli beyond its guarantee in use, request needs {amount})")
        # (guarantees above the capacity leave no free pool)
        free_pool = max(self.cluster.capacity_milli_by_model.get(tier, 0) - self._cohort_guaranteed.get(tier, 0), 0)
        outside = 0  # the use of tenants in no cohort
        for (owner, owner_tier), (used_in, used_over) in usage.items():
            if owner_tier == tier and not cohorts.get(owner):
                outside += used_in + used_over
        if not mine:
            outside += amount
        spill_total, lent_to_me = 0, 0
        for cohort, members in self._cohort_members.items():
            overflow = lend = 0
            for member in members:
                spec = self._cohort_specs.get((member, tier))
                deserved = spec.deserved_milli if spec else 0
                used = sum(usage.get((member, tier), (0, 0))) + (amount if member == tenant else 0)
                if used > deserved:
                    overflow += used - deserved
                elif spec is not None:
                    idle = deserved - used
                    lend += idle if spec.lending_limit_milli < 0 else min(idle, spec.lending_limit_milli)
            spill_total += max(overflow - lend, 0)
            if cohort == mine:
                lent_to_me = lend
        if outside + spill_total <= free_pool:
            return None
        if mine:
            return (f"over quota on {tier}: no capacity left to borrow for cohort {mine} (its members lend at most "
                    f"{lent_to_me} milli of idle guarantee, their lending limits, and it is borrowed; the rest of "
                    "the idle capacity is guaranteed to other cohorts' tenants)")
        return (f"over quota on {tier}: the idle capacity is guaranteed to tenants of a cohort and lent only within "
                f"it; {max(free_pool - (outside - amount) - spill_total, 0)} milli is borrowable by tenants in no "
                f"cohort, request needs {amount}")

    def over_share(self, project: str, tier: str) -> tuple[int, int]:
        """The project's fair-share key on ``tier`` (``fairshare.share_key``): its borrowed use now and, with a
        half-life, its decayed borrowed use, per weight, as an exact integer."""
        quota = self.quotas.get((project, tier))
        over = self.cluster.project_usage.get((project, tier), [0, 0])[1]
        return share_key(over_milli=over, decayed_milli_seconds=self._history.get((project, tier), 0),
                         weight=quota.weight if quota else 1, half_life_seconds=self._half_life, scale=self._scale)

    def history_words(self, project: str, tier: str) -> str:
        """The project's standing in the fair share for a reason ("" without a half-life)."""
        if not self._half_life:
            return ""
        quota = self.quotas.get((project, tier))
        used = self._history.get((project, tier), 0) / 3_600_000
        return (f"; fair share: project {project} borrowed {used:.1f} GPU-h of {tier} decayed over a half-life of "
                f"{self._half_life} s (weight {quota.weight if quota else 1}); less history is served first")

    def protected(self, allocation: Allocation, now: float) -> float | None:
        """Until when ``allocation`` is protected from reclaim by the preemption back-off (None: it is not)."""
        snapshot = self.snapshot
        times = snapshot.preempted_at.get(allocation.id)
        if not times:
            return None
        until = protected_until(times, allocation.started_at, count=snapshot.backoff_preemptions,
                                window=snapshot.backoff_window_seconds, protect=snapshot.backoff_protect_seconds)
        return until if until is not None and now < until else None

    # -- one cycle --------------------------------------------------------------------------------
    def schedule(self, requests: list[Request], *, now: float) -> list[Decision]:
        """Decide every request. Across projects the order is fair share, never priority: the in-quota
        pass serves the project using the smallest part of its guarantee first, the over-quota pass the
        project with the least over-quota use per weight; both re-rank after every admission. Priority
        (then submission time, then id) orders the requests of one project only, so what one project
        sends as priority cannot move another project's work."""
        decisions: dict[str, Decision] = {}
        served: list[str] = []
        by_project: dict[str, list[Request]] = {}
        self._running_at_start = set(self.cluster.allocations)  # a reclaim's victims must be among these
        self._reserved = {}
        self.grown = []
        self._vacating = set()
        self._switch_room = self._rooms_switching()
        self._other_mode_counts = {}
        self._other_mode_text = {}
        groups: dict[str, list[Request]] = {}
        leaders: list[Request] = []
        for request in sorted(requests, key=lambda r: (-r.priority, r.submitted_at, r.id)):
            if request.group:
                members = groups.setdefault(request.group, [])
                members.append(request)
                if len(members) > 1:
                    continue  # served with its group's leader: the member that comes first in this order
            leaders.append(request)

        def record(found: list[Decision]) -> None:
            for decision in found:
                decisions[decision.request] = decision
                served.append(decision.request)

        decided = self._decided_groups = self._serve_aged_groups(groups, now=now, record=record)
        self.reserved = ()
        if self.reservations:  # the oldest in-quota requests that cannot start hold GPUs from when they will fit
            aged = frozenset(key for key in decided
                             if all(decisions[m.id].mode == DecisionMode.WAITING for m in groups[key]))
            self._held = reserve(self, requests, now=now, limit=self.reservation_limit, aged=aged)
            for key in aged:  # ageing decided them before: their reasons name their reservation now
                words = self._held.words_for(key, now) if self._held is not None else None
                if words is not None:
                    for member in groups[key]:
                        found = decisions[member.id]
                        decisions[member.id] = Decision(found.request, found.mode, f"{found.reason}; {words}")
        for request in leaders:
            if request.group and request.group in decided:
                continue
            # without quotas (the simulator's FIFO baseline) there is no share to keep: one queue
            by_project.setdefault(request.project if self.snapshot.enforce_quotas else "", []).append(request)
        # in-quota pass: a request that is in-quota now is served before any over-quota one
        deferred: dict[str, list[Request]] = {}

        def in_quota_pass(request: Request) -> None:
            if request.group:
                found = self._try_group(groups[request.group], now=now, allow_over_quota=False)
                decision = found[0] if found else None
            else:
                decision = self._try(request, now=now, allow_over_quota=False)
                found = [decision]
            if decision is None:
                deferred.setdefault(request.project if self.snapshot.enforce_quotas else "", []).append(request)
            else:
                record(found)

        self._fair_rounds(by_project, self._guarantee_key, in_quota_pass)

        # over-quota pass: weighted max-min fairness of the idle capacity
        def over_quota_pass(request: Request) -> None:
            if request.group:
                found = self._try_group(groups[request.group], now=now, allow_over_quota=True)
                assert found is not None
                record(found)
                return
            decision = self._try(request, now=now, allow_over_quota=True)
            assert decision is not None
            decisions[request.id] = decision
            served.append(request.id)

        self._fair_rounds(deferred, self._fair_key, over_quota_pass)
        if self._held is not None:  # the holders that still wait: their GPUs open again (the state is the plan's)
            self._held.open_all()
            self.reserved = self._held.reservations
            self._held = None
        if self.grow and self.cluster.growable:  # the lowest priority: what every request left idle
            self.grown = self._grow(decisions, requests, now=now)
        ordered = []
        waiting_position = 0
        for request_id in served:
            decision = decisions[request_id]
            if decision.mode == DecisionMode.WAITING:
                waiting_position += 1
                decision = Decision(decision.request, decision.mode, decision.reason, queue_position=waiting_position)
            ordered.append(decision)
        return ordered

    def _serve_aged_groups(self, groups: dict[str, list[Request]], *, now: float, record) -> set[str]:
        """Ageing, so a large lease group is not starved by a stream of smaller requests that each fit where it
        does not: a group whose oldest member has waited ``Snapshot.group_reserve_after_seconds`` or longer is
        served before the fair-share rounds (oldest group first), in quota only. Placed: done. Waiting for
        capacity: it **reserves** every tier its members have quota on — a request submitted after the group's
        oldest member is not placed on such a tier (nor reclaims there) in this cycle, so capacity that frees
        gathers for the group until it fits; older requests and the group's own members are not held back. A
        group over quota, or one that only quota holds back, reserves nothing and is left to the usual passes.
        Returns the groups decided here."""
        bound = self.snapshot.group_reserve_after_seconds
        decided: set[str] = set()
        if bound <= 0:
            return decided
        aged = sorted((min(m.submitted_at for m in members), key) for key, members in groups.items()
                      if now - min(m.submitted_at for m in members) >= bound)
        for since, key in aged:
            members = groups[key]
            found = self._try_group(members, now=now, allow_over_quota=False)
            if found is None:
                continue  # over quota: borrowing reserves nothing
            if any(d.mode != DecisionMode.WAITING for d in found):
                record(found)
                decided.add(key)
                continue
            tiers = self._group_quota_tiers(members)
            if not tiers:
                continue  # quota holds it back, not capacity
            for tier in tiers:
                self._reserved.setdefault(tier, since)
            held = (f"; waiting {now - since:.0f} s (over {bound:.0f} s): the group reserves {', '.join(tiers)} "
                    "against younger requests until it fits")
            record([Decision(d.request, d.mode, d.reason + held) for d in found])
            decided.add(key)
        return decided

    def _group_quota_tiers(self, members: list[Request]) -> list[str]:
        """The tiers on which the whole group's need (every member that may run there) stays within the limits
        of its projects and its tenant: those it could hold once capacity frees, so those it may reserve."""
        need_on: dict[str, dict[tuple[str, str], int]] = {}
        for member in members:
            for tier, need in self.tiers_for(member):
                by_owner = need_on.setdefault(tier, {})
                for owner in (("project", member.project), ("tenant", member.tenant)):
                    by_owner[owner] = by_owner.get(owner, 0) + need.total_milli
        found = []
        for tier, by_owner in need_on.items():
            fits = True
            for (kind, owner), amount in by_owner.items():
                if not self.snapshot.enforce_quotas:
                    break
                quotas, usage = ((self.quotas, self.cluster.project_usage) if kind == "project"
                                 else (self.tenant_quotas, self.cluster.tenant_usage))
                quota = quotas.get((owner, tier))
                if quota is None:
                    fits = fits and kind == "tenant"  # no project quota: nothing to run on; no tenant bound: fine
                    continue
                fits = fits and sum(usage.get((owner, tier), [0, 0])) + amount <= quota.limit
            if fits:
                found.append(tier)
        return sorted(found)

    @staticmethod
    def _fair_rounds(queues: dict[str, list[Request]], project_key, serve) -> None:
        """Serve every queue (one per project, already in its own priority order): each step the project
        whose head has the smallest ``project_key`` (ties: the project id), re-ranked after each step.
        The tie-break depends neither on priorities nor on which requests failed (the simulator prunes
        those that cannot be placed and must reach the same decisions). Only the served project's key is
        recomputed: serving one project changes no other's key (in-quota use grows only with its own
        admissions, over-quota use likewise; reclaim takes over-quota work, which the guarantee key does
        not count)."""
        # a heap of (key, project, position of its head): one entry per project with requests left, so the
        # smallest entry is the smallest (key, project) of a scan of every project's key, at log cost per step
        heap = [(project_key(queue[0]), project, 0) for project, queue in queues.items()]
        heapq.heapify(heap)
        while heap:
            _key, project, head = heap[0]
            queue = queues[project]
            serve(queue[head])
            head += 1
            if head == len(queue):
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (project_key(queue[head]), project, head))

    def _guarantee_key(self, request: Request) -> float:
        """The part of its guarantee (``deserved``) the request's project already uses, on the best of the
        request's tiers: the project furthest from its guarantee is served first."""
        shares = []
        for tier, _need in self.tiers_for(request):
            quota = self.quotas.get((request.project, tier))
            if quota is None or quota.deserved <= 0:
                continue
            used_in = self.cluster.project_usage.get((request.project, tier), [0, 0])[0]
            shares.append(used_in / quota.deserved)
        return min(shares, default=0.0)

    def _fair_key(self, request: Request) -> tuple[int, int]:
        tiers = self.tiers_for(request)
        return min((self.over_share(request.project, tier) for tier, _ in tiers), default=(0, 0))

    def _try_group(self, members: list[Request], *, now: float, allow_over_quota: bool) -> list[Decision] | None:
        """Decisions for a lease group, all in one: every member is tried in turn on the working state (its
        own tiers, quota check and placement, as a request alone; the members placed before it count in its
        quota use and occupy their capacity). When one member must wait, everything the group did is undone
        and every member waits, naming the member that does not fit: the group takes nothing and smaller
        requests behind it are served as if it were not there (a group that holds a reservation has its GPUs
        open to its members only while they are tried, and releases it once placed: ``Held.group``). None: some
        member is over quota and the in-quota pass defers the whole group. When a member needs a reclaim, no
        member starts: the reclaiming members give their victims notice and the others wait (their capacity held
        for the rest of this cycle), so the whole group is placed together in a later cycle once the victims have
        left."""
        if self._held is not None and self._held.by_group:  # the group's reservation open to its members only
            return self._held.group(members[0].group, lambda: self._try_group_now(
                members, now=now, allow_over_quota=allow_over_quota), now=now)
        return self._try_group_now(members, now=now, allow_over_quota=allow_over_quota)

    def _try_group_now(self, members: list[Request], *, now: float, allow_over_quota: bool) -> list[Decision] | None:
        if len(members) == 1:
            decision = self._try(members[0], now=now, allow_over_quota=allow_over_quota)
            return None if decision is None else [decision]
        allocations_before = dict(self.cluster.allocations)
        warm_before = dict(self.cluster.warm)
        group = members[0].group
        done: list[Decision] = []
        for member in members:
            decision = self._try(member, now=now, allow_over_quota=allow_over_quota)
            if decision is None or decision.mode == DecisionMode.WAITING:
                self._undo(done, allocations_before, warm_before)
                if decision is None:
                    return None
                why = decision.reason.removeprefix("waiting: ")
                tail = f"no member is placed until all {len(members)} fit"
                return [
                    self._waiting(other, f"group {group}: request {member.id} ({_describe(member)}) does not fit: "
                                         f"{why}; {tail}")
                    for other in members
                ]
            done.append(decision)
        fresh = sorted({v for d in done for v in (*d.victims, *(a for a, _ in d.shrunk))} - self._running_at_start)
        if fresh:
            # a group served in the over-quota pass would reclaim what this very cycle placed: not a running
            # allocation, so nothing to give notice to; the group waits, and reclaims next cycle if it must
            self._undo(done, allocations_before, warm_before)
            return [self._waiting(other, f"group {group}: would reclaim capacity placed in this cycle "
                                         f"({', '.join(fresh)}); waits for the next")
                    for other in members]
        reclaiming = [d.request for d in done if d.mode in _RECLAIMING]
        if not reclaiming:
            together = f"; with group {group} ({len(members)} members placed together)"
            return [Decision(d.request, d.mode, d.reason + together, allocation=d.allocation, victims=d.victims,
                             warm=d.warm) for d in done]
        names = ", ".join(f"request {r}" for r in reclaiming)
        # the members that would start now wait for the others: what they took goes back to the working state
        # (kept, it was capacity no decision holds, and a later request could pick it as a victim)
        self._undo([d for d in done if d.mode not in _RECLAIMING], allocations_before, warm_before)
        return [d if d.mode in _RECLAIMING else self._waiting_for(d.request, (
            f"group {group}: starts with its other members once the capacity reclaimed for {names} is free"))
            for d in done]

    def _undo(self, decisions: list[Decision], allocations_before: dict[str, Allocation],
              warm_before: dict) -> None:
        """Take back what ``decisions`` did to the working state, latest first: the allocation placed, the
        victims it preempted, the warm instances it bound."""
        for decision in reversed(decisions):
            self.cluster.remove(decision.allocation.id)
            for victim in decision.victims:
                self.cluster.apply(allocations_before[victim])
            for shrunk, _units in decision.shrunk:
                self.cluster.remove(shrunk)
                self.cluster.apply(allocations_before[shrunk])
            for warm_id in decision.warm:
                self.cluster.apply_warm(warm_before[warm_id])

    def _try(self, request: Request, *, now: float, allow_over_quota: bool) -> Decision | None:
        """A decision, or None when the request is over-quota and over-quota admission comes later. Under a
        reservation, only its holder and work that ends by its start may use the GPUs it holds."""
        if self._held is None or not self._held.by_request:
            return self._try_now(request, now=now, allow_over_quota=allow_over_quota)
        return self._held.decide(
            request, lambda: self._try_now(request, now=now, allow_over_quota=allow_over_quota), now=now)

    def _try_now(self, request: Request, *, now: float, allow_over_quota: bool) -> Decision | None:
        tiers = self.tiers_for(request)
        shape = request.shape
        if not shape.gang and shape.count > 1 and (shape.cpu_milli or shape.host_memory_mib):
            return self._waiting(request, "a request spread over several nodes (gang off) cannot reserve host "
                                          "CPU or memory; ask for a gang or leave them out")
        if not tiers:
            wanted = ", ".join(request.shape.models) or "any model here"
            return self._waiting(request, f"no GPU model offers this shape ({_describe(request)}) on {wanted}")
        reasons: list[str] = []
        over_quota_candidates: list[tuple[str, Need]] = []
        for tier, need in tiers:
            since = self._reserved.get(tier)
            if since is not None and request.submitted_at > since:
                # an aged lease group reserves the tier (``_serve_aged_groups``): its own members were tried there
                reasons.append(f"{tier} is reserved for an older lease group that has waited too long "
                               "(ageing); younger requests wait until it is placed")
                continue
            reason, in_quota = self.quota_check(request, tier, need)
            if reason:
                reasons.append(reason)
                continue
            if not in_quota:
                if request.workload_class == WorkloadClass.INTERACTIVE:
                    # interactive work is never preemptible, so it never borrows: it waits for its deserved
                    # quota (training borrows idle capacity over quota and may be preempted)
                    reasons.append(f"interactive work runs only within the guaranteed quota; {tier}'s is in use")
                    continue
                over_quota_candidates.append((tier, need))
                continue
            placed = self._place(request, tier, need, preemptible=False, now=now)
            if placed:
                return placed
            reclaimed = self._reclaim(request, tier, need, now=now)
            if reclaimed:
                return reclaimed
            if self.snapshot.switch_modes:
                switched = self._switch_for(request, tier, need, now=now)
                self._reclaimable_seen = None
                if switched:
                    return switched
            reasons.append(self._no_fit_reason(tier, need) + self._protected_words(tier, now)
                           + self._min_runtime_words(tier, need, now))
        if over_quota_candidates:
            if not allow_over_quota:
                return None
            for tier, need in over_quota_candidates:
                if self._cohort_members:
                    refused = self.cohort_check(request.tenant, tier, need.total_milli)
                    if refused:
                        reasons.append(refused)
                        continue
                placed = self._place(request, tier, need, preemptible=True, now=now)
                if placed:
                    return placed
                reasons.append(f"over quota on {tier} and no idle capacity: {self._no_fit_reason(tier, need)}"
                               + self.history_words(request.project, tier))
        return self._waiting(request, "; ".join(dict.fromkeys(reasons)))

    def place(self, request: Request, tier: str, need: Need, *, preemptible: bool, now: float) -> Decision | None:
        """Place one resolved need through the policy, without quota checks (the trace simulator's entry)."""
        return self._place(request, tier, need, preemptible=preemptible, now=now)

    def _place(self, request: Request, tier: str, need: Need, *, preemptible: bool, now: float):
        warm_ids: tuple[str, ...] = ()
        bound = self._warm_for(tier, need) if self.cluster.warm_index else None
        if bound is not None:  # a warm instance of the profile: bind it, no placement search
            node_id, warm_ids = bound
            found = (node_id, tuple(self.cluster.warm_units[warm_id] for warm_id in warm_ids))
            for warm_id in warm_ids:
                self.cluster.remove_warm(warm_id)
        else:
            found = self._find(need)
            if found is None:
                return None
        allocation = self._allocation(request, tier, need, found, preemptible=preemptible, now=now)
        self.cluster.apply(allocation)
        kind = "over quota, preemptible" if preemptible else "within quota"
        reason = f"placed on {allocation.node} ({tier}, {kind})"
        if preemptible and self.snapshot.preempted_at.get(request.id):
            reason += self._back_off_words(allocation, now)
        if preemptible and request.tenant in self.snapshot.min_runtime_by_tenant:
            reason += (f"; not reclaimed before its minimum runtime of {self.min_runtime(allocation):.0f} s "
                       "(its SLO contract)")
        if warm_ids:
            reason += f", binding warm instance{'s' if len(warm_ids) > 1 else ''} {', '.join(warm_ids)}"
        if request.shape is not None and not request.shape.models:
            reason += "; " + self.auto_reason(request, tier)
        return Decision(request.id, DecisionMode.PLACED, reason, allocation=allocation, warm=warm_ids)

    def _warm_for(self, tier: str, need: Need) -> tuple[str, tuple[str, ...]] | None:
        """The node and the warm instances a MIG need binds on ``tier``: ``count`` instances of its profile
        on one node that accepts the request (not cordoned, its host CPU and memory free), the lowest
        (node, GPU index, start, id) first; None when there are not that many."""
        if need.kind != Kind.MIG or need.profile is None or need.count < 1:
            return None
        entries = self.cluster.warm_index.get((tier, need.profile.name))
        if not entries or len(entries) < need.count:
            return None
        node_id: str | None = None
        accepts, chosen = False, []
        for entry_node, _index, _start, warm_id in entries:  # in order, so one node's entries are together
            if entry_node != node_id:
                node_id, chosen = entry_node, []
                accepts = node_accepts(self.cluster.nodes[node_id], need)
            if accepts:
                chosen.append(warm_id)
                if len(chosen) == need.count:
                    return node_id, tuple(chosen)
        return None

    def auto_reason(self, request: Request, tier: str) -> str:
        """Why ``auto`` chose ``tier``: its price, and why cheaper models were passed over."""
        price = self.snapshot.prices.get(tier)
        labels = self.snapshot.price_labels
        text = f"auto: {tier}" + (f" at {labels.get(tier, price)} per GPU-hour" if price is not None else "")
        passed = []
        for model in self.models_present:
            if model == tier:
                continue
            other = self.snapshot.prices.get(model)
            if other is None or price is None or other >= price:
                continue
            if need_for(request.shape, model) is None:
                passed.append(f"{model} ({labels.get(model, other)}) cannot serve the shape")
            else:
                passed.append(f"{model} ({labels.get(model, other)}) has no room or quota")
        return text + ("; cheaper: " + ", ".join(passed) if passed else ", the cheapest that fits")

    def _find(self, need: Need):
        if need.gang or need.count <= 1:
            return self.placer.find(need)
        if need.cpu_milli or need.host_memory_mib:
            return None  # a request spread over nodes cannot reserve host CPU/memory (reason in _try)
        # not a gang: place units one at a time (all-or-nothing), possibly on several nodes
        single = Need(need.kind, 1, need.models, need.milli, need.memory_mib, need.profile, True, 0, 0,
                      need.avoid, need.pools)
        held = []
        for index in range(need.count):
            found = self.placer.find(single)
            if found is None:
                break
            temp = Allocation(f"__tmp{index}", "", "", "", found[0], found[1], True)
            self.cluster.apply(temp)
            held.append(temp)
        for temp in held:
            self.cluster.remove(temp.id)
        if len(held) < need.count:
            return None
        return "multi", tuple(held)

    def _allocation(self, request, tier, need, found, *, preemptible, now) -> Allocation:
        node_id, units = found
        if node_id == "multi":  # spread over nodes: one allocation per request, first node recorded
            units = tuple(unit for temp in units for unit in temp.units)
            node_id = found[1][0].node
        return Allocation(
            id=request.id,
            project=request.project,
            tenant=request.tenant,
            tier=tier,
            node=node_id,
            units=units,
            preemptible=preemptible,
            started_at=now,
            priority=request.priority,
            cpu_milli=need.cpu_milli,
            host_memory_mib=need.host_memory_mib,
            group=request.group,
            min_units=(elastic := _elastic_min(request.shape)),
            grow_to=request.shape.count if elastic else 0,
            grow_spread=bool(elastic) and not request.shape.gang,
        )

    # -- elastic growth ---------------------------------------------------------------------------
    def _grow(self, decisions: dict[str, Decision], requests: list[Request], *, now: float) -> list[Decision]:
        """Elastic leases shrunk under reclaim grow back toward their ``count`` (``Allocation.grow_to``) on the
        capacity this cycle left idle, after every request was decided: the lowest priority. Growing is borrowing
        over quota, as the elastic lease's own placement was (an elastic lease shrinks only while it borrows): the
        added units are preemptible, within the project's and the tenant's ``limit``, never for a project of
        over-quota weight 0, within the cohorts' bounds. Not grown: an allocation placed in this cycle or touched by
        one of its reclaims; never onto a GPU a reclaim of this cycle frees (its victims still hold it) or one a
        reservation holds; never on a tier where a request still waiting could use the idle capacity (it passes
        its quota check there and fits now: it waits for something else, a group's other member, an ageing
        group's reservation, and keeps the capacity). Order: the fair share of the over-quota pass — the project
        with the least borrowed use per weight first (``over_share``), re-ranked after each growth (ties: the
        project id) — then, within a project, the highest priority, the oldest, the id. One decision per
        allocation per cycle, for as many units as fit (``_grow_one``)."""
        touched: set[str] = set()
        for decision in decisions.values():
            touched.update(decision.victims)
            touched.update(allocation_id for allocation_id, _ in decision.shrunk)
        allocations = self.cluster.allocations
        candidates = [allocations[allocation_id] for allocation_id in sorted(self.cluster.growable)
                      if allocation_id in self._running_at_start and allocation_id not in touched]
        if not candidates:
            return []
        blocked = set(self._vacating)
        for reservation in self.reserved:
            blocked.update(reservation.gpus)
        waiting = [request for request in requests
                   if (found := decisions.get(request.id)) is not None and found.mode == DecisionMode.WAITING]
        usable: dict[str, bool] = {}  # tier -> a waiting request could use its idle capacity now
        grown = []
        while candidates:
            allocation = min(candidates, key=lambda a: (self.over_share(a.project, a.tier), a.project, -a.priority,
                                                        a.started_at, a.id))
            candidates.remove(allocation)
            tier = allocation.tier
            if tier not in usable:
                usable[tier] = self._waiting_could_use(tier, waiting)
            if usable[tier]:
                continue
            decision = self._grow_one(allocation, blocked)
            if decision is not None:
                grown.append(decision)
        return grown

    def _waiting_could_use(self, tier: str, waiting: list[Request]) -> bool:
        """Whether one of the ``waiting`` requests passes its quota check on ``tier`` and fits there now."""
        tried: set[tuple] = set()
        for request in waiting:
            for model, need in self.tiers_for(request):
                if model != tier or need.key() in tried:
                    continue
                reason, in_quota = self.quota_check(request, tier, need)
                if reason or (not in_quota and request.workload_class == WorkloadClass.INTERACTIVE):
                    continue
                tried.add(need.key())
                if self._find(need) is not None:
                    return True
        return False

    def _grow_quota(self, allocation: Allocation, want: int, milli: int) -> int:
        """How many of ``want`` units of ``milli`` the allocation's project and tenant may borrow more on its tier:
        within their ``limit``, none for a project of weight 0, within the cohorts' bounds."""
        if not self.snapshot.enforce_quotas:
            return want
        tier = allocation.tier
        quota = self.quotas.get((allocation.project, tier))
        if quota is None or quota.weight == 0 or milli <= 0:
            return 0
        count = min(want, (quota.limit - sum(self.cluster.project_usage.get((allocation.project, tier), (0, 0))))
                    // milli)
        tenant_quota = self.tenant_quotas.get((allocation.tenant, tier))
        if tenant_quota is not None:
            used = sum(self.cluster.tenant_usage.get((allocation.tenant, tier), (0, 0)))
            count = min(count, (tenant_quota.limit - used) // milli)
        if self._cohort_members:
            while count > 0 and self.cohort_check(allocation.tenant, tier, count * milli) is not None:
                count -= 1
        return max(count, 0)

    def _grow_one(self, allocation: Allocation, blocked: set[str]) -> Decision | None:
        """Grow one shrunk elastic allocation by the units that fit, of its own shape (a whole GPU of its model, or
        a share of its milli and memory on a shared GPU of its model, one per GPU): first on the nodes it holds
        (its node first, each node's GPUs in order); an allocation that is not a gang then on other nodes of its
        pools, those in one of its NVLink domains first, by node id and GPU order. Its host CPU and memory per
        unit come along on its node. Applied to the working state; None when nothing fits."""
        cluster = self.cluster
        gpus, nodes = cluster.gpus, cluster.nodes
        held = len(allocation.units)
        first = allocation.units[0]
        first_gpu = gpus[first.gpu]
        milli, memory = first.milli, first.memory_mib
        whole = milli == FULL and (first_gpu.gpu.mode != GpuMode.SHARED or memory >= first_gpu.memory_mib)
        want = self._grow_quota(allocation, allocation.grow_to - held, milli)
        if want <= 0:
            return None
        cpu = allocation.cpu_milli // held
        host_memory = allocation.host_memory_mib // held
        home = nodes[allocation.node]
        mine = {unit.gpu for unit in allocation.units}
        held_nodes = cluster._nodes_of(allocation)
        order = [gpu for node_id in held_nodes for gpu in nodes[node_id].gpus]
        if allocation.grow_spread:
            domains = {gpus[unit.gpu].gpu.nvlink_domain for unit in allocation.units} - {""}
            pools = {nodes[node_id].node.pool for node_id in held_nodes}
            elsewhere = [gpu for gpu in gpus.values() if gpu.gpu.model == allocation.tier
                         and gpu.gpu.node not in held_nodes and nodes[gpu.gpu.node].node.pool in pools]
            elsewhere.sort(key=lambda gpu: (gpu.gpu.nvlink_domain not in domains, gpu.gpu.node, gpu.position))
            order += elsewhere
        added: list[Unit] = []
        for gpu in order:
            if len(added) == want:
                break
            state = gpu.gpu
            if state.model != allocation.tier or state.id in blocked or nodes[state.node].node.cordoned:
                continue
            if whole:
                if not gpu.fits_whole():
                    continue
                unit = Unit(state.id, FULL, gpu.memory_mib)
            else:
                if state.id in mine or not gpu.fits_share(milli, memory):
                    continue
                unit = Unit(state.id, milli, memory)
            if state.node == home.node.id and (cpu or host_memory):
                count = sum(1 for other in added if gpus[other.gpu].gpu.node == home.node.id) + 1
                if ((home.node.cpu_milli and home.free_cpu_milli < cpu * count)
                        or (home.node.memory_mib and home.free_memory_mib < host_memory * count)):
                    continue
            added.append(unit)
        if not added:
            return None
        size = held + len(added)
        bigger = replace(allocation, units=(*allocation.units, *added), cpu_milli=cpu * size,
                         host_memory_mib=host_memory * size)
        cluster.remove(allocation.id)
        cluster.apply(bigger)
        nodes_added = sorted({gpus[unit.gpu].gpu.node for unit in added})
        return Decision(allocation.id, DecisionMode.GROW,
                        f"grown on {allocation.tier}: {allocation.id} ({allocation.project}) from {held} to {size} "
                        f"units of its {allocation.grow_to} (capacity freed; over quota, preemptible) on "
                        f"{', '.join(nodes_added)}", allocation=bigger, grown=tuple(added))

    # -- reclaim ----------------------------------------------------------------------------------
    def min_runtime(self, allocation: Allocation) -> float:
        """Seconds from its start before ``allocation`` may be reclaimed: its tenant's SLO contract's minimum
        runtime (``Snapshot.min_runtime_by_tenant``), else the platform's (``Snapshot.min_runtime_seconds``)."""
        by_tenant = self.snapshot.min_runtime_by_tenant
        if by_tenant:
            found = by_tenant.get(allocation.tenant)
            if found is not None:
                return found
        return self.snapshot.min_runtime_seconds

    def _reclaimable(self, request: Request, tier: str, need: Need, *, now: float) -> list[Allocation]:
        """The over-quota allocations of ``tier`` a reclaim for ``request`` may take (past their minimum runtime, not
        protected by the back-off, in the request's pools, not of its own group), in the victim order."""
        candidates = [
            a for a in self.cluster.allocations.values()
            if a.preemptible and a.tier == tier and a.started_at + self.min_runtime(a) <= now and a.id != request.id
        ]
        if need.pools:  # only work in the request's pools frees room it can use
            nodes = self.cluster.nodes
            candidates = [a for a in candidates
                          if any(nodes[n].node.pool in need.pools for n in self.cluster._nodes_of(a))]
        if request.group:  # a group member never reclaims from its own group
            candidates = [a for a in candidates if a.group != request.group]
        if candidates and self.snapshot.preempted_at:  # the back-off: work reclaimed again and again runs a while
            candidates = [a for a in candidates if self.protected(a, now) is None]
        if not candidates:
            return candidates
        # the preferred victims first: the project furthest above its fair share (ties: the project whose
        # newest borrowed work is youngest, then the project id), and within a project the lowest priority,
        # then the youngest. Priority compares allocations of one project only: a project cannot shield
        # its borrowed work from reclaim by sending a high priority.
        share = {}
        for allocation in candidates:
            if allocation.project not in share:
                key = self.over_share(allocation.project, tier)
                share[allocation.project] = (-key[0], -key[1])
        newest: dict[str, float] = {}
        for allocation in candidates:
            newest[allocation.project] = max(newest.get(allocation.project, allocation.started_at),
                                             allocation.started_at)
        candidates.sort(key=lambda a: (share[a.project], -newest[a.project], a.project, a.priority,
                                       -a.started_at, a.id))
        return candidates

    def _reclaim(self, request: Request, tier: str, need: Need, *, now: float) -> Decision | None:
        candidates = self._reclaimable(request, tier, need, now=now)
        # what a reclaim across modes of the same request reads next when this one finds nothing (the state as now)
        self._reclaimable_seen = ((request.id, tier, need), candidates)
        if not candidates:
            return None
        if not need.gang and need.count > 1:
            return self._reclaim_spread(request, tier, need, candidates, now=now)
        rank = {allocation.id: position for position, allocation in enumerate(candidates)}
        by_node: dict[str, list[Allocation]] = {}
        for allocation in candidates:
            for node_id in self.cluster._nodes_of(allocation):
                by_node.setdefault(node_id, []).append(allocation)
        # the options, best first by: the GPU capacity taken (the set that frees the least beyond the need: the least
        # borrowed work thrown away), then the leases touched, then the victims' ranks in the victim order, then the
        # node id. An elastic allocation may give back units instead (a shrink: one allocation, never below its
        # minimum), keyed the same way by the units it gives back. (Taking the victims from the shallowest classes
        # of the victim order first lost more GPU-hours and waited longer in the Philly replay: docs/scheduling.md.)
        best: tuple[tuple, str, list[Allocation], tuple] | None = None
        for node_id, victims_here in by_node.items():
            if node_id in need.avoid or not self._fits_without(node_id, victims_here, need):
                continue
            chosen = self._victims_on(node_id, victims_here, need, rank)
            if chosen is not None:
                key = (sum(v.milli for v in chosen), len(chosen), sorted(rank[v.id] for v in chosen), node_id)
                if best is None or key < best[0]:
                    best = (key, node_id, chosen, ())
            for victim in victims_here:
                if victim.min_units <= 0 or len(victim.units) <= victim.min_units:
                    continue
                taken = self._shrink_on(node_id, victim, need)
                if taken is None:
                    continue
                key = (sum(unit.milli for unit in taken), 1, [rank[victim.id]], node_id)
                if best is None or key < best[0]:
                    best = (key, node_id, [victim], taken)
        if best is None:
            return None
        _, node_id, victims, taken = best
        self._vacating.update(unit.gpu for unit in (taken or [u for v in victims for u in v.units]))
        if taken:
            victim = victims[0]
            smaller = _without(victim, taken)
            self.cluster.remove(victim.id)
            self.cluster.apply(smaller)
        else:
            for victim in victims:
                self.cluster.remove(victim.id)
        units = self.placer.policy.node_options(self.cluster.nodes[node_id], need)
        allocation = self._allocation(request, tier, need, (node_id, units[0]), preemptible=False, now=now)
        self.cluster.apply(allocation)
        if taken:
            return Decision(request.id, DecisionMode.SHRINK,
                            f"in quota on {tier}: shrinking elastic over-quota work: {victim.id} ({victim.project}) "
                            f"from {len(victim.units)} to {len(smaller.units)} units (its minimum {victim.min_units})",
                            allocation=allocation, shrunk=((victim.id, taken),))
        names = ", ".join(f"{v.id} ({v.project})" for v in victims)
        return Decision(request.id, DecisionMode.PREEMPT,
                        f"in quota on {tier}: reclaiming from over-quota work: {names}",
                        allocation=allocation, victims=tuple(v.id for v in victims))

    # -- reclaim across modes ------------------------------------------------------------------------
    def _switch_for(self, request: Request, tier: str, need: Need, *, now: float) -> Decision | None:
        """Reclaim across modes, for an in-quota request of one unit that neither fits nor reclaims in its own mode
        (``Snapshot.switch_modes`` names the tier and that mode; not a group's member).

        First, a GPU of ``tier`` already being switched to that mode (in this cycle, or the snapshot's
        ``switching``) with room left for the request: it waits for that switch. Else the GPU of another mode that
        holds the least over-quota capacity: an idle one, or one held only by reclaimable over-quota allocations that
        sit on it alone (a lease spread over other GPUs is never thrown away for one unit); then the fewest victims,
        the best ranked in the victim order, the GPU id. Its victims leave the working state and the GPU is closed
        for the rest of the cycle (``DecisionMode.SWITCH``: the capacity loop switches it once they have left, and
        the request starts on it at a later cycle). None: no such GPU."""
        wanted = WANTED_MODE[need.kind]
        if (tier, wanted) not in self.snapshot.switch_modes or request.group or need.count != 1:
            return None
        cluster = self.cluster
        for gpu_id, room in self._switch_room.items():
            if room.tier == tier and room.mode == wanted and room.take(need, cluster.nodes[cluster.gpus[gpu_id]
                                                                                          .gpu.node]):
                gpu = cluster.gpus[gpu_id].gpu
                return self._waiting(request, f"in quota on {tier}: waits for GPU {gpu.index} on {gpu.node}, which "
                                              f"is being switched to {_MODE_WORD[wanted]} mode for in-quota work")
        options: list[tuple[tuple, str, list[Allocation]]] = []
        for gpu_id in self._idle_other_mode(tier, wanted, need):
            options.append(((0, 0, (), gpu_id), gpu_id, []))
        seen = self._reclaimable_seen
        if seen is not None and seen[0] == (request.id, tier, need):
            candidates = seen[1]
        else:
            candidates = self._reclaimable(request, tier, need, now=now)
        by_gpu: dict[str, list[Allocation]] = {}
        for allocation in candidates:
            first = allocation.units[0].gpu
            if all(unit.gpu == first for unit in allocation.units):
                by_gpu.setdefault(first, []).append(allocation)
        rank = {allocation.id: position for position, allocation in enumerate(candidates)}
        for gpu_id, victims in by_gpu.items():
            state = cluster.gpus[gpu_id]
            if state.gpu.mode == wanted or state.gpu.closed or state.units != sum(len(v.units) for v in victims):
                continue  # its own mode (the reclaim within it found nothing), or it holds more than these
            node = cluster.nodes[state.gpu.node]
            if node.node.cordoned or node.node.id in need.avoid or (need.pools and node.node.pool not in need.pools):
                continue
            options.append(((sum(v.milli for v in victims), len(victims), sorted(rank[v.id] for v in victims), gpu_id),
                            gpu_id, victims))
        options.sort(key=lambda option: option[0])
        for _, gpu_id, victims in options:
            state = cluster.gpus[gpu_id]
            for victim in victims:
                cluster.remove(victim.id)
            if not node_accepts(cluster.nodes[state.gpu.node], need):  # its host CPU or memory, even then
                for victim in reversed(victims):
                    cluster.apply(victim)
                continue
            gpu = state.gpu
            cluster.replace_gpus([replace(gpu, closed=True)])
            self._vacating.add(gpu_id)
            room = _SwitchRoom(tier, wanted, state.memory_mib)
            room.take(need, None)
            self._switch_room[gpu_id] = room
            # its ask counts as its project's and tenant's use in quota for the rest of the cycle, as a reclaim's
            # placement does: a later request of the project is judged with it (the working state is the cycle's; the
            # replay builds a new one once it has made the switch)
            for usage in (cluster.project_usage.setdefault((request.project, tier), [0, 0]),
                          cluster.tenant_usage.setdefault((request.tenant, tier), [0, 0])):
                usage[0] += need.total_milli
            where = f"GPU {gpu.index} on {gpu.node} ({_MODE_WORD[gpu.mode]} mode)"
            if victims:
                names = ", ".join(f"{v.id} ({v.project})" for v in victims)
                reason = (f"in quota on {tier}: no room in {_MODE_WORD[wanted]} mode; {where} is emptied of over-quota "
                          f"work: {names}, and switched to {_MODE_WORD[wanted]} mode for it")
            else:
                reason = (f"in quota on {tier}: no room in {_MODE_WORD[wanted]} mode; {where} is idle and switched to "
                          f"{_MODE_WORD[wanted]} mode for it")
            return Decision(request.id, DecisionMode.SWITCH, reason, victims=tuple(v.id for v in victims),
                            switch=(gpu_id, wanted.value))
        return None

    def _rooms_switching(self) -> dict[str, _SwitchRoom]:
        """The GPUs the snapshot says are being switched (``Snapshot.switching``), each with its new mode's room."""
        rooms = {}
        for gpu_id, target in sorted(self.snapshot.switching.items()):
            state = self.cluster.gpus.get(gpu_id)
            if state is not None:
                rooms[gpu_id] = _SwitchRoom(state.gpu.model, GpuMode(target), state.memory_mib)
        return rooms

    def _idle_other_mode(self, tier: str, wanted: GpuMode, need: Need) -> list[str]:
        """One idle GPU of ``tier`` per node class in a mode other than ``wanted``, open, on a node that takes
        ``need`` (the class's lowest such node): the class index, not the fleet's GPUs."""
        cluster, found = self.cluster, []
        for class_id, members in cluster.by_signature.items():
            info = cluster.class_info[class_id]
            if info.cordoned or (need.pools and info.pool not in need.pools):
                continue
            if not any(model == tier and mode != wanted.value and idle for (model, mode), idle in info.idle):
                continue
            for node_id in sorted(members):
                node = cluster.nodes[node_id]
                if not node_accepts(node, need):
                    continue
                for state in node.gpus:
                    gpu = state.gpu
                    if (gpu.model == tier and gpu.mode != wanted and not gpu.closed and state.units == 0
                            and state.used_milli == 0):
                        found.append(gpu.id)
                        break
                break
        return found

    def _shrink_on(self, node_id: str, victim: Allocation, need: Need) -> tuple[Unit, ...] | None:
        """The fewest units of the elastic allocation ``victim`` on ``node_id`` (its last placed first, never
        below its minimum) whose release lets ``need`` fit there, or None. Whole GPUs and shares only (a MIG
        allocation is not elastic). The state is unchanged afterwards."""
        if any(unit.mig_profile for unit in victim.units):
            return None
        gpus = self.cluster.gpus
        here = [index for index in range(len(victim.units) - 1, -1, -1)
                if gpus[victim.units[index].gpu].gpu.node == node_id]
        here = here[:len(victim.units) - victim.min_units]
        if not here:
            return None
        self.cluster.remove(victim.id)
        taken = None
        for count in range(1, len(here) + 1):
            units = tuple(victim.units[index] for index in sorted(here[:count]))
            smaller = _without(victim, units)
            self.cluster.apply(smaller)
            fits = self._fits_on(node_id, need)
            self.cluster.remove(smaller.id)
            if fits:
                taken = units
                break
        self.cluster.apply(victim)
        return taken

    def _reclaim_spread(self, request, tier, need, candidates, *, now) -> Decision | None:
        """Reclaim for a request that may spread over nodes: victims anywhere in the tier, in victim order.

        Victims are removed in order while a cheap per-GPU count says the request cannot fit yet; then
        the placement search confirms, and the victims not needed are put back (latest first, so the
        preferred victims stay chosen). The state is unchanged when it does not help."""
        room = {gpu_id: self._units_room(gpu, need) for gpu_id, gpu in self.cluster.gpus.items()
                if gpu.gpu.model == tier and not self.cluster.nodes[gpu.gpu.node].node.cordoned
                and gpu.gpu.node not in need.avoid
                and (not need.pools or self.cluster.nodes[gpu.gpu.node].node.pool in need.pools)}
        total = sum(room.values())
        removed: list[Allocation] = []
        found = self._find(need) if total >= need.count else None
        for victim in candidates:
            if found is not None:
                break
            removed.append(self.cluster.remove(victim.id))
            for unit in victim.units:
                if unit.gpu in room:
                    now_room = self._units_room(self.cluster.gpus[unit.gpu], need)
                    total += now_room - room[unit.gpu]
                    room[unit.gpu] = now_room
            if total >= need.count:
                found = self._find(need)
        if found is None:
            for victim in reversed(removed):
                self.cluster.apply(victim)
            return None
        for victim in reversed(removed[:-1]):
            self.cluster.apply(victim)
            if self._find(need) is not None:
                removed.remove(victim)
            else:
                self.cluster.remove(victim.id)
        found = self._find(need)
        allocation = self._allocation(request, tier, need, found, preemptible=False, now=now)
        self.cluster.apply(allocation)
        self._vacating.update(unit.gpu for victim in removed for unit in victim.units)
        names = ", ".join(f"{v.id} ({v.project})" for v in removed)
        return Decision(request.id, DecisionMode.PREEMPT,
                        f"in quota on {tier}: reclaiming from over-quota work: {names}",
                        allocation=allocation, victims=tuple(v.id for v in removed))

    @staticmethod
    def _units_room(gpu, need: Need) -> int:
        """An upper bound on how many single units of ``need`` this GPU could take now."""
        if need.kind == Kind.WHOLE:
            return int(gpu.fits_whole())
        if need.kind == Kind.MIG:
            if not gpu.mig_starts(need.profile):
                return 0
            return (COMPUTE_SLICES - gpu.compute_used) // need.profile.compute_slices
        if gpu.gpu.mode != GpuMode.SHARED:
            return 0
        by_memory = (gpu.memory_mib - gpu.used_memory_mib) // need.memory_mib if need.memory_mib else need.count
        return max(0, min((FULL - gpu.used_milli) // max(need.milli, 1), by_memory))

    def _fits_without(self, node_id: str, victims: list[Allocation], need: Need) -> bool:
        """Whether ``need`` fits on the node with every one of ``victims`` gone: one placement check that rules
        out most nodes before ``_victims_on`` tries them one by one (its answer is None exactly when this is
        False, since its last try removes them all). The state is unchanged afterwards."""
        removed = [self.cluster.remove(victim.id) for victim in victims]
        fits = self._fits_on(node_id, need)
        for victim in reversed(removed):
            self.cluster.apply(victim)
        return fits

    def _victims_on(self, node_id: str, ordered: list[Allocation], need: Need,
                    rank: dict[str, int]) -> list[Allocation] | None:
        """The victims on one node (all of ``ordered`` let ``need`` fit: ``_fits_without``) that take the least GPU
        capacity (the least beyond the need), then the fewest, then the best ranked in the victim order.

        The best single victim is tried (each alone); then victims are removed smallest first until it fits and
        those not needed are put back, largest first; the smaller of the two wins. The state is unchanged
        afterwards."""
        single = None
        for victim in ordered:
            if single is not None and victim.milli >= single.milli:
                continue
            self.cluster.remove(victim.id)
            fits = self._fits_on(node_id, need)
            self.cluster.apply(victim)
            if fits:
                single = victim
        removed: list[Allocation] = []
        for victim in sorted(ordered, key=lambda a: (a.milli, rank[a.id])):
            removed.append(self.cluster.remove(victim.id))
            if self._fits_on(node_id, need):
                break
        for victim in sorted(removed[:-1], key=lambda a: (-a.milli, -rank[a.id])):
            self.cluster.apply(victim)
            if self._fits_on(node_id, need):
                removed.remove(victim)
            else:
                self.cluster.remove(victim.id)
        for victim in removed:
            self.cluster.apply(victim)
        if single is not None and (single.milli, 1) <= (sum(v.milli for v in removed), len(removed)):
            return [single]
        return removed

    def _fits_on(self, node_id: str, need: Need) -> bool:
        return bool(self.placer.policy.node_options(self.cluster.nodes[node_id], need))

    # -- reasons ----------------------------------------------------------------------------------
    def _back_off_words(self, allocation: Allocation, now: float) -> str:
        """"; protected from reclaim until …" for a lease placed over quota that the back-off protects."""
        until = self.protected(allocation, now)
        if until is None:
            return ""
        snapshot = self.snapshot
        times = snapshot.preempted_at[allocation.id]
        words = back_off_words(times, allocation.started_at, count=snapshot.backoff_preemptions,
                               window=snapshot.backoff_window_seconds)
        return f"; protected from reclaim for {until - now:.0f} s (back-off: {words})"

    def _protected_words(self, tier: str, now: float) -> str:
        """Why reclaim found nothing when the back-off protects borrowed work on ``tier``: how many, until when."""
        if not self.snapshot.preempted_at:
            return ""
        untils = [until for allocation in self.cluster.allocations.values()
                  if allocation.preemptible and allocation.tier == tier
                  and (until := self.protected(allocation, now)) is not None]
        if not untils:
            return ""
        return (f"; {len(untils)} over-quota lease(s) on {tier} are protected from reclaim by the preemption "
                f"back-off, the first until {min(untils) - now:.0f} s from now")

    def _min_runtime_words(self, tier: str, need: Need, now: float) -> str:
        """Why reclaim found nothing when over-quota work on ``tier`` is still within its minimum runtime: how
        many leases, the first reclaimable when ("" when none is, or no tenant has its own minimum runtime)."""
        if not self.snapshot.min_runtime_by_tenant:
            return ""
        nodes = self.cluster.nodes
        waits = [allocation.started_at + self.min_runtime(allocation) - now
                 for allocation in self.cluster.allocations.values()
                 if allocation.preemptible and allocation.tier == tier
                 and allocation.started_at + self.min_runtime(allocation) > now
                 and (not need.pools or nodes[allocation.node].node.pool in need.pools)]
        if not waits:
            return ""
        return (f"; {len(waits)} over-quota lease(s) on {tier} are within their minimum runtime (their SLO "
                f"contract's), the first reclaimable in {min(waits):.0f} s")

    def _no_fit_reason(self, tier: str, need: Need) -> str:
        if need.pools:
            return f"no node in pool(s) {', '.join(sorted(need.pools))} has room: " + self._no_fit_room(tier, need)
        return self._no_fit_room(tier, need)

    def _no_fit_room(self, tier: str, need: Need) -> str:
        if need.kind == Kind.MIG and need.profile is not None:
            profile = need.profile
            repartitionable = sum(
                1
                for gpu in self.cluster.gpus.values()
                if gpu.gpu.model == tier
                and gpu.gpu.mode.value == "mig"
                and not gpu.mig_starts(profile)
                and 7 - gpu.compute_used >= profile.compute_slices
                and 8 - bin(gpu.slot_mask).count("1") >= profile.memory_slots
            )
            text = f"no {profile.name} slot free on {tier}"
            if repartitionable:
                text += f"; {repartitionable} GPUs have the slices free in other slots and could be repartitioned"
            return text
        if need.kind == Kind.WHOLE and not need.gang and need.count > 1:
            return f"fewer than {need.count} {tier} GPUs free in total" + self._other_modes(tier, "whole")
        if need.kind == Kind.WHOLE:
            return (f"no node has {need.count} free {tier} GPU{'s' if need.count > 1 else ''}"
                    + self._other_modes(tier, "whole"))
        return (f"no {tier} GPU has {need.milli} milli and {need.memory_mib} MiB free"
                + self._other_modes(tier, "shared"))

    def _other_modes(self, tier: str, wanted: str) -> str:
        """The ``tier`` GPUs in another mode than ``wanted`` (issue 29: whole-GPU requests waited "forever" on an
        all-MIG pool with no word of the modes): "; 20 H100-80GB are in MIG mode (20 idle): the capacity loop can
        switch one to whole"; "" when there are none."""
        cached = self._other_mode_text.get((tier, wanted))
        if cached is not None and cached[0] == self.cluster.changes:  # no GPU changed since: the same words
            return cached[1]
        text = self._other_modes_now(tier, wanted)
        self._other_mode_text[(tier, wanted)] = (self.cluster.changes, text)
        return text

    def _other_modes_now(self, tier: str, wanted: str) -> str:
        totals = self._other_mode_counts.get((tier, wanted))
        if totals is None:  # a GPU's mode holds for the cycle: count the fleet once per (tier, mode) a cycle
            totals = self._other_mode_counts[(tier, wanted)] = {}
            for state in self.cluster.gpus.values():
                mode = state.gpu.mode.value
                if state.gpu.model == tier and mode != wanted:
                    totals[mode] = totals.get(mode, 0) + 1
        if not totals:
            return ""
        # the idle ones from the class index (``ClassInfo.idle``: every node of a class has the same idle GPUs), so
        # a waiting request costs the live classes, not the fleet's GPUs
        cluster = self.cluster
        idle_by_mode = dict.fromkeys(totals, 0)
        for class_id, members in cluster.by_signature.items():
            for (model, mode), idle in cluster.class_info[class_id].idle:
                if model == tier and mode in idle_by_mode:
                    idle_by_mode[mode] += idle * len(members)
        counts = {mode: (total, idle_by_mode[mode]) for mode, total in totals.items()}
        parts = [f"{total} {tier} {'is' if total == 1 else 'are'} in {'MIG' if mode == 'mig' else mode} mode "
                 f"({idle} idle)" for mode, (total, idle) in sorted(counts.items())]
        return "; " + ", ".join(parts) + f": the capacity loop can switch one to {wanted}"

    def _waiting(self, request: Request, reason: str) -> Decision:
        return self._waiting_for(request.id, reason)

    @staticmethod
    def _waiting_for(request_id: str, reason: str) -> Decision:
        return Decision(request_id, DecisionMode.WAITING, f"waiting: {reason}")


def _elastic_min(shape) -> int:
    """The minimum units an allocation of ``shape`` may shrink to: ``min_count`` of an elastic whole-GPU or share
    request with fewer than ``count``; 0 (not elastic) otherwise."""
    if shape is None or not 0 < shape.min_count < shape.count or shape.kind == Kind.MIG:
        return 0
    return shape.min_count


def _without(allocation: Allocation, units: tuple[Unit, ...]) -> Allocation:
    """``allocation`` less ``units`` (a shrink): the same id, project, tier and minimum."""
    left = list(allocation.units)
    for unit in units:
        left.remove(unit)
    return replace(allocation, units=tuple(left))


def _describe(request: Request) -> str:
    shape = request.shape
    if shape.kind == Kind.MIG:
        return f"{shape.count} x MIG {shape.profile}"
    if shape.kind == Kind.SHARE:
        return f"{shape.count} x share {shape.milli} milli / {shape.memory_mib} MiB"
    return f"{shape.count} x whole GPU"


def plan(
    snapshot: Snapshot,
    requests: list[Request],
    *,
    now: float,
    policy: str | Policy = "default",
    seed: int = 0,
    workload=None,
    reservations: bool = False,
) -> list[Decision]:
    """Decisions for ``requests`` on ``snapshot``; pure: the snapshot is not changed."""
    return Scheduler(snapshot, policy=policy, seed=seed, workload=workload,
                     reservations=reservations).schedule(requests, now=now)


__all__ = ["Scheduler", "plan"]
