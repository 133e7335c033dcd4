"""Monthly spend caps (tenant admins; platform staff in the admin) and the budget guard leasing admits requests and
renewals with (``broker.extensions``)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from billing import selectors
from billing.choices import CapAction
from billing.core.periods import period_bounds
from billing.core.pricing import HOUR_SECONDS, format_money, to_minor
from billing.models import SpendCap
from billing.services.prices import MAX_MINOR
from core.errors import Conflict, NotFound, ValidationFailed
from tenants.access import Actor
from tenants.audit import audit_record
from tenants.models import Project, Tenant


# -- spend caps (tenant admins; platform staff in the admin) ----------------------------------------------------
def _cap_by(*, actor: Actor | None, tenant: Tenant, by_user):
    """The user to audit: a tenant member (``actor``) needs ``manage`` in ``tenant``; None is platform staff."""
    if actor is None:
        return by_user
    actor.require("manage")
    if actor.tenant.pk != tenant.pk:
        raise NotFound("No such spend cap in this tenant.", field="id")
    return actor.user


def _cap_values(*, monthly_minor: object = None, action: object = None) -> dict:
    values: dict = {}
    if monthly_minor is not None:
        bad = isinstance(monthly_minor, bool) or not isinstance(monthly_minor, int)
        if bad or not 1 <= monthly_minor <= MAX_MINOR:
            raise ValidationFailed(f"monthly_minor must be a whole number of minor units from 1 to {MAX_MINOR}.",
                                   field="monthly_minor")
        values["monthly_minor"] = monthly_minor
    if action is not None:
        if action not in CapAction.values:
            raise ValidationFailed(f"action must be one of {', '.join(CapAction.values)}.", field="action")
        values["action"] = action
    return values


def _cap_scope(tenant: Tenant, project: Project | None) -> str:
    return f"project {project.slug}" if project is not None else f"tenant {tenant.slug}"


def _cap_target(tenant: Tenant, project: Project | None) -> str:
    return f"spend_cap:{tenant.slug}" + (f"/{project.slug}" if project is not None else "")


def spend_cap_create(*, tenant: Tenant, project: Project | None = None, monthly_minor: object,
                     action: object = CapAction.REFUSE, actor: Actor | None = None, by_user=None) -> SpendCap:
    """A monthly spend cap of the tenant (``project`` None) or of one project, in minor units of the tenant's
    currency: ``refuse`` makes the budget guard refuse (402) requests and renewals whose forecast would pass
    it, ``warn`` only warns. One per scope (a second: 409 naming ``project``). ``actor``: a tenant member, who
    needs ``manage`` (admin or owner); None: platform staff in the admin (``by_user``). Audited."""
    user = _cap_by(actor=actor, tenant=tenant, by_user=by_user)
    if project is not None and project.tenant_id != tenant.pk:
        raise ValidationFailed(f"Project {project.slug} is not in tenant {tenant.slug}.", field="project")
    if monthly_minor is None:
        raise ValidationFailed("monthly_minor is required.", field="monthly_minor")
    values = _cap_values(monthly_minor=monthly_minor, action=action if action is not None else CapAction.REFUSE)
    taken = Conflict(f"The {_cap_scope(tenant, project)} already has a spend cap; change that one instead.",
                     field="project")
    try:
        with transaction.atomic():
            if SpendCap.objects.filter(tenant=tenant, project=project).exists():
                raise taken
            cap = SpendCap.objects.create(tenant=tenant, project=project, **values)
            audit_record(tenant=tenant, by=user, action="spend_cap.create", target=_cap_target(tenant, project),
                         data={"currency": tenant.currency, **values})
    except IntegrityError:  # a racing create of the same scope
        raise taken from None
    return cap


def spend_cap_update(*, cap: SpendCap, monthly_minor: object = None, action: object = None,
                     actor: Actor | None = None, by_user=None) -> SpendCap:
    """Change a cap's monthly amount and/or action (what is None stays), audited with the values before."""
    user = _cap_by(actor=actor, tenant=cap.tenant, by_user=by_user)
    values = _cap_values(monthly_minor=monthly_minor, action=action)
    with transaction.atomic():
        locked = (SpendCap.objects.select_for_update(of=("self",)).select_related("tenant", "project")
                  .filter(pk=cap.pk).first())
        if locked is None:
            raise NotFound(f"No spend cap {cap.pk} in this tenant.", field="id")
        before = {"monthly_minor": locked.monthly_minor, "action": locked.action}
        if values:
            SpendCap.objects.filter(pk=locked.pk).update(**values)
        audit_record(tenant=locked.tenant, by=user, action="spend_cap.update",
                     target=_cap_target(locked.tenant, locked.project),
                     data={"currency": locked.tenant.currency, "before": before, **values})
    locked.refresh_from_db()
    return locked


def spend_cap_delete(*, cap: SpendCap, actor: Actor | None = None, by_user=None) -> None:
    """Remove a cap (its scope is then unlimited, or limited by the tenant's cap), audited."""
    user = _cap_by(actor=actor, tenant=cap.tenant, by_user=by_user)
    with transaction.atomic():
        audit_record(tenant=cap.tenant, by=user, action="spend_cap.delete",
                     target=_cap_target(cap.tenant, cap.project),
                     data={"currency": cap.tenant.currency, "monthly_minor": cap.monthly_minor, "action": cap.action})
        if not SpendCap.objects.filter(pk=cap.pk).delete()[0]:
            raise NotFound(f"No spend cap {cap.pk} in this tenant.", field="id")


