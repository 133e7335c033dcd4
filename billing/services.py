"""Writers of billing data. Metering is idempotent: every hour is recomputed whole from lease events and
upserted, so running any window again (after a crash half-way, or with more events) gives the same rows."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from billing import selectors, slo
from billing.choices import CapAction, InvoiceStatus, LineKind, RateKind
from billing.metering import HOLDING, HOUR, held_intervals, hour_floor, split_hours
from billing.models import (
    AllocationUsage,
    BillingTerms,
    Invoice,
    InvoiceLine,
    MeterWindow,
    PriceBook,
    PriceRate,
    SloEvaluation,
    SpendCap,
)
from billing.pricing import HOUR_SECONDS, MILLI_HOUR, format_money, from_minor, to_minor, units_of
from config.errors import Conflict, NotFound, ValidationFailed
from gpus.catalogue import MODELS
from gpus.mig import UnknownProfile, profile_get
from leasing.models import Allocation, Lease, LeaseEvent
from tenants.access import Actor
from tenants.models import Project, SloContract, Tenant


def usage_meter_window(*, start: datetime, end: datetime, now: datetime | None = None, chunk: int = 2000) -> int:
    """Meter every lease that held capacity in [start, end) (whole UTC hours); returns rows written.
    Time not yet past (after ``now``) is not metered; the hour in progress is completed by a later run.
    Leases are read and written in chunks (two queries and one upsert per chunk); each chunk commits on
    its own, and a re-run after a crash recomputes the same rows."""
    now = now or timezone.now()
    if start != hour_floor(start) or end != hour_floor(end) or end <= start:
        raise ValidationFailed("The window must be whole UTC hours, start before end.", field="start")
    until = min(end, now)
    lease_ids = (LeaseEvent.objects.filter(to_state__in=HOLDING, at__lt=until).values("lease_id").distinct())
    candidates = list(Lease.objects.filter(pk__in=lease_ids)
                      .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=start)).order_by("pk")
                      .values_list("pk", "tenant_id", "project_id", "workload_class"))
    written = 0
    for offset in range(0, len(candidates), chunk):
        part = candidates[offset:offset + chunk]
        ids = [row[0] for row in part]
        events: dict[int, list] = defaultdict(list)
        for lease_id, at, to_state in (LeaseEvent.objects.filter(lease_id__in=ids, at__lt=until)
                                       .order_by("lease_id", "at", "pk").values_list("lease_id", "at", "to_state")):
            events[lease_id].append((at, to_state))
        allocations: dict[int, list[Allocation]] = defaultdict(list)
        for allocation in Allocation.objects.filter(lease_id__in=ids).order_by("pk").only(
                "lease_id", "tier", "kind", "mig_profile", "milli", "memory_mib", "preemptible", "created_at",
                "freed_at"):
            allocations[allocation.lease_id].append(allocation)
        rows = []
        for lease_id, tenant_id, project_id, workload_class in part:
            rows.extend(_usage_rows(lease_id, tenant_id, project_id, workload_class, events[lease_id],
                                    allocations[lease_id], start=start, until=until, now=now))
        with transaction.atomic(durable=True):
            AllocationUsage.objects.bulk_create(
                rows, update_conflicts=True, unique_fields=["lease", "hour_start"],
                update_fields=["seconds", "tier", "kind", "mig_profile", "gpu_milli", "memory_mib", "workload_class",
                               "over_quota", "metered_at"], batch_size=5000)
        written += len(rows)
    return written


def _usage_rows(lease_id, tenant_id, project_id, workload_class, events, allocations, *, start, until, now):
    hours: dict[datetime, Decimal] = defaultdict(Decimal)
    held: dict[datetime, list[Allocation]] = {}
    for begin, finish in held_intervals(events, until=until):
        units = [a for a in allocations if a.created_at <= begin and (a.freed_at is None or a.freed_at >= finish)]
        for bucket, seconds in split_hours(begin, finish, window=(start, until)):
            hours[bucket] += Decimal(str(seconds))
            held.setdefault(bucket, units)
    rows = []
    for bucket, seconds in hours.items():
        units = held[bucket]
        if not units:
            continue
        first = units[0]
        rows.append(AllocationUsage(
            tenant_id=tenant_id, project_id=project_id, lease_id=lease_id, hour_start=bucket,
            seconds=min(seconds, Decimal(3600)), tier=first.tier, kind=first.kind, mig_profile=first.mig_profile,
            gpu_milli=sum(a.milli for a in units), memory_mib=sum(a.memory_mib for a in units),
            workload_class=workload_class, over_quota=first.preemptible, metered_at=now))
    return rows


# -- periods ---------------------------------------------------------------------------------------------
def period_parse(value: str) -> date:
    """``YYYY-MM`` → the first day of that month; a clear error naming ``period`` otherwise."""
    try:
        year, month = (int(part) for part in str(value).split("-"))
        return date(year, month, 1)
    except (ValueError, TypeError):
        raise ValidationFailed(f"period must be a month as YYYY-MM, not {value!r}.", field="period") from None


def period_bounds(period: date) -> tuple[datetime, datetime]:
    start = datetime(period.year, period.month, 1, tzinfo=UTC)
    following = date(period.year + (period.month == 12), period.month % 12 + 1, 1)
    return start, datetime(following.year, following.month, 1, tzinfo=UTC)


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
SELECT u.project_id, u.tier, u.kind, u.mig_profile, u.workload_class, u.over_quota,
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
 GROUP BY 1, 2, 3, 4, 5, 6
 ORDER BY 1, 2, 3, 4, 5, 6
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
                                     over_quota=group["over_quota"], workload_class=group["workload_class"])
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
            notes = [n for n, on in (("over quota", group["over_quota"]),) if on]
            piece = "" if len(books) == 1 else f", {max(moment, start):%d %b}–{piece_end:%d %b}"
            lines.append(InvoiceLine(
                kind=LineKind.USAGE, project=project, tier=group["tier"], mig_profile=group["mig_profile"],
                workload_class=group["workload_class"], over_quota=group["over_quota"], unit=unit,
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
        from billing import stripe_sync
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
            invoice = invoice_build(tenant=item, period=period, now=now)
        except ValidationFailed as error:
            result["errors"][item.slug] = error.message
            continue
        if invoice is None:
            continue
        if invoice.status != InvoiceStatus.DRAFT:
            result["unchanged"] += 1
        elif do_finalize:
            invoice_finalize(invoice=invoice, now=now)
            result["finalized"] += 1
        else:
            result["drafts"] += 1
        result["total_minor"][invoice.currency] += invoice.total_minor
    result["total_minor"] = dict(result["total_minor"])
    return result


# -- price books, terms, caps ----------------------------------------------------------------------------------
# Who sets what (docs/billing.md, "Who sets what"): platform staff set price books and a tenant's terms (the ops
# pages, the Django admin, the staff API); a tenant's admins set its spend caps (the Budgets page, the API).
# Every change writes its AuditEvent in its transaction. The transactions are not durable: the Django admin's
# change form is one transaction of its own, and its saves call these services inside it.

MAX_MINOR = 10**15  # a monthly amount in minor units (10 trillion USD): beyond any cap or commitment
BOOK_FIELDS = ("name", "effective_from", "over_quota_multiplier", "interactive_multiplier", "energy_per_kwh",
               "rates")
# column (max_digits, decimal_places) and whether zero is refused, for each decimal of a book
_BOOK_DECIMALS = {"over_quota_multiplier": (6, 4, True), "interactive_multiplier": (6, 4, True),
                  "energy_per_kwh": (10, 6, False)}
_RATE_DIGITS = (14, 6)


def _audit(*, tenant: Tenant | None, by_user, event: str, target: str, data: dict) -> None:
    from tenants.models import AuditEvent

    AuditEvent.objects.create(tenant=tenant, actor=by_user if by_user is not None and by_user.is_authenticated
                              else None, action=event, target=target, data=data)


def _decimal_in(value: object, field: str, *, max_digits: int, places: int, positive: bool = False) -> Decimal:
    """``value`` as the ``Decimal`` its column stores exactly: a finite number ≥ 0 (> 0 when ``positive``),
    below 10^(max_digits − places), with at most ``places`` decimals; otherwise an error naming ``field``
    (the database would round the decimals silently and refuse an overflow with a 500)."""
    try:
        number = Decimal(str(value).strip())
    except ArithmeticError:
        raise ValidationFailed(f"{field} must be a decimal number.", field=field) from None
    if not number.is_finite():
        raise ValidationFailed(f"{field} must be a decimal number.", field=field)
    if number < 0 or (positive and number == 0):
        raise ValidationFailed(f"{field} must be a {'positive' if positive else 'non-negative'} number.",
                               field=field)
    limit = Decimal(10) ** (max_digits - places)
    if number >= limit:
        raise ValidationFailed(f"{field} must be below {limit}.", field=field)
    step = Decimal(1).scaleb(-places)
    if number != number.quantize(step):
        raise ValidationFailed(f"{field} has at most {places} decimal places.", field=field)
    return number.quantize(step)


def _rates_clean(rates: object) -> list[PriceRate]:
    """Unsaved rates from ``[{"tier", "kind", "mig_profile", "per_hour"}, ...]``; errors name ``rates[i].x``."""
    if not isinstance(rates, list | tuple) or not rates:
        raise ValidationFailed("A price book needs at least one rate.", field="rates")
    models_known = {m.code for m in MODELS}
    rows, seen = [], set()
    for index, rate in enumerate(rates):
        where = f"rates[{index}]"
        if not isinstance(rate, dict):
            raise ValidationFailed(f"{where} must be an object with tier, kind, mig_profile and per_hour.",
                                   field=where)
        tier, kind, profile = rate.get("tier"), rate.get("kind", RateKind.WHOLE), rate.get("mig_profile") or ""
        if not isinstance(tier, str) or tier not in models_known:
            raise ValidationFailed(f"{where}.tier must be a GPU model code.", field=f"{where}.tier")
        if not isinstance(kind, str) or kind not in RateKind.values:
            raise ValidationFailed(f"{where}.kind must be one of {', '.join(RateKind.values)}.", field=f"{where}.kind")
        if kind == RateKind.MIG:
            try:
                profile = profile_get(tier, str(profile)).name
            except UnknownProfile:
                raise ValidationFailed(f"{where}.mig_profile {profile!r} is not a MIG profile of {tier}.",
                                       field=f"{where}.mig_profile") from None
        elif profile:
            raise ValidationFailed(f"{where}.mig_profile applies only to kind mig.", field=f"{where}.mig_profile")
        if (tier, kind, profile) in seen:
            raise ValidationFailed(f"{where} repeats {tier} {profile or kind}.", field=where)
        seen.add((tier, kind, profile))
        per_hour = _decimal_in(rate.get("per_hour"), f"{where}.per_hour", max_digits=_RATE_DIGITS[0],
                               places=_RATE_DIGITS[1])
        rows.append(PriceRate(tier=tier, kind=kind, mig_profile=profile, per_hour=per_hour))
    return rows


def _book_values(values: dict) -> dict:
    """The clean value of each book field in ``values`` (in its order); the first bad one is refused by name."""
    clean: dict = {}
    for key, value in values.items():
        if key == "name":
            if not isinstance(value, str) or not value.strip():
                raise ValidationFailed("name is required.", field="name")
            if len(value.strip()) > 100:
                raise ValidationFailed("name must be at most 100 characters.", field="name")
            clean[key] = value.strip()
        elif key == "effective_from":
            if not isinstance(value, datetime) or value.tzinfo is None:
                raise ValidationFailed("effective_from must be a date-time with a time zone.", field="effective_from")
            clean[key] = value
        elif key == "energy_per_kwh" and (value is None or value == ""):
            clean[key] = None
        elif key in _BOOK_DECIMALS:
            digits, places, positive = _BOOK_DECIMALS[key]
            clean[key] = _decimal_in(value, key, max_digits=digits, places=places, positive=positive)
        elif key == "rates":
            clean[key] = _rates_clean(value)
        else:
            raise ValidationFailed(f"{key} is not a field of a price book that can change (currency and tenant are "
                                   f"its scope: create a new book for another).", field=key)
    return clean


def _book_scope_taken(*, tenant: Tenant | None, currency: str, effective_from: datetime,
                      exclude: int | None = None) -> None:
    scope = PriceBook.objects.filter(effective_from=effective_from)
    scope = scope.filter(tenant=tenant) if tenant else scope.filter(tenant__isnull=True, currency=currency)
    if scope.exclude(pk=exclude).exists():
        raise ValidationFailed("Another book of this scope starts at that moment.", field="effective_from")


def _book_reprices_metered_usage(*, tenant: Tenant | None, currency: str, effective_from: datetime) -> None:
    """Refuse a start before the end of an hour already metered for a tenant the book would price (its own
    tenant; for a general book, every tenant in its currency): that usage was priced, perhaps invoiced."""
    usage = AllocationUsage.objects.filter(hour_start__gt=effective_from - HOUR)
    usage = usage.filter(tenant=tenant) if tenant else usage.filter(tenant__currency=currency)
    last = usage.order_by("-hour_start").values_list("hour_start", flat=True).first()
    if last is not None:
        scope = f"tenant {tenant.slug}" if tenant else f"tenants billed in {currency}"
        raise ValidationFailed(
            f"A new book cannot reprice usage already metered: {scope} have usage metered up to "
            f"{last + HOUR:%Y-%m-%d %H:%M} UTC; start the book at or after then.", field="effective_from")


def _book_audit_data(book: PriceBook, rates: list[PriceRate] | None) -> dict:
    data = {"name": book.name, "currency": book.currency, "effective_from": book.effective_from.isoformat(),
            "over_quota_multiplier": str(book.over_quota_multiplier),
            "interactive_multiplier": str(book.interactive_multiplier),
            "energy_per_kwh": None if book.energy_per_kwh is None else str(book.energy_per_kwh)}
    if rates is not None:
        data["rates"] = [{"tier": r.tier, "kind": r.kind, "mig_profile": r.mig_profile, "per_hour": str(r.per_hour)}
                         for r in rates]
    return data


def price_book_create(*, name: str, currency: str, effective_from: datetime, rates: list[dict],
                      tenant: Tenant | None = None, over_quota_multiplier: object = "0.6",
                      interactive_multiplier: object = "1.25", energy_per_kwh: object = None,
                      by_user=None) -> PriceBook:
    """A price book with its rates in one transaction, audited; every bad value is refused naming its field
    (``rates[2].per_hour``) and nothing is written. Changing prices means a new book from a date: a book may
    start in the past only while nothing it would price has been metered (usage already priced, perhaps
    invoiced, is never repriced by a new book)."""
    from tenants.choices import CURRENCIES

    values = _book_values({"name": name})
    if not isinstance(currency, str) or currency not in CURRENCIES:
        raise ValidationFailed(f"currency must be one of {', '.join(CURRENCIES)}.", field="currency")
    if tenant is not None and tenant.currency != currency:
        raise ValidationFailed(f"A book for tenant {tenant.slug} must be in its currency {tenant.currency}.",
                               field="currency")
    values |= _book_values({"effective_from": effective_from, "over_quota_multiplier": over_quota_multiplier,
                            "interactive_multiplier": interactive_multiplier, "energy_per_kwh": energy_per_kwh,
                            "rates": rates})
    rows = values.pop("rates")
    book = PriceBook(currency=currency, tenant=tenant, **values)
    try:
        with transaction.atomic():
            _book_scope_taken(tenant=tenant, currency=currency, effective_from=book.effective_from)
            _book_reprices_metered_usage(tenant=tenant, currency=currency, effective_from=book.effective_from)
            book.save()
            for row in rows:
                row.book = book
            PriceRate.objects.bulk_create(rows)
            _audit(tenant=tenant, by_user=by_user, event="price_book.create", target=f"price_book:{book.pk}",
                   data=_book_audit_data(book, rows))
    except IntegrityError:  # a racing create of the same scope and start
        raise ValidationFailed("Another book of this scope starts at that moment.", field="effective_from") from None
    return book


def _book_not_started(book: PriceBook, now: datetime) -> None:
    if book.effective_from <= now:
        raise Conflict(f"Price book {book.name!r} has been in force since {book.effective_from:%Y-%m-%d %H:%M} UTC: "
                       f"usage was priced by it, so it cannot change. Create a new book from a later date.",
                       field="effective_from")


def price_book_update(*, book: PriceBook, changes: dict, by_user=None, now: datetime | None = None) -> PriceBook:
    """Change a book that has not started yet (``effective_from`` after now): name, start, multipliers, energy
    price, and its rates (``rates`` replaces them all). A book in force or past is refused (409 naming
    ``effective_from``): its prices change through a new book from a later date. The new start must be in the
    future too. Currency and tenant are the book's scope and do not change. Audited with the fields changed."""
    now = now or timezone.now()
    clean = _book_values(dict(changes))
    if "effective_from" in clean and clean["effective_from"] <= now:
        raise ValidationFailed("effective_from must be in the future: a book that has started cannot change.",
                               field="effective_from")
    rates = clean.pop("rates", None)
    try:
        with transaction.atomic():
            locked = PriceBook.objects.select_for_update().filter(pk=book.pk).first()
            if locked is None:
                raise NotFound(f"No price book {book.pk}.", field="id")
            _book_not_started(locked, now)
            if "effective_from" in clean:
                _book_scope_taken(tenant=locked.tenant, currency=locked.currency,
                                  effective_from=clean["effective_from"], exclude=locked.pk)
            for key, value in clean.items():
                setattr(locked, key, value)
            if clean:
                locked.save(update_fields=list(clean))
            if rates is not None:
                locked.rates.all().delete()
                for row in rates:
                    row.book = locked
                PriceRate.objects.bulk_create(rates)
            fields = sorted([*clean, *(["rates"] if rates is not None else [])])
            _audit(tenant=locked.tenant, by_user=by_user, event="price_book.update", target=f"price_book:{locked.pk}",
                   data={"fields": fields, **_book_audit_data(locked, rates)})
    except IntegrityError:
        raise ValidationFailed("Another book of this scope starts at that moment.", field="effective_from") from None
    return PriceBook.objects.prefetch_related("rates").get(pk=locked.pk)


