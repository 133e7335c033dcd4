"""Applying a proposed change, whoever asked (the loop in auto mode, a person accepting it): taken once
(proposed → applying), then the kind's own module re-checks the world under locks and carries it out. Rows a
dead process left ``applying`` are failed by ``applying_sweep``."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.core.exceptions import ObjectDoesNotExist
from django.db import DatabaseError, transaction
from django.utils import timezone

from agent.protocol import AgentHTTPError, AgentUnreachable
from capacity.choices import AdjustmentKind, AdjustmentState
from capacity.models import Adjustment
from capacity.services.common import AdjustmentConflict, _audit, _finish, _state
from capacity.services.idle_reclaim import reclaim_apply
from capacity.services.mode_switch import mode_apply
from capacity.services.warm_pool import warm_apply
from core.errors import ApplicationError

logger = logging.getLogger("capacity.services")

# what applying may meet and the row records as its failure: an agent that refused or did not answer, a
# database refusal (a constraint, a lock timeout), a row gone meanwhile, a broker service's refusal (e.g. a
# lease that changed state). Anything else is a defect: it propagates (the row is failed by the sweep).
EXPECTED_ERRORS = (AgentHTTPError, AgentUnreachable, DatabaseError, ObjectDoesNotExist, ApplicationError)


def adjustment_apply(*, adjustment: Adjustment, actor: str, by_user=None, now: datetime | None = None) -> Adjustment:
    """Apply a proposed change (the loop in auto mode, or a person accepting it). Conditional: only a
    PROPOSED row is taken (proposed → applying), and each kind re-checks the world under locks."""
    now = now or timezone.now()
    if not Adjustment.objects.filter(pk=adjustment.pk, state=AdjustmentState.PROPOSED).update(
            state=AdjustmentState.APPLYING, applied_by=actor, decided_at=now,
            decided_by=by_user if by_user is not None and by_user.is_authenticated else None):
        raise AdjustmentConflict(f"Adjustment {adjustment.pk} is {_state(adjustment)}; only a proposed one can be "
                                 "applied.", field="state")
    adjustment.refresh_from_db()
    try:
        if adjustment.kind in (AdjustmentKind.MODE_SWITCH, AdjustmentKind.MIG_LAYOUT):
            mode_apply(adjustment, now)
        elif adjustment.kind == AdjustmentKind.WARM_POOL:
            warm_apply(adjustment, now)
        elif adjustment.kind == AdjustmentKind.IDLE_RECLAIM:
            reclaim_apply(adjustment, now)
        else:
            _finish(adjustment, AdjustmentState.APPLIED, "advice recorded", now=now)
    except EXPECTED_ERRORS as error:
        logger.exception("adjustment %s failed", adjustment.pk)
        _finish(adjustment, AdjustmentState.FAILED, f"{type(error).__name__}: {error}", now=now)
    adjustment.refresh_from_db()
    with transaction.atomic():
        _audit("adjustment.apply", by_user, {"actor": actor, "state": adjustment.state,
                                            "outcome": adjustment.outcome}, adjustment=adjustment)
    return adjustment


def applying_sweep(*, now: datetime) -> int:
    """Rows left ``applying`` by a process that died mid-way (not drains, which wait on purpose) fail after
    10 minutes with that said; what was done is in the audit log and the lease events."""
    stuck = Adjustment.objects.filter(state=AdjustmentState.APPLYING, decided_at__lt=now - timedelta(minutes=10))
    return stuck.exclude(kind__in=(AdjustmentKind.MODE_SWITCH, AdjustmentKind.MIG_LAYOUT)).update(
        state=AdjustmentState.FAILED, finished_at=now, outcome="interrupted while being applied (the process "
                                                               "stopped); see the audit log and lease events")
