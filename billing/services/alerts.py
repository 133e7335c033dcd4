"""Spend alerts (issue 33): rules per tenant and project, the alerts raised once per period, and the month-boundary
check of the leases a month inherits against its cap.

- ``spend_alert_rule_set`` / ``spend_alert_rule_delete``: a scope's thresholds (percentages), its budget (the base
  of the percentages when the scope has no cap, or instead of it) and whether the forecast is watched too. A scope
  with a cap and no rule is watched at ``SPEND_ALERT_DEFAULT_THRESHOLDS`` of its cap, spend and forecast.
- ``spend_alerts_evaluate``: for every watched scope, this month's spend and forecast (``spend_forecast``, the
  budget guard's own figures) against each threshold; a threshold reached raises one ``SpendAlert`` per (scope,
  month, basis, threshold) — the unique constraints make every later evaluation of the month raise nothing more.
- ``spend_caps_boundary_check``: a lease admitted last month was checked against last month's cap only; when a
  month begins, the leases it inherits (active or preempted since before its first instant) are checked against
  its cap: when the scope's forecast (the carried leases to their end, with anything queued) passes the cap, one
  ``boundary`` alert is raised for the month. The leases keep running (a running lease is not stopped for money,
  as dunning leaves running leases alone); a ``refuse`` cap then refuses their renewals and new requests as the
  budget guard always does.

Each alert is written with its audit row in one transaction; the notification outbox (``notifications``, which
sits above billing) tells it to the tenant's webhooks (``spend.alert``) and its admins' mailboxes.
"""

from __future__ import annotations

from datetime import date, datetime

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from billing import selectors
from billing.choices import AlertBasis
from billing.core.pricing import format_money
from billing.models import SpendAlert, SpendAlertRule, SpendCap
from billing.services.prices import MAX_MINOR
from core.errors import NotFound, ValidationFailed
from tenants.access import Actor
from tenants.audit import audit_record
from tenants.models import Project, Tenant

MAX_THRESHOLDS = 10


def _rule_target(tenant: Tenant, project: Project | None) -> str:
    return f"spend_alert_rule:{tenant.slug}" + (f"/{project.slug}" if project is not None else "")


def _thresholds_check(thresholds: object) -> list[int]:
    if (not isinstance(thresholds, list | tuple) or not 1 <= len(thresholds) <= MAX_THRESHOLDS
            or not all(isinstance(t, int) and not isinstance(t, bool) and 1 <= t <= 1000 for t in thresholds)):
        raise ValidationFailed(f"thresholds_pct must list 1 to {MAX_THRESHOLDS} whole percentages from 1 to 1000.",
                               field="thresholds_pct")
    return sorted(set(thresholds))


