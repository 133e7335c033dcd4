"""Invoices from metered usage: lines by project × model/profile × class × over-quota, priced by the
book in force, with discount, committed minimum and SLO credit; totals add up; re-running changes
nothing; a finalized invoice is frozen by the database itself."""

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
import time_machine
from django.core.management import CommandError, call_command
from django.db import IntegrityError, transaction

from billing import services as billing
from billing.choices import InvoiceStatus, LineKind
from billing.models import BillingTerms, Invoice, InvoiceLine, SloEvaluation
from broker import services
from broker.choices import LeaseState
from broker.models import Allocation, Lease
from core.errors import ValidationFailed
from tenants import services as tenant_services
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_world


def t(day, hour, minute=0, second=0, month=1):
    return datetime(2026, month, day, hour, minute, second, tzinfo=UTC)


JANUARY = date(2026, 1, 1)
AFTER = t(2, 12, month=2)  # the month has ended and the grace has passed


@pytest.fixture
def world(db):
    world = make_world()
    token = services.enrollment_token_create()
    services.node_enroll(node_id="n1", token=token, address="http://127.0.0.1:9/n/n1", inventory={"gpus": [
        {"index": 0, "uuid": "GPU-h100-0", "model": "H100-80GB", "mode": "mig", "memory_mib": 81559},
        {"index": 1, "uuid": "GPU-h100-1", "model": "H100-80GB", "mode": "whole", "memory_mib": 81559}]})
    billing.price_book_create(name="list 2026", currency="USD", effective_from=datetime(2025, 1, 1, tzinfo=UTC),
                              rates=[{"tier": "H100-80GB", "per_hour": "4.00"}], over_quota_multiplier="0.5",
                              interactive_multiplier="1.5")
    return world


def start_lease(world, gpu, *, requested, active, workload_class="training", duration_seconds=3600):
    """A lease ACTIVE from ``active`` for ``duration_seconds``; one released after its end is billed to its end only
    (metering stops at the end time whatever the events say: tests/billing/test_money_format.py)."""
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    with time_machine.travel(requested, tick=False):
        lease, _ = services.lease_request(actor=actor, project="vision", gpu=gpu, workload_class=workload_class,
                                          duration_seconds=duration_seconds)
        services.schedule_cycle()
    for allocation in Allocation.objects.filter(lease=lease):
        with time_machine.travel(active, tick=False):
            services.allocation_ready(allocation=allocation, instance={"device_uuid": "X"}, now=active)
    return lease


def end_lease(lease, released):
    with time_machine.travel(released, tick=False):
        services.lease_release(lease=lease, actor="user:max", now=released)
        services.allocations_free(lease=Lease.objects.get(pk=lease.pk), now=released, to=LeaseState.RELEASED,
                                  reason="released")
    return Lease.objects.get(pk=lease.pk)


def two_leases(world):
    # planned for 2 h: released at 12:10:30, before its end (11:55 with the default hour would cut it there)
    mig = start_lease(world, {"kind": "mig", "profile": "3g.40gb", "model": "H100-80GB"},
                      requested=t(1, 10, 50), active=t(1, 10, 55), duration_seconds=7200)
    # 428 + 1000 milli is beyond the project's 1000 deserved: the whole GPU runs over quota. It is priced as
    # interactive too, to check both multipliers on one line: the scheduler no longer lets interactive work
    # borrow over quota, so the class is set on the row (as on a lease placed before that rule)
    whole = start_lease(world, {"kind": "whole", "model": "H100-80GB"}, requested=t(1, 11), active=t(1, 11, 5))
    Lease.objects.filter(pk=whole.pk).update(workload_class="interactive")
    whole = end_lease(whole, t(1, 11, 35))
    mig = end_lease(mig, t(1, 12, 10, 30))
    assert not mig.over_quota and whole.over_quota
    return mig, whole


