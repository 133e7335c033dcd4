"""Mode switch and MIG layout (one path: both change a GPU's mode): the GPU is closed to the scheduler first
(``Gpu.mode_target``, set under the schedule cycle's advisory lock after checking that no lease the proposal
did not count holds it), then the agent is asked, then the mode recorded. A drain preempts the over-quota
holders with their promised notice; ``drains_finish`` switches once they have left."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction

from broker.choices import AllocationState, LeaseState, NodeStatus
from broker.extensions import ModeSwitchFor
from broker.models import Allocation, Gpu, Lease
from capacity.choices import AdjustmentKind, AdjustmentState, LoopMode
from capacity.models import Adjustment
from capacity.services.common import LOOP, _audit, _cycle_lock, _finish, _gpu_of, identity_print
from capacity.services.warm_pool import _destroy_warm
from core.task_registry import task


def mode_apply(adjustment: Adjustment, now: datetime) -> None:
    from broker.services import lease_preempt

    change = adjustment.change
    with transaction.atomic(durable=True):
        _cycle_lock()
        # the GPU's row only (not its node's, which heartbeats lock), as an update of non-key columns locks it:
        # an allocation inserted on it (KEY SHARE) neither waits for it nor makes it wait (issue 27 item 12)
        gpu = (Gpu.objects.select_for_update(no_key=True, of=("self",)).select_related("node")
               .get(pk=_gpu_of(adjustment)))
        if gpu.mode != change["from_mode"] or gpu.mode_target or gpu.lost_at or gpu.node.status != NodeStatus.READY:
            return _finish(adjustment, AdjustmentState.EXPIRED, f"the GPU changed since the proposal (now {gpu.mode}"
                           f"{', changing' if gpu.mode_target else ''}, node {gpu.node.status})", now=now)
        live = list(Allocation.objects.filter(gpu=gpu, freed_at__isnull=True).select_related("lease"))
        held = [a for a in live if a.lease_id is not None]
        if held:
            others = {a.lease_id for a in held} - set(adjustment.risk)
            if not change.get("drain") or others or any(not a.preemptible for a in held):
                return _finish(adjustment, AdjustmentState.EXPIRED,
                               "a lease the proposal did not count now holds the GPU; left alone", now=now)
            for lease_id in sorted({a.lease_id for a in held}):
                lease = Lease.objects.select_for_update().get(pk=lease_id)
                if lease.state == LeaseState.ACTIVE:
                    lease_preempt(lease=lease, actor=LOOP, now=now,
                                  why=f"to switch GPU {gpu} to {change['to_mode']} mode for queued in-quota work "
                                      f"(adjustment {adjustment.pk})")
        warm = [a.pk for a in live if a.lease_id is None]
        Allocation.objects.filter(pk__in=warm, lease__isnull=True).update(state=AllocationState.RELEASING)
        gpu.mode_target = change["to_mode"]
        gpu.save(update_fields=["mode_target"])
    if warm:
        _destroy_warm(warm, now)
    if held:
        Adjustment.objects.filter(pk=adjustment.pk).update(
            outcome=f"draining lease(s) {', '.join(str(a) for a in sorted({a.lease_id for a in held}))}; the switch "
                    "follows once they have left")
        return None
    return _switch_now(adjustment, now)


def _switch_now(adjustment: Adjustment, now: datetime) -> None:
    from agent.protocol import AgentHTTPError, AgentUnreachable
    from broker.services import agent_client

    gpu = Gpu.objects.select_related("node").get(pk=_gpu_of(adjustment))
    target = adjustment.change["to_mode"]
    try:
        agent_client(gpu.node).set_gpu_mode(gpu.uuid, target)
    except (AgentHTTPError, AgentUnreachable) as error:
        Gpu.objects.filter(pk=gpu.pk, mode_target=target).update(mode_target="")
        return _finish(adjustment, AdjustmentState.FAILED, f"the agent did not switch {gpu}: {error}", now=now)
    with transaction.atomic():
        # under the cycle's lock, which asks for a cycle once this commits (``_cycle_lock``): a cycle that ran
        # during the agent's switch saw the GPU closed, and one asked for with ``schedule_cycle_request`` alone was
        # swallowed by that cycle's trigger flag — its look after commit is for leases it did not see, not for
        # capacity — so a lease waiting for this very GPU stayed queued until beat's next cycle (in the tests,
        # which run no beat, for ever: a likely cause of test_a_queue_of_mig_requests_on_whole_gpus_switches_a_gpu_
        # and_drains failing 2 runs in 4, tests/capacity/conftest.py)
        _cycle_lock()
        Gpu.objects.filter(pk=gpu.pk).update(mode=target, mode_target="", mode_since=now)
        _finish(adjustment, AdjustmentState.APPLIED, f"{gpu.node.node_id}/{gpu.index} switched from "
                f"{adjustment.change['from_mode']} to {target} mode", now=now)
    return None


def drains_finish(*, now: datetime) -> int:
    """Switches waiting for a drain: once no lease holds the GPU any more, switch it; a drain that outlived
    its leases' notices by far (a stuck release) gives the GPU back to the scheduler and fails."""
    count = 0
    for adjustment in Adjustment.objects.filter(state=AdjustmentState.APPLYING, kind__in=(
            AdjustmentKind.MODE_SWITCH, AdjustmentKind.MIG_LAYOUT)).order_by("pk"):
        gpu_pk = _gpu_of(adjustment)
        if Allocation.objects.filter(gpu_id=gpu_pk, freed_at__isnull=True).exists():
            if adjustment.decided_at and now - adjustment.decided_at > timedelta(hours=6):
                Gpu.objects.filter(pk=gpu_pk).update(mode_target="")
                _finish(adjustment, AdjustmentState.FAILED, "the drained leases did not leave within 6 hours",
                        now=now)
            continue
        if not Gpu.objects.filter(pk=gpu_pk, mode_target=adjustment.change["to_mode"]).exists():
            continue
        _switch_now(adjustment, now)
        count += 1
    return count