# -- budget guard ----------------------------------------------------------------------------------------------
class BudgetExceeded(ValidationFailed):
    status = 402
    code = "budget_exceeded"
    title = "Monthly spend cap reached"


def budget_check(*, tenant: Tenant, project: Project, gpu: dict, workload_class: str, duration_seconds: int,
                 over_quota: bool = False, now: datetime | None = None) -> str:
    """Refuse (``BudgetExceeded``, 402, with the figures) a request whose forecast would take the month's
    spend of its tenant or project over a ``refuse`` cap; return a warning for a ``warn`` cap; "" when
    within every cap or none is set. Forecast = charges metered this month + what the tenant's live leases
    cost until their end (or the month's) + this request for its duration (within the month)."""
    caps = list(SpendCap.objects.filter(tenant=tenant).filter(Q(project__isnull=True) | Q(project=project)))
    if not caps:
        return ""
    now = now or timezone.now()
    period = now.date().replace(day=1)
    _start, end = period_bounds(period)
    quote = selectors.price_quote(tenant=tenant, gpu=gpu, workload_class=workload_class, over_quota=over_quota,
                                  at=now)
    request_hours = Decimal(min(duration_seconds, max(0, (end - now).total_seconds()))) / HOUR_SECONDS
    request_minor = to_minor(quote.per_hour * request_hours, tenant.currency) if quote else 0
    return _budget_against_caps(caps=caps, tenant=tenant, project=project, request_minor=request_minor, now=now,
                                what="this request", field="project")


def budget_check_renewal(*, lease, ends_at: datetime, now: datetime | None = None) -> str:
    """The budget guard of ``lease_renew``: the same caps and forecast as a request, where "this request"
    is what the renewal adds — the lease's price from its current end (or now) to ``ends_at``, within the
    month (its cost until the current end is already in the forecast of live leases). Refuses with
    ``BudgetExceeded`` (402, figures, field ``duration_seconds``) or returns the warning, or ""."""
    tenant, project = lease.tenant, lease.project
    caps = list(SpendCap.objects.filter(tenant=tenant).filter(Q(project__isnull=True) | Q(project=project)))
    if not caps:
        return ""
    now = now or timezone.now()
    _start, end = period_bounds(now.date().replace(day=1))
    since = max(lease.ends_at or now, now)
    until = min(ends_at, end)
    quote = selectors.price_quote(tenant=tenant, gpu=selectors._lease_gpu(lease),
                                  workload_class=lease.workload_class, over_quota=lease.over_quota, at=now)
    added_hours = Decimal(max(0.0, (until - since).total_seconds())) / HOUR_SECONDS
    added_minor = to_minor(quote.per_hour * added_hours, tenant.currency) if quote else 0
    return _budget_against_caps(caps=caps, tenant=tenant, project=project, request_minor=added_minor, now=now,
                                what="this renewal", field="duration_seconds")


def budget_admit_request(admission) -> str:
    """``budget_check`` as leasing's admission check for a new request (``broker.extensions.RequestAdmission``)."""
    return budget_check(tenant=admission.actor.tenant, project=admission.project, gpu=admission.gpu,
                        workload_class=admission.workload_class, duration_seconds=admission.duration_seconds,
                        now=admission.now)


def budget_caps_exist():
    """When ``budget_admit_request`` applies, as leasing's seam asks: a cap exists for the request's tenant or
    project (an ``Exists`` over the project row leasing looks up anyway; without caps the check costs no query)."""
    return Exists(SpendCap.objects.filter(tenant=OuterRef("tenant_id"))
                  .filter(Q(project__isnull=True) | Q(project=OuterRef("pk"))))


def budget_admit_renewal(admission) -> str:
    """``budget_check_renewal`` as leasing's admission check for a renewal (``RenewalAdmission``)."""
    return budget_check_renewal(lease=admission.lease, ends_at=admission.ends_at, now=admission.now)


def _budget_against_caps(*, caps: list[SpendCap], tenant: Tenant, project: Project, request_minor: int,
                         now: datetime, what: str, field: str) -> str:
    warnings = []
    for cap in sorted(caps, key=lambda c: c.project_id is None):
        project_id = cap.project_id
        spent, running = selectors.spend_forecast(tenant=tenant, project_id=project_id, now=now)
        forecast = spent + running + request_minor
        if forecast <= cap.monthly_minor:
            continue
        scope = f"project {project.slug}" if project_id else f"tenant {tenant.slug}"
        money = lambda minor: format_money(minor, tenant.currency)  # noqa: E731
        message = (f"The monthly spend cap of {scope} is {money(cap.monthly_minor)}; spent {money(spent)}, "
                   f"running leases {money(forecast - spent - request_minor)}, {what} "
                   f"{money(request_minor)}: forecast {money(forecast)}.")
        if cap.action == CapAction.REFUSE:
            raise BudgetExceeded(message, field=field, extra={
                "cap_minor": cap.monthly_minor, "spent_minor": spent, "request_minor": request_minor,
                "forecast_minor": forecast, "currency": tenant.currency})
        warnings.append(message)
    return " ".join(warnings)