def price_book_delete(*, book: PriceBook, by_user=None, now: datetime | None = None) -> None:
    """Delete a book that has not started yet (with its rates), audited; one in force or past is refused (409)."""
    now = now or timezone.now()
    with transaction.atomic():
        locked = PriceBook.objects.select_for_update().filter(pk=book.pk).first()
        if locked is None:
            raise NotFound(f"No price book {book.pk}.", field="id")
        _book_not_started(locked, now)
        _audit(tenant=locked.tenant, by_user=by_user, event="price_book.delete", target=f"price_book:{locked.pk}",
               data=_book_audit_data(locked, list(locked.rates.all())))
        locked.delete()


# -- billing terms (platform staff) -----------------------------------------------------------------------------
def _month_start(period: object, now: datetime) -> date:
    """The month ``period`` names (``YYYY-MM``, a first-of-month date; None: this month), refused by name
    when it is not this month or later: earlier months are invoiced at the terms they had."""
    if period is None or period == "":
        month = now.date().replace(day=1)
    elif isinstance(period, date) and not isinstance(period, datetime):
        if period.day != 1:
            raise ValidationFailed("period must be the first day of a month.", field="period")
        month = period
    else:
        month = period_parse(period)
    current = now.date().replace(day=1)
    if month < current:
        raise ValidationFailed(f"period must be this month ({current:%Y-%m}) or later: earlier months are invoiced "
                               f"at the terms they had.", field="period")
    return month


