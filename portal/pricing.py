"""What the portal asks billing for outside the billing pages: a price for the request form's live
preview and the month's spend for the dashboard."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from billing import selectors as billing
from billing.core.pricing import format_money
from billing.services.metering_run import usage_meter_recent
from core.errors import ApplicationError


def price_quote(*, tenant, gpu: dict, workload_class: str, over_quota: bool):
    """Billing's quote for this request shape — an object with ``currency``, ``per_hour`` (``Decimal``,
    major units) and ``description`` — or None when no price book applies."""
    try:
        return billing.price_quote(tenant=tenant, gpu=gpu, workload_class=workload_class, over_quota=over_quota,
                                   at=None)
    except ApplicationError:
        return None


def budget_outcome(*, actor, project: str, gpu: dict, workload_class: str, duration_seconds: int,
                   over_quota: bool) -> dict | None:
    """What the budget guard would say about this request now, with the same check as the request path
    (``billing.services.budget_check``): ``{"outcome": "refused", "message", "figures"}`` for a ``refuse``
    cap it would break, ``{"outcome": "warning", "message"}`` for a ``warn`` cap, None when within every
    cap or none is set. Reads only."""
    from billing.services import BudgetExceeded, budget_check
    from tenants.selectors import project_get

    try:
        target = project_get(actor=actor, slug=project)
        warning = budget_check(tenant=actor.tenant, project=target, gpu=gpu, workload_class=workload_class,
                               duration_seconds=duration_seconds, over_quota=over_quota)
    except BudgetExceeded as error:
        return {"outcome": "refused", "message": error.message, "figures": error.extra}
    except ApplicationError:
        return None
    return {"outcome": "warning", "message": warning} if warning else None


def dashboard_spend(actor) -> dict | None:
    """This month's spend so far (metered, the hour in progress metered on demand: ``metered_until``, at current
    prices) and the forecast to the month's end with the live leases; None when no price book applies to the
    tenant."""
    tenant = actor.tenant
    now = timezone.now()
    if not billing.price_books_for(tenant=tenant, start=now, end=now + timedelta(seconds=1)):
        return None
    # the hour in progress metered on demand: "so far" counts it before any hourly run or invoice (issue 29)
    metered_until = usage_meter_recent(tenant_id=tenant.pk, now=now)
    spent, running = billing.spend_forecast(tenant=tenant, now=now)
    return {"spent": format_money(spent, tenant.currency), "running": format_money(running, tenant.currency),
            "forecast": format_money(spent + running, tenant.currency), "metered_until": metered_until}


def dashboard_alerts(actor) -> list:
    """This month's spend alerts for the dashboard (newest first, at most five; issue 33)."""
    from billing.selectors.alerts import spend_alert_list

    this_month = timezone.now().date().replace(day=1)
    return list(spend_alert_list(actor=actor, period=this_month)[:5])