def test_invoice_lines_match_a_hand_computation(world):
    two_leases(world)
    BillingTerms.objects.create(tenant=world.acme, effective_from=t(1, 0), discount_pct=Decimal(10),
                                monthly_commit_minor=500)
    tenant_services.slo_contract_create(
        tenant=world.acme, name="gold", effective_from=datetime(2025, 1, 1, tzinfo=UTC), effective_to=None,
        time_to_gpu_p95_seconds=60, availability_target_pct=Decimal("99.9"), preemption_notice_seconds=30,
        credit_steps=[{"metric": "time_to_gpu_p95", "threshold": "120", "credit_pct": "10"},
                      {"metric": "time_to_gpu_p95", "threshold": "600", "credit_pct": "25"},
                      {"metric": "availability", "threshold": "99.9", "credit_pct": "5"}])
    result = billing.invoice_run(period=JANUARY, now=AFTER)
    assert result["finalized"] == 1 and not result["errors"]
    invoice = Invoice.objects.get(tenant=world.acme, period=JANUARY)
    lines = list(invoice.lines.order_by("position"))
    # by hand: 3g.40gb = 4.00 × 3/7 = 1.714286 per instance-hour; 10:55:00 → 12:10:30 = 4530 s;
    # 4530/3600 × 1.714286 = 2.1571432 → 216 cents
    assert (lines[0].kind, lines[0].mig_profile, lines[0].unit) == (LineKind.USAGE, "3g.40gb", "3g.40gb instance-hour")
    assert lines[0].quantity == Decimal("1.258333") and lines[0].unit_price == Decimal("1.714286")
    assert lines[0].amount_minor == 216 and lines[0].gpu_hours == Decimal("0.538567")  # 4530 s × 428/1000 ÷ 3600
    # whole GPU, interactive, over quota: 4.00 × 0.5 × 1.5 = 3.00 per GPU-hour × 0.5 h = 150 cents
    assert (lines[1].over_quota, lines[1].workload_class, lines[1].quantity, lines[1].unit_price,
            lines[1].amount_minor) == (True, "interactive", Decimal("0.5"), Decimal("3"), 150)
    # discount 10% of 366 = 36.6 → 37; usage after discount 329 < committed 500 → 171 shortfall
    assert (lines[2].kind, lines[2].amount_minor) == (LineKind.DISCOUNT, -37)
    assert (lines[3].kind, lines[3].amount_minor) == (LineKind.COMMIT, 171)
    # SLO: the in-quota lease waited 300 s (p95 300 > 120 → 10%; not > 600); availability 100 % → none.
    # credit 10 % of 329 = 32.9 → 33
    assert (lines[4].kind, lines[4].amount_minor) == (LineKind.SLO_CREDIT, -33)
    assert lines[4].evidence["time_to_gpu_p95"] == {"measured": 300.0, "threshold": "120.000", "credit_pct": "10.00",
                                                    "target": 60}
    assert len(lines) == 5
    assert (invoice.subtotal_minor, invoice.discount_minor, invoice.credit_minor, invoice.total_minor) == (
        537, -37, -33, 467)
    assert invoice.total_minor == sum(line.amount_minor for line in lines)
    assert invoice.status == InvoiceStatus.FINALIZED and invoice.number.startswith("GPUB-202601-")
    evaluation = SloEvaluation.objects.get(tenant=world.acme, period=JANUARY)
    assert (evaluation.in_quota_requests, evaluation.time_to_gpu_p95_seconds, evaluation.availability_pct) == (
        1, Decimal("300.000"), Decimal("100.000"))


def test_a_rerun_changes_nothing_and_a_finalized_invoice_is_frozen(world):
    two_leases(world)
    with time_machine.travel(t(20, 0), tick=False):
        billing.invoice_run(period=JANUARY, now=t(20, 0))  # the month is running: a draft
    draft = Invoice.objects.get(tenant=world.acme)
    assert draft.status == InvoiceStatus.DRAFT and draft.total_minor == 366
    fields = ("description", "quantity", "amount_minor")
    first = list(InvoiceLine.objects.filter(invoice=draft).values_list(*fields))
    billing.invoice_run(period=JANUARY, now=t(20, 1))
    assert list(InvoiceLine.objects.filter(invoice=draft).values_list(*fields)) == first
    billing.invoice_run(period=JANUARY, now=AFTER)
    billing.invoice_run(period=JANUARY, now=AFTER)
    invoice = Invoice.objects.get(tenant=world.acme)
    assert invoice.status == InvoiceStatus.FINALIZED and Invoice.objects.count() == 1
    assert list(invoice.lines.values_list(*fields)) == first
    # the database refuses changes to a finalized invoice or its lines, whatever code tries
    with pytest.raises(IntegrityError), transaction.atomic():
        Invoice.objects.filter(pk=invoice.pk).update(total_minor=1)
    with pytest.raises(IntegrityError), transaction.atomic():
        InvoiceLine.objects.filter(invoice=invoice).update(amount_minor=0)
    with pytest.raises(IntegrityError), transaction.atomic():
        InvoiceLine.objects.filter(invoice=invoice).delete()
    with pytest.raises(IntegrityError), transaction.atomic():
        Invoice.objects.filter(pk=invoice.pk).update(status=InvoiceStatus.DRAFT)
    Invoice.objects.filter(pk=invoice.pk).update(status=InvoiceStatus.PAID, paid_at=AFTER)  # allowed


def test_a_period_with_open_metering_windows_stays_a_draft(world):
    from billing.models import MeterWindow

    two_leases(world)
    MeterWindow.objects.create(source="utilisation", hour_start=t(31, 23), last_error="Prometheus unreachable")
    result = billing.invoice_run(period=JANUARY, now=AFTER)
    assert result["drafts"] == 1 and "1 metering window(s) still open" in result["open_reason"]
    assert Invoice.objects.get().status == InvoiceStatus.DRAFT


