"""SLO evaluation and invoices: lines computed from metered usage and the price books, built, corrected, finalized,
and the monthly invoice run."""

from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.db.models import OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from billing import selectors
from billing.choices import InvoiceStatus, LineKind
from billing.core import slo
from billing.core.metering import HOUR, hour_floor
from billing.core.periods import period_bounds
from billing.core.pricing import MILLI_HOUR, format_money, from_minor, to_minor, units_of
from billing.models import (
    AllocationUsage,
    BillingTerms,
    Invoice,
    InvoiceLine,
    MeterWindow,
    SloEvaluation,
)
from billing.services.metering import usage_meter_window
from config.errors import ValidationFailed
from leasing.models import Allocation, Lease, LeaseEvent
from tenants.models import Project, SloContract, Tenant


# -- SLO evaluation ----------------------------------------------------------------------------------------
def _histories(tenant: Tenant, start: datetime, end: datetime) -> list[slo.LeaseHistory]:
    """The leases' histories as of ``end``: only what cannot change afterwards, so a month evaluates the
    same whenever it runs. Over quota is read from the lease's first allocation (its first placement),
    not from ``Lease.over_quota``, which a requeue resets and a later placement rewrites; leases in id order
    (the evidence lists keep that order)."""
    first_placement = (Allocation.objects.filter(lease=OuterRef("pk")).order_by("created_at", "pk")
                       .values("preemptible")[:1])
    leases = list(Lease.objects.filter(tenant=tenant, requested_at__lt=end)
                  .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=start))
                  .annotate(first_over_quota=Coalesce(Subquery(first_placement), "over_quota"))
                  .order_by("pk").values_list("pk", "requested_at", "first_over_quota", "ends_at"))
    events: dict[int, list] = defaultdict(list)
    for lease_id, at, from_state, to_state, actor in (
            LeaseEvent.objects.filter(lease_id__in=[row[0] for row in leases], at__lt=end)
            .order_by("lease_id", "at", "pk").values_list("lease_id", "at", "from_state", "to_state", "actor")
            .iterator(chunk_size=5000)):
        events[lease_id].append((at, from_state, to_state, actor))
    return [slo.LeaseHistory(lease_id=pk, requested_at=requested, over_quota=over, ends_at=ends, events=events[pk])
            for pk, requested, over, ends in leases]


def period_parse(value: str) -> date:
    """``YYYY-MM`` → the first day of that month; a clear error naming ``period`` otherwise."""
    try:
        year, month = (int(part) for part in str(value).split("-"))
        return date(year, month, 1)
    except (ValueError, TypeError):
        raise ValidationFailed(f"period must be a month as YYYY-MM, not {value!r}.", field="period") from None


def slo_evaluate(*, tenant: Tenant, period: date, now: datetime | None = None) -> SloEvaluation | None:
    """Measure the tenant's SLOs for the month against the contract in force at its start (else the
    latest one that overlaps it) and store the result (one row per tenant-month, replaced by a re-run
    while the month's invoice is a draft). None when the tenant has no contract for the period."""
    now = now or timezone.now()
    start, end = period_bounds(period)
    contract = (SloContract.objects.filter(tenant=tenant, effective_from__lt=end)
                .filter(Q(effective_to__isnull=True) | Q(effective_to__gt=start))
                .prefetch_related("credit_steps").order_by("-effective_from").first())
    if contract is None:
        return None
    until = min(end, now)
    figures = slo.measure(_histories(tenant, start, until), start=start, end=until,
                          notice_seconds=contract.preemption_notice_seconds)
    steps = [(s.metric, s.threshold, s.credit_pct) for s in contract.credit_steps.all()]
    credit_pct, evidence = slo.credit_for(figures, steps, contract.max_credit_pct)
    targets = {"time_to_gpu_p95": contract.time_to_gpu_p95_seconds,
               "availability": str(contract.availability_target_pct),
               "preemption_notice": "100"}
    for metric, item in evidence.items():
        item["target"] = targets[metric]
    evidence["losses"] = figures.losses[:50]
    evidence["short_notices"] = figures.short_notices[:50]
    evidence["period"] = {"from": start.isoformat(), "to": until.isoformat()}

    def dec(value: float | None, places: str = "0.001") -> Decimal | None:
        return None if value is None else Decimal(str(value)).quantize(Decimal(places))

    evaluation, _ = SloEvaluation.objects.update_or_create(
        tenant=tenant, period=period,
        defaults={"contract": contract, "time_to_gpu_p95_seconds": dec(figures.ttg_p95),
                  "in_quota_requests": len(figures.ttg_samples), "availability_pct": dec(figures.availability_pct),
                  "preemption_notice_pct": dec(figures.notice_pct), "preemptions": figures.preemptions,
                  "credit_pct": credit_pct, "evidence": evidence, "evaluated_at": now})
    return evaluation


