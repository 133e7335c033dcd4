"""``make run``: the whole service on one machine, with what it needs started or reused.

Finds or starts PostgreSQL and the Celery broker (``infra/services.py``), migrates, seeds the demo,
then starts the web server (gunicorn), the agents' ingress (a gunicorn of its own, ``config.agent_wsgi``, on
``--agents-port``, PORT + 1 by default: the nodes' heartbeats never share the tenant API's workers), a Celery
worker, Celery beat, a fleet of simulated GPU nodes (``agent.fleet``, calling the ingress) and, where it is
installed, Prometheus scraping them, as child processes, and
supervises them: a child that exits is restarted after a back-off (1 s, doubling up to 30 s; back to
1 s once it has stayed up for a minute), with one log line per restart naming the child, how it ended
and the delay. Their PIDs are in ``var/run.json``. Only Ctrl-C (or SIGTERM) stops everything: each
child by its own process group, then the services it started itself, by their PIDs, and nothing else.

``GPUBROKER_VAR_DIR`` moves ``var/`` (a second instance beside a developer's ``make run``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from core import processes
from core.processes import describe_exit, http_ok, signal_group
from infra import services
from infra.services import ROOT, VAR, say

__all__ = ["Supervisor", "agents_command", "describe_exit", "main", "next_delay", "web_command"]

BIN = Path(sys.executable).parent

RESTART_FIRST_DELAY_SECONDS = 1.0
RESTART_MAX_DELAY_SECONDS = 30.0
STABLE_AFTER_SECONDS = 60.0  # a child up this long is healthy again: its next restart waits the first delay
STOP_TIMEOUT_SECONDS = 15.0



DEMO_WORKLOAD_UIDS = "300000-365535"


def closed_local_flags(web_port: int) -> list[str]:
    """As root (workloads isolated under their tenants' uids) with iptables: the demo's PostgreSQL, Redis,
    agents and everything else this machine serves are closed to lease workloads, but for the broker's web
    port (profiling runs post their samples there). docs/security.md, "Workload isolation"."""
    if os.geteuid() != 0 or shutil.which("iptables") is None:
        return []
    # the demo's own uid range: its firewall chain matches the demo's workloads only, not those of an agent
    # started beside it with the default range (the test suite's)
    return ["--workload-uids", DEMO_WORKLOAD_UIDS, "--workload-network", "closed-local",
            "--workload-local-port", str(web_port)]

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


def _http_ok(url: str) -> bool:
    return http_ok(url, timeout=2)


DOCUMENTED_WORKLOAD_ROOT = "/srv/gpubroker"  # the root of the docs' workload examples (docs/leasing.md)


def workload_root(var: Path) -> tuple[Path, str]:
    """The one root the demo's nodes and the broker agree on for workload paths (``<root>/<tenant>/<project>``):
    the first of ``WORKLOAD_ALLOWED_ROOTS`` (by default the documented /srv/gpubroker, so the docs' examples run
    as written), created if missing; where this user cannot write there, ``var/workloads`` instead, and a note
    saying so for the banner."""
    wanted = Path((os.environ.get("WORKLOAD_ALLOWED_ROOTS") or DOCUMENTED_WORKLOAD_ROOT).split(",")[0].strip())
    try:
        wanted.mkdir(parents=True, exist_ok=True)
        if os.access(wanted, os.W_OK | os.X_OK):
            documented = str(wanted) == DOCUMENTED_WORKLOAD_ROOT
            return wanted, "as in the docs' examples" if documented else "WORKLOAD_ALLOWED_ROOTS"
    except OSError:
        pass
    fallback = var / "workloads"
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback, f"{wanted} is not writable for this user: write {fallback} where the docs say {wanted}"


def fleet_workloads_stop(fleet_dir: Path, *, grace_seconds: float = 5.0) -> int:
    """After the fleet stopped: end the lease workloads its nodes left running (each run is the leader of its own
    session, so stopping the fleet's process group does not reach it; a node agent that restarts adopts its runs,
    which is what a supervisor's restart wants, but Ctrl-C means everything). A run is signalled only while its
    pid still has the start time the node recorded (a reused pid is someone else's): SIGTERM to its group, then
    SIGKILL to what is left after ``grace_seconds``. Returns the number of runs stopped."""
    from agent.workloads import STATE_FILE, process_start_ticks

    def ours(run: dict) -> bool:
        ticks = process_start_ticks(run["pid"])
        return ticks is not None and ticks[0] == run.get("start_ticks") and ticks[1] != "Z"

    runs = []
    for state_file in sorted(fleet_dir.glob(f"*/{STATE_FILE}")):
        try:
            workloads = json.loads(state_file.read_text())["workloads"].values()
        except (OSError, ValueError, KeyError):
            continue
        for workload in workloads:
            run = workload["runs"][-1] if workload.get("runs") else None
            if run and run.get("pid") and run.get("ended_at") is None and ours(run):
                runs.append(run)
    for run in runs:
        signal_group(run["pid"], signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while any(ours(run) for run in runs) and time.monotonic() < deadline:
        time.sleep(0.1)
    for run in runs:
        if ours(run):
            signal_group(run["pid"], signal.SIGKILL)
    return len(runs)


def demo_logins(path: Path) -> list[str]:
    """The demo's logins, printed last in the banner so they do not scroll away (``seed_demo`` keeps them in
    ``path``, mode 0600, which the banner names)."""
    from tenants.demo import DEMO

    try:
        credentials = json.loads(path.read_text())
    except (OSError, ValueError):
        return [f"Demo logins: see {path} (not readable now)"]
    lines = [f"Demo logins (kept in {path}):", f"  admin       admin / {credentials['admin']} (platform staff)"]
    for slug, spec in DEMO.items():
        people = ", ".join(f"{user} ({role})" for user, role in spec["members"].items())
        lines.append(f"  {slug:<11} {people}; password {credentials['users']}")
    return lines


def oidc_provider_files(var: Path, credentials_path: Path) -> Path:
    """The local OpenID provider's config (0600: the client secret and the demo users' password, kept off the
    command line) for the single sign-on demo (tenants.demo.SSO_DEMO)."""
    from tenants.demo import DEMO, SSO_DEMO

    credentials = json.loads(credentials_path.read_text())
    members = DEMO[SSO_DEMO["tenant"]]["members"]
    users = [f"{name}:{credentials['users']}:{name}@{SSO_DEMO['domain']}:{groups}"
             for name, groups in SSO_DEMO["users"].items() if name in members or groups]
    directory = var / "oidc-provider"
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "config.json"
    config.touch(mode=0o600)
    config.chmod(0o600)
    config.write_text(json.dumps({"client_secret": credentials["sso_client_secret"], "users": users}))
    return config


def oidc_provider_command(*, port: int, site: str, var: Path, config: Path) -> list[str]:
    """The local OpenID provider (infra/oidc_provider) as make run starts it: its issuer is
    http://127.0.0.1:<port>/o, its one client the broker's demo (redirect URI <site>/accounts/sso/callback)."""
    from tenants.demo import SSO_DEMO

    return [str(BIN / "python"), "-m", "infra.oidc_provider", "--port", str(port), "--data",
            str(var / "oidc-provider"), "--client-id", SSO_DEMO["client_id"], "--config", str(config),
            "--redirect-uri", f"{site}/accounts/sso/callback",
            "--redirect-uri", f"{site.replace('127.0.0.1', 'localhost')}/accounts/sso/callback"]


def web_command(*, port: int, workers: int = 2, threads: int = 4) -> list[str]:
    """gunicorn as make run starts it. Threads (gthread): a worker answers /healthz and pages while other
    threads check passwords (PBKDF2 releases the GIL); at most LOGIN_CONCURRENCY of them do at once."""
    return [str(BIN / "gunicorn"), "config.wsgi", "--config", "python:config.gunicorn", "--bind", f"127.0.0.1:{port}",
            "--workers", str(workers),
            "--worker-class", "gthread", "--threads", str(threads), "--graceful-timeout", "10",
            "--access-logfile", "-"]


def agents_command(*, port: int, workers: int = 1, threads: int = 4) -> list[str]:
    """The agents' ingress as make run starts it: gunicorn with ``config.agent_wsgi`` (heartbeats, workload reports
    and enrollments only; the usual heartbeat without Django's request cycle), apart from the tenant API's."""
    return [str(BIN / "gunicorn"), "config.agent_wsgi", "--config", "python:config.gunicorn", "--bind",
            f"127.0.0.1:{port}", "--workers", str(workers), "--worker-class", "gthread", "--threads", str(threads),
            "--graceful-timeout", "10"]


def next_delay(previous: float, uptime: float, *, first: float = RESTART_FIRST_DELAY_SECONDS,
               cap: float = RESTART_MAX_DELAY_SECONDS, stable_after: float = STABLE_AFTER_SECONDS) -> float:
    """Exponential back-off with a cap, reset when the child had stayed up ``stable_after`` seconds."""
    if previous <= 0 or uptime >= stable_after:
        return first
    return min(previous * 2, cap)


@dataclass
class Child:
    name: str
    command: list[str]
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    delay: float = 0.0  # the back-off used for the last restart; 0 until one was needed
    restart_at: float | None = None  # when an exited child is due to start again
    restarts: int = 0


class Supervisor:
    """Starts the children, restarts one that exits (back-off per child), stops them all by process group.

    Every child is the leader of its own session, so its PID is also its process group: signals reach
    the child and what it forked (gunicorn's and Celery's workers), and nothing else on the machine.
    """

    def __init__(self, pid_file: Path):
        self.children: list[Child] = []
        self.pid_file = pid_file

    def add(self, name: str, command: list[str]) -> Child:
        child = Child(name, command)
        self.children.append(child)
        self._start(child)
        return child

    def _start(self, child: Child) -> None:
        # Own session: the terminal's Ctrl-C reaches only us, and we stop the children in order.
        child.process = processes.start(child.command, cwd=ROOT)
        child.started_at = time.monotonic()
        child.restart_at = None
        self._write_pid_file()

    def _write_pid_file(self) -> None:
        body = {"launcher": os.getpid(),
                "children": {c.name: c.process.pid for c in self.children if c.process is not None}}
        tmp = self.pid_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(body, indent=1))
        tmp.replace(self.pid_file)

    def check(self) -> None:
        """Notice exited children and restart those whose back-off has passed. Called every half second."""
        now = time.monotonic()
        for child in self.children:
            process = child.process
            if child.restart_at is None and process is not None and process.poll() is not None:
                signal_group(process.pid, signal.SIGTERM)  # what it forked and left behind
                child.delay = next_delay(child.delay, now - child.started_at)
                child.restart_at = now + child.delay
                child.restarts += 1
                say(f"{child.name} (pid {process.pid}) exited with {describe_exit(process.returncode)}; "
                    f"restart #{child.restarts} in {child.delay:g} s")
            elif child.restart_at is not None and now >= child.restart_at:
                if process is not None:
                    signal_group(process.pid, signal.SIGKILL)  # leftovers that ignored SIGTERM
                self._start(child)
                say(f"restarted {child.name} (pid {child.process.pid})")

    def stop(self) -> None:
        running = [c for c in reversed(self.children) if c.process is not None]
        for child in running:
            signal_group(child.process.pid, signal.SIGTERM)
        for child in running:
            process = child.process
            try:
                process.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                say(f"{child.name} (pid {process.pid}) did not stop in {STOP_TIMEOUT_SECONDS:g} s; killing it")
                signal_group(process.pid, signal.SIGKILL)
                process.wait()
            signal_group(process.pid, signal.SIGKILL)  # anything of its group still there
            say(f"stopped {child.name} (pid {process.pid})")
        self.pid_file.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--threads", type=int, default=4,
                        help="threads per gunicorn worker (health probes are answered while others hash passwords)")
    parser.add_argument("--agents-port", type=int, default=None,
                        help="the agents' ingress (enrollment, heartbeats, workload reports); default PORT + 1")
    parser.add_argument("--interactive-port", type=int, default=None,
                        help="the interactive proxy (leases' workload ports, HTTP and WebSocket); default PORT + 2")
    parser.add_argument("--ssh-port", type=int, default=None,
                        help="the SSH gateway (a shell beside a lease's workload, with your SSH key); default PORT + 3")
    parser.add_argument("--fleet-nodes", type=int, default=4, help="simulated GPU nodes (agent.fleet)")
    parser.add_argument("--fleet-port", type=int, default=9400)
    parser.add_argument("--prometheus-port", type=int, default=9090)
    parser.add_argument("--oidc-port", type=int, default=9500,
                        help="the local OpenID provider of the single sign-on demo (infra/oidc_provider)")
    args = parser.parse_args(argv)
    if args.agents_port is None:
        args.agents_port = args.port + 1
    if args.interactive_port is None:
        args.interactive_port = args.port + 2
    if args.ssh_port is None:
        args.ssh_port = args.port + 3

    for port, what in ((args.port, "PORT"), (args.agents_port, "--agents-port"),
                       (args.interactive_port, "--interactive-port"), (args.ssh_port, "--ssh-port"),
                       (args.fleet_port, "--fleet-port"),
                       (args.prometheus_port, "--prometheus-port"), (args.oidc_port, "--oidc-port")):
        if not _port_free(port):
            say(f"port {port} on 127.0.0.1 is in use; stop what holds it or choose another ({what})")
            return 2

    VAR.mkdir(parents=True, exist_ok=True)
    started_services: list[services.Service] = []
    supervisor = Supervisor(VAR / "run.json")
    state = {"supervising": False, "stop_requested": False, "stopped": False}

    def stop_all() -> None:
        if state["stopped"]:
            return
        state["stopped"] = True
        say("stopping…")
        supervisor.stop()
        stopped = fleet_workloads_stop(VAR / "fleet")
        if stopped:
            say(f"stopped {stopped} lease workload(s) the simulated nodes were running")
        for service in reversed(started_services):
            service.shutdown()

    def on_signal(signum, _frame):
        state["stop_requested"] = True
        if not state["supervising"]:
            raise KeyboardInterrupt  # still setting up: abandon the step in progress, then stop

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    try:
        database = services.ensure_postgres()
        started_services.append(database)
        broker = services.ensure_broker(redis_db=0)
        started_services.append(broker)
        site = f"http://127.0.0.1:{args.port}"
        agents_site = f"http://127.0.0.1:{args.agents_port}"
        interactive_site = f"http://127.0.0.1:{args.interactive_port}"
        env_values = {
            "DATABASE_URL": database.url,
            "CELERY_BROKER_URL": broker.url,
            "CELERY_RESULT_BACKEND": services.result_backend_for(broker.url),
            "SECRET_KEY": services.secret_key(),
            "SITE_URL": site,
            "CSRF_TRUSTED_ORIGINS": f"{site},http://localhost:{args.port}",
            "PROMETHEUS_URL": f"http://127.0.0.1:{args.prometheus_port}",
            # leases' workload ports at /leases/<id>/port/ (broker/interactive_proxy.py), beside the web server
            "INTERACTIVE_PROXY_URL": interactive_site,
            "INTERACTIVE_PROXY_LISTEN": f"127.0.0.1:{args.interactive_port}",
            # a shell beside a lease's workload with the member's SSH key (broker/ssh_gateway.py)
            "SSH_GATEWAY_ADDRESS": f"127.0.0.1:{args.ssh_port}",
            "SSH_GATEWAY_LISTEN": f"127.0.0.1:{args.ssh_port}",
            "HTTPS": "0",  # served over plain HTTP on the loopback: cookies without Secure
            # the simulated nodes listen on 127.0.0.1
            "NODE_ADDRESS_NETWORKS": os.environ.get("NODE_ADDRESS_NETWORKS", services.LOCAL_NODE_ADDRESS_NETWORKS),
        }
        # the simulated nodes' workload root is the broker's too: a path the broker accepts, the nodes run
        root, root_note = workload_root(VAR)
        env_values["WORKLOAD_ALLOWED_ROOTS"] = str(root)
        # webhooks can be tried against a receiver on this machine (http://127.0.0.1:...); production, without
        # this, refuses loopback and plain-http targets (docs/notifications.md)
        env_values["WEBHOOK_ALLOW_LOOPBACK"] = os.environ.get("WEBHOOK_ALLOW_LOOPBACK", "1")
        # The broker's own metrics (docs/operations.md "Metrics"): a token for /metrics, shared with Prometheus
        # through a 0600 file, and one folder where every web and worker process writes its counters (emptied at
        # each start: prometheus_client's multi-process mode).
        metrics_token = VAR / "metrics-token"
        if not metrics_token.exists():
            import secrets

            metrics_token.touch(mode=0o600)
            metrics_token.write_text(secrets.token_urlsafe(32))
        metrics_dir = VAR / "metrics"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        env_values["METRICS_TOKEN"] = metrics_token.read_text().strip()
        env_values["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        # What the launcher chose, for manage.py commands run by hand while the service is up.
        runtime = VAR / "runtime.env"
        runtime.touch(mode=0o600)
        runtime.chmod(0o600)
        runtime.write_text("".join(f"{k}={v}\n" for k, v in env_values.items()))
        os.environ.update(env_values)
        # the children's "python" is the project's (a lease workload's `python train.py` on the demo's nodes:
        # docs/leasing.md), also when make run is started without the virtual environment activated
        os.environ["PATH"] = os.pathsep.join([str(BIN), os.environ.get("PATH", "")])
        os.environ["RUNTIME_ENV_FILE"] = str(runtime)
        os.environ["GPUBROKER_VAR_DIR"] = str(VAR)
        os.environ.setdefault("CELERY_SCHEDULER_QUEUE", "scheduler")
        os.environ.setdefault("CELERY_NOTIFICATIONS_QUEUE", "notifications")
        os.environ.setdefault("LOG_FORMAT", "text")

        _manage("migrate", "--noinput", "-v", "0")
        _manage("createcachetable")  # the login-throttle cache's table, where no Redis is used (a no-op else)
        _manage("collectstatic", "--noinput", "-v", "0")
        oidc_issuer = f"http://127.0.0.1:{args.oidc_port}/o"
        # and the demo projects' directories under the root; globex signs in through the local OpenID provider
        _manage("seed_demo", "--workload-root", str(root), "--sso-issuer", oidc_issuer)
        _manage("seed_prices")
        # auto-tiering answers from the first request: the reference profiles, and a model trained once on them
        # (else none until the 6-hourly retrain, and every kind: auto request is 409 profile_first)
        _manage("tiering_seed", "--background")  # training takes minutes: the worker does it once it starts

        specs = [
            ("web", web_command(port=args.port, workers=args.workers, threads=args.threads)),
            ("agents", agents_command(port=args.agents_port)),
            # a notebook's WebSocket or a slow answer of a workload holds no gunicorn thread: an aiohttp process
            ("interactive", [str(BIN / "python"), "manage.py", "interactive_proxy"]),
            ("ssh", [str(BIN / "python"), "manage.py", "ssh_gateway"]),
            ("worker", [str(BIN / "celery"), "-A", "config", "worker", "--loglevel", "INFO", "--concurrency", "2",
                        "--hostname", f"worker-{os.getpid()}@%h"]),
            # schedule cycles have a worker of their own: agent calls of seconds never hold a placement back
            ("scheduler", [str(BIN / "celery"), "-A", "config", "worker", "--loglevel", "INFO", "--concurrency", "1",
                           "--queues", os.environ["CELERY_SCHEDULER_QUEUE"], "--hostname",
                           f"scheduler-{os.getpid()}@%h"]),
            # webhook and e-mail deliveries have a worker of their own: a slow receiver (up to its deadline,
            # WEBHOOK_TIMEOUT_SECONDS) never holds back provisioning or releases, nor they a delivery
            ("notifications", [str(BIN / "celery"), "-A", "config", "worker", "--loglevel", "INFO", "--concurrency",
                               "2", "--queues", os.environ["CELERY_NOTIFICATIONS_QUEUE"], "--hostname",
                               f"notifications-{os.getpid()}@%h"]),
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
                                "--broker-url", agents_site, "--enrollment-token-file", str(token_file),
                                "--listen", f"127.0.0.1:{args.fleet_port}", "--state-dir", str(fleet_dir),
                                "--workload-root", str(root), *closed_local_flags(args.port),
                                "--shape", "h100-80gb:8:mig", "--shape", "a100-80gb:8:whole",
                                "--shape", "h100-80gb:4:mig,l4:4:shared"]))
        prometheus = shutil.which("prometheus")
        if prometheus:
            from infra.prometheus_config import render

            # the broker's own /metrics too (its token in a 0600 file) and the alerting rules (infra/alerts/)
            (VAR / "prometheus.yml").write_text(render(targets_file=fleet_dir / "prometheus-targets.json",
                                                       broker=f"127.0.0.1:{args.port}", token_file=metrics_token))
            specs.append(("prometheus", [prometheus, f"--config.file={VAR / 'prometheus.yml'}",
                                         f"--storage.tsdb.path={VAR / 'prometheus'}",
                                         f"--web.listen-address=127.0.0.1:{args.prometheus_port}",
                                         "--log.level=warn"]))
        specs.append(("oidc", oidc_provider_command(
            port=args.oidc_port, site=site, var=VAR,
            config=oidc_provider_files(VAR, VAR / "demo-credentials.json"))))
        for name, command in specs:
            supervisor.add(name, command)
        state["supervising"] = True

        deadline = time.monotonic() + 30
        while not (_http_ok(f"{site}/healthz") and _http_ok(f"{agents_site}/healthz")):
            if state["stop_requested"]:
                stop_all()
                return 0
            if time.monotonic() > deadline:
                say("the web server or the agents' ingress did not answer /healthz within 30 s")
                stop_all()
                return 1
            supervisor.check()
            time.sleep(0.2)

        lines = [
            "",
            "GPU broker is running:",
            f"  portal      {site}/",
            f"  admin       {site}/admin/",
            f"  API docs    {site}/api/docs/",
            f"  health      {site}/healthz   readiness {site}/readyz",
            f"  agents      {agents_site}/api/v1/agents/ (the nodes' ingress: enrollment, heartbeats)",
            f"  interactive {interactive_site}/leases/<id>/port/ (a lease's workload port, HTTP and WebSocket: "
            "your token or portal session)",
            f"  ssh         ssh -p {args.ssh_port} lease-<id>@127.0.0.1 (a shell beside a lease's workload, with a key "
            "added at Settings → SSH keys)",
            f"  PostgreSQL  {database.how} ({services.redact(database.url)})",
            f"  broker      {broker.how} ({services.redact(broker.url)})",
            f"  GPU nodes   {args.fleet_nodes} simulated at http://127.0.0.1:{args.fleet_port}/n/<node>/ "
            f"(secrets in {fleet_dir / 'fleet.json'}); their metrics at "
            f"http://127.0.0.1:{args.fleet_port}/n/<node>/metrics",
            f"  workloads   paths under {root}/<tenant>/<project> on every node ({root_note})",
            f"  metrics     {site}/metrics (Authorization: Bearer $(cat {metrics_token}))",
            (f"  Prometheus  http://127.0.0.1:{args.prometheus_port}/ scraping them and the broker, with the alerts of "
             "infra/alerts/" if prometheus
             else "  Prometheus  not installed (apt-get install prometheus) — metrics at the nodes' /metrics"),
            f"  SSO         globex signs in through a local OpenID provider ({oidc_issuer}, infra/oidc_provider): "
            f"{site}/accounts/login/?org=globex → \"Sign in with Local OpenID provider\" as carol, dan or grace "
            "(new: a member just in time, admin by her group) with the demo users' password; a real provider: "
            "README \"Single sign-on\"",
            "  2FA         staff (admin) set up an authenticator app at the first sign-in (any TOTP app)",
            "  webhooks    " + ("http:// and loopback targets allowed (WEBHOOK_ALLOW_LOOPBACK=1, for trying them "
                                 "here; production refuses them)" if env_values["WEBHOOK_ALLOW_LOOPBACK"] in
                                 ("1", "true", "True", "yes", "on") else "loopback targets refused"),
            "  processes   " + ", ".join(f"{c.name} pid {c.process.pid}" for c in supervisor.children)
            + f" (also in {supervisor.pid_file}); a child that exits is restarted",
            "Ctrl-C stops everything listed here, the lease workloads the nodes run and the embedded servers it "
            "started, nothing else.",
            "",
            *demo_logins(VAR / "demo-credentials.json"),
            "",
        ]
        print("\n".join(lines), flush=True)

        while not state["stop_requested"]:
            supervisor.check()
            time.sleep(0.5)
        stop_all()
        return 0
    except subprocess.CalledProcessError as exc:
        say(f"set-up step failed: {' '.join(map(str, exc.cmd))} (exit {exc.returncode})")
        stop_all()
        return 1
    except KeyboardInterrupt:
        stop_all()
        return 130
    except BaseException:
        stop_all()
        raise


if __name__ == "__main__":
    sys.exit(main())
