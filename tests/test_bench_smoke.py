"""The benchmarks that write their history straight into PostgreSQL (COPY, bypassing the models) run at toy
sizes in the suite: a column added to a table they fill must break this test, not the next person's
``make bench`` (a NOT NULL ``access_extra`` on ``broker_lease`` once did, unseen for a day).

Each runs as its command line does, in a subprocess, against a scratch database on the suite's PostgreSQL,
with ``BENCH_RESULTS_DIR`` pointed at a temporary folder so the recorded figures are untouched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.record import ROOT

pytestmark = pytest.mark.django_db  # the suite's PostgreSQL is up (the scratch databases live beside it)


def _run(tmp_path, *argv: str, timeout: int = 240) -> subprocess.CompletedProcess:
    from django.conf import settings

    database = settings.DATABASES["default"]
    url = (f"postgres://{database['USER']}:{database.get('PASSWORD') or ''}@{database['HOST']}:{database['PORT']}"
           f"/{database['NAME']}")
    env = {**os.environ, "BENCH_RESULTS_DIR": str(tmp_path), "DATABASE_URL": url}
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_billing_benchmark_runs_at_toy_size(tmp_path):
    done = _run(tmp_path, "bench/billing.py", "--tenants", "4", "--nodes", "2", "--days", "2")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    figures = json.loads((tmp_path / "billing.json").read_text())["figures"]
    assert figures["history"]["leases"] > 0 and figures["metering"]["rows"] > 0
    assert figures["invoice_run"]["errors"] == 0 and figures["invoice_run"]["finalized"] >= 1
    assert figures["rerun"]["rows_changed"] == 0


def test_scheduler_cycle_benchmark_with_postgresql_runs_at_toy_size(tmp_path):
    done = _run(tmp_path, "bench/scheduler_cycle.py", "--db", "--nodes", "20", "--requests", "30", "--repeat", "1",
                "--no-record")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "decisions" in done.stdout