# -- invoices ----------------------------------------------------------------------------------------------
USAGE_SQL = """
SELECT u.project_id, u.tier, u.kind, u.mig_profile, u.workload_class, u.over_quota, u.profiling,
       SUM(u.seconds * u.gpu_milli)                                                   AS milli_seconds,
       SUM(CASE WHEN t.engine_active_avg IS NOT NULL THEN u.seconds * u.gpu_milli END) AS measured_ms,
       SUM(u.seconds * u.gpu_milli * t.engine_active_avg)                              AS active_ms,
       SUM(CASE WHEN t.fb_used_avg_mib IS NOT NULL THEN u.seconds END)                 AS memory_s,
       SUM(u.seconds * t.fb_used_avg_mib)                                              AS memory_mib_s,
       SUM(CASE WHEN t.engine_active_avg < %(idle)s THEN u.seconds * u.gpu_milli END)  AS idle_ms,
       SUM(t.energy_wh)                                                                AS energy_wh
  FROM billing_allocationusage u
  LEFT JOIN billing_utilisationusage t ON t.lease_id = u.lease_id AND t.hour_start = u.hour_start
 WHERE u.tenant_id = %(tenant)s AND u.hour_start >= %(start)s AND u.hour_start < %(end)s
 GROUP BY 1, 2, 3, 4, 5, 6, 7
 ORDER BY 1, 2, 3, 4, 5, 6, 7
"""

SIX = Decimal("0.000001")