def test_usage_without_a_price_is_refused_by_name(world):
    from billing.models import PriceBook

    two_leases(world)
    PriceBook.objects.all().delete()
    billing.price_book_create(name="A100 only", currency="USD", effective_from=datetime(2025, 6, 1, tzinfo=UTC),
                              rates=[{"tier": "A100-80GB", "per_hour": "2"}])
    result = billing.invoice_run(period=JANUARY, now=AFTER)
    assert "has no price for" in result["errors"]["acme"] and not Invoice.objects.exists()


def test_a_price_change_mid_month_splits_the_lines(world):
    two_leases(world)
    billing.price_book_create(name="list 2026-b", currency="USD", effective_from=t(1, 11, 30),
                              rates=[{"tier": "H100-80GB", "per_hour": "8.00"}], over_quota_multiplier="0.5",
                              interactive_multiplier="1.5")
    billing.invoice_run(period=JANUARY, now=AFTER)
    lines = list(Invoice.objects.get().lines.filter(kind=LineKind.USAGE).order_by("position"))
    # books change at hour granularity of the metered rows: the 11:00 hour is priced by the book in force
    # at 11:00 (the old one); 12:00 onwards by the new one
    books = sorted({line.evidence["price_book"] for line in lines})
    assert books == ["list 2026", "list 2026-b"]
    assert sum(line.quantity for line in lines if line.mig_profile) == Decimal("1.258333")


def test_the_command_names_bad_arguments(world):
    with pytest.raises(CommandError, match="--period"):
        call_command("invoice_run", "--period", "2026-13")
    with pytest.raises(CommandError, match="--tenant"):
        call_command("invoice_run", "--period", "2026-01", "--tenant", "nobody")


def test_price_book_validation_names_the_field(world):
    cases = [({"currency": "XXX"}, "currency"), ({"rates": []}, "rates"),
             ({"rates": [{"tier": "H100-80GB", "per_hour": "-1"}]}, "rates[0].per_hour"),
             ({"rates": [{"tier": "H100-80GB", "kind": "mig", "mig_profile": "9g.1gb", "per_hour": "1"}]},
              "rates[0].mig_profile"),
             ({"rates": [{"tier": "Z80", "per_hour": "1"}]}, "rates[0].tier"),
             ({"over_quota_multiplier": "0"}, "over_quota_multiplier")]
    for change, field in cases:
        arguments = {"name": "x", "currency": "USD", "effective_from": datetime(2027, 1, 1, tzinfo=UTC),
                     "rates": [{"tier": "H100-80GB", "per_hour": "1"}], **change}
        with pytest.raises(ValidationFailed) as caught:
            billing.price_book_create(**arguments)
        assert caught.value.field == field


def test_late_usage_of_a_finalized_month_becomes_a_correction_next_month(world):
    from billing.models import AllocationUsage

    two_leases(world)
    billing.invoice_run(period=JANUARY, now=AFTER)
    january = Invoice.objects.get(period=JANUARY)
    assert january.status == InvoiceStatus.FINALIZED and january.total_minor == 366
    # an hour of the whole GPU metered late (say a window filled after the invoice was issued)
    row = AllocationUsage.objects.filter(gpu_milli=1000).first()
    AllocationUsage.objects.filter(pk=row.pk).update(seconds=row.seconds + 1200)  # +20 min at 3.00/h = 100
    february = date(2026, 2, 1)
    billing.invoice_run(period=february, now=t(10, 0, month=2))
    draft = Invoice.objects.get(period=february)
    [correction] = draft.lines.filter(kind=LineKind.CORRECTION)
    assert correction.amount_minor == 100 and correction.evidence["corrects"] == january.pk
    assert january.number in correction.description
    assert Invoice.objects.get(pk=january.pk).total_minor == 366  # the finalized one is untouched
    # once February is finalized, March does not correct January again
    billing.invoice_run(period=february, now=t(2, 12, month=3))
    billing.invoice_run(period=date(2026, 3, 1), now=t(10, 0, month=3))
    march = Invoice.objects.filter(period=date(2026, 3, 1)).first()
    assert march is None or not march.lines.filter(kind=LineKind.CORRECTION).exists()


def test_a_month_the_meter_has_not_reached_stays_a_draft(world):
    from billing.models import MeterWindow

    two_leases(world)
    # metering is in use and closed up to 30 Jan: the month's last hour has no closed window yet
    MeterWindow.objects.create(source="allocation", hour_start=t(30, 0), closed_at=t(30, 2))
    result = billing.invoice_run(period=JANUARY, now=AFTER)
    assert result["drafts"] == 1 and "has not reached the month's last hour" in result["open_reason"]
    MeterWindow.objects.create(source="allocation", hour_start=t(31, 23), closed_at=t(1, 1, month=2))
    assert billing.invoice_run(period=JANUARY, now=AFTER)["finalized"] == 1
