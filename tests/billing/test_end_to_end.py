"""Billing end to end on the simulated fleet: a lease runs through the REST API (a real Celery worker, a
real agent over HTTP), a real Prometheus scrapes the agent, metering fills, ``invoice_run`` produces an
invoice whose line matches a hand computation, the PDF and CSV download, the worker pushes the invoice to
the Stripe test server, a signed ``invoice.paid`` webhook marks it paid and a forged one is refused."""

import csv
import io
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

import pytest
import stripe

from billing import services as billing
from billing.choices import InvoiceStatus, StripeState
from billing.core.metering import HOUR, hour_floor
from billing.models import Invoice, StripeEvent, UtilisationUsage
from billing.services.utilisation import utilisation_meter_hour
from broker.models import LeaseEvent
from tests.factories import make_world
from tests.stripe_server import StripeTestServer, deliver
from tests.support.api import Api
from tests.support.processes import start_fleet, start_workers, stop_workers, wait_until


@pytest.mark.slow
def test_billing_end_to_end(live_server, transactional_db, tmp_path, prometheus_server, monkeypatch, settings):
    world = make_world()
    with StripeTestServer() as stripe_server:
        for name, value in (("STRIPE_API_KEY", stripe_server.api_key), ("STRIPE_API_BASE", stripe_server.url),
                            ("STRIPE_WEBHOOK_SECRET", stripe_server.webhook_secret)):
            monkeypatch.setenv(name, value)  # for the worker processes
            setattr(settings, name, value)  # for this one (the webhook view under live_server)
        # 1g.10gb at 3,600.00 an instance-hour: one cent per second held, easy to check by hand
        billing.price_book_create(name="e2e", currency="USD", effective_from=datetime(2025, 1, 1, tzinfo=UTC),
                                  rates=[{"tier": "H100-80GB", "per_hour": "7.00"},
                                         {"tier": "H100-80GB", "kind": "mig", "mig_profile": "1g.10gb",
                                          "per_hour": "3600.00"}])
        workers = start_workers(1)
        fleet = start_fleet(live_server.url, tmp_path / "fleet", 1, "h100-80gb:1:mig")
        prometheus = prometheus_server(file_sd=tmp_path / "fleet" / "prometheus-targets.json").start()
        settings.PROMETHEUS_URL = prometheus.url
        settings.METERING_STEP_SECONDS = 1  # the lease lives seconds, not hours
        try:
            prometheus.wait_for("DCGM_FI_DEV_POWER_USAGE", timeout=30)
            api = Api(live_server.url, world.tokens["member"])
            status, lease = api.call("POST", "/leases", {"project": "vision", "duration_seconds": 600,
                                                         "gpu": {"kind": "mig", "profile": "1g.10gb"}},
                                     {"Idempotency-Key": "e2e-1"})
            assert status == 201, lease
            wait_until(lambda: api.call("GET", f"/leases/{lease['id']}")[1]["state"] == "active")
            # the agent's per-instance series appear once the instance exists; let a few scrapes land
            prometheus.wait_for('DCGM_FI_PROF_GR_ENGINE_ACTIVE{allocation_id!=""}', timeout=30)
            time.sleep(4)
            assert api.call("DELETE", f"/leases/{lease['id']}")[0] == 202
            wait_until(lambda: api.call("GET", f"/leases/{lease['id']}")[1]["state"] == "released")

            # metering: every hour the lease touched, after Prometheus has scraped past the release
            events = {e.to_state: e.at for e in LeaseEvent.objects.filter(lease_id=lease["id"]).order_by("pk")}
            held = events["releasing"] - events["active"]
            time.sleep(2.5)
            now = datetime.now(UTC) - timedelta(seconds=1)
            hour = hour_floor(events["active"])
            while hour <= events["releasing"]:
                billing.usage_meter_window(start=hour, end=hour + HOUR, now=now)
                utilisation_meter_hour(hour_start=hour, now=now)
                hour += HOUR
            usage = UtilisationUsage.objects.filter(lease_id=lease["id"])
            assert usage.exists() and all(u.engine_active_avg is not None and u.samples > 0 for u in usage)

            period = now.date().replace(day=1)
            result = billing.invoice_run(period=period, tenant=world.acme, finalize=True, now=now)
            assert result["finalized"] == 1, result
            invoice = Invoice.objects.get(tenant=world.acme, period=period)
            [line] = invoice.lines.all()
            # by hand: seconds held (ACTIVE → RELEASING) × 3600.00/h ÷ 3600 s/h = cents held
            seconds = Decimal(held.total_seconds()).quantize(Decimal("0.000001"))
            assert line.unit == "1g.10gb instance-hour" and line.unit_price == Decimal("3600")
            assert line.quantity == (seconds / 3600).quantize(Decimal("0.000001"))
            assert line.amount_minor == int((seconds * 100).quantize(Decimal(1), rounding=ROUND_HALF_UP))
            assert line.engine_active_avg is not None and line.memory_used_avg_mib is not None
            assert invoice.total_minor == line.amount_minor > 0

            # documents over HTTP, with the tenant's token
            def download(suffix):
                request = urllib.request.Request(f"{live_server.url}/api/v1/invoices/{invoice.pk}.{suffix}",
                                                 headers={"Authorization": f"Bearer {world.tokens['viewer']}"})
                with urllib.request.urlopen(request, timeout=60) as response:
                    return response.headers["Content-Type"], response.read()

            kind, pdf = download("pdf")
            assert kind == "application/pdf" and pdf.startswith(b"%PDF")
            rows = list(csv.DictReader(io.StringIO(download("csv")[1].decode())))
            assert rows[0]["amount"] == str(Decimal(line.amount_minor).scaleb(-2))

            # the worker pushed it to Stripe after finalization
            wait_until(lambda: Invoice.objects.get(pk=invoice.pk).stripe_state == StripeState.SENT, timeout=60)
            invoice.refresh_from_db()
            stripe_invoice = stripe_server.invoice(invoice.stripe_invoice_id)
            assert stripe_invoice["status"] == "open" and stripe_invoice["total"] == invoice.total_minor
            assert [item["amount"] for item in stripe_invoice["lines"]["data"]] == [line.amount_minor]

            # the customer pays at Stripe; Stripe's signed event marks ours paid; a forged one is refused
            client = stripe.StripeClient(stripe_server.api_key, base_addresses={"api": stripe_server.url})
            client.v1.invoices.pay(invoice.stripe_invoice_id)
            paid = stripe_server.last_event("invoice.paid", invoice.stripe_invoice_id)
            webhook = f"{live_server.url}/api/v1/billing/stripe/webhook"
            forged = dict(paid, id="evt_forged_1")
            status, _ = deliver(webhook, forged, stripe_server.webhook_secret, forged=True)
            assert status == 400 and not StripeEvent.objects.filter(event_id="evt_forged_1").exists()
            assert Invoice.objects.get(pk=invoice.pk).status == InvoiceStatus.FINALIZED
            status, _ = deliver(webhook, paid, stripe_server.webhook_secret)
            assert status == 200
            invoice.refresh_from_db()
            assert invoice.status == InvoiceStatus.PAID and invoice.paid_at is not None
        finally:
            prometheus.stop()
            fleet.terminate()
            fleet.wait(30)
            stop_workers(workers)