def _usage_groups(tenant: Tenant, start: datetime, end: datetime) -> list[dict]:
    with connection.cursor() as cursor:
        cursor.execute(USAGE_SQL, {"tenant": tenant.pk, "start": start, "end": end,
                                   "idle": settings.BILLING_IDLE_ENGINE_ACTIVE})
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def invoice_lines_compute(*, tenant: Tenant, period: date, slo_credit_pct: Decimal = Decimal(0),
                          slo_evidence: dict | None = None) -> list[InvoiceLine]:
    """The lines of the tenant's invoice for ``period`` from metered usage (unsaved). Usage lines by
    project × model/profile × class × over-quota (and price book, where one changed mid-month); then
    energy, discount, committed minimum and the SLO credit. Usage without a price is refused."""
    start, end = period_bounds(period)
    books = selectors.price_books_for(tenant=tenant, start=start, end=end)
    currency = tenant.currency
    projects = {p.pk: p for p in Project.objects.filter(tenant=tenant)}
    lines: list[InvoiceLine] = []
    energy_wh = defaultdict(Decimal)
    energy_price: dict[int, Decimal] = {}
    bounds = [moment for moment, _b, _t in books] + [end]
    for index, (moment, book, table) in enumerate(books):
        piece_end = bounds[index + 1]
        for group in _usage_groups(tenant, moment, piece_end):
            found = table.unit_price(group["tier"], group["kind"], group["mig_profile"],
                                     over_quota=group["over_quota"], workload_class=group["workload_class"],
                                     profiling=group["profiling"])
            project = projects[group["project_id"]]
            if found is None:
                raise ValidationFailed(
                    f"Price book {book.name!r} has no price for {group['mig_profile'] or group['kind']} on "
                    f"{group['tier']} (used by project {project.slug}).", field="price_book")
            unit_price, unit = found
            qty = units_of(group["kind"], group["tier"], group["mig_profile"], group["milli_seconds"])
            held = Decimal(group["milli_seconds"]) / MILLI_HOUR
            measured = Decimal(group["measured_ms"] or 0)
            active = (Decimal(group["active_ms"]) / measured) if measured else None
            memory = (Decimal(group["memory_mib_s"]) / Decimal(group["memory_s"])) if group["memory_s"] else None
            idle = Decimal(group["idle_ms"] or 0) / MILLI_HOUR if measured else None
            what = group["mig_profile"] or ("shared GPU" if group["kind"] == "share" else "GPU")
            notes = [n for n, on in (("over quota", group["over_quota"]),
                                     (f"profiling rate × {table.profiling_multiplier.normalize()}", group["profiling"]))
                     if on]
            piece = "" if len(books) == 1 else f", {max(moment, start):%d %b}–{piece_end:%d %b}"
            lines.append(InvoiceLine(
                kind=LineKind.USAGE, project=project, tier=group["tier"], mig_profile=group["mig_profile"],
                workload_class=group["workload_class"], over_quota=group["over_quota"],
                profiling=group["profiling"], unit=unit,
                description=f"{project.slug}: {group['tier']} {what}, {group['workload_class']}"
                            + (f" ({', '.join(notes)})" if notes else "") + piece,
                quantity=qty.quantize(SIX), unit_price=unit_price, amount_minor=to_minor(qty * unit_price, currency),
                gpu_hours=held.quantize(SIX), engine_active_avg=None if active is None else active.quantize(SIX),
                memory_used_avg_mib=None if memory is None else memory.quantize(Decimal("0.001")),
                idle_gpu_hours=None if idle is None else idle.quantize(SIX),
                evidence={"price_book": book.name, "price_book_id": book.pk}))
            if group["energy_wh"] is not None and table.energy_per_kwh is not None:
                energy_wh[project.pk] += Decimal(group["energy_wh"])
                energy_price[project.pk] = table.energy_per_kwh
    for project_id, wh in sorted(energy_wh.items()):
        kwh = wh / 1000
        lines.append(InvoiceLine(
            kind=LineKind.ENERGY, project=projects[project_id], unit="kWh",
            description=f"{projects[project_id].slug}: energy pass-through", quantity=kwh.quantize(SIX),
            unit_price=energy_price[project_id], amount_minor=to_minor(kwh * energy_price[project_id], currency)))
    charges = sum(line.amount_minor for line in lines)
    terms = (BillingTerms.objects.filter(tenant=tenant, effective_from__lt=end).order_by("-effective_from").first())
    if terms is not None and terms.discount_pct and charges:
        amount = -to_minor(from_minor(charges, currency) * terms.discount_pct / 100, currency)
        lines.append(InvoiceLine(kind=LineKind.DISCOUNT, unit="percent", quantity=terms.discount_pct,
                                 unit_price=Decimal(0), amount_minor=amount,
                                 description=f"Discount {terms.discount_pct}% on usage"))
    net = sum(line.amount_minor for line in lines)
    if terms is not None and terms.monthly_commit_minor > net:
        shortfall = terms.monthly_commit_minor - net
        lines.append(InvoiceLine(kind=LineKind.COMMIT, unit="month", quantity=Decimal(1),
                                 unit_price=from_minor(shortfall, currency), amount_minor=shortfall,
                                 description="Committed-use minimum "
                                             f"{format_money(terms.monthly_commit_minor, currency)}, usage "
                                             f"{format_money(net, currency)}"))
    if slo_credit_pct and net > 0:
        amount = -to_minor(from_minor(net, currency) * slo_credit_pct / 100, currency)
        missed = [m for m, item in (slo_evidence or {}).items()
                  if isinstance(item, dict) and item.get("credit_pct") not in (None, "0")]
        lines.append(InvoiceLine(kind=LineKind.SLO_CREDIT, unit="percent", quantity=slo_credit_pct,
                                 unit_price=Decimal(0), amount_minor=amount, evidence=slo_evidence or {},
                                 description="SLO credit: " + ", ".join(
                                     f"{m} measured {slo_evidence[m]['measured']} (target {slo_evidence[m]['target']})"
                                     for m in missed)))
    for position, line in enumerate(lines, start=1):
        line.position = position
    return lines


def _totals(lines: list[InvoiceLine]) -> dict[str, int]:
    discount = sum(line.amount_minor for line in lines if line.kind == LineKind.DISCOUNT)
    credit = sum(line.amount_minor for line in lines if line.kind == LineKind.SLO_CREDIT)
    subtotal = sum(line.amount_minor for line in lines) - discount - credit
    return {"subtotal_minor": subtotal, "discount_minor": discount, "credit_minor": credit,
            "total_minor": subtotal + discount + credit}


