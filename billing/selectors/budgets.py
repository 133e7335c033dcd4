"""Spend caps and the budgets page: each cap with this month's spend and forecast."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import QuerySet
from django.utils import timezone

from billing.selectors.usage import spend_forecast
from tenants.access import Actor, restrict


def spend_cap_list(*, actor: Actor) -> QuerySet:
    """The actor's tenant's spend caps: the tenant-wide one first, then by project."""
    from django.db.models import F

    from billing.models import SpendCap

    return (restrict(SpendCap.objects.select_related("tenant", "project"), actor)
            .order_by(F("project__slug").asc(nulls_first=True)))


def spend_cap_get(*, actor: Actor, pk: int):
    from core.errors import NotFound

    cap = spend_cap_list(actor=actor).filter(pk=pk).first()
    if cap is None:
        raise NotFound(f"No spend cap {pk} in this tenant.", field="id")
    return cap


@dataclass(frozen=True)
class Budget:
    """One scope of the Budgets page: this month's spend (metered, and forecast with the live leases to their
    end) against its cap, if any. Amounts in minor units of the tenant's currency."""

    project: object  # tenants.models.Project, None for the whole tenant
    cap: object  # billing.models.SpendCap or None
    spent_minor: int
    forecast_minor: int

    @property
    def used_pct(self) -> float | None:
        return None if self.cap is None else min(100.0, self.spent_minor * 100 / self.cap.monthly_minor)

    @property
    def forecast_pct(self) -> float | None:
        return None if self.cap is None else min(100.0, self.forecast_minor * 100 / self.cap.monthly_minor)

    @property
    def over(self) -> bool:
        return self.cap is not None and self.forecast_minor > self.cap.monthly_minor


def budget_list(*, actor: Actor, now: datetime | None = None) -> list[Budget]:
    """The tenant-wide budget, then one per project: spend this month at current prices before discounts and
    credits (``spend_forecast``, the budget guard's own figures) and the cap where one is set."""
    from tenants.models import Project

    now = now or timezone.now()
    tenant = actor.tenant
    caps = {cap.project_id: cap for cap in spend_cap_list(actor=actor)}
    out = []
    for project in [None, *restrict(Project.objects.all(), actor).order_by("slug")]:
        project_id = None if project is None else project.pk
        spent, running = spend_forecast(tenant=tenant, project_id=project_id, now=now)
        out.append(Budget(project=project, cap=caps.get(project_id), spent_minor=spent,
                          forecast_minor=spent + running))
    return out
