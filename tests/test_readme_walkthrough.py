"""The walk-through (issue 14): ``docs/walkthrough.sh`` runs every command that ``docs/tour.md`` ("The
walk-through") and the README's one API example show, against a live server with real parts (the Django live
server, a Celery worker process, simulated agents enrolled over HTTP, ``manage.py`` on the test database), and
those pages and the script cannot drift apart."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.urls import Resolver404, resolve

from billing.models import Invoice
from broker import services as broker
from broker.models import Lease
from tests.support.processes import start_fleet, start_workers, stop_workers, test_database_url

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TOUR = ROOT / "docs" / "tour.md"
SCRIPT = ROOT / "docs" / "walkthrough.sh"
# README line → the script's form of it (the script takes BASE_URL from the environment)
SCRIPT_FORM = {"BASE_URL=http://127.0.0.1:8000": "BASE_URL=${BASE_URL:-http://127.0.0.1:8000}"}
# the script's calls the README need not show, each with its reason
SCRIPT_ONLY = {'curl -s -o /dev/null "$BASE_URL/healthz"': "the script's own check that a server answers"}


def _logical_lines(text: str) -> list[str]:
    """Shell lines with backslash continuations joined and runs of blanks made one space."""
    return [" ".join(line.split()) for line in text.replace("\\\n", " ").splitlines()]


def _commands(text: str) -> list[str]:
    """The commands of shell text: comment lines and trailing ``  # comments`` left out."""
    commands = []
    for line in _logical_lines(text):
        line = re.sub(r"\s#\s.*$", "", line).strip()
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


def _section_commands(path: Path, heading: str) -> list[str]:
    """The commands of the ``sh`` blocks in the section ``heading`` of ``path`` (up to the next ``## ``)."""
    text = path.read_text()
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    section = text[start:end if end != -1 else len(text)]
    return [command for block in re.findall(r"```sh\n(.*?)```", section, re.S) for command in _commands(block)]


def _readme_walkthrough() -> list[str]:
    """Every walk-through command the docs show: the whole of it in docs/tour.md, the README's one example."""
    return [*_section_commands(TOUR, "## The walk-through"), *_readme_example()]


def _readme_example() -> list[str]:
    return _section_commands(README, "## The API in one example")


def test_readme_walkthrough_every_readme_command_is_in_the_script():
    readme = _readme_walkthrough()
    script = _commands(SCRIPT.read_text())
    # the section was found and holds the whole walk-through
    for needed in ("manage.py tenant_bootstrap", "/api/v1/quotas", '"$BASE_URL/api/v1/leases")',
                   "/api/v1/leases/$LEASE", "-X DELETE", "invoice_run", "/api/v1/usage", "/api/v1/invoices",
                   "$INVOICE.pdf"):
        assert any(needed in command for command in readme), f"the README's walk-through lost {needed!r}"
    missing = [c for c in readme if not any(SCRIPT_FORM.get(c, c) in line for line in script)]
    assert not missing, f"documented commands that docs/walkthrough.sh does not run: {missing}"


def test_readme_walkthrough_the_readme_example_is_run_by_the_script():
    """The README's one example is the lease part of the walk-through, word for word."""
    example = _readme_example()
    for needed in ("manage.py tenant_bootstrap", '"$BASE_URL/api/v1/leases")', "/api/v1/leases/$LEASE", "-X DELETE"):
        assert any(needed in command for command in example), f"the README's example lost {needed!r}"
    script = _commands(SCRIPT.read_text())
    missing = [c for c in example if not any(SCRIPT_FORM.get(c, c) in line for line in script)]
    assert not missing, f"README commands that docs/walkthrough.sh does not run: {missing}"


def test_readme_walkthrough_every_script_call_is_in_the_readme():
    readme = [SCRIPT_FORM.get(c, c) for c in _readme_walkthrough()]
    calls = [line for line in _commands(SCRIPT.read_text())
             if re.search(r"(^|\$\(|&& )(curl|\.venv/bin/python manage\.py) ", line)]
    assert len(calls) >= 9
    unshown = [line for line in calls
               if not any(c in line for c in SCRIPT_ONLY) and not any(c in line for c in readme)]
    assert not unshown, f"docs/walkthrough.sh calls that docs/tour.md does not show: {unshown}"


def test_readme_walkthrough_has_no_fixed_ids_or_months():
    """Ids come from the answers and the month from the clock (issue 14: lease 2, 2026-11 hard-coded)."""
    for command in _readme_walkthrough():
        assert not re.search(r"/(leases|invoices)/\d", command), command
        assert not re.search(r"\b20\d\d-\d\d\b", command), command
        assert "-OJ" not in command and (".pdf" not in command or "-sSf -o" in command), command


