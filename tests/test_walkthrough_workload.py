"""The second walk-through (issue 29): ``docs/walkthrough-workload.sh`` runs the workload example of docs/leasing.md
as written there — its body read from the page — against a live service with real parts (the Django live server, a
Celery worker process, a simulated node over HTTP running the workload as a process, ``manage.py`` on the test
database), set up as ``make run`` sets it up: one workload root for the broker and the node, the demo seeded with
its projects' directories and train.py (``seed_demo --workload-root``). The preview says it fits, the lease runs
the training and ends released, and its log holds the training's last line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker import services as broker
from broker.models import Lease
from tests.support.processes import start_fleet, start_workers, stop_fleet, stop_workers, test_database_url

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "docs" / "walkthrough-workload.sh"


def _manage(env: dict, *args: str) -> None:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=180)
    assert result.returncode == 0, f"manage.py {' '.join(args)}: {result.stdout}{result.stderr}"


@pytest.mark.slow
def test_the_documented_workload_runs_as_written_on_a_make_run_setup(live_server, transactional_db, tmp_path,
                                                                      settings):
    root = tmp_path / "srv"  # make run's /srv/gpubroker, here under the test's own directory
    settings.WORKLOAD_ALLOWED_ROOTS = [str(root)]
    broker.cycle_flag_clear()
    env = {**os.environ, "DATABASE_URL": test_database_url(), "GPUBROKER_VAR_DIR": str(tmp_path / "var"),
           "BASE_URL": live_server.url, "WORKLOAD_ROOT": str(root), "PYTHON": sys.executable}
    _manage(env, "seed_demo", "--workload-root", str(root))
    assert (root / "acme" / "vision" / "train.py").exists()
    workers = start_workers(1)
    fleet = start_fleet(live_server.url, tmp_path / "fleet", 1, "a100-80gb:1:whole",
                        extra=("--workload-root", str(root)))
    try:
        result = subprocess.run(["sh", str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=300)
    finally:
        stop_fleet(fleet)
        stop_workers(workers)
    output = f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    assert result.returncode == 0, output
    lease = Lease.objects.get(project__slug="vision", tenant__slug="acme")
    assert lease.state == "released", output
    assert lease.reason == "released: the workload succeeded (exit status 0); the lease ends", output
    assert f"lease {lease.pk} ended (released): released: the workload succeeded" in result.stdout, output
    assert "epoch 3/3 done" in result.stdout and "training finished" in result.stdout, output
    assert (root / "acme" / "vision" / "run-1" / "checkpoint.json").read_text() == '{"epoch": 3}'
    assert "hf_" not in result.stdout.split("== POST /api/v1/leases")[-1]  # the secret is never shown back


def test_the_walkthrough_reads_the_documented_request_from_the_page():
    text = (ROOT / "docs" / "leasing.md").read_text()
    assert "```json\nPOST /api/v1/leases\n" in text and '"workdir": "/srv/gpubroker/acme/vision"' in text
    assert "docs/leasing.md" in SCRIPT.read_text()
