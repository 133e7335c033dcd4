"""What every part of the loop's services shares: the loop's actor name, the conflict error, finishing a
row, the schedule cycle's lock, and the one audit helper."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime

from django.db import connection, transaction

from capacity.models import Adjustment
from core.errors import ApplicationError

LOOP = "capacity-loop"


class AdjustmentConflict(ApplicationError):
    status = 409
    code = "adjustment_conflict"
    title = "Adjustment no longer open"


def _state(adjustment: Adjustment) -> str:
    return Adjustment.objects.values_list("state", flat=True).get(pk=adjustment.pk)


def _finish(adjustment: Adjustment, state: str, outcome: str, *, now: datetime, effect: dict | None = None) -> None:
    fields = {"state": state, "finished_at": now, "outcome": outcome}
    if effect is not None:
        fields |= {"effect": effect, "effect_at": now}
    Adjustment.objects.filter(pk=adjustment.pk).update(**fields)
    adjustment.state, adjustment.outcome = state, outcome


def _audit(action: str, user, data: dict, *, adjustment: Adjustment | None = None, target: str = "",
           tenant=None) -> None:
    """The audit row of a decision on an adjustment (its tenant, ``adjustment:<id>``, its kind and target
    added to ``data``), of a platform setting (``target``, no tenant) or of a tenant's own setting (``tenant``:
    a project's idle reclaim opt-in). ``user``: a user or an ``Actor``. The one place this package writes
    ``AuditEvent`` (through ``tenants.audit.audit_record``)."""
    from tenants.audit import audit_record

    if adjustment is not None:
        tenant, target = adjustment.tenant, f"adjustment:{adjustment.pk}"
        data = {"kind": adjustment.kind, "adjustment_target": adjustment.target, **data}
    audit_record(tenant=tenant, by=user, action=action, target=target, data=data)


def _cycle_lock() -> None:
    """Wait for the schedule cycle's advisory lock (held to the end of the caller's transaction): no cycle
    places while the loop changes a GPU. A cycle that found the lock taken meanwhile skipped (leaving its
    trigger flag set, which would hold back every trigger until it expires): after the commit the flag is
    cleared and a cycle asked for, so what queued meanwhile is placed at once."""
    from broker.services import ADVISORY_LOCK, cycle_flag_clear, schedule_cycle_request

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ADVISORY_LOCK])

    def again() -> None:
        cycle_flag_clear()
        schedule_cycle_request()

    transaction.on_commit(again)


def _gpu_of(adjustment: Adjustment) -> int:
    return int(str(adjustment.change["gpu"]).lstrip("g"))


def proposal_identity(kind: str, target: str, change: dict, risk: list | tuple) -> dict:
    """What makes two proposals the same decision for a person: the kind, the target and the direction of
    the change — not the details the planner recomputes every run (a warm pool's slots and exact size, a
    layout's slots, the figures). A warm pool grows or shrinks; a GPU goes to a mode (draining which leases);
    a lease gets a reclaim step; a lease would fit a profile; a quota goes up or down."""
    if kind == "warm_pool":
        what = {"grow": int(change.get("size_after", 0)) > int(change.get("size_before", 0))}
    elif kind in ("mode_switch", "mig_layout"):
        what = {"to_mode": change.get("to_mode", ""), "drain": sorted(str(r) for r in risk)}
    elif kind == "idle_reclaim":
        what = {"step": change.get("step", "")}
    elif kind == "right_size":
        what = {"model": change.get("model", ""), "profile": change.get("profile", "")}
    elif kind == "quota_advice":
        what = {"raise": int(change.get("size_after", 0)) > int(change.get("size_before", 0))}
    else:
        what = {"change": change}
    return {"kind": kind, "target": target, **what}


def identity_print(kind: str, target: str, change: dict, risk: list | tuple) -> str:
    """The fingerprint of a proposal's open row (``Adjustment.fingerprint``): its ``proposal_identity``, hashed."""
    body = proposal_identity(kind, target, change, risk)
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
