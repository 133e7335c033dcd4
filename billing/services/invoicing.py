"""SLO evaluation and invoices: lines computed from metered usage and the price books, built, corrected, finalized,
and the monthly invoice run."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Context, Decimal, localcontext

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from billing import selectors
from billing.choices import InvoiceStatus, LineKind
from billing.core import slo
from billing.core.metering import HOUR, hour_floor
from billing.core.periods import period_bounds
from billing.core.pricing import MILLI_HOUR, format_money, from_minor, to_minor, units_of
from billing.core.tax import tax_lines
from billing.models import (
    AllocationUsage,
    BillingTerms,
    Invoice,
    InvoiceLine,
    MeterWindow,
    PriceBook,
    SloEvaluation,
)
from billing.selectors.prices import books_in_force
from billing.services.credits import credits_draw
from billing.services.metering import usage_meter_window
from billing.services.tax import tax_setup_for
from broker.models import Allocation, Lease, LeaseEvent
from core.errors import ValidationFailed
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
                  .order_by("pk").values_list("pk", "requested_at", "first_over_quota", "ends_at", "guarantee_covered"))
    events: dict[int, list] = defaultdict(list)
    for lease_id, at, from_state, to_state, actor in (
            LeaseEvent.objects.filter(lease_id__in=[row[0] for row in leases], at__lt=end)
            .order_by("lease_id", "at", "pk").values_list("lease_id", "at", "from_state", "to_state", "actor")
            .iterator(chunk_size=5000)):
        events[lease_id].append((at, from_state, to_state, actor))
    return [slo.LeaseHistory(lease_id=pk, requested_at=requested, over_quota=over, ends_at=ends, events=events[pk],
                             covered=covered)
            for pk, requested, over, ends, covered in leases]


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
    # in-quota leases whose wait was their own project's queue (not covered by the guarantee when requested)
    evidence["not_covered"] = {"leases": len(figures.not_covered), "ids": figures.not_covered[:50]}
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
# what utilisation adds to a usage group (u: billing_allocationusage, t: billing_utilisationusage); one text for
# the one-tenant read (USAGE_SQL) and the many-tenant one (USAGE_BATCH_SQL), whose sums must agree exactly
_UTILISATION_SUMS = """
       SUM(CASE WHEN t.engine_active_avg IS NOT NULL THEN u.seconds * u.gpu_milli END) AS measured_ms,
       SUM(u.seconds * u.gpu_milli * t.engine_active_avg)                              AS active_ms,
       SUM(CASE WHEN t.fb_used_avg_mib IS NOT NULL THEN u.seconds END)                 AS memory_s,
       SUM(u.seconds * t.fb_used_avg_mib)                                              AS memory_mib_s,
       SUM(CASE WHEN t.engine_active_avg < %(idle)s THEN u.seconds * u.gpu_milli END)  AS idle_ms,
       SUM(t.energy_wh)                                                                AS energy_wh"""
USAGE_SQL = """
SELECT u.project_id, u.tier, u.kind, u.mig_profile, u.workload_class, u.over_quota, u.profiling,
       SUM(u.seconds * u.gpu_milli)                                                   AS milli_seconds,"""
USAGE_SQL += _UTILISATION_SUMS + """
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


@dataclass
class _Read:
    """What ``invoice_lines_compute`` reads, read beforehand for many tenants at once (the invoice run):
    the tenant's books in force, its projects, its terms and its usage groups per piece of the month."""

    books: list
    projects: dict
    terms: BillingTerms | None
    usage: Callable[[datetime, datetime], list[dict]]
    tax: tuple | None = None  # (active rates, profile) from billing.services.tax.tax_setup_for; None: read it


