"""``gpubroker`` (the console script pip installs from pyproject.toml) against a live server: the walk-through of
docs/cli.md runs as a script, as a user would paste it, with a real Celery worker and a simulated node that runs the
workload; and every ``gpubroker`` command the docs and the README show is one the walk-through runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from broker.models import Lease
from tests.factories import make_quota

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "cli.md"
README = ROOT / "README.md"
SCRIPT = Path(sys.executable).parent / "gpubroker"


def _sh_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, re.S)


def _walkthrough() -> str:
    text = DOC.read_text()
    start = text.index("## Walk-through\n")
    end = text.index("\n## ", start + 1)
    (block,) = _sh_blocks(text[start:end])
    return block


def _cli_lines(text: str) -> set[str]:
    return {line.strip() for block in _sh_blocks(text) for line in block.splitlines()
            if re.search(r"(^|\$\()gpubroker ", line.strip())}


def test_cli_console_script_is_installed():
    assert SCRIPT.exists(), f"{SCRIPT} is missing: make venv installs it (pip install -e .)"
    run = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "{lease,quote,usage}" in run.stdout


def test_cli_every_documented_command_is_in_the_walkthrough():
    shown = _cli_lines(DOC.read_text()) | _cli_lines(README.read_text())
    assert shown, "no gpubroker command found in docs/cli.md or README.md"
    assert shown <= _cli_lines(f"```sh\n{_walkthrough()}```"), shown - _cli_lines(f"```sh\n{_walkthrough()}```")


@pytest.mark.slow
def test_cli_walkthrough_runs_against_the_live_server(live_server, worker, workload_fleet, world, tmp_path):
    make_quota(world.project, "A100-80GB", deserved=1000, limit=2000)
    config = tmp_path / "gpubroker" / "config.toml"  # the token from the config file, the URL from the environment
    config.parent.mkdir()
    config.write_text(f'token = "{world.tokens["member"]}"\n')
    config.chmod(0o600)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GPUBROKER_")},
           "PATH": f"{SCRIPT.parent}{os.pathsep}{os.environ['PATH']}", "XDG_CONFIG_HOME": str(tmp_path),
           "GPUBROKER_URL": live_server.url}
    script = "set -euo pipefail\nset -x\n" + _walkthrough()
    run = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lease = Lease.objects.get(project=world.project)
    out = run.stdout
    assert "hello from the GPU" in out  # the workload's own output, from the node, through the broker
    assert re.search(rf"^{lease.pk}\s+vision\s+", out, re.M)  # the lease list's table row
    listed = json.loads(out[out.index("[\n"):out.index("\n]\n") + 3])
    assert [item["id"] for item in listed] == [lease.pk] and listed[0]["requested_at"].endswith("Z")
    assert "state: released" in out or "state: releasing" in out
    assert "by project" in out
    lease.refresh_from_db()
    assert lease.state in ("released", "releasing")
    assert world.tokens["member"] not in run.stdout + run.stderr  # the token is never printed


def test_cli_refusal_prints_the_problem_and_exits_1(live_server, world):
    env = {**os.environ, "GPUBROKER_URL": live_server.url, "GPUBROKER_TOKEN": world.tokens["member"]}
    run = subprocess.run([str(SCRIPT), "lease", "request", "--project", "nlp", "--gpu", "mig:1g.10gb"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 1
    assert run.stderr.strip() == "gpubroker: 404 not_found (project): No project 'nlp' in this tenant."
    viewer = {**env, "GPUBROKER_TOKEN": world.tokens["viewer"]}
    run = subprocess.run([str(SCRIPT), "lease", "request", "--project", "vision", "--gpu", "mig:1g.10gb"],
                         capture_output=True, text=True, env=viewer, timeout=60)
    assert run.returncode == 1 and run.stderr.startswith("gpubroker: 403 ")


def test_cli_the_sdk_example_of_the_docs_runs_against_the_live_server(live_server, world, tmp_path):
    """docs/cli.md's Python example, as written, in a fresh interpreter with the token in the environment."""
    text = DOC.read_text()
    (example,) = re.findall(r"```python\n(.*?)```", text[text.index("## The Python SDK"):], re.S)
    env = {**os.environ, "GPUBROKER_URL": live_server.url, "GPUBROKER_TOKEN": world.tokens["member"],
           "XDG_CONFIG_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True, env=env, timeout=120,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1].startswith("404 not_found project No project 'nlp'")
    lease = Lease.objects.get(project=world.project, idempotency_key="nightly-2026-11-26")
    assert lease.state in ("released", "releasing")


def test_cli_lease_request_carries_labels_and_names_a_refused_key(live_server, world):
    env = {**os.environ, "GPUBROKER_URL": live_server.url, "GPUBROKER_TOKEN": world.tokens["member"]}
    command = [str(SCRIPT), "lease", "request", "--project", "vision", "--gpu", "mig:1g.10gb", "-q"]
    run = subprocess.run([*command, "--label", "team=vision", "--label", "cost-center=cc-42"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    assert Lease.objects.get(pk=int(run.stdout)).labels == {"cost-center": "cc-42", "team": "vision"}
    run = subprocess.run([*command, "--label", "owner=max"], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 1
    assert run.stderr.startswith("gpubroker: 400 invalid (labels.owner): Label key 'owner' is not allowed")
