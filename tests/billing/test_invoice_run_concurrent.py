"""Two ``invoice_run`` processes at once for a month with no invoices yet (issue 13, item 5): both finish,
and every tenant has exactly one invoice, equal to what one run computes.

To make the two runs meet on the same tenant every time (not only when the timing happens to collide),
the test holds an EXCLUSIVE lock on the invoice table (reads go on; ``SELECT … FOR UPDATE`` waits) until
both processes are blocked, then lets them go together. Without the per tenant-month advisory lock both
found no invoice, both inserted one, and one run died on the unique constraint, skipping the rest."""

import os
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest

from billing import services as billing
from billing.models import AllocationUsage, Invoice, InvoiceLine
from broker.models import Lease
from tests.factories import make_project, make_tenant
from tests.support.processes import ROOT, test_database_url

TENANTS = 12
JANUARY = date(2026, 1, 1)


def usage_for_tenants():
    billing.price_book_create(name="list", currency="USD", effective_from=datetime(2025, 1, 1, tzinfo=UTC),
                              rates=[{"tier": "H100-80GB", "per_hour": "3.20"}])
    start = datetime(2026, 1, 1, tzinfo=UTC)
    rows = []
    for number in range(TENANTS):
        tenant = make_tenant(f"c{number:02d}")
        project = make_project(tenant, "main")
        lease = Lease.objects.create(tenant=tenant, project=project, kind="whole", duration_seconds=86400 * 40,
                                     state="active", tier="H100-80GB", requested_at=start)
        rows += [AllocationUsage(tenant=tenant, project=project, lease=lease, hour_start=start + timedelta(hours=h),
                                 seconds=Decimal(3600), tier="H100-80GB", kind="whole", gpu_milli=1000,
                                 memory_mib=81559, workload_class="training", over_quota=False, metered_at=start)
                 for h in range(5 + number)]
    AllocationUsage.objects.bulk_create(rows)


def waiting_on_locks(cursor) -> int:
    cursor.execute("SELECT pg_stat_clear_snapshot()")  # the statistics views are cached per transaction
    cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                   "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
    return cursor.fetchone()[0]


@pytest.mark.slow
def test_invoice_run_twice_at_once_both_finish_with_one_invoice_per_tenant(transactional_db):
    usage_for_tenants()
    url = test_database_url()
    env = {**os.environ, "DATABASE_URL": url}
    command = [sys.executable, "manage.py", "invoice_run", "--period", "2026-01", "--finalize"]
    with psycopg.connect(url) as gate:
        gate.execute("LOCK TABLE billing_invoice IN EXCLUSIVE MODE")  # held until the block ends (commit)
        runs = [subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) for _ in range(2)]
        deadline = time.monotonic() + 60
        with gate.cursor() as cursor:
            while waiting_on_locks(cursor) < 2 and time.monotonic() < deadline:
                assert all(run.poll() is None for run in runs), [run.communicate()[0] for run in runs]
                time.sleep(0.05)
            assert waiting_on_locks(cursor) >= 2, "both runs must be waiting at the gate"
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    for run, output in zip(runs, outputs, strict=True):
        assert run.returncode == 0, output
        assert f"{TENANTS} tenant(s)" in output, output
    assert Invoice.objects.count() == TENANTS
    assert sorted(Invoice.objects.values_list("tenant__slug", flat=True)) == [f"c{n:02d}" for n in range(TENANTS)]
    for invoice in Invoice.objects.select_related("tenant"):
        expected = billing.invoice_lines_compute(tenant=invoice.tenant, period=JANUARY)
        stored = list(InvoiceLine.objects.filter(invoice=invoice).order_by("position")
                      .values_list("description", "quantity", "amount_minor"))
        assert stored == [(line.description, line.quantity, line.amount_minor) for line in expected]
        assert invoice.status == "finalized" and invoice.total_minor == sum(a for _d, _q, a in stored)