# -- reclaim across modes (issue 30) ------------------------------------------------------------------------------
def mode_switch_for(switch: ModeSwitchFor) -> Adjustment:
    """A schedule cycle's reclaim across modes (``broker.extensions.ModeSwitchFor``), carried out as a drain-then-
    switch the loop applied: the row (applying, ``auto``, the drained leases as its risk) and the GPU closed to the
    scheduler (``Gpu.mode_target``) in the cycle's own transaction, where the cycle has already given the leases
    their notice. ``drains_finish`` switches the GPU once they have left: its task is sent for the end of the
    longest notice (at once for an idle GPU). An open proposal of the same change (a drain the planner advised) is
    taken over rather than doubled."""
    gpu = Gpu.objects.select_for_update(no_key=True, of=("self",)).get(pk=switch.gpu)
    kind = AdjustmentKind.MIG_LAYOUT if switch.to_mode == "mig" else AdjustmentKind.MODE_SWITCH
    target = f"gpu:g{gpu.pk}"
    change = {"gpu": f"g{gpu.pk}", "from_mode": gpu.mode, "to_mode": switch.to_mode, "drain": bool(switch.leases),
              "slots": [], "model": gpu.model}
    risk = sorted(switch.leases)
    print_ = identity_print(kind, target, change, [str(r) for r in risk])
    # whom it concerns: the tenants whose leases it drains (they see the row, as a planner drain's); the lease it is
    # for is another tenant's business, so it is named only in the audit trail (staff's), never in the row
    tenants = sorted(set(Lease.objects.filter(pk__in=risk).values_list("tenant_id", flat=True)))
    reason = (f"for an in-quota lease that fits nowhere in {switch.to_mode} mode: the schedule cycle reclaims across "
              f"modes; " + (f"drain over-quota lease(s) {', '.join(map(str, risk))}, then switch" if risk
                            else f"the GPU is idle in {gpu.mode} mode; switch it"))
    values = {"kind": kind, "target": target, "state": AdjustmentState.APPLYING, "mode": LoopMode.AUTO,
              "reason": reason, "change": change, "risk": risk, "tenant_ids": tenants, "gpu": gpu,
              "evidence": {"start": switch.now.timestamp(), "end": switch.now.timestamp(),
                           "figures": {"from_mode": gpu.mode, "to_mode": switch.to_mode,
                                       "over-quota leases drained": len(risk)}},
              "last_seen_at": switch.now, "decided_at": switch.now, "applied_by": LOOP,
              "outcome": (f"draining lease(s) {', '.join(map(str, risk))}; the switch follows once they have left"
                          if risk else "switching the idle GPU")}
    row = Adjustment.objects.select_for_update().filter(fingerprint=print_, state=AdjustmentState.PROPOSED).first()
    if row is None:
        row = Adjustment.objects.create(fingerprint=print_, proposed_at=switch.now, **values)
    else:
        for name, value in values.items():
            setattr(row, name, value)
        row.save()
    # warm members: the core chose a GPU with none, but one may have been added since the cycle read the fleet
    warm = list(Allocation.objects.filter(gpu=gpu, freed_at__isnull=True, lease__isnull=True).values_list("pk",
                                                                                                       flat=True))
    if warm:
        Allocation.objects.filter(pk__in=warm).update(state=AllocationState.RELEASING)
        transaction.on_commit(lambda: _destroy_warm(warm, switch.now))
    gpu.mode_target = switch.to_mode
    gpu.save(update_fields=["mode_target"])
    _audit("adjustment.apply", None, {"actor": LOOP, "state": row.state, "outcome": row.outcome,
                                      "for_lease": switch.lease}, adjustment=row)
    notice = 0
    if risk:
        deadlines = Lease.objects.filter(pk__in=risk, notice_deadline__isnull=False).values_list(
            "notice_deadline", flat=True)
        notice = max(((deadline - switch.now).total_seconds() for deadline in deadlines), default=0)
    transaction.on_commit(lambda: task("capacity", "drains_run").apply_async(
        countdown=max(0.0, notice) + 1.0, kwargs={"adjustment": row.pk}))
    return row


