"""``invoice_run`` killed with SIGKILL half-way, then run again: every tenant gets exactly one invoice,
equal to what an uninterrupted run computes — no double charge, no lost usage."""

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from billing import services as billing
from billing.choices import InvoiceStatus
from billing.models import AllocationUsage, Invoice, InvoiceLine
from broker.models import Lease
from tests.factories import make_project, make_tenant
from tests.support.processes import ROOT, test_database_url

TENANTS = 150
JANUARY = date(2026, 1, 1)


def usage_for_many_tenants():
    billing.price_book_create(name="list", currency="USD", effective_from=datetime(2025, 1, 1, tzinfo=UTC),
                              rates=[{"tier": "H100-80GB", "per_hour": "3.20"}])
    start = datetime(2026, 1, 1, tzinfo=UTC)
    rows = []
    for number in range(TENANTS):
        tenant = make_tenant(f"t{number:03d}")
        project = make_project(tenant, "main")
        lease = Lease.objects.create(tenant=tenant, project=project, kind="whole", duration_seconds=86400 * 40,
                                     state="active", tier="H100-80GB", requested_at=start)
        for hour in range(24 * (1 + number % 20)):
            rows.append(AllocationUsage(
                tenant=tenant, project=project, lease=lease, hour_start=start + timedelta(hours=hour),
                seconds=Decimal(3600 - (number % 7)), tier="H100-80GB", kind="whole", gpu_milli=1000,
                memory_mib=81559, workload_class="training", over_quota=number % 3 == 0, metered_at=start))
    AllocationUsage.objects.bulk_create(rows, batch_size=5000)


@pytest.mark.slow
def test_invoice_run_killed_half_way_converges(transactional_db):
    usage_for_many_tenants()
    env = {**os.environ, "DATABASE_URL": test_database_url()}
    command = [sys.executable, "manage.py", "invoice_run", "--period", "2026-01"]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while Invoice.objects.count() < 5 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    done_before = Invoice.objects.count()
    assert 0 < done_before < TENANTS, "the kill must land half-way"
    finished = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert f"{TENANTS} tenant(s)" in finished.stdout
    assert Invoice.objects.count() == TENANTS
    assert not Invoice.objects.exclude(status=InvoiceStatus.FINALIZED).exists()
    # each invoice equals an uninterrupted computation of its lines, and adds up
    for invoice in Invoice.objects.select_related("tenant"):
        expected = billing.invoice_lines_compute(tenant=invoice.tenant, period=JANUARY)
        stored = list(InvoiceLine.objects.filter(invoice=invoice).order_by("position")
                      .values_list("description", "quantity", "amount_minor"))
        assert stored == [(line.description, line.quantity, line.amount_minor) for line in expected]
        assert invoice.total_minor == sum(amount for _d, _q, amount in stored)
    # and a third run changes nothing
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert f"{TENANTS} already final" in again.stdout