def invoice_build(*, tenant: Tenant, period: date, now: datetime | None = None) -> Invoice | None:
    """Create or recompute the tenant's draft for ``period`` in one transaction; a finalized, paid or
    void invoice is returned untouched. None when the tenant has no usage and no commitment.

    Builds of one tenant-month are serialised by a PostgreSQL advisory lock held until the transaction
    ends: ``select_for_update`` locks nothing while the invoice does not exist yet, so two runs at once
    would both insert it and one would die on the unique constraint. The second waits, then finds the
    first one's invoice (a draft it recomputes, or a final one it leaves alone)."""
    now = now or timezone.now()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                           [f"billing.invoice_build:{tenant.pk}:{period:%Y-%m}"])
        existing = Invoice.objects.select_for_update().filter(tenant=tenant, period=period).first()
        if existing is not None and existing.status != InvoiceStatus.DRAFT:
            return existing
        evaluation = slo_evaluate(tenant=tenant, period=period, now=now)
        lines = invoice_lines_compute(
            tenant=tenant, period=period,
            slo_credit_pct=evaluation.credit_pct if evaluation else Decimal(0),
            slo_evidence=evaluation.evidence if evaluation else None)
        lines += _corrections(tenant=tenant, period=period, start=len(lines) + 1)
        if not lines and existing is None:
            return None
        invoice = existing or Invoice(tenant=tenant, period=period)
        invoice.currency = tenant.currency
        invoice.computed_at = now
        for name, value in _totals(lines).items():
            setattr(invoice, name, value)
        invoice.save()
        invoice.lines.all().delete()
        for line in lines:
            line.invoice = invoice
        InvoiceLine.objects.bulk_create(lines)
    return invoice


def _corrections(*, tenant: Tenant, period: date, start: int) -> list[InvoiceLine]:
    """Correction lines for the previous month's finalized invoice, when usage metered after it was
    finalized (late events, a window filled later) changes what it should have charged: the difference
    between a recomputation (with the SLO credit as evaluated then) and what was invoiced plus the
    corrections already made in other finalized invoices. A finalized invoice itself never changes."""
    previous_month = (period - timedelta(days=1)).replace(day=1)
    earlier = Invoice.objects.filter(tenant=tenant, period=previous_month,
                                     status__in=[InvoiceStatus.FINALIZED, InvoiceStatus.PAID]).first()
    if earlier is None:
        return []
    evaluation = SloEvaluation.objects.filter(tenant=tenant, period=previous_month).first()
    recomputed = invoice_lines_compute(
        tenant=tenant, period=previous_month,
        slo_credit_pct=evaluation.credit_pct if evaluation else Decimal(0),
        slo_evidence=evaluation.evidence if evaluation else None)
    should = sum(line.amount_minor for line in recomputed)
    corrected = sum(InvoiceLine.objects.filter(
        kind=LineKind.CORRECTION, evidence__corrects=earlier.pk,
        invoice__status__in=[InvoiceStatus.FINALIZED, InvoiceStatus.PAID]).exclude(
        invoice__period=period).values_list("amount_minor", flat=True))
    # what the earlier invoice charged for its own month (its correction lines were about the month before)
    invoiced = sum(earlier.lines.exclude(kind=LineKind.CORRECTION).values_list("amount_minor", flat=True))
    difference = should - invoiced - corrected
    if difference == 0:
        return []
    return [InvoiceLine(
        kind=LineKind.CORRECTION, position=start, unit="invoice", quantity=Decimal(1),
        unit_price=from_minor(difference, tenant.currency), amount_minor=difference,
        description=f"Correction of invoice {earlier.number} ({previous_month:%B %Y}): usage metered after it "
                    f"was issued",
        evidence={"corrects": earlier.pk, "number": earlier.number, "invoiced_minor": invoiced,
                  "earlier_corrections_minor": corrected, "recomputed_minor": should})]


def invoice_finalize(*, invoice: Invoice, now: datetime | None = None) -> Invoice:
    """Draft → finalized (idempotent): numbered, frozen by the database, pushed to Stripe after commit."""
    now = now or timezone.now()
    with transaction.atomic():
        invoice = Invoice.objects.select_for_update().get(pk=invoice.pk)
        if invoice.status != InvoiceStatus.DRAFT:
            return invoice
        invoice.status = InvoiceStatus.FINALIZED
        invoice.finalized_at = now
        invoice.number = f"GPUB-{invoice.period:%Y%m}-{invoice.pk:06d}"
        invoice.save(update_fields=["status", "finalized_at", "number"])
        invoice_id = invoice.pk
        transaction.on_commit(lambda: _push_later(invoice_id))
    return invoice


