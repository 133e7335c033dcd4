"""Money that reads right in the first hour (issue 29): amounts and rates with their currency and its decimals
on every human-facing surface, usage visible (and labelled a live estimate) before any hourly metering run or
invoice, one slot per day in the usage chart, the SLO credit as an adjustment rather than a project row in the
staff report, and nothing billed after a lease's end however late the expiry task runs."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.core.cache import cache
from django.template import Context, Template
from django.utils import timezone

from billing import services as billing
from billing.core.pricing import format_money, format_rate
from billing.models import AllocationUsage, Invoice
from billing.selectors import reports
from billing.services.metering_run import LIVE_METER_KEY
from broker import services
from broker.choices import LeaseState
from broker.models import Lease
from portal.presenters import bar_chart
from tenants import services as tenant_services
from tests.billing.test_invoicing import AFTER, JANUARY, start_lease, t, two_leases
from tests.billing.test_invoicing import world as world
from tests.factories import make_user
from tests.portal.test_pages import login, text


# -- the helper and its filters ------------------------------------------------------------------------------
@pytest.mark.parametrize(("amount", "currency", "expected"), [
    (Decimal("0.700000"), "USD", "0.70 USD"), (Decimal("1.714286"), "USD", "1.714286 USD"),
    (Decimal("4.2"), "EUR", "4.20 EUR"), (Decimal("1234.5"), "USD", "1,234.50 USD"), (Decimal("150"), "JPY", "150 JPY"),
    (Decimal("0.875000"), "USD", "0.875 USD"), (Decimal(0), "USD", "0.00 USD")])
def test_money_format_rate_keeps_the_currency_decimals_and_no_trailing_zeros(amount, currency, expected):
    assert format_rate(amount, currency) == expected


def test_money_format_filters_write_amounts_and_rates_with_their_currency():
    assert format_money(123456, "USD") == "1,234.56 USD" and format_money(1235, "JPY") == "1,235 JPY"
    rendered = Template("{% load portal_tags %}{{ a|money:'USD' }} | {{ r|rate:'USD' }} | {{ n|money:'USD' }}").render(
        Context({"a": 70, "r": Decimal("0.700000"), "n": None}))
    assert rendered == "0.70 USD | 0.70 USD | \u2013"


# -- pages and documents ----------------------------------------------------------------------------------
def _credited_invoice(world) -> Invoice:
    """January with the two leases of test_invoicing and an SLO contract whose time-to-GPU target was missed:
    the invoice has an SLO credit line (no project)."""
    two_leases(world)
    tenant_services.slo_contract_create(
        tenant=world.acme, name="gold", effective_from=datetime(2025, 1, 1, tzinfo=UTC), effective_to=None,
        time_to_gpu_p95_seconds=60, availability_target_pct=Decimal("99.9"), preemption_notice_seconds=30,
        credit_steps=[{"metric": "time_to_gpu_p95", "threshold": "120", "credit_pct": "10"}])
    billing.invoice_run(period=JANUARY, now=AFTER)
    invoice = Invoice.objects.get(tenant=world.acme, period=JANUARY)
    assert invoice.credit_minor < 0, "the setup must give an SLO credit"
    return invoice


def test_money_format_invoice_page_and_pdf_show_unit_prices_with_currency(world, client):
    invoice = _credited_invoice(world)
    login(client, "vic")
    page = client.get(f"/invoices/{invoice.pk}")
    body = text(page)
    # 3g.40gb = 4.00 × 3/7 per instance-hour; the whole GPU 4.00 × 0.5 × 1.5 (over quota, interactive)
    assert "1.714286 USD" in body and "3.00 USD" in body
    assert "1.7143" not in body and "3.0000" not in body  # the unit prices' old floatformat:4, no currency
    pdf = client.get(f"/invoices/{invoice.pk}.pdf")
    assert pdf.status_code == 200 and pdf.content.startswith(b"%PDF")


def test_money_format_price_book_page_shows_rates_with_currency(world, client):
    from billing.models import PriceBook

    make_user("root", is_staff=True)
    login(client, "root")
    book = PriceBook.objects.get()
    body = text(client.get(f"/ops/price-books/{book.pk}"))
    assert "4.00 USD" in body and "4.000000" not in body


def test_money_format_report_shows_the_slo_credit_as_an_adjustment_not_a_project(world, client):
    invoice = _credited_invoice(world)
    rows = reports.revenue(start=JANUARY, end=datetime(2026, 2, 1).date(), group_by="project")
    assert [(r.key, r.adjustment) for r in rows] == [(("acme", "vision"), ""), (("acme", ""), "SLO credit")]
    assert rows[1].amount_minor == invoice.credit_minor
    make_user("root", is_staff=True)
    login(client, "root")
    page = client.get("/ops/billing", {"month": "2026-01"})
    body = text(page)
    assert "acme · SLO credit tenant-wide, no project" in body and "acme / —" not in body
    csv_lines = client.get("/ops/billing", {"month": "2026-01", "format": "csv", "report": "project"}) \
        .content.decode().splitlines()
    assert csv_lines[0].endswith(",drafts,adjustment")
    assert csv_lines[2].startswith(f"acme,,USD,{Decimal(invoice.credit_minor) / 100}") and \
        csv_lines[2].endswith(",SLO credit")


def test_money_format_chart_draws_one_day_as_one_slot_of_the_month(world, client):
    days = [f"{day:02d}" for day in range(1, 32)]
    chart = bar_chart([("01", 2.0)], label="GPU-hours per day", unit="GPU-h", slots=days)
    assert len(chart.bars) == 31 and chart.bars[0].height > 0 and chart.bars[0].width < 720 / 31
    assert all(bar.height == 0 for bar in chart.bars[1:])
    assert bar_chart([], label="x", unit="y", slots=days).empty  # nothing at all: nothing to draw
    two_leases(world)
    billing.usage_meter_window(start=t(1, 0), end=t(2, 0), now=AFTER)
    page = login(client, "vic").get("/usage", {"month": "2026-01"}).content.decode()
    bars = r'<rect x="[^"]+" y="[^"]+" width="([^"]+)" height="[^"]+" class="bar"'
    widths = [float(w) for w in re.findall(bars, page)]
    assert len(widths) == 31 and max(widths) < 720 / 31
    assert "data-live-estimate" not in page  # a past month: metered, not live


# -- usage before the first metering run or invoice ----------------------------------------------------------
def test_money_format_usage_is_visible_in_the_first_hour_as_a_live_estimate(world, client):
    cache.delete(f"{LIVE_METER_KEY}:{world.acme.pk}")
    now = timezone.now()
    start_lease(world, {"kind": "whole", "model": "H100-80GB"}, requested=now - timedelta(minutes=11),
                active=now - timedelta(minutes=10))
    theirs = _globex_lease(world, active=now - timedelta(minutes=10))
    assert not AllocationUsage.objects.exists()  # no hourly run, no invoice yet
    page = login(client, "max").get("/usage")
    body = text(page)
    assert "Live estimate." in body and "metered on demand at" in body
    # 10 minutes of a whole H100 at 4.00 USD an hour: 0.67 USD (in-quota training)
    assert "0.67 USD" in body or "0.68 USD" in body
    assert AllocationUsage.objects.count() >= 1
    assert not AllocationUsage.objects.filter(lease=theirs).exists()  # acme's reader meters acme's leases only
    # the dashboard's "so far" counts the hour in progress too, and says it is a live estimate
    dashboard = client.get("/")
    spent = re.search(r'data-spend="spent">([^<]+)<', dashboard.content.decode()).group(1)
    assert spent in ("0.67 USD", "0.68 USD") and "a live estimate" in text(dashboard)
    api = world.client("member").get("/api/v1/usage", {"group_by": "model"})
    assert api.status_code == 200, api.content
    data = api.json()
    assert data["live_estimate"] is True and data["metered_until"] and data["currency"] == "USD"
    [group] = data["groups"]
    assert group["key"] == "H100-80GB" and Decimal(group["gpu_hours"]) >= Decimal("0.16")
    assert group["amount_minor"] in (67, 68)
    # a bad request meters nothing and names the field
    cache.delete(f"{LIVE_METER_KEY}:{world.acme.pk}")
    AllocationUsage.objects.all().delete()
    refused = world.client("member").get("/api/v1/usage", {"group_by": "planet"})
    assert refused.status_code == 400 and refused.json()["field"] == "group_by"
    assert not AllocationUsage.objects.exists()
    # an old window is not live
    past = world.client("member").get("/api/v1/usage", {"from": "2026-01-01", "to": "2026-01-02"}).json()
    assert past["live_estimate"] is False and past["metered_until"] is None


def _globex_lease(world, *, active):
    """An active lease of the other tenant (a 1g.10gb slice on the MIG GPU)."""
    from broker.models import Allocation
    from tenants.access import Actor
    from tenants.choices import Role

    actor = Actor(user=world.outsider, tenant=world.globex, role=Role.OWNER)
    with time_machine.travel(active - timedelta(minutes=1), tick=False):
        lease, _ = services.lease_request(actor=actor, project="secret", gpu={"kind": "mig", "profile": "1g.10gb"})
        services.schedule_cycle()
    for allocation in Allocation.objects.filter(lease=lease):
        with time_machine.travel(active, tick=False):
            services.allocation_ready(allocation=allocation, instance={"device_uuid": "MIG-g"}, now=active)
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.ACTIVE
    return lease


# -- nothing billed after the end ----------------------------------------------------------------------------
def test_money_format_an_expiry_15_s_late_bills_only_to_the_end(world):
    lease = start_lease(world, {"kind": "whole", "model": "H100-80GB"}, requested=t(1, 9, 59), active=t(1, 10),
                        duration_seconds=3600)
    lease.refresh_from_db()
    assert lease.ends_at == t(1, 11)
    late = t(1, 11, 0, 15)  # the periodic task's worst case before issue 29
    with time_machine.travel(late, tick=False):
        assert services.lease_expire_due(now=late) == 1
        services.allocations_free(lease=Lease.objects.get(pk=lease.pk), now=late, to=LeaseState.EXPIRED,
                                  reason="the lease reached its end")
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.EXPIRED
    billing.usage_meter_window(start=t(1, 0), end=t(2, 0), now=AFTER)
    assert [(u.hour_start, u.seconds) for u in AllocationUsage.objects.filter(lease=lease).order_by("hour_start")] \
        == [(t(1, 10), Decimal(3600))]
    billing.invoice_run(period=JANUARY, now=AFTER)
    assert Invoice.objects.get(tenant=world.acme).total_minor == 400  # one hour at 4.00 USD, not 4.02


def test_money_format_expiry_runs_are_enqueued_at_each_end_time(world):
    now = timezone.now()
    first = start_lease(world, {"kind": "whole", "model": "H100-80GB"}, requested=now - timedelta(hours=1),
                        active=now - timedelta(hours=1))
    Lease.objects.filter(pk=first.pk).update(ends_at=now + timedelta(seconds=3))
    assert services.lease_expiries_upcoming(now=now, within_seconds=15) == [3.1]
    Lease.objects.filter(pk=first.pk).update(ends_at=now + timedelta(seconds=20))
    assert services.lease_expiries_upcoming(now=now, within_seconds=15) == []


def test_money_format_a_quote_keeps_the_rate_decimals_and_rounds_the_amount_once():
    from billing.selectors.quotes import QuotePrice

    price = QuotePrice(currency="USD", per_hour=Decimal("0.8750"), for_duration_minor=175, duration_seconds=7200,
                       description="", book="list")
    assert price.formatted == "0.875 USD per hour, 1.75 USD for 2 h"
