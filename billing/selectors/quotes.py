"""The quote before a lease (``POST /api/v1/quotes`` and the portal's request panel): leasing's preview of the
request (fits, reclaims or waits; quota standing; the wait) with billing's price for it and the spend caps'
verdict. It lives in billing because it is the one place that joins the two: billing reads leasing, never the
other way (``broker.extensions``). Nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.utils import timezone

from broker.models import Lease
from broker.selectors import LeasePreview, duration_words, lease_dry_run
from tenants.access import Actor


@dataclass(frozen=True)
class QuotePrice:
    """What the request would cost at the rate it would run at (over-quota and interactive multipliers
    applied): ``per_hour`` in major units for the whole request, ``for_duration_minor`` that rate for the
    requested duration, rounded once to the currency's minor units."""

    currency: str
    per_hour: Decimal
    for_duration_minor: int
    duration_seconds: int
    description: str
    book: str

    @property
    def for_duration(self) -> Decimal:
        from billing.core.pricing import from_minor

        return from_minor(self.for_duration_minor, self.currency)

    @property
    def formatted(self) -> str:
        from billing.core.pricing import format_money, format_rate

        # a rate keeps its own decimals (0.875 USD per hour, not 0.88); the amount for the duration is money
        return (f"{format_rate(self.per_hour, self.currency)} per hour, "
                f"{format_money(self.for_duration_minor, self.currency)} for {duration_words(self.duration_seconds)}")


@dataclass(frozen=True)
class QuoteBudget:
    """The monthly spend caps' verdict, from ``billing.services.budget_check`` called as ``lease_request``
    calls it: ``refuse`` (the request would be a 402), ``warn`` (it would be accepted with the warning) or
    ``ok``. The figures (minor units) are those of the cap in ``cap_scope`` (``tenant`` or ``project``): the
    refusing cap, else the one with the least headroom; all None when no cap applies."""

    outcome: str
    message: str
    currency: str
    cap_scope: str | None = None
    cap_minor: int | None = None
    spent_minor: int | None = None
    request_minor: int | None = None
    forecast_minor: int | None = None


@dataclass(frozen=True)
class LeaseQuote:
    """Everything the broker can say about a request before it is made, nothing written: the preview's
    outcome, reason, model and quota standing, plus the preemption risk, the wait, the price and the budget.

    ``expected_wait_seconds``: 0 when it fits (placed at the next cycle); when it reclaims, the longest
    preemption notice its victims are promised (the most it waits, unless they leave sooner); when it waits,
    the time to its ``estimated_start`` (the running leases leaving at their expiry: docs/scheduling.md,
    "Estimated start times"), None when no estimate can be made."""

    preview: LeasePreview
    project: str
    gpu: dict
    preemption_risk: str
    preemption_notice_seconds: int | None
    expected_wait_seconds: int | None
    price: QuotePrice | None
    price_unavailable_reason: str | None
    budget: QuoteBudget
    share_enforcement: dict | None = None  # a share request: whether its limits would hold (docs/leasing.md)

    @property
    def outcome(self) -> str:
        return self.preview.outcome

    @property
    def reason(self) -> str:
        return self.preview.reason

    @property
    def tier(self) -> str:
        return self.preview.tier

    @property
    def over_quota(self) -> bool:
        return self.preview.over_quota

    @property
    def guarantee_covered(self) -> bool | None:
        return self.preview.guarantee_covered

    @property
    def queue_position(self) -> int | None:
        return self.preview.queue_position

    @property
    def estimated_start(self) -> datetime | None:
        if self.preview.outcome == "waits":
            return self.preview.estimated_start
        return None

    @property
    def units_milli(self) -> int:
        return self.preview.units_milli


def lease_quote(*, actor: Actor, project: object, gpu: object, workload_class: object = "training",
                priority: object = 0, duration_seconds: object = 3600, workload: object = None,
                labels: object = None, now: datetime | None = None) -> LeaseQuote:
    """The quote of a request — the one function behind ``POST /api/v1/quotes`` and the portal's live
    preview, so the two never disagree. The same checks and errors as ``lease_request`` (each naming its
    field, the optional workload's included); ``view`` is enough (it writes nothing). Reads only."""
    from broker import services
    from broker.validation import labels_check, workload_check, workload_scope

    now = now or timezone.now()
    if labels:  # refused as lease_request refuses them (labels.<key>)
        labels_check(labels, allowed=actor.tenant.allowed_label_keys)
    run = lease_dry_run(actor=actor, project=project, gpu=gpu, workload_class=workload_class, priority=priority,
                         duration_seconds=duration_seconds, now=now)
    # as lease_request checks it (a workload needs one node, paths under the project's own directory)
    if workload is not None:
        workload_check(workload, run.shape, scope=workload_scope(tenant_slug=actor.tenant.slug, project=project))
    preview = run.preview
    own_notice = services.lease_notice_seconds(tenant_id=actor.tenant.pk, now=now)
    if preview.over_quota:
        risk = (f"Over quota: it runs on capacity other projects are guaranteed and can be preempted when they "
                f"claim it back, after a notice of {own_notice} s; billed at the over-quota rate.")
    else:
        risk = "Within the guaranteed quota: it is not preempted."
    price, missing = _quote_price(actor=actor, preview=preview, workload_class=workload_class,
                                  duration_seconds=duration_seconds, now=now)
    # the budget guard as lease_request calls it: the request's gpu (its one fitting model filled in)
    budget_gpu = {**run.gpu, "model": run.fitting[0]} if len(run.fitting) == 1 else run.gpu
    budget = _quote_budget(actor=actor, project=run.project, gpu=budget_gpu, workload_class=workload_class,
                           duration_seconds=duration_seconds, now=now)
    enforcement = None
    if run.shape["kind"] == "share":  # never sold as enforced where no MPS runs
        from broker.selectors import share_enforcement_by_model, share_enforcement_note

        model = preview.tier or (run.fitting[0] if run.fitting else "")
        enforcement = share_enforcement_note(model, share_enforcement_by_model().get(model))
    return LeaseQuote(preview=preview, project=run.project.slug, gpu=_gpu_output(run.shape, preview.tier),
                      preemption_risk=risk, preemption_notice_seconds=own_notice if preview.over_quota else None,
                      expected_wait_seconds=_expected_wait(preview, run.victims, now=now), price=price,
                      price_unavailable_reason=missing, budget=budget, share_enforcement=enforcement)