def spend_alert_rule_set(*, actor: Actor, project: Project | None = None, thresholds_pct: object = None,
                         budget_minor: object = None, forecast: object = True,
                         now: datetime | None = None) -> SpendAlertRule:
    """Create or replace the alert rule of the actor's tenant (``project`` None) or of one of its projects. Needs
    ``manage``. ``thresholds_pct`` defaults to ``SPEND_ALERT_DEFAULT_THRESHOLDS``; ``budget_minor`` (minor units of
    the tenant's currency, optional) is the base of the percentages (else the scope's spend cap: a scope with
    neither is refused, naming ``budget_minor``). Audited with the rule before."""
    actor.require("manage")
    tenant = actor.tenant
    if project is not None and project.tenant_id != tenant.pk:
        raise NotFound("No such project in this tenant.", field="project")
    thresholds = _thresholds_check(list(settings.SPEND_ALERT_DEFAULT_THRESHOLDS) if thresholds_pct is None
                                   else thresholds_pct)
    if budget_minor is not None and (isinstance(budget_minor, bool) or not isinstance(budget_minor, int)
                                     or not 1 <= budget_minor <= MAX_MINOR):
        raise ValidationFailed(f"budget_minor must be a whole number of minor units from 1 to {MAX_MINOR}.",
                               field="budget_minor")
    if not isinstance(forecast, bool):
        raise ValidationFailed("forecast must be true or false.", field="forecast")
    if budget_minor is None and not SpendCap.objects.filter(tenant=tenant, project=project).exists():
        raise ValidationFailed("This scope has no spend cap: give a budget_minor for the percentages.",
                               field="budget_minor")
    now = now or timezone.now()
    values = {"thresholds_pct": thresholds, "budget_minor": budget_minor, "forecast": forecast}
    with transaction.atomic(durable=True):
        existing = (SpendAlertRule.objects.select_for_update().filter(tenant=tenant, project=project).first())
        before = None if existing is None else {"thresholds_pct": existing.thresholds_pct,
                                                "budget_minor": existing.budget_minor, "forecast": existing.forecast}
        try:
            with transaction.atomic():
                if existing is None:
                    rule = SpendAlertRule.objects.create(tenant=tenant, project=project, created_at=now, **values)
                else:
                    SpendAlertRule.objects.filter(pk=existing.pk).update(**values)
                    rule = SpendAlertRule.objects.get(pk=existing.pk)
        except IntegrityError:  # a racing create of the same scope
            raise ValidationFailed("This scope's alert rule was just created by someone else; try again.",
                                   field="project") from None
        audit_record(tenant=tenant, by=actor.user, action="spend_alert_rule.set", target=_rule_target(tenant, project),
                     data={"currency": tenant.currency, "before": before, **values})
    return rule


def spend_alert_rule_delete(*, actor: Actor, rule: SpendAlertRule) -> None:
    """Remove a rule: its scope goes back to the default thresholds of its cap (or to no alerts without one)."""
    actor.require("manage")
    if rule.tenant_id != actor.tenant.pk:
        raise NotFound("No such alert rule in this tenant.", field="id")
    with transaction.atomic(durable=True):
        if not SpendAlertRule.objects.filter(pk=rule.pk).delete()[0]:
            raise NotFound(f"No alert rule {rule.pk} in this tenant.", field="id")
        audit_record(tenant=actor.tenant, by=actor.user, action="spend_alert_rule.delete",
                     target=_rule_target(actor.tenant, rule.project),
                     data={"thresholds_pct": rule.thresholds_pct, "budget_minor": rule.budget_minor,
                           "forecast": rule.forecast})


def _raise(*, tenant: Tenant, project: Project | None, period: date, basis: str, threshold_pct: int,
           base_minor: int, amount_minor: int, message: str, now: datetime) -> SpendAlert | None:
    """One alert with its audit row, or None when the (scope, period, basis, threshold) has one already."""
    exists = SpendAlert.objects.filter(tenant=tenant, project=project, period=period, basis=basis,
                                       threshold_pct=threshold_pct).exists()
    if exists:
        return None
    try:
        with transaction.atomic():
            alert = SpendAlert.objects.create(tenant=tenant, project=project, period=period, basis=basis,
                                              threshold_pct=threshold_pct, base_minor=base_minor,
                                              amount_minor=amount_minor, currency=tenant.currency,
                                              message=message[:300], created_at=now)
            audit_record(tenant=tenant, by=None, action=f"spend_alert.{basis}",
                         target=f"spend_alert:{tenant.slug}" + (f"/{project.slug}" if project else ""),
                         data={"period": f"{period:%Y-%m}", "threshold_pct": threshold_pct,
                               "base_minor": base_minor, "amount_minor": amount_minor, "currency": tenant.currency})
    except IntegrityError:  # another evaluation raised it first: raised once
        return None
    return alert


def _scopes() -> list[tuple[Tenant, Project | None, SpendAlertRule | None, SpendCap | None]]:
    caps = {(c.tenant_id, c.project_id): c for c in SpendCap.objects.select_related("tenant", "project")}
    rules = {(r.tenant_id, r.project_id): r for r in SpendAlertRule.objects.select_related("tenant", "project")}
    out = []
    for key in sorted(set(caps) | set(rules), key=lambda k: (k[0], k[1] or 0)):
        holder = rules.get(key) or caps.get(key)
        out.append((holder.tenant, holder.project, rules.get(key), caps.get(key)))
    return out