def test_readme_names_portal_pages_that_exist():
    paths = set(re.findall(r"`(/[a-z0-9_./-]*)[`?]", README.read_text() + TOUR.read_text()))
    assert {"/ops/", "/ops/fleet", "/usage", "/invoices/"} <= paths
    unknown = []
    for path in sorted(paths):
        try:
            resolve(path.split("?")[0])
        except Resolver404:
            unknown.append(path)
    assert not unknown, f"the README or docs/tour.md names pages that are 404: {unknown}"


def test_readme_ops_leads_staff_to_the_fleet_map(admin_client):
    response = admin_client.get("/ops/", follow=True)
    assert response.status_code == 200
    assert response.redirect_chain == [("/ops/fleet", 302)]


def test_invoice_run_through_now_is_refused_with_finalize(db):
    with pytest.raises(CommandError, match="--through-now"):
        call_command("invoice_run", "--period", datetime.now(UTC).strftime("%Y-%m"), "--through-now", "--finalize")


def _manage(env: dict, *args: str) -> None:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=180)
    assert result.returncode == 0, f"manage.py {' '.join(args)}: {result.stdout}{result.stderr}"


@pytest.fixture
def demo_env(live_server, transactional_db, tmp_path) -> dict:
    """The script's environment: manage.py on the test database, which holds the demo as `make run` seeds it."""
    broker.cycle_flag_clear()
    env = {**os.environ, "DATABASE_URL": test_database_url(), "GPUBROKER_VAR_DIR": str(tmp_path / "var"),
           "BASE_URL": live_server.url, "OUT_DIR": str(tmp_path / "out")}
    _manage(env, "seed_demo")
    _manage(env, "seed_prices")
    return env


def _walkthrough(env: dict, cwd: Path) -> tuple[subprocess.CompletedProcess, str]:
    result = subprocess.run(["sh", str(SCRIPT)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return result, f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


@pytest.mark.slow
def test_readme_walkthrough_script_runs_against_a_live_service(live_server, demo_env, tmp_path):
    workers = start_workers(1)
    fleet = start_fleet(live_server.url, tmp_path / "fleet", 2, "h100-80gb:2:mig", "a100-80gb:2:whole")
    try:
        result, output = _walkthrough(demo_env, tmp_path)
    finally:
        fleet.terminate()
        fleet.wait(30)
        stop_workers(workers)
    assert result.returncode == 0, output
    active = re.search(r"^lease (\d+) is active on (sim-\d+): 3g\.40gb MIG-\S+$", result.stdout, re.M)
    assert active, output
    lease = Lease.objects.get(pk=int(active.group(1)))
    assert f"lease {lease.pk} is released" in result.stdout, output
    assert lease.state == "released" and lease.project.slug == "vision" and lease.tenant.slug == "acme"
    assert re.search(r"^\d{4}-\d\d: 1 tenant\(s\); 0 finalized, 1 draft\(s\)", result.stdout, re.M), output
    invoice = Invoice.objects.get(tenant=lease.tenant, period=datetime.now(UTC).date().replace(day=1))
    assert invoice.status == "draft"
    assert invoice.lines.filter(project=lease.project, mig_profile="3g.40gb", gpu_hours__gt=0).exists()
    assert (tmp_path / "out" / "invoice.pdf").read_bytes().startswith(b"%PDF"), output
    assert "walkthrough failed" not in result.stderr


@pytest.mark.slow
def test_readme_walkthrough_script_stops_with_a_reason_when_no_node_serves(demo_env, tmp_path):
    """A worker but no fleet: the wait is bounded and the failure says what the lease waits for."""
    workers = start_workers(1)
    try:
        result, output = _walkthrough({**demo_env, "WAIT_SECONDS": "3"}, tmp_path)
    finally:
        stop_workers(workers)
    assert result.returncode == 1, output
    assert re.search(r"walkthrough failed: lease \d+ is still queued after 3 s, not active \(reason: waiting",
                     result.stderr), output
    assert "Are the Celery worker and the simulated fleet running?" in result.stderr
    assert not (tmp_path / "out").exists()


def test_readme_walkthrough_script_says_when_nothing_answers(tmp_path):
    from tests.support.processes import free_port

    env = {**os.environ, "BASE_URL": f"http://127.0.0.1:{free_port()}"}
    result, output = _walkthrough(env, tmp_path)
    assert result.returncode == 1, output
    assert f"walkthrough failed: nothing answers at {env['BASE_URL']}" in result.stderr