def _push_later(invoice_id: int) -> None:
    try:
        from billing.services import stripe_sync
    except ImportError:  # the Stripe part is optional in a deployment without it
        return
    stripe_sync.invoice_push_task.delay(invoice_id)


def period_closed(*, period: date, now: datetime) -> tuple[bool, str]:
    """Whether the month can be invoiced for good: it has ended, the grace for late events has passed
    and every metering window of the month is closed."""
    start, end = period_bounds(period)
    if now < end + timedelta(seconds=settings.BILLING_FINALIZE_GRACE_SECONDS):
        return False, f"the period ends {end:%Y-%m-%d %H:%M} UTC (+ grace {settings.BILLING_FINALIZE_GRACE_SECONDS} s)"
    open_windows = MeterWindow.objects.filter(hour_start__gte=start, hour_start__lt=end, closed_at__isnull=True)
    count = open_windows.count()
    if count:
        first = open_windows.order_by("hour_start").first()
        return False, f"{count} metering window(s) still open (first {first.source} {first.hour_start:%Y-%m-%d %H}:00)"
    last_hour = end - HOUR
    if MeterWindow.objects.exists() and not MeterWindow.objects.filter(
            source="allocation", hour_start=last_hour, closed_at__isnull=False).exists():
        return False, f"the meter has not reached the month's last hour ({last_hour:%Y-%m-%d %H}:00) yet"
    return True, ""


def invoice_run(*, period: date, tenant: Tenant | None = None, finalize: bool | None = None,
                meter: bool = True, now: datetime | None = None) -> dict:
    """Build (or recompute) the drafts of ``period`` for every tenant with usage (or one), and finalize
    them when the period is closed (``finalize`` None) or when told to. Idempotent: a re-run after a
    crash recomputes the drafts left and leaves finalized invoices alone."""
    now = now or timezone.now()
    start, end = period_bounds(period)
    if meter and hour_floor(now) > start:  # allocation metering of the month's past hours (idempotent)
        usage_meter_window(start=start, end=min(end, hour_floor(now)), now=now)
    closed, why_open = period_closed(period=period, now=now)
    do_finalize = closed if finalize is None else finalize
    if tenant is not None:
        tenants = [tenant]
    else:
        ids = set(AllocationUsage.objects.filter(hour_start__gte=start, hour_start__lt=end)
                  .values_list("tenant_id", flat=True).distinct())
        ids |= set(BillingTerms.objects.filter(monthly_commit_minor__gt=0, effective_from__lt=end)
                   .values_list("tenant_id", flat=True))
        ids |= set(Invoice.objects.filter(period=period).values_list("tenant_id", flat=True))
        previous_month = (period - timedelta(days=1)).replace(day=1)  # a correction may be due
        ids |= set(Invoice.objects.filter(period=previous_month, status__in=[InvoiceStatus.FINALIZED,
                                                                             InvoiceStatus.PAID])
                   .values_list("tenant_id", flat=True))
        tenants = list(Tenant.objects.filter(pk__in=ids).order_by("pk"))
    result = {"period": f"{period:%Y-%m}", "tenants": len(tenants), "drafts": 0, "finalized": 0, "unchanged": 0,
              "total_minor": defaultdict(int), "open_reason": "" if closed else why_open, "errors": {}}
    for item in tenants:
        try:
            # build and finalize in one transaction: one commit per tenant, not two (a commit waits for the
            # disk: at 1,000 tenants that was most of the run's time); a crash leaves the tenant as it was
            with transaction.atomic():
                invoice = invoice_build(tenant=item, period=period, now=now)
                state = None if invoice is None else invoice.status
                if state == InvoiceStatus.DRAFT and do_finalize:
                    invoice_finalize(invoice=invoice, now=now)
        except ValidationFailed as error:
            result["errors"][item.slug] = error.message
            continue
        if invoice is None:
            continue
        if state != InvoiceStatus.DRAFT:
            result["unchanged"] += 1
        elif do_finalize:
            result["finalized"] += 1
        else:
            result["drafts"] += 1
        result["total_minor"][invoice.currency] += invoice.total_minor
    result["total_minor"] = dict(result["total_minor"])
    return result