def billing_terms_set(*, tenant: Tenant, discount_pct: object, monthly_commit_minor: object,
                      period: object = None, by_user=None, now: datetime | None = None) -> BillingTerms:
    """A tenant's terms from the first instant (UTC) of ``period`` — a month, this one by default — replacing
    terms that start then: a discount (0–100 %, two decimals) on the usage of every invoice from that month, and
    a committed monthly minimum in minor units of the tenant's currency (a shortfall becomes a line of its own).
    Months before this one cannot change: their invoices were computed with the terms they had (a change would
    come back as a correction). Audited."""
    now = now or timezone.now()
    month = _month_start(period, now)
    discount = _decimal_in(discount_pct, "discount_pct", max_digits=5, places=2)
    if discount > 100:
        raise ValidationFailed("discount_pct must be at most 100.", field="discount_pct")
    commit = monthly_commit_minor
    if isinstance(commit, bool) or not isinstance(commit, int) or not 0 <= commit <= MAX_MINOR:
        raise ValidationFailed(f"monthly_commit_minor must be a whole number of minor units ({tenant.currency}) from "
                               f"0 to {MAX_MINOR}.", field="monthly_commit_minor")
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    try:
        with transaction.atomic():
            terms, created = BillingTerms.objects.update_or_create(
                tenant=tenant, effective_from=start,
                defaults={"discount_pct": discount, "monthly_commit_minor": commit})
            _audit(tenant=tenant, by_user=by_user, event="billing_terms.set",
                   target=f"billing_terms:{tenant.slug}/{month:%Y-%m}",
                   data={"period": f"{month:%Y-%m}", "created": created, "discount_pct": str(discount),
                         "monthly_commit_minor": commit, "currency": tenant.currency})
    except IntegrityError:  # a racing first save of the same month
        raise Conflict("The terms of that month were saved at the same moment; try again.", field="period") from None
    return terms