def invoice_lines_compute(*, tenant: Tenant, period: date, slo_credit_pct: Decimal = Decimal(0),
                          slo_evidence: dict | None = None, read: _Read | None = None) -> list[InvoiceLine]:
    """The lines of the tenant's invoice for ``period`` from metered usage (unsaved). Usage lines by
    project × model/profile × class × over-quota (and price book, where one changed mid-month); then
    energy, discount, committed minimum and the SLO credit. Usage without a price is refused."""
    start, end = period_bounds(period)
    if read is None:
        read = _Read(books=selectors.price_books_for(tenant=tenant, start=start, end=end),
                     projects={p.pk: p for p in Project.objects.filter(tenant=tenant)},
                     terms=BillingTerms.objects.filter(tenant=tenant, effective_from__lt=end)
                     .order_by("-effective_from").first(),
                     usage=lambda moment, piece_end: _usage_groups(tenant, moment, piece_end))
    books = read.books
    currency = tenant.currency
    projects = read.projects
    lines: list[InvoiceLine] = []
    energy_wh = defaultdict(Decimal)
    energy_price: dict[int, Decimal] = {}
    bounds = [moment for moment, _b, _t in books] + [end]
    for index, (moment, book, table) in enumerate(books):
        piece_end = bounds[index + 1]
        for group in read.usage(moment, piece_end):
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
    terms = read.terms
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
    lines += _tax_lines(tenant, sum(line.amount_minor for line in lines), read.tax)
    for position, line in enumerate(lines, start=1):
        line.position = position
    return lines


def _tax_lines(tenant: Tenant, net_minor: int, setup: tuple | None) -> list[InvoiceLine]:
    """One line per tax rate of the tenant (``billing.core.tax``), on the net of every other line."""
    rates, profile = setup if setup is not None else tax_setup_for([tenant.pk])[tenant.pk]
    reverse = profile is not None and profile.reverse_charge
    if not rates and not reverse:
        return []
    out = []
    for item in tax_lines(net_minor, rates, reverse_charge=reverse, legal_note=profile.legal_note if reverse else ""):
        out.append(InvoiceLine(
            kind=LineKind.TAX, unit="percent", quantity=item.percentage, unit_price=Decimal(0),
            amount_minor=item.amount_minor, description=item.description[:300],
            evidence={"tax_rate": item.key, "inclusive": item.inclusive, "base_minor": item.base_minor,
                      "included_minor": item.included_minor, "reverse_charge": reverse,
                      "tax_id": profile.tax_id if profile is not None else ""}))
    return out


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
        credits_draw(invoices=[invoice], now=now)  # prepaid credits, in the finalisation's transaction
        invoice_id = invoice.pk
        transaction.on_commit(lambda: _push_later(invoice_id))
    return invoice


def _push_later(invoice_id: int) -> None:
    """Stripe's push after commit, sent by name (``billing.tasks`` registers it: ``core.task_registry``)."""
    from core.task_registry import task

    task("billing", "invoice_push_task").delay(invoice_id)


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
        # one probe of the (tenant, hour) index per tenant, not a scan of the month's rows
        ids = set(Tenant.objects.filter(Exists(AllocationUsage.objects.filter(
            tenant=OuterRef("pk"), hour_start__gte=start, hour_start__lt=end))).values_list("pk", flat=True))
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
    if tenants:
        # read once for every tenant: the books, who has an SLO contract, who may need a correction line
        books = list(PriceBook.objects.filter(effective_from__lt=end).prefetch_related("rates")
                     .order_by("effective_from", "tenant_id"))
        contracted = set(SloContract.objects.filter(tenant__in=tenants, effective_from__lt=end)
                         .filter(Q(effective_to__isnull=True) | Q(effective_to__gt=start))
                         .values_list("tenant_id", flat=True))
        previous_month = (period - timedelta(days=1)).replace(day=1)
        corrected = set(Invoice.objects.filter(tenant__in=tenants, period=previous_month,
                                               status__in=[InvoiceStatus.FINALIZED, InvoiceStatus.PAID])
                        .values_list("tenant_id", flat=True))
        month = _Month(period=period, start=start, end=end, now=now, finalize=do_finalize, books=books, tables={},
                       contracted=contracted, corrected=corrected)
        month.in_force = {t.pk: books_in_force(books, tenant=t, start=start, end=end, tables=month.tables)
                          for t in tenants}
        # every tenant's usage in one pass over the month's rows (read before the batches' locks, as a
        # tenant's was before: metering does not take them); the batches then write
        # (on INVOICE_WORKERS connections at once: the tenants' halves read side by side, then the batches)
        parts = [tenants[n::INVOICE_WORKERS] for n in range(INVOICE_WORKERS)]
        for usage in _on_connections(lambda part: _usage_batch(month, part), [p for p in parts if p]):
            month.usage.update(usage)  # the parts share no tenant
        batches = [tenants[offset:offset + INVOICE_BATCH] for offset in range(0, len(tenants), INVOICE_BATCH)]
        for done in _on_connections(lambda batch: _invoice_batch(month, batch, _batch_result()), batches):
            for name in ("drafts", "finalized", "unchanged"):
                result[name] += done[name]
            for currency, minor in done["total_minor"].items():
                result["total_minor"][currency] += minor
            result["errors"].update(done["errors"])
    result["total_minor"] = dict(result["total_minor"])
    return result


