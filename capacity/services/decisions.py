"""People deciding proposals: who may (``_may_decide``), accepting (advice recorded, quota advice applied,
a change applied now) and rejecting (a "no" that stands for the proposal's lifetime). Each decision is taken
once, by a conditional update of a PROPOSED row, and audited."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from capacity.choices import ADVICE_KINDS, AdjustmentKind, AdjustmentState
from capacity.models import Adjustment
from capacity.services.applying import adjustment_apply
from capacity.services.common import AdjustmentConflict, _audit, _finish, _state
from capacity.services.quota_advice import quota_advice_apply
from core.errors import ApplicationError, NotFound, PermissionDenied, ValidationFailed


def _may_decide(adjustment: Adjustment, *, user, actor) -> None:
    """Staff decide everything; a tenant's admins decide their own lease and project advice (idle reclaim,
    right-sizing); pool changes and quota advice are the platform's."""
    if user is not None and user.is_staff:
        return
    own = actor is not None and adjustment.tenant_id == actor.tenant.pk
    if not own or adjustment.kind not in (AdjustmentKind.IDLE_RECLAIM, AdjustmentKind.RIGHT_SIZE):
        raise PermissionDenied("Only platform staff decide this adjustment.", field="id")
    if actor.project_ids is not None:  # an actor limited to projects decides only their advice (another's: 404)
        project_id = adjustment.project_id or (adjustment.lease.project_id if adjustment.lease_id else None)
        if project_id not in actor.project_ids:
            raise NotFound("No such adjustment.", field="id")
    actor.require("release" if adjustment.kind == AdjustmentKind.IDLE_RECLAIM else "manage")


def adjustment_accept(*, adjustment: Adjustment, user, actor=None, now: datetime | None = None) -> Adjustment:
    """Accept a proposal: advice is recorded as accepted (quota advice accepted by staff sets the quota);
    a change is applied now."""
    _may_decide(adjustment, user=user, actor=actor)
    now = now or timezone.now()
    label = f"user:{user.get_username()}"
    if adjustment.kind in ADVICE_KINDS:
        return _accept_advice(adjustment, user=user, label=label, now=now)
    return adjustment_apply(adjustment=adjustment, actor=label, by_user=user, now=now)


def adjustment_reject(*, adjustment: Adjustment, user, actor=None, reason: str = "",
                      now: datetime | None = None) -> Adjustment:
    """Reject a proposed adjustment (only a PROPOSED one); the reason is kept on its outcome and audited."""
    _may_decide(adjustment, user=user, actor=actor)
    if len(reason) > 2000:
        raise ValidationFailed("reason is at most 2000 characters.", field="reason")
    now = now or timezone.now()
    with transaction.atomic():
        done = Adjustment.objects.filter(pk=adjustment.pk, state=AdjustmentState.PROPOSED).update(
            state=AdjustmentState.REJECTED, decided_at=now, decided_by=user, finished_at=now,
            outcome=f"rejected by {user.get_username()}" + (f": {reason}" if reason else ""))
        if not done:
            raise AdjustmentConflict(f"Adjustment {adjustment.pk} is {_state(adjustment)}; only a proposed one "
                                     "can be rejected.", field="state")
        _audit("adjustment.reject", user, {"reason": reason}, adjustment=adjustment)
    adjustment.refresh_from_db()
    return adjustment


def _accept_advice(adjustment: Adjustment, *, user, label: str, now: datetime) -> Adjustment:
    """Taken once (proposed → applying); staff accepting quota advice then set the quota
    (``quota_advice``): refused, the row is ``failed`` with the reason and the refusal reaches the caller."""
    if not Adjustment.objects.filter(pk=adjustment.pk, state=AdjustmentState.PROPOSED).update(
            state=AdjustmentState.APPLYING, decided_at=now, decided_by=user, applied_by=label):
        raise AdjustmentConflict(f"Adjustment {adjustment.pk} is {_state(adjustment)}; only a proposed one "
                                 "can be accepted.", field="state")
    outcome = "accepted (advice: nothing changes by itself)"
    if adjustment.kind == AdjustmentKind.QUOTA_ADVICE and user.is_staff and adjustment.project is not None:
        try:
            outcome = quota_advice_apply(adjustment, user=user)
        except ApplicationError as error:
            with transaction.atomic():
                _finish(adjustment, AdjustmentState.FAILED, f"the quota was not changed: {error}", now=now)
                _audit("adjustment.accept", user, {"outcome": adjustment.outcome}, adjustment=adjustment)
            raise
    with transaction.atomic():
        _finish(adjustment, AdjustmentState.APPLIED, outcome, now=now)
        _audit("adjustment.accept", user, {"outcome": outcome}, adjustment=adjustment)
    adjustment.refresh_from_db()
    return adjustment
