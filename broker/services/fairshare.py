"""Fair share with history: the schedule cycle moves each project's remembered borrowed use on to its ``now``."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings

from broker.models import ProjectUsageHistory
from broker.scheduler.fairshare import usage_decayed


def usage_history_record(*, snapshot, now: datetime) -> dict[tuple[str, str], int]:
    """Move every project's decayed borrowed use (``ProjectUsageHistory``) on to ``now``, inside the caller's
    transaction (the schedule cycle's, under its lock): the figure kept decays from its ``updated_at`` and the
    interval adds what the project borrows in ``snapshot`` (its preemptible allocations), taken as held since then.
    A row appears when a project first borrows a model; one decayed to nothing is deleted. Returns the figures,
    (project id, tier) → milli-GPU x seconds, for ``selectors.scheduler_inputs``. Nothing when the half-life is 0."""
    half_life = settings.LEASE_FAIR_SHARE_HALF_LIFE_SECONDS
    if not half_life:
        return {}
    borrowed: dict[tuple[str, str], int] = {}
    for allocation in snapshot.allocations:
        if allocation.preemptible:
            key = (allocation.project, allocation.tier)
            borrowed[key] = borrowed.get(key, 0) + allocation.milli
    rows = {(str(row.project_id), row.tier): row for row in ProjectUsageHistory.objects.select_for_update()
            .order_by("pk")}
    figures: dict[tuple[str, str], int] = {}
    changed, gone = [], []
    for key in sorted(set(rows) | set(borrowed)):
        row = rows.get(key)
        if row is None:
            row = ProjectUsageHistory(project_id=int(key[0]), tier=key[1], decayed_milli_seconds=0, updated_at=now)
        elapsed = (now - row.updated_at).total_seconds()
        decayed = usage_decayed(previous_milli_seconds=row.decayed_milli_seconds, used_milli=borrowed.get(key, 0),
                                elapsed_seconds=elapsed, half_life_seconds=half_life)
        if decayed == 0 and key not in borrowed:
            if row.pk is not None:
                gone.append(row.pk)
            continue
        figures[key] = decayed
        if elapsed > 0 or row.pk is None:
            row.decayed_milli_seconds, row.updated_at = decayed, max(now, row.updated_at)
            changed.append(row)
    if gone:
        ProjectUsageHistory.objects.filter(pk__in=gone).delete()
    if changed:
        ProjectUsageHistory.objects.bulk_create(changed, update_conflicts=True, unique_fields=["project", "tier"],
                                                update_fields=["decayed_milli_seconds", "updated_at"])
    return figures