INVOICE_WORKERS = 2  # connections a whole-month run uses at once (the development machine's 2 cores)


def _batch_result() -> dict:
    return {"drafts": 0, "finalized": 0, "unchanged": 0, "total_minor": defaultdict(int), "errors": {}}


def _on_connections(work: Callable, items: list) -> list:
    """``work`` of every item, on up to INVOICE_WORKERS threads each with its own database connection (one
    transaction per item already), in the items' order. Inside a transaction (a test's, a caller's) the other
    connections would not see its rows: then one after the other, on this connection."""
    if INVOICE_WORKERS <= 1 or len(items) <= 1 or connection.in_atomic_block:
        return [work(item) for item in items]

    def on_own_connection(item):
        try:
            return work(item)
        finally:
            connection.close()  # this thread's connection

    with ThreadPoolExecutor(max_workers=INVOICE_WORKERS, thread_name_prefix="invoicing") as pool:
        return list(pool.map(on_own_connection, items))


# -- the invoice run, many tenants per transaction ------------------------------------------------------------
INVOICE_BATCH = 50  # tenants per transaction: a commit waits for the disk, 1,000 of them were most of the run

# USAGE_SQL for many tenants at once, per piece of the month between any two price books' starts (``cuts``,
# the month's start first): a tenant's own pieces are unions of these, and sums add up exactly
USAGE_BATCH_SQL = """
WITH held AS (  -- every row: one product and one sum each
    SELECT u.tenant_id, width_bucket(u.hour_start, %(cuts)s::timestamptz[]) AS piece,
           u.project_id, u.tier, u.kind, u.mig_profile, u.workload_class, u.over_quota, u.profiling,
           SUM(u.seconds * u.gpu_milli) AS milli_seconds
      FROM billing_allocationusage u
     WHERE u.tenant_id = ANY(%(tenants)s) AND u.hour_start >= %(start)s AND u.hour_start < %(end)s
     GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9
),
measured AS (  -- the rows with utilisation only (an inner join: the others add nothing to these sums)
    SELECT u.tenant_id, width_bucket(u.hour_start, %(cuts)s::timestamptz[]) AS piece,
           u.project_id, u.tier, u.kind, u.mig_profile, u.workload_class, u.over_quota, u.profiling,"""
