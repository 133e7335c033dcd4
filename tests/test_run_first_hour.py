"""``make run`` as a new user meets it (issue 29), on a real ``python -m infra.run`` with free ports, a var dir and
database of its own (a developer's ``make run`` is never touched) and its workload root kept beside that var dir:

- the banner names the workload root, says loopback webhooks are allowed here, and ends with the demo logins and
  the file that keeps them; the tiering model was seeded and trained at start;
- docs/leasing.md's workload example runs as written (``docs/walkthrough-workload.sh``);
- Ctrl-C (SIGINT) stops a lease workload the simulated nodes were running, not only the launcher's children.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import requests

from agent.workloads import process_start_ticks
from core.processes import http_ok
from tests.support.oidc import Provider, provider_sign_in
from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
STARTUP_SECONDS = 240  # a fresh database migrates, seeds the demo and the tiering reference set (a worker trains)


def _log(path: Path) -> str:
    return path.read_text()


def _wait(predicate, timeout: float, process, log: Path, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        assert process.poll() is None, f"launcher exited while waiting for {what}:\n{_log(log)[-6000:]}"
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}:\n{_log(log)[-6000:]}")


def _call(site: str, token: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(site + "/api/v1" + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


@pytest.mark.slow
def test_make_run_serves_the_documented_paths_and_ctrl_c_stops_lease_workloads(tmp_path):
    var = ROOT / "var" / "test-first-hour"  # kept between runs (ignored), as make run's var/ is
    var.mkdir(parents=True, exist_ok=True)
    # the workload root is kept with the var dir: a second run's nodes report the same root the broker's inventory
    # (in the kept database) still holds from the first, as a developer's make run does with its var/
    root = var / "srv"
    parts = urlsplit(os.environ["DATABASE_URL"])
    database_url = urlunsplit(parts._replace(path=parts.path.rstrip("/") + "_first_hour"))
    port, oidc_port = free_port(), free_port()
    site = f"http://127.0.0.1:{port}"
    env = {**os.environ, "GPUBROKER_VAR_DIR": str(var), "DATABASE_URL": database_url,
           "WORKLOAD_ALLOWED_ROOTS": str(root), "CELERY_TASK_DEFAULT_QUEUE": f"first-hour-{os.getpid()}",
           "CACHE_KEY_PREFIX": f"first-hour-{os.getpid()}", "LOG_LEVEL": "WARNING"}
    log = tmp_path / "run.log"
    interactive_port, ssh_port = free_port(), free_port()
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "infra.run", "--port", str(port), "--agents-port", str(free_port()),
             "--interactive-port", str(interactive_port), "--ssh-port", str(ssh_port), "--fleet-port",
             str(free_port()), "--prometheus-port", str(free_port()), "--oidc-port", str(oidc_port),
             "--fleet-nodes", "2", "--workers", "1"], cwd=ROOT,
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    children: dict[str, int] = {}
    try:
        _wait(lambda: "Demo logins (kept in" in _log(log), STARTUP_SECONDS, process, log, "the banner")
        time.sleep(1)  # the banner's last lines
        text = _log(log)
        children = json.loads((var / "run.json").read_text())["children"]
        assert f"workloads   paths under {root}/<tenant>/<project> on every node" in text
        assert "webhooks    http:// and loopback targets allowed" in text
        assert re.search(r"model: training queued|model \d+ kept", text), text[-4000:]
        banner = text[text.index("GPU broker is running:"):].splitlines()  # children may log after it
        header = next(i for i, line in enumerate(banner) if line.startswith("Demo logins (kept in "))
        assert banner[header] == f"Demo logins (kept in {var / 'demo-credentials.json'}):"
        assert header > next(i for i, line in enumerate(banner) if line.startswith("Ctrl-C stops everything"))
        credentials = json.loads((var / "demo-credentials.json").read_text())
        assert banner[header + 1] == f"  admin       admin / {credentials['admin']} (platform staff)"
        assert banner[header + 2].startswith("  acme ") and banner[header + 3].startswith("  globex ")
        # the single sign-on demo, all over real HTTP, one cookie jar as a browser has (the broker's session and
        # the provider's share the host 127.0.0.1): the broker, its local provider, back as a new globex member
        assert f"SSO         globex signs in through a local OpenID provider (http://127.0.0.1:{oidc_port}/o" in text
        _wait(lambda: http_ok(f"http://127.0.0.1:{oidc_port}/o/.well-known/openid-configuration"), 240, process, log,
              "the local OpenID provider")  # it migrates its SQLite file first
        browser = requests.Session()
        begun = browser.get(f"{site}/accounts/sso/start", params={"org": "globex"}, allow_redirects=False,
                            timeout=30)
        assert begun.status_code == 302, begun.text[:500]
        provider = Provider(process=None, base=f"http://127.0.0.1:{oidc_port}", client_secret="")
        callback = provider_sign_in(provider, begun.headers["Location"], "grace", credentials["users"],
                                    callback=f"{site}/accounts/sso/callback", browser=browser)
        back = browser.get(callback, allow_redirects=False, timeout=30)
        assert back.status_code == 302 and back.headers["Location"] == "/", back.text[:500]
        assert "grace@globex.example" in browser.get(f"{site}/", timeout=30).text
        assert (root / "acme" / "vision" / "train.py").exists()

        script_env = {**env, "BASE_URL": site, "WORKLOAD_ROOT": str(root), "PYTHON": sys.executable,
                      "RUNTIME_ENV_FILE": str(var / "runtime.env")}
        walk = subprocess.run(["sh", str(ROOT / "docs" / "walkthrough-workload.sh")], cwd=tmp_path, env=script_env,
                              capture_output=True, text=True, timeout=300)
        assert walk.returncode == 0, f"{walk.stdout}\n{walk.stderr}\n{_log(log)[-4000:]}"
        assert "training finished" in walk.stdout

        # a workload that tries the broker's own database on this machine (password-less PostgreSQL on
        # loopback: Node.secret is in there), then would run for ten minutes; Ctrl-C must end it
        token = subprocess.run([sys.executable, "manage.py", "tenant_bootstrap", "--tenant", "acme", "--user",
                                "adam"], cwd=ROOT, env=script_env, capture_output=True, text=True,
                               timeout=120).stdout.strip()
        probe = ("import socket, time\n"
                 "try:\n"
                 f"    socket.create_connection(('127.0.0.1', {parts.port or 5432}), timeout=5).close()\n"
                 "    print('database reachable', flush=True)\n"
                 "except OSError as error:\n"
                 "    print('database refused', error.errno, flush=True)\n"
                 "print('up', flush=True)\n"
                 "time.sleep(600)\n")
        # the rest of the first hour (docs/walkthrough-first-hour.sh): the CLI, a signed webhook, a workload's port
        # through the interactive proxy, SSH beside it, auto-tiering — every address from the service's answers
        assert f"interactive http://127.0.0.1:{interactive_port}/leases/<id>/port/" in text
        assert f"ssh         ssh -p {ssh_port} lease-<id>@127.0.0.1" in text
        (tmp_path / "first-hour").mkdir()
        first_hour = subprocess.run(["sh", str(ROOT / "docs" / "walkthrough-first-hour.sh")], cwd=tmp_path,
                                    env={**script_env, "WORK": str(tmp_path / "first-hour"), "SSH_AUTH_SOCK": ""},
                                    capture_output=True, text=True, timeout=900)
        (var / "first-hour.log").write_text(first_hour.stdout + first_hour.stderr)  # kept for a look afterwards
        assert first_hour.returncode == 0, f"{first_hour.stdout}\n{first_hour.stderr}\n{_log(log)[-4000:]}"
        for said in ("hello from the lease", "with CUDA_VISIBLE_DEVICES=", "each signature verified",
                     'auto-tiering of workload'):
            assert said in first_hour.stdout, (said, first_hour.stdout[-3000:])

        status, lease = _call(site, token, "POST", "/leases", {
            "project": "vision", "gpu": {"kind": "whole", "model": "A100-80GB"},
            "workload": {"command": [sys.executable, "-c", probe], "workdir": str(root / "acme" / "vision")}})
        assert status == 201, lease
        _wait(lambda: _call(site, token, "GET", f"/leases/{lease['id']}")[1].get("workload", {}).get("state")
              == "running", 90, process, log, "the workload to run")
        output = _wait(lambda: (data := _call(site, token, "GET", f"/leases/{lease['id']}/logs")[1].get("data", ""))
                       and "up" in data and data, 60, process, log, "the workload's first lines")
        if os.geteuid() == 0:  # make run isolates workloads and closes the machine's services to them (as root)
            assert "database refused" in output, output

        def run_pids() -> list[int]:
            pids = []
            for state in (var / "fleet").glob("*/workloads.json"):
                for workload in json.loads(state.read_text())["workloads"].values():
                    run = workload["runs"][-1] if workload["runs"] else None
                    if run and run.get("pid") and run.get("ended_at") is None:
                        pids.append(run["pid"])
            return pids

        pids = _wait(run_pids, 30, process, log, "the run's pid in the node's state")
        assert all(process_start_ticks(pid) for pid in pids)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=90) == 0, _log(log)[-4000:]
        assert "lease workload(s) the simulated nodes were running" in _log(log)
        left = [pid for pid in pids if (ticks := process_start_ticks(pid)) and ticks[1] != "Z"]
        assert not left, f"lease workloads still running after Ctrl-C: {left}"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
        for pid in children.values():  # only what this launcher started
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