def _gpu_output(shape: dict, tier: str) -> dict:
    """The request's ``gpu`` as the lease answer writes it, with the model it would run on."""
    out = {"kind": shape["kind"], "count": shape["count"], "model": tier or (shape["models"] or ["auto"])[0],
           "gang": shape["gang"]}
    for name in ("profile", "milli", "memory_mib", "cpu_milli_per_unit", "host_memory_mib_per_unit"):
        if shape.get(name):
            out[name] = shape[name]
    return out


def _expected_wait(preview: LeasePreview, victims: tuple[str, ...], *, now: datetime) -> int | None:
    from broker import services

    if preview.outcome == "fits":
        return 0
    if preview.outcome == "waits" and preview.estimated_start is not None:
        return max(0, round((preview.estimated_start - now).total_seconds()))
    if preview.outcome == "reclaims":  # as services._preempt: the longest notice among the victims' tenants
        tenants = set(Lease.objects.filter(pk__in=[int(v) for v in victims]).values_list("tenant_id", flat=True))
        return max([settings.LEASE_PREEMPTION_NOTICE_SECONDS,
                    *(services.lease_notice_seconds(tenant_id=tenant, now=now) for tenant in sorted(tenants))])
    return None


def _quote_price(*, actor: Actor, preview: LeasePreview, workload_class: str, duration_seconds: int,
                 now: datetime) -> tuple[QuotePrice | None, str | None]:
    """Billing's price of the request on the model it would run on, at the rate it would run at; or None
    and why."""
    from datetime import timedelta

    from billing.core.pricing import HOUR_SECONDS, to_minor
    from billing.selectors import price_books_for, price_quote

    tenant = actor.tenant
    quote = price_quote(tenant=tenant, gpu=preview.gpu, workload_class=workload_class,
                        over_quota=preview.over_quota, at=now)
    if quote is None:
        books = price_books_for(tenant=tenant, start=now, end=now + timedelta(seconds=1))
        if not books:
            return None, f"No price book is in force for tenant '{tenant.slug}' ({tenant.currency})."
        model = preview.gpu.get("model", "auto")
        what = {"mig": f"MIG {preview.gpu.get('profile')}", "share": "a GPU share"}.get(preview.gpu.get("kind"),
                                                                                       "a whole GPU")
        where = "any model" if model == "auto" else model
        return None, f"The price book '{books[-1][1].name}' has no rate for {what} on {where}."
    amount = quote.per_hour * Decimal(duration_seconds) / HOUR_SECONDS
    return QuotePrice(currency=quote.currency, per_hour=quote.per_hour,
                      for_duration_minor=to_minor(amount, quote.currency), duration_seconds=duration_seconds,
                      description=quote.description, book=quote.book), None


def _quote_budget(*, actor: Actor, project, gpu: dict, workload_class: str, duration_seconds: int,
                  now: datetime) -> QuoteBudget:
    """``billing.services.budget_check`` decides (the request's own guard); the figures of a cap it did not
    refuse are computed the way it computes them (this month's spend, the live leases, this request)."""
    from django.db.models import Q

    from billing.core.pricing import HOUR_SECONDS, to_minor
    from billing.models import SpendCap
    from billing.selectors import price_quote, spend_forecast
    from billing.services import BudgetExceeded, budget_check, period_bounds

    tenant = actor.tenant
    caps = list(SpendCap.objects.filter(tenant=tenant).filter(Q(project__isnull=True) | Q(project=project))
                .order_by("pk"))
    if not caps:
        return QuoteBudget("ok", "", tenant.currency)
    try:
        warning = budget_check(tenant=tenant, project=project, gpu=gpu, workload_class=workload_class,
                               duration_seconds=duration_seconds, now=now)
    except BudgetExceeded as error:
        figures = error.extra
        scope = "project" if error.message.startswith(f"The monthly spend cap of project {project.slug} ") \
            else "tenant"
        return QuoteBudget("refuse", error.message, tenant.currency, scope, figures["cap_minor"],
                           figures["spent_minor"], figures["request_minor"], figures["forecast_minor"])
    _start, end = period_bounds(now.date().replace(day=1))
    quote = price_quote(tenant=tenant, gpu=gpu, workload_class=workload_class, over_quota=False, at=now)
    hours = Decimal(min(duration_seconds, max(0, (end - now).total_seconds()))) / HOUR_SECONDS
    request_minor = to_minor(quote.per_hour * hours, tenant.currency) if quote else 0
    tightest = None
    for cap in sorted(caps, key=lambda c: c.project_id is None):  # project caps first, as budget_check
        spent, running = spend_forecast(tenant=tenant, project_id=cap.project_id, now=now)
        forecast = spent + running + request_minor
        if tightest is None or cap.monthly_minor - forecast < tightest[0]:
            tightest = (cap.monthly_minor - forecast, cap, spent, forecast)
    _headroom, cap, spent, forecast = tightest
    return QuoteBudget("warn" if warning else "ok", warning, tenant.currency,
                       "project" if cap.project_id else "tenant", cap.monthly_minor, spent, request_minor, forecast)
