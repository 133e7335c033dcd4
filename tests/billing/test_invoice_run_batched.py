"""``invoice_run`` computes many tenants at once (one grouped read of the month's usage, a transaction per batch of
tenants): its invoices must be exactly what ``invoice_lines_compute`` gives tenant by tenant, whatever the books
(a general price change mid-month, a tenant's own book from mid-month), utilisation, terms and batch size."""

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from billing import services as billing
from billing.models import AllocationUsage, BillingTerms, Invoice, InvoiceLine, UtilisationUsage
from billing.services import invoicing
from broker.models import Lease
from tests.factories import make_project, make_tenant

OCTOBER = date(2026, 10, 1)
START = datetime(2026, 10, 1, tzinfo=UTC)


def test_invoice_run_in_batches_equals_the_tenant_by_tenant_computation(db, monkeypatch):
    billing.price_book_create(name="list", currency="USD", effective_from=datetime(2026, 1, 1, tzinfo=UTC),
                              rates=[{"tier": "H100-80GB", "per_hour": "3.20"}], energy_per_kwh="0.30")
    billing.price_book_create(name="list b", currency="USD", effective_from=START + timedelta(days=10, minutes=30),
                              rates=[{"tier": "H100-80GB", "per_hour": "2.90"}])
    tenants = [make_tenant(f"b{n}") for n in range(5)]
    billing.price_book_create(name="own", currency="USD", tenant=tenants[2], effective_from=START + timedelta(days=20),
                              rates=[{"tier": "H100-80GB", "per_hour": "2.00"}])
    BillingTerms.objects.create(tenant=tenants[1], effective_from=START, discount_pct=Decimal("7.5"),
                                monthly_commit_minor=0)
    BillingTerms.objects.create(tenant=tenants[3], effective_from=START, monthly_commit_minor=10_000_000)
    rows, measured = [], []
    for number, tenant in enumerate(tenants[:4]):  # the fifth has nothing: no invoice
        for slug in ("main", "lab"):
            project = make_project(tenant, slug)
            lease = Lease.objects.create(tenant=tenant, project=project, kind="whole", duration_seconds=86400 * 40,
                                         state="active", tier="H100-80GB", requested_at=START)
            for hour in range(0, 24 * 31, 5 + number):
                at = START + timedelta(hours=hour)
                mig = hour % 3 == 0
                rows.append(AllocationUsage(
                    tenant=tenant, project=project, lease=lease, hour_start=at,
                    seconds=Decimal(3600) - Decimal(hour % 7) / 3, tier="H100-80GB", kind="mig" if mig else "whole",
                    mig_profile="3g.40gb" if mig else "", gpu_milli=428 if mig else 1000,
                    memory_mib=40320 if mig else 81559, workload_class="interactive" if hour % 4 == 0 else "training",
                    over_quota=hour % 5 == 0, metered_at=at))
                if hour % 2 == 0:
                    measured.append(UtilisationUsage(
                        tenant=tenant, lease=lease, hour_start=at, engine_active_avg=Decimal(hour % 10) / 10,
                        fb_used_avg_mib=Decimal("1234.5"), energy_wh=Decimal("512.25") if hour % 6 else None,
                        samples=61, metered_at=at))
    AllocationUsage.objects.bulk_create(rows)
    UtilisationUsage.objects.bulk_create(measured)
    monkeypatch.setattr(invoicing, "INVOICE_BATCH", 3)  # batches of 3, 1 (and the fifth tenant skipped)
    result = billing.invoice_run(period=OCTOBER, meter=False, finalize=True, now=START + timedelta(days=40))
    assert (result["tenants"], result["finalized"], result["errors"]) == (4, 4, {})
    assert Invoice.objects.count() == 4
    for invoice in Invoice.objects.select_related("tenant"):
        expected = billing.invoice_lines_compute(tenant=invoice.tenant, period=OCTOBER)
        stored = list(InvoiceLine.objects.filter(invoice=invoice).order_by("position").values_list(
            "kind", "description", "quantity", "unit_price", "amount_minor", "gpu_hours", "engine_active_avg",
            "memory_used_avg_mib", "idle_gpu_hours"))
        assert stored == [(line.kind, line.description, line.quantity, line.unit_price, line.amount_minor,
                           line.gpu_hours, line.engine_active_avg, line.memory_used_avg_mib, line.idle_gpu_hours)
                          for line in expected]
        assert len({kind for kind, *_rest in stored}) > 1 or invoice.tenant.slug == "b0"
        assert invoice.total_minor == sum(line.amount_minor for line in expected)
        assert invoice.number == f"GPUB-202610-{invoice.pk:06d}" and invoice.status == "finalized"
    assert sum(Invoice.objects.values_list("total_minor", flat=True)) == result["total_minor"]["USD"]
    again = billing.invoice_run(period=OCTOBER, meter=False, finalize=True, now=START + timedelta(days=41))
    assert (again["unchanged"], again["total_minor"]) == (4, result["total_minor"])