USAGE_BATCH_SQL += _UTILISATION_SUMS + """
      FROM billing_utilisationusage t
      JOIN billing_allocationusage u ON u.lease_id = t.lease_id AND u.hour_start = t.hour_start
     WHERE u.tenant_id = ANY(%(tenants)s) AND t.hour_start >= %(start)s AND t.hour_start < %(end)s
     GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9
)
SELECT held.tenant_id, held.piece, held.project_id, held.tier, held.kind, held.mig_profile, held.workload_class,
       held.over_quota, held.profiling, held.milli_seconds, measured.measured_ms, measured.active_ms, measured.memory_s,
       measured.memory_mib_s, measured.idle_ms, measured.energy_wh
  FROM held
  LEFT JOIN measured USING (tenant_id, piece, project_id, tier, kind, mig_profile, workload_class, over_quota,
                            profiling)
 ORDER BY held.tenant_id, held.project_id, held.tier, held.kind, held.mig_profile, held.workload_class,
          held.over_quota, held.profiling, held.piece
"""
_GROUP_KEY = ("project_id", "tier", "kind", "mig_profile", "workload_class", "over_quota", "profiling")
_SUMS = ("milli_seconds", "measured_ms", "active_ms", "memory_s", "memory_mib_s", "idle_ms", "energy_wh")


@dataclass
class _Month:
    period: date
    start: datetime
    end: datetime
    now: datetime
    finalize: bool
    books: list
    tables: dict
    contracted: set
    corrected: set
    in_force: dict = field(default_factory=dict)  # tenant id → price_books_for
    usage: dict = field(default_factory=dict)  # (tenant id, piece start) → usage groups


def _add(a: Decimal | None, b: Decimal | None) -> Decimal | None:
    if a is None:
        return b
    if b is None:
        return a
    with localcontext(Context(prec=200)):  # exact: numeric sums never round
        return a + b


