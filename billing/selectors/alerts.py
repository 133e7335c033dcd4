"""Spend alert rules and the alerts raised (the budgets page, the dashboard and the API)."""

from __future__ import annotations

from django.db.models import F, QuerySet

from core.errors import NotFound
from tenants.access import Actor, restrict


def spend_alert_rule_list(*, actor: Actor) -> QuerySet:
    """The actor's tenant's alert rules: the tenant-wide one first, then by project."""
    from billing.models import SpendAlertRule

    return (restrict(SpendAlertRule.objects.select_related("tenant", "project"), actor)
            .order_by(F("project__slug").asc(nulls_first=True)))


def spend_alert_rule_get(*, actor: Actor, pk: int):
    rule = spend_alert_rule_list(actor=actor).filter(pk=pk).first()
    if rule is None:
        raise NotFound(f"No alert rule {pk} in this tenant.", field="id")
    return rule


def spend_alert_list(*, actor: Actor, period=None) -> QuerySet:
    """The alerts raised for the actor's tenant, newest first (one month's with ``period``)."""
    from billing.models import SpendAlert

    alerts = restrict(SpendAlert.objects.select_related("project"), actor).order_by("-created_at", "-id")
    return alerts.filter(period=period) if period is not None else alerts
