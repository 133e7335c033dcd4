"""Quota advice is the platform's advice: accepted by staff, the project's deserved quota is set to the
suggested size through ``tenants.services.quota_set`` (its own transaction, which checks the tenant's bound)."""

from __future__ import annotations

from capacity.models import Adjustment


def quota_advice_apply(adjustment: Adjustment, *, user) -> str:
    """Set the deserved quota the advice suggests (the limit raised to it where lower); the outcome to record.
    ``quota_set``'s ``ApplicationError`` (refused) reaches the caller."""
    from tenants.models import Quota
    from tenants.services import quota_set

    tier = adjustment.change.get("model", "")
    quota = Quota.objects.filter(project=adjustment.project, tier=tier).first()
    limit = max(quota.limit_gpu_milli if quota else 0, adjustment.change["size_after"])
    quota_set(project=adjustment.project, tier=tier, deserved_gpu_milli=adjustment.change["size_after"],
              limit_gpu_milli=limit, over_quota_weight=quota.over_quota_weight if quota else 1, by_user=user)
    return f"accepted: deserved quota on {tier} set to {adjustment.change['size_after']} milli"