def _usage_batch(month: _Month, items: list[Tenant]) -> dict[tuple[int, datetime], list]:
    """Every tenant's usage groups per piece of its month (keyed by the piece's start, as
    ``invoice_lines_compute`` asks for them), from one query: the same sums as ``USAGE_SQL`` piece by piece."""
    cuts = sorted({month.start} | {b.effective_from for b in month.books if month.start < b.effective_from < month.end})
    with transaction.atomic(), connection.cursor() as cursor:
        # a few thousand groups from millions of rows: hashed. The planner's estimate of the groups (the product
        # of the columns' distinct counts) would otherwise have it sort every row, on disk, at 4 MB
        cursor.execute("SET LOCAL work_mem = '256MB'")
        cursor.execute(USAGE_BATCH_SQL, {"tenants": [t.pk for t in items], "cuts": cuts, "start": month.start,
                                         "end": month.end, "idle": settings.BILLING_IDLE_ENGINE_ACTIVE})
        names = [column[0] for column in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    pieces: dict[tuple[int, datetime], dict] = {}
    for row in rows:
        moments = [moment for moment, _book, _table in month.in_force[row["tenant_id"]]]
        low = cuts[row["piece"] - 1]
        mine = [moment for moment in moments if moment <= low]
        if not mine:
            continue  # before the tenant's first book: no piece asks for it
        groups = pieces.setdefault((row["tenant_id"], mine[-1]), {})
        key = tuple(row[name] for name in _GROUP_KEY)
        if key not in groups:
            groups[key] = {name: row[name] for name in (*_GROUP_KEY, *_SUMS)}
        else:
            for name in _SUMS:
                groups[key][name] = _add(groups[key][name], row[name])
    return {key: list(groups.values()) for key, groups in pieces.items()}


def _invoice_batch(month: _Month, items: list[Tenant], result: dict) -> dict:
    """What ``invoice_build`` (then ``invoice_finalize``) does for each tenant of ``items``, in one
    transaction and a few statements: the same advisory locks (taken in tenant order, so two runs at once
    wait on each other), the same lines and totals; a tenant whose lines are refused is left as it was."""
    period = month.period
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(pg_advisory_xact_lock(hashtextextended(key, 0))) FROM "
                           "(SELECT key FROM unnest(%s::text[]) WITH ORDINALITY AS k(key, n) ORDER BY n) AS keys",
                           [[f"billing.invoice_build:{t.pk}:{period:%Y-%m}" for t in items]])
        existing = {invoice.tenant_id: invoice for invoice in
                    Invoice.objects.select_for_update().filter(tenant__in=items, period=period)}
        projects: dict[int, dict] = defaultdict(dict)
        for project in Project.objects.filter(tenant__in=items):
            projects[project.tenant_id][project.pk] = project
        terms: dict[int, BillingTerms] = {}
        for item in BillingTerms.objects.filter(tenant__in=items, effective_from__lt=month.end).order_by(
                "tenant_id", "-effective_from"):
            terms.setdefault(item.tenant_id, item)
        taxes = tax_setup_for([t.pk for t in items])
        created, updated, lines_all, states = [], [], [], []
        for tenant in items:
            invoice = existing.get(tenant.pk)
            if invoice is not None and invoice.status != InvoiceStatus.DRAFT:
                states.append((invoice, invoice.status))
                continue
            read = _Read(books=month.in_force[tenant.pk], projects=projects[tenant.pk], terms=terms.get(tenant.pk),
                         usage=lambda moment, _end, pk=tenant.pk: month.usage.get((pk, moment), []),
                         tax=taxes[tenant.pk])
            try:
                if tenant.pk in month.contracted:
                    with transaction.atomic():  # the evaluation is stored: undone with the tenant on refusal
                        lines = _tenant_lines(tenant, month, read)
                else:
                    lines = _tenant_lines(tenant, month, read)
            except ValidationFailed as error:
                result["errors"][tenant.slug] = error.message
                continue
            if not lines and invoice is None:
                continue
            if invoice is None:
                invoice = Invoice(tenant=tenant, period=period)
                created.append(invoice)
            else:
                updated.append(invoice)
            invoice.currency = tenant.currency
            invoice.computed_at = month.now
            for name, value in _totals(lines).items():
                setattr(invoice, name, value)
            lines_all.append((invoice, lines))
            states.append((invoice, InvoiceStatus.DRAFT))
        Invoice.objects.bulk_create(created)
        if updated:
            Invoice.objects.bulk_update(updated, ["currency", "computed_at", "subtotal_minor", "discount_minor",
                                                  "credit_minor", "total_minor"])
            InvoiceLine.objects.filter(invoice__in=updated).delete()
        for invoice, lines in lines_all:
            for line in lines:
                line.invoice = invoice
        InvoiceLine.objects.bulk_create([line for _invoice, lines in lines_all for line in lines])
        drafts = [invoice for invoice, _lines in lines_all]
        if month.finalize and drafts:
            for invoice in drafts:
                invoice.status = InvoiceStatus.FINALIZED
                invoice.finalized_at = month.now
                invoice.number = f"GPUB-{invoice.period:%Y%m}-{invoice.pk:06d}"
            Invoice.objects.bulk_update(drafts, ["status", "finalized_at", "number"])
            credits_draw(invoices=drafts, now=month.now)
            ids = [invoice.pk for invoice in drafts]
            transaction.on_commit(lambda: [_push_later(invoice_id) for invoice_id in ids])
    for invoice, state in states:
        if state != InvoiceStatus.DRAFT:
            result["unchanged"] += 1
        elif month.finalize:
            result["finalized"] += 1
        else:
            result["drafts"] += 1
        result["total_minor"][invoice.currency] += invoice.total_minor
    return result


def _tenant_lines(tenant: Tenant, month: _Month, read: _Read) -> list[InvoiceLine]:
    evaluation = (slo_evaluate(tenant=tenant, period=month.period, now=month.now)
                  if tenant.pk in month.contracted else None)
    lines = invoice_lines_compute(
        tenant=tenant, period=month.period,
        slo_credit_pct=evaluation.credit_pct if evaluation else Decimal(0),
        slo_evidence=evaluation.evidence if evaluation else None, read=read)
    if tenant.pk in month.corrected:
        lines += _corrections(tenant=tenant, period=month.period, start=len(lines) + 1)
    return lines
