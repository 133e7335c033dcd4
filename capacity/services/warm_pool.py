"""Warm pools: warm allocations (no lease) inserted first — the exclusion constraint keeps them apart from
every lease — then the agent asked to create them, one call per node; a schedule cycle binds a member to a
lease with no agent call (``broker.services.cycle._bind_warm``). Removing one destroys it on its agent."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.backends.postgresql.psycopg_any import NumericRange

from broker.choices import AllocationState, GpuKind, GpuMode, NodeStatus
from broker.models import Allocation, Gpu
from capacity.choices import AdjustmentState
from capacity.models import Adjustment
from capacity.services.common import _cycle_lock, _finish
from gpus.mig import profile_get

logger = logging.getLogger("capacity.services")


def warm_apply(adjustment: Adjustment, now: datetime) -> None:
    change = adjustment.change
    removed = _remove_warm([int(i) for i in change.get("remove", ())], now)
    created, skipped = _create_warm(change.get("slots", ()), now)
    outcome = f"pool {change['model']} {change['profile']}: {created} created, {removed} removed"
    if skipped:
        outcome += f"; {len(skipped)} slot(s) skipped ({'; '.join(skipped)})"
    state = AdjustmentState.APPLIED if created or removed or not change.get("slots") else AdjustmentState.FAILED
    _finish(adjustment, state, outcome, now=now)


def _remove_warm(ids: list[int], now: datetime) -> int:
    with transaction.atomic():
        taken = list(Allocation.objects.select_for_update().filter(
            pk__in=ids, lease__isnull=True, freed_at__isnull=True).order_by("pk").values_list("pk", flat=True))
        Allocation.objects.filter(pk__in=taken).update(state=AllocationState.RELEASING)
    _destroy_warm(taken, now)
    return len(taken)


def _destroy_warm(ids: list[int], now: datetime) -> None:
    """Destroy warm members on their agents, then free the rows (one not destroyed now is freed anyway: the
    reconcile destroys it as an orphan when its node answers)."""
    from agent.protocol import AgentHTTPError, AgentUnreachable
    from broker.services import agent_client

    for allocation in Allocation.objects.filter(pk__in=ids).select_related("gpu__node"):
        try:
            agent_client(allocation.gpu.node).destroy(allocation.instance_id)
        except (AgentHTTPError, AgentUnreachable) as error:
            logger.warning("warm instance %s not destroyed now (%s); the reconcile will", allocation.instance_id, error)
    Allocation.objects.filter(pk__in=ids, lease__isnull=True, freed_at__isnull=True).update(
        state=AllocationState.FREED, freed_at=now)


def _create_warm(slots, now: datetime) -> tuple[int, list[str]]:
    """Warm allocations for the slots (each on a MIG GPU no lease holds, its slots free: the exclusion
    constraint decides), then one agent call per node; what the agent made becomes WARM."""
    from agent.protocol import AgentHTTPError, AgentUnreachable
    from broker.services import agent_client, allocation_spec

    skipped: list[str] = []
    made: list[Allocation] = []
    with transaction.atomic(durable=True):
        _cycle_lock()
        # the slots' GPUs locked at once in key order (the order of every writer of several GPUs' rows:
        # node_inventory_sync), their rows only, as an update of non-key columns locks them (issue 27 item 12)
        wanted = sorted({int(str(slot["gpu"]).lstrip("g")) for slot in slots})
        locked = {gpu.pk: gpu for gpu in Gpu.objects.select_for_update(no_key=True, of=("self",))
                  .select_related("node").filter(pk__in=wanted).order_by("pk")}
        for slot in slots:
            gpu = locked.get(int(str(slot["gpu"]).lstrip("g")))
            if (gpu is None or gpu.mode != GpuMode.MIG or gpu.mode_target or gpu.lost_at
                    or gpu.node.status != NodeStatus.READY):
                skipped.append(f"{slot['gpu']}: not an available MIG GPU")
                continue
            if Allocation.objects.filter(gpu=gpu, freed_at__isnull=True, lease__isnull=False).exists():
                skipped.append(f"{gpu}: a lease holds it now")
                continue
            profile = profile_get(gpu.model, slot["profile"])
            try:
                with transaction.atomic():
                    made.append(Allocation.objects.create(
                        lease=None, gpu=gpu, tier=gpu.model, kind=GpuKind.MIG, mig_profile=profile.name,
                        mig_start=slot["start"],
                        slots=NumericRange(slot["start"], slot["start"] + profile.memory_slots),
                        milli=profile.gpu_milli, memory_mib=profile.memory_mib, state=AllocationState.PENDING,
                        created_at=now))
            except IntegrityError:
                skipped.append(f"{gpu} slot {slot['start']}: taken")
    by_node: dict[int, list[Allocation]] = {}
    for allocation in made:
        by_node.setdefault(allocation.gpu.node_id, []).append(allocation)
    created = 0
    for allocations in by_node.values():
        node = allocations[0].gpu.node
        try:
            answers = agent_client(node).create_many({a.instance_id: allocation_spec(a) for a in allocations})
        except (AgentUnreachable, AgentHTTPError) as error:
            answers = {a.instance_id: {"status": 503, "problem": {"detail": str(error)}} for a in allocations}
        for allocation in allocations:
            answer = answers.get(allocation.instance_id) or {"status": 502, "problem": {"detail": "no answer"}}
            if answer["status"] < 300:
                instance = answer["instance"]
                created += Allocation.objects.filter(pk=allocation.pk, state=AllocationState.PENDING,
                                                     lease__isnull=True).update(
                    state=AllocationState.WARM, warm_at=now, ready_at=now,
                    device_uuid=instance.get("device_uuid", ""), gpu_instance_id=instance.get("gpu_instance_id"),
                    access=instance.get("access", {}))
            else:
                skipped.append(f"{allocation.instance_id}: {answer['problem'].get('detail')}")
                _destroy_warm([allocation.pk], now)
    if created:
        from broker.services import schedule_cycle_request

        schedule_cycle_request()  # queued requests of the profile may bind them now
    return created, skipped