def billing_terms_delete(*, terms: BillingTerms, by_user=None, now: datetime | None = None) -> None:
    """Remove terms that start this month or later (the earlier terms apply again from then), audited."""
    now = now or timezone.now()
    if terms.effective_from.date() < now.date().replace(day=1):
        raise Conflict(f"The terms from {terms.effective_from:%Y-%m} applied to invoices of past months; they stay. "
                       f"Set new terms from this month instead.", field="period")
    with transaction.atomic():
        _audit(tenant=terms.tenant, by_user=by_user, event="billing_terms.delete",
               target=f"billing_terms:{terms.tenant.slug}/{terms.effective_from:%Y-%m}",
               data={"discount_pct": str(terms.discount_pct), "monthly_commit_minor": terms.monthly_commit_minor})
        BillingTerms.objects.filter(pk=terms.pk).delete()


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
            _audit(tenant=tenant, by_user=user, event="spend_cap.create", target=_cap_target(tenant, project),
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
        _audit(tenant=locked.tenant, by_user=user, event="spend_cap.update",
               target=_cap_target(locked.tenant, locked.project),
               data={"currency": locked.tenant.currency, "before": before, **values})
    locked.refresh_from_db()
    return locked


def spend_cap_delete(*, cap: SpendCap, actor: Actor | None = None, by_user=None) -> None:
    """Remove a cap (its scope is then unlimited, or limited by the tenant's cap), audited."""
    user = _cap_by(actor=actor, tenant=cap.tenant, by_user=by_user)
    with transaction.atomic():
        _audit(tenant=cap.tenant, by_user=user, event="spend_cap.delete", target=_cap_target(cap.tenant, cap.project),
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
    """``budget_check`` as leasing's admission check for a new request (``leasing.extensions.RequestAdmission``)."""
    return budget_check(tenant=admission.actor.tenant, project=admission.project, gpu=admission.gpu,
                        workload_class=admission.workload_class, duration_seconds=admission.duration_seconds,
                        now=admission.now)


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
