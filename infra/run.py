"""``make run``: the whole service on one machine, with what it needs started or reused.

Finds or starts PostgreSQL and the Celery broker (``infra/services.py``), migrates, seeds the demo,
then starts the web server (gunicorn), a Celery worker, Celery beat, a fleet of simulated GPU nodes
(``agent.fleet``) and, where it is installed, Prometheus scraping them, as child processes. Prints
what it started and where. Ctrl-C (or SIGTERM) stops exactly those children, then the services it
started itself, by their PIDs, and nothing else.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from infra import services
from infra.services import ROOT, VAR, say

BIN = Path(sys.executable).parent


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds; ignores TIME_WAIT
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _manage(*args: str) -> None:
    subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], check=True, cwd=ROOT)


def _wait_http(url: str, timeout: float) -> bool:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback URL we built
                if response.status == 200:
                    return True
        except OSError:
            time.sleep(0.2)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--fleet-nodes", type=int, default=4, help="simulated GPU nodes (agent.fleet)")
    parser.add_argument("--fleet-port", type=int, default=9400)
    parser.add_argument("--prometheus-port", type=int, default=9090)
    args = parser.parse_args(argv)

    for port, what in ((args.port, "PORT"), (args.fleet_port, "--fleet-port"), (args.prometheus_port,
                                                                              "--prometheus-port")):
        if not _port_free(port):
            say(f"port {port} on 127.0.0.1 is in use; stop what holds it or choose another ({what})")
            return 2

    VAR.mkdir(exist_ok=True)
    started_services: list[services.Service] = []
    children: list[tuple[str, subprocess.Popen]] = []
    stopping = False

    def stop_all(*_):
        nonlocal stopping
        if stopping:
            return
        stopping = True
        say("stopping…")
        for _name, process in reversed(children):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for name, process in reversed(children):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                say(f"{name} (pid {process.pid}) did not stop in 15 s; killing it")
                process.kill()
                process.wait()
            say(f"stopped {name} (pid {process.pid})")
        for service in reversed(started_services):
            service.shutdown()

    signal.signal(signal.SIGINT, stop_all)
    signal.signal(signal.SIGTERM, stop_all)

    try:
        database = services.ensure_postgres()
        started_services.append(database)
        broker = services.ensure_broker(redis_db=0)
        started_services.append(broker)
        site = f"http://127.0.0.1:{args.port}"
        env_values = {
            "DATABASE_URL": database.url,
            "CELERY_BROKER_URL": broker.url,
            "CELERY_RESULT_BACKEND": services.result_backend_for(broker.url),
            "SECRET_KEY": services.secret_key(),
            "SITE_URL": site,
            "CSRF_TRUSTED_ORIGINS": f"{site},http://localhost:{args.port}",
            "PROMETHEUS_URL": f"http://127.0.0.1:{args.prometheus_port}",
        }
        # What the launcher chose, for manage.py commands run by hand while the service is up.
        runtime = VAR / "runtime.env"
        runtime.touch(mode=0o600)
        runtime.chmod(0o600)
        runtime.write_text("".join(f"{k}={v}\n" for k, v in env_values.items()))
        os.environ.update(env_values)
        os.environ.setdefault("LOG_FORMAT", "text")

        _manage("migrate", "--noinput", "-v", "0")
        _manage("collectstatic", "--noinput", "-v", "0")
        _manage("seed_demo")
        _manage("seed_prices")

        specs = [
            ("web", [str(BIN / "gunicorn"), "config.wsgi", "--bind", f"127.0.0.1:{args.port}", "--workers",
                     str(args.workers), "--graceful-timeout", "10", "--access-logfile", "-"]),
            ("worker", [str(BIN / "celery"), "-A", "config", "worker", "--loglevel", "INFO", "--concurrency", "2",
                        "--hostname", f"worker-{os.getpid()}@%h"]),
            ("beat", [str(BIN / "celery"), "-A", "config", "beat", "--loglevel", "INFO", "--schedule",
                      str(VAR / "celerybeat-schedule")]),
        ]
        # The demo fleet: simulated nodes (H100s in MIG mode, A100s whole, L4 shares) and, where Debian's
        # prometheus is installed, a Prometheus scraping them (infra/prometheus.yml).
        fleet_dir = VAR / "fleet"
        # One use per node, valid for 10 minutes, handed over in a 0600 file (argv is visible in ps).
        token = subprocess.run([str(BIN / "python"), "manage.py", "agent_token_create", "--uses",
                                str(args.fleet_nodes), "--ttl-seconds", "600"], cwd=ROOT, check=True,
                               capture_output=True, text=True).stdout.strip()
        fleet_dir.mkdir(parents=True, exist_ok=True)
        token_file = fleet_dir / "enrollment-token"
        token_file.unlink(missing_ok=True)
        with os.fdopen(os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
            handle.write(token)
        specs.append(("fleet", [str(BIN / "python"), "-m", "agent.fleet", "--nodes", str(args.fleet_nodes),
                                "--broker-url", site, "--enrollment-token-file", str(token_file),
                                "--listen", f"127.0.0.1:{args.fleet_port}", "--state-dir", str(fleet_dir),
                                "--shape", "h100-80gb:8:mig", "--shape", "a100-80gb:8:whole",
                                "--shape", "h100-80gb:4:mig,l4:4:shared"]))
        prometheus = shutil.which("prometheus")
        if prometheus:
            config = (ROOT / "infra" / "prometheus.yml").read_text()
            (VAR / "prometheus.yml").write_text(config.replace("__TARGETS__",
                                                               str(fleet_dir / "prometheus-targets.json")))
            specs.append(("prometheus", [prometheus, f"--config.file={VAR / 'prometheus.yml'}",
                                         f"--storage.tsdb.path={VAR / 'prometheus'}",
                                         f"--web.listen-address=127.0.0.1:{args.prometheus_port}",
                                         "--log.level=warn"]))
        for name, command in specs:
            # Own session: the terminal's Ctrl-C reaches only us, and we stop the children in order.
            process = subprocess.Popen(command, cwd=ROOT, start_new_session=True)
            children.append((name, process))

        if not _wait_http(f"{site}/healthz", timeout=30):
            say("the web server did not answer /healthz within 30 s")
            stop_all()
            return 1

        lines = [
            "",
            "GPU broker is running:",
            f"  portal      {site}/",
            f"  admin       {site}/admin/",
            f"  API docs    {site}/api/docs/",
            f"  health      {site}/healthz   readiness {site}/readyz",
            f"  PostgreSQL  {database.how} ({services.redact(database.url)})",
            f"  broker      {broker.how} ({services.redact(broker.url)})",
            f"  GPU nodes   {args.fleet_nodes} simulated at http://127.0.0.1:{args.fleet_port}/n/<node>/ "
            f"(secrets in {fleet_dir / 'fleet.json'})",
            (f"  Prometheus  http://127.0.0.1:{args.prometheus_port}/ scraping them" if prometheus
             else "  Prometheus  not installed (apt-get install prometheus) — metrics at the nodes' /metrics"),
            "  processes   " + ", ".join(f"{name} pid {p.pid}" for name, p in children),
            "Ctrl-C stops everything listed here (and the embedded servers it started), nothing else.",
            "",
        ]
        print("\n".join(lines), flush=True)

        while not stopping:
            for name, process in children:
                if process.poll() is not None and not stopping:
                    say(f"{name} exited with status {process.returncode}; stopping the rest")
                    stop_all()
                    return 1
            time.sleep(0.5)
        return 0
    except subprocess.CalledProcessError as exc:
        say(f"set-up step failed: {' '.join(map(str, exc.cmd))} (exit {exc.returncode})")
        stop_all()
        return 1
    except BaseException:
        stop_all()
        raise


if __name__ == "__main__":
    sys.exit(main())