DRAINS_LOOK_AGAIN_SECONDS = 3.0  # while a drain for in-quota work waits for its leases' release
DRAINS_LOOK_FOR_SECONDS = 600  # and for at most this long after it began (then the loop's timer looks)


def drains_run(*, adjustment: int | None = None, now: datetime | None = None) -> dict:
    """The task a reclaim across modes sends for the end of its leases' notice: ``drains_finish``, and while its
    drain (``adjustment``; None: any), begun in the last ``DRAINS_LOOK_FOR_SECONDS``, still waits (a release under
    way on its node), the same task again in ``DRAINS_LOOK_AGAIN_SECONDS`` — one chain per switch, ending with it,
    so that switches decided together do not each poll for all."""
    from django.utils import timezone

    now = now or timezone.now()
    switched = drains_finish(now=now)
    pending = Adjustment.objects.filter(
        state=AdjustmentState.APPLYING, kind__in=(AdjustmentKind.MODE_SWITCH, AdjustmentKind.MIG_LAYOUT),
        decided_at__gte=now - timedelta(seconds=DRAINS_LOOK_FOR_SECONDS))
    waiting = (pending if adjustment is None else pending.filter(pk=adjustment)).exists()
    if waiting:
        task("capacity", "drains_run").apply_async(countdown=DRAINS_LOOK_AGAIN_SECONDS,
                                                   kwargs={} if adjustment is None else {"adjustment": adjustment})
    return {"switched": switched, "waiting": int(waiting)}
