"""A scaled-out broker on this machine, as the deployment runs it (infra/docker/entrypoint.sh's roles):
``web`` gunicorn servers on ports of their own, Celery ``worker`` processes on distinct host names
(``worker@host1`` …), ``scheduler-worker`` processes (schedule cycles only, on ``CELERY_SCHEDULER_QUEUE``), and
``beat`` contenders under ``manage.py run_as_leader`` — all against one PostgreSQL database, one Celery broker
(Redis or RabbitMQ) and the shared cache — with a fleet of simulated nodes over HTTP.

Used by ``tests/deploy/test_scaleout.py`` (no double allocation, one cycle at a time, every lease ACTIVE) and
``bench/scaleout.py`` (leases/s with 1 worker and with 3 in one run). Every process is started here and stopped
here by its own PID. The database must be migrated and have the cache table (``createcachetable``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from core import processes
from core.processes import free_port
from infra import services

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CYCLE_LINE = re.compile(r"schedule cycle ran from (\d+\.\d+) to (\d+\.\d+)")
LEASE_BODY = {"project": "load", "gpu": {"kind": "mig", "profile": "1g.10gb"}, "duration_seconds": 3600}


@dataclass
class Cluster:
    """The processes of one scaled-out deployment. ``start()`` → ``submit()`` / ``wait_active()`` → ``stop()``."""

    database_url: str
    broker_url: str
    folder: Path
    web: int = 2
    workers: int = 3
    schedulers: int = 2
    beats: int = 2
    nodes: int = 100
    concurrency: int = 2  # children per worker process (the image's WORKER_CONCURRENCY)
    create_latency_seconds: float = 0.0  # each simulated MIG create answers this much later (agent.sim)
    environment: dict = field(default_factory=dict)  # extra settings for every process
    processes: dict = field(default_factory=dict)  # role -> [Popen]
    ports: list = field(default_factory=list)  # the web servers'
    api_token: str = ""

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.run_id = f"scaleout-{os.getpid()}-{time.monotonic_ns() % 10**8}"
        self.queue = self.run_id
        self.env = {
            **os.environ, "DATABASE_URL": self.database_url, "CELERY_BROKER_URL": self.broker_url,
            "CELERY_RESULT_BACKEND": services.result_backend_for(self.broker_url),
            "CELERY_TASK_DEFAULT_QUEUE": self.queue, "CELERY_SCHEDULER_QUEUE": f"{self.queue}-cycles",
            "CACHE_KEY_PREFIX": self.run_id, "SECRET_KEY": os.environ.get("SECRET_KEY", "scale-out-test"),
            "RUNTIME_ENV_FILE": os.devnull, "ALLOWED_HOSTS": "127.0.0.1", "DJANGO_SETTINGS_MODULE": "config.settings",
            "LOG_LEVEL": "WARNING", "LOG_FORMAT": "text", "HTTPS": "0", "DJANGO_DEBUG": "0",
            "GPUBROKER_VAR_DIR": str(self.folder / "var"), "OTEL_SDK_DISABLED": "true",
            "NODE_ADDRESS_NETWORKS": services.LOCAL_NODE_ADDRESS_NETWORKS, **self.environment,
        }
        self.env.pop("CACHE_URL", None)  # the deployment's default: the broker's Redis, else PostgreSQL's table
        self.env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        self.env.pop("METRICS_PORT", None)

    # -- processes -------------------------------------------------------------------------------------------
    def _spawn(self, role: str, name: str, argv: list[str], **extra_env: str) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        process = processes.start(argv, cwd=ROOT, env={**self.env, **extra_env}, stdout=log, stderr=subprocess.STDOUT)
        process.log = log
        process.name = name
        self.processes.setdefault(role, []).append(process)
        return process

    def log(self, name: str) -> str:
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _manage(self, *args: str) -> str:
        done = subprocess.run([str(BIN / "python"), "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True,
                              text=True, timeout=300)
        if done.returncode:
            raise RuntimeError(f"manage.py {args[0]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
        return done.stdout

    def setup(self) -> str:
        """A tenant with a member's API token and a quota for the whole fleet; returns an enrollment token. (And
        the cache table, which the shared cache is when the broker is not Redis.)"""
        self._manage("createcachetable")
        script = (
            "from tests.factories import make_tenant, make_member, make_project, make_quota, make_token;"
            "from broker import services;"
            f"t = make_tenant('scale-{self.run_id[-6:]}'); u = make_member(t, 'loader-{self.run_id[-6:]}', 'member');"
            "p = make_project(t, 'load');"
            f"make_quota(p, 'H100-80GB', deserved={self.nodes * 8000}, limit={self.nodes * 8000});"
            f"print(make_token(t, u)[1]); print(services.enrollment_token_create(uses={self.nodes}))")
        output = self._manage("shell", "-c", script).split()
        self.api_token = output[-2]
        return output[-1]

    def start_web(self) -> None:
        for number in range(1, self.web + 1):
            port = free_port()
            self.ports.append(port)
            self._spawn("web", f"web{number}", [
                str(BIN / "gunicorn"), "config.wsgi", "--config", "python:config.gunicorn", "--bind",
                f"127.0.0.1:{port}", "--workers", "1", "--worker-class", "gthread", "--threads", "4",
                "--timeout", "120", "--graceful-timeout", "5", "--log-level", "warning"])

    def start_workers(self, count: int, *, first: int = 1) -> None:
        """``count`` Celery worker processes (the image's ``worker`` role), host names ``worker@hostN``."""
        for number in range(first, first + count):
            self._spawn("worker", f"worker{number}", [
                str(BIN / "celery"), "-A", "config", "worker", "--loglevel", "INFO", "--concurrency",
                str(self.concurrency), "--queues", self.queue, "--hostname", f"worker@host{number}"])

    def start_schedulers(self) -> None:
        """The ``scheduler-worker`` role: one child each, schedule cycles only; they log each cycle (INFO)."""
        for number in range(1, self.schedulers + 1):
            self._spawn("scheduler", f"scheduler{number}", [
                str(BIN / "celery"), "-A", "config", "worker", "--loglevel", "INFO", "--concurrency", "1",
                "--queues", f"{self.queue}-cycles", "--hostname", f"scheduler@schedhost{number}"], LOG_LEVEL="INFO")

    def start_beats(self) -> None:
        """The ``beat`` role: each contender runs beat only while it holds the leader lock."""
        for number in range(1, self.beats + 1):
            self._spawn("beat", f"beat{number}", [
                str(BIN / "python"), "manage.py", "run_as_leader", "--lock", self.run_id, "--retry-seconds", "1",
                "--check-seconds", "2", "--", str(BIN / "celery"), "-A", "config", "beat", "--loglevel", "WARNING",
                "--schedule", str(self.folder / f"beat{number}-schedule")], PYTHONUNBUFFERED="1")

    def start_fleet(self, enrollment_token: str, *, per_fleet: int = 25) -> None:
        """The simulated nodes: fleet processes of ``per_fleet`` nodes, their nodes enrolling and heartbeating with
        the web servers in turn; each fleet starts once the one before has enrolled (a burst of enrollments on a
        loaded machine outlasts the agents' patience: see ``--broker-timeout``)."""
        self.fleet_ports = []
        for number in range(1, -(-self.nodes // per_fleet) + 1):
            port = free_port()
            count = min(per_fleet, self.nodes - per_fleet * (number - 1))
            self.fleet_ports.append((port, count))
            self._spawn("fleet", f"fleet{number}", [
                str(BIN / "python"), "-m", "agent.fleet", "--nodes", str(count), "--listen", f"127.0.0.1:{port}",
                "--state-dir", str(self.folder / f"fleet{number}"), "--shape", "h100-80gb:8:mig",
                "--prefix", f"n{self.run_id[-6:]}-{number}", "--broker-url", self.url(number - 1),
                "--broker-timeout", "120", "--log-level", "ERROR",
                "--create-latency", str(self.create_latency_seconds)], GPUB_ENROLLMENT_TOKEN=enrollment_token)
            self._wait(f"fleet {number}", self.enrolled, 300)

    def enrolled(self) -> bool:
        return all((self._answers(f"http://127.0.0.1:{port}/healthz") or {}).get("enrolled") == count
                   for port, count in self.fleet_ports)

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.ports[index % len(self.ports)]}"

    def _wait(self, what: str, ready, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for role_processes in self.processes.values():
                for process in role_processes:
                    if process.poll() is not None:
                        raise RuntimeError(f"{process.name} exited ({process.returncode}) while waiting for {what}:\n"
                                           f"{self.log(process.name)[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not ready in {timeout:.0f} s (logs in {self.folder})")
            time.sleep(0.3)

    @staticmethod
    def _answers(url: str) -> dict | None:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return json.loads(response.read() or b"{}")
        except (OSError, ValueError):
            return None

    def start(self, *, workers: int | None = None) -> None:
        """Everything, in the order a deployment comes up (web, the nodes enroll, then the Celery processes);
        returns once every node has enrolled and every worker is ready."""
        enrollment = self.setup()
        self.start_web()
        self._wait("web servers", lambda: all(self._answers(self.url(i) + "/healthz") is not None
                                              for i in range(self.web)), 180)
        self.start_fleet(enrollment)
        self.start_workers(self.workers if workers is None else workers)
        self.start_schedulers()
        self.start_beats()
        self._wait("Celery workers", self.workers_ready, 180)

    def workers_ready(self) -> bool:
        """Each worker and scheduler worker has said "ready" (Celery's own line, at WARNING or INFO)."""
        names = [p.name for role in ("worker", "scheduler") for p in self.processes.get(role, [])]
        return all("ready." in self.log(name) for name in names)

    def stop(self) -> None:
        roles = ("fleet", "beat", "scheduler", "worker", "web")
        everything = [p for role in roles for p in self.processes.get(role, [])]
        for process in everything:
            if process.poll() is None:
                processes.signal_group(process.pid, signal.SIGTERM)  # each role in its own group: it and its children
        for process in everything:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                processes.signal_group(process.pid, signal.SIGKILL)
                process.wait(10)
            process.log.close()
        self._queues_delete()

    def _queues_delete(self) -> None:
        from kombu import Connection

        try:
            with Connection(self.broker_url, connect_timeout=3) as connection:
                for queue in (self.queue, f"{self.queue}-cycles"):
                    connection.default_channel.queue_delete(queue)
        except Exception as error:
            print(f"queues of {self.run_id} not deleted: {error}", file=sys.stderr)

    # -- load ------------------------------------------------------------------------------------------------
    def submit(self, leases: int, *, clients: int = 8, key: str = "a") -> float:
        """POST ``leases`` lease requests from ``clients`` concurrent keep-alive connections, spread over the web
        servers; returns the seconds it took. Every answer must be 201 (or 200 for a resent request)."""
        from bench.leasing import Client

        connections = [Client(self.ports[n % len(self.ports)], self.api_token) for n in range(clients)]
        body = json.dumps(LEASE_BODY).encode()
        failures: list = []

        def send(number: int) -> None:
            try:
                for index in range(number, leases, clients):
                    status, answer = connections[number].call("POST", "/api/v1/leases", body,
                                                              {"Idempotency-Key": f"{self.run_id}-{key}-{index}"})
                    if status not in (200, 201):
                        failures.append((status, answer[:300]))
            except Exception as error:
                failures.append(repr(error))

        started = time.monotonic()
        threads = [threading.Thread(target=send, args=(n,)) for n in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise AssertionError(f"{len(failures)} requests failed, e.g. {failures[:3]}")
        return time.monotonic() - started

    def sql(self, query: str, params: tuple = ()) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.database_url, autocommit=True) as connection:
            return connection.execute(query, params).fetchall()

    def wait_active(self, count: int, timeout: float = 600) -> None:
        """Until ``count`` leases are ACTIVE (or ``timeout``: the states so far in the error)."""
        deadline = time.monotonic() + timeout
        while True:
            active = self.sql("SELECT count(*) FROM broker_lease WHERE state = 'active'")[0][0]
            if active >= count:
                return
            if time.monotonic() > deadline:
                states = self.sql("SELECT state, count(*) FROM broker_lease GROUP BY state")
                raise TimeoutError(f"{active}/{count} leases ACTIVE after {timeout:.0f} s: {states} "
                                   f"(logs in {self.folder})")
            time.sleep(0.3)

    # -- what happened ---------------------------------------------------------------------------------------
    def cycles(self) -> list[tuple[float, float, str]]:
        """(start, end, scheduler) of every cycle that ran, from the scheduler workers' logs."""
        found = []
        for process in self.processes.get("scheduler", []):
            for match in CYCLE_LINE.finditer(self.log(process.name)):
                found.append((float(match.group(1)), float(match.group(2)), process.name))
        return sorted(found)

    def leaders(self) -> dict[str, str]:
        """Each beat contender's word: "leading" or "standby"."""
        said = {}
        for process in self.processes.get("beat", []):
            text = self.log(process.name)
            said[process.name] = "leading" if "leading" in text else "standby" if "standby" in text else "?"
        return said

    def agent_instances(self) -> list[str]:
        """Every instance the simulated nodes hold (allocation ids), asked over HTTP with each node's secret."""
        from agent.protocol import AgentClient

        nodes = [node for number in range(len(self.fleet_ports))
                 for node in json.loads((self.folder / f"fleet{number + 1}" / "fleet.json").read_text())["nodes"]]
        held = []
        for node in nodes:
            client = AgentClient(node["url"], node["node_id"], node["secret"], timeout=10)
            held += [item["allocation_id"] for item in client.inventory()["instances"]]
        return held

    def lease_rate(self, since_lease_id: int = 0) -> tuple[int, float]:
        """(leases, leases/s from the first REQUESTED to the last ACTIVE event) of leases with id > ``since``."""
        rows = self.sql(
            "SELECT count(DISTINCT lease_id), extract(epoch FROM max(at) FILTER (WHERE to_state = 'active') "
            "- min(at) FILTER (WHERE to_state = 'requested')) FROM broker_leaseevent WHERE lease_id > %s",
            (since_lease_id,))
        count, span = rows[0]
        return count, count / float(span) if span else 0.0