def spend_alerts_evaluate(*, now: datetime | None = None) -> list[SpendAlert]:
    """Raise the alerts of this month that every watched scope reached and has not had yet; returns them."""
    now = now or timezone.now()
    period = now.date().replace(day=1)
    raised: list[SpendAlert] = []
    for tenant, project, rule, cap in _scopes():
        base = (rule.budget_minor if rule is not None and rule.budget_minor else None) or (
            cap.monthly_minor if cap is not None else None)
        if not base:
            continue
        thresholds = rule.thresholds_pct if rule is not None else settings.SPEND_ALERT_DEFAULT_THRESHOLDS
        watch_forecast = rule.forecast if rule is not None else True
        spent, running = selectors.spend_forecast(tenant=tenant, project_id=project.pk if project else None, now=now)
        scope = f"project {project.slug}" if project else f"tenant {tenant.slug}"
        what = "budget" if rule is not None and rule.budget_minor else "spend cap"
        currency = tenant.currency
        figures = [(AlertBasis.SPENT, spent)] + ([(AlertBasis.FORECAST, spent + running)] if watch_forecast else [])
        for basis, amount in figures:
            for threshold in thresholds:
                if amount * 100 < threshold * base:
                    continue
                noun = "spend" if basis == AlertBasis.SPENT else "forecast spend"
                message = (f"The {noun} of {scope} this month, {format_money(amount, currency)}, reached "
                           f"{threshold}% of its {what} of {format_money(base, currency)}.")
                alert = _raise(tenant=tenant, project=project, period=period, basis=basis, threshold_pct=threshold,
                               base_minor=base, amount_minor=amount, message=message, now=now)
                if alert is not None:
                    raised.append(alert)
    return raised


def spend_caps_boundary_check(*, now: datetime | None = None) -> list[SpendAlert]:
    """At (or after) the start of a month: every capped scope that holds leases carried over from the month before
    is checked against this month's cap; a forecast over it raises one ``boundary`` alert for the month."""
    from broker.models import Lease

    now = now or timezone.now()
    period = now.date().replace(day=1)
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    raised: list[SpendAlert] = []
    for cap in SpendCap.objects.select_related("tenant", "project").order_by("tenant_id", "pk"):
        carried = Lease.objects.filter(tenant=cap.tenant, state__in=["active", "preempted"],
                                       active_at__lt=month_start)
        if cap.project_id:
            carried = carried.filter(project_id=cap.project_id)
        count = carried.count()
        if not count:
            continue
        spent, running = selectors.spend_forecast(tenant=cap.tenant, project_id=cap.project_id, now=now)
        forecast = spent + running
        if forecast <= cap.monthly_minor:
            continue
        scope = f"project {cap.project.slug}" if cap.project_id else f"tenant {cap.tenant.slug}"
        currency = cap.tenant.currency
        message = (f"{count} lease(s) of {scope} carried into {period:%B %Y} take its forecast to "
                   f"{format_money(forecast, currency)}, over its monthly spend cap of "
                   f"{format_money(cap.monthly_minor, currency)}"
                   + ("; renewals and new requests are refused while over it." if cap.action == "refuse" else "."))
        alert = _raise(tenant=cap.tenant, project=cap.project, period=period, basis=AlertBasis.BOUNDARY,
                       threshold_pct=100, base_minor=cap.monthly_minor, amount_minor=forecast, message=message,
                       now=now)
        if alert is not None:
            raised.append(alert)
    return raised


def spend_alerts_run(*, now: datetime | None = None) -> int:
    """The periodic run: the month-boundary check, then the thresholds; returns how many alerts were raised."""
    now = now or timezone.now()
    return len(spend_caps_boundary_check(now=now)) + len(spend_alerts_evaluate(now=now))
