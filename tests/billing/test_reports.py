"""Admin billing reports from invoice lines and metered usage."""

from datetime import date
from decimal import Decimal

from billing import services as billing
from billing.models import AllocationUsage, UtilisationUsage
from billing.selectors import reports
from tests.billing.test_invoicing import AFTER, JANUARY, t, two_leases
from tests.billing.test_invoicing import world as world


def test_revenue_idle_cost_over_quota_share_and_idle_leases(world):
    mig, _whole = two_leases(world)
    billing.usage_meter_window(start=t(1, 0), end=t(2, 0), now=AFTER)
    # the MIG lease was idle (2 % engine-active) in its 11:00 hour and busy (80 %) in the others
    for usage in AllocationUsage.objects.filter(lease=mig):
        UtilisationUsage.objects.create(tenant=world.acme, lease=mig, hour_start=usage.hour_start,
                                        engine_active_avg=Decimal("0.02") if usage.hour_start == t(1, 11)
                                        else Decimal("0.8"), samples=60, metered_at=AFTER)
    billing.invoice_run(period=JANUARY, now=AFTER)
    [row] = reports.revenue(start=JANUARY, end=date(2026, 2, 1), group_by="tenant")
    assert row.key == ("acme",) and row.amount_minor == 366 and row.drafts == 0
    assert row.gpu_hours == Decimal("1.038567")
    # measured only on the MIG line: 0.538567 GPU-h; idle hour 3600 s × 0.428 = 0.428 GPU-h
    assert row.measured_gpu_hours == Decimal("0.538567") and row.idle_gpu_hours == Decimal("0.428000")
    # idle cost: 216 × 0.428 / 0.538567 = 171.66 cents
    assert round(row.idle_cost_minor, 2) == Decimal("171.66")
    assert round(row.over_quota_pct, 2) == round(0.5 / 1.038567 * 100, 2)
    by_model = reports.revenue(start=JANUARY, end=date(2026, 2, 1), group_by="model")
    assert [(r.key, r.amount_minor) for r in by_model] == [(("H100-80GB",), 366)]
    [idle] = reports.top_idle_leases(period=JANUARY)
    assert idle["lease_id"] == mig.pk and idle["tenant"] == "acme" and idle["idle_gpu_hours"] == Decimal("0.428")
