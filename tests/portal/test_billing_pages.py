"""Portal pages for money: usage, invoices (with PDF/CSV), the dashboard's spend and the platform's
billing reports — scoped to the tenant, reports for staff only."""

from __future__ import annotations

import pytest

from billing import services as billing
from billing.models import Invoice
from tests.billing.test_invoicing import AFTER, JANUARY, two_leases
from tests.billing.test_invoicing import world as world
from tests.factories import make_user
from tests.portal.test_pages import login, text


@pytest.fixture
def invoiced(world):
    two_leases(world)
    billing.invoice_run(period=JANUARY, now=AFTER)
    return Invoice.objects.get(tenant=world.acme)


def test_usage_page_shows_projects_models_and_the_daily_chart(invoiced, client):
    page = login(client, "vic").get("/usage", {"month": "2026-01"})
    assert page.status_code == 200
    body = text(page)
    assert "Usage January 2026" in body and "vision" in body and "H100-80GB" in body
    assert "3.66 USD" in body  # 2.16 + 1.50
    assert '<svg viewBox="0 0 720 160" role="img" aria-label="GPU-hours per day"' in page.content.decode()
    # a bad month is said next to the picker, and the current month is shown instead
    assert "period must be a month as YYYY-MM" in text(client.get("/usage", {"month": "2026-13"}))


def test_invoices_list_detail_and_downloads(invoiced, client):
    login(client, "vic")
    listing = text(client.get("/invoices/"))
    assert invoiced.number in listing and "3.66 USD" in listing and "Finalized" in listing
    detail = client.get(f"/invoices/{invoiced.pk}")
    assert detail.status_code == 200
    body = text(detail)
    assert "3g.40gb instance-hour" in body and "vision: H100-80GB GPU, interactive (over quota)" in body
    pdf = client.get(f"/invoices/{invoiced.pk}.pdf")
    assert pdf.status_code == 200 and pdf.content.startswith(b"%PDF")
    csv_text = client.get(f"/invoices/{invoiced.pk}.csv").content.decode()
    assert csv_text.splitlines()[0].startswith("invoice,period,position")
    assert client.get(f"/invoices/{invoiced.pk}.txt").status_code == 404


def test_another_tenants_invoice_is_404(invoiced, client):
    login(client, "bob")
    for path in (f"/invoices/{invoiced.pk}", f"/invoices/{invoiced.pk}.pdf", f"/invoices/{invoiced.pk}.csv"):
        assert client.get(path).status_code == 404
    assert invoiced.number not in text(client.get("/invoices/"))


def test_dashboard_shows_the_months_spend(world, client):
    page = text(login(client, "max").get("/"))
    assert "Spend this month" in page and "Forecast for the month" in page


def test_billing_reports_for_staff_only(invoiced, client):
    login(client, "alice")  # a tenant owner is not platform staff
    assert client.get("/ops/billing").status_code == 403
    make_user("root", is_staff=True)
    client.logout()
    login(client, "root")
    page = client.get("/ops/billing", {"month": "2026-01"})
    assert page.status_code == 200
    body = text(page)
    assert "Billing January 2026" in body and "acme" in body and "3.66 USD" in body
    assert "Over-quota share" in body and "SLO attainment" in body
    report = client.get("/ops/billing", {"month": "2026-01", "format": "csv", "report": "project"})
    lines = report.content.decode().splitlines()
    assert lines[0].startswith("tenant,project,currency,amount") and lines[1].startswith("acme,vision,USD,3.66")
    assert client.get("/ops/billing", {"format": "csv", "report": "planet"}).status_code == 400
