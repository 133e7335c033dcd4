"""Leases per second from request to ACTIVE, their latency, and the CPU each part of the path spends on one.

    .venv/bin/python bench/leasing.py --leases 300 --nodes 20

Starts the whole path on this machine: a PostgreSQL server of its own (embedded, data in ``var/bench-pg``;
``DATABASE_URL``'s server instead when that is set), the Celery broker as ``make run`` finds it, gunicorn
(the REST API, ``--web-workers`` processes x ``--threads``), ``--workers`` Celery worker processes (2
children each) and a fleet of ``--nodes`` simulated nodes (8 x H100 in MIG mode each) enrolled with the
broker. ``--clients`` threads POST ``--leases`` requests for 1g.10gb MIG slices over HTTP/1.1 keep-alive
connections, each with an Idempotency-Key (a request cut off by a closed connection is simply sent again).

Figures come from the lease events in the database: latency = ACTIVE event - REQUESTED event per lease;
throughput = leases / (last ACTIVE - first REQUESTED). CPU per lease: user + system seconds of each part
(process trees, children included) from the first request until every lease is ACTIVE, divided by the
leases. PostgreSQL is its whole private server, or on a shared server the backends of the bench database
only. Unlike the wall-clock figures this does not depend on what else runs on the machine, and it bounds
the throughput: all cores busy with nothing else gives at most cores / (CPU per lease).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.profile import report as profile_report  # noqa: E402
from bench.profile import start as profile_start  # noqa: E402
from bench.profile import stop as profile_stop  # noqa: E402
from bench.record import load, write  # noqa: E402  (at start: the tree is recorded as the run found it)
from core import processes  # noqa: E402
from core.processes import free_port  # noqa: E402
from infra import services  # noqa: E402

BIN = Path(sys.executable).parent
PGDATA = ROOT / "var" / "bench-pg"
DATABASE = (os.environ.get("DATABASE_URL", "").rstrip("/").rsplit("/", 1)[-1].split("?")[0] or "gpubroker") + "_bench"


class CpuMeter:
    """CPU seconds (user, system) used by named groups of processes between ``begin()`` and ``since()``.

    A group is a callable returning PIDs: a positive PID counts the whole process tree (its live members
    plus what their reaped children used, so processes that come and go inside the tree are counted); a
    negative PID counts that one process alone (the backends of a shared PostgreSQL server). ``poll()``
    (called while waiting) remembers processes that end before ``since()``."""

    def __init__(self) -> None:
        self.groups: dict[str, object] = {}
        self.start: dict[str, dict[int, tuple[float, float]]] = {}
        self.last: dict[str, dict[int, tuple[float, float]]] = {}

    def add(self, name: str, pids) -> None:
        self.groups[name] = pids

    @staticmethod
    def _seconds(pid: int) -> tuple[float, float] | None:
        try:
            root = psutil.Process(abs(pid))
            members = [root] if pid < 0 else [root, *root.children(recursive=True)]
        except psutil.Error:
            return None
        user = system = 0.0
        for process in members:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            user += times.user + (times.children_user if pid > 0 else 0.0)
            system += times.system + (times.children_system if pid > 0 else 0.0)
        return user, system

    def _sample(self) -> dict[str, dict[int, tuple[float, float]]]:
        found: dict[str, dict[int, tuple[float, float]]] = {}
        for name, pids in self.groups.items():
            found[name] = {}
            for pid in pids():
                seconds = self._seconds(pid)
                if seconds is not None:
                    found[name][pid] = seconds
        return found

    def begin(self) -> None:
        self.start = self._sample()
        self.last = {name: dict(values) for name, values in self.start.items()}

    def poll(self) -> None:
        for name, values in self._sample().items():
            self.last[name].update(values)

    def since(self) -> dict[str, tuple[float, float]]:
        """Per group: (user, system) seconds."""
        self.poll()
        used = {}
        for name, values in self.last.items():
            before = self.start[name]
            used[name] = (sum(user - before.get(pid, (0.0, 0.0))[0] for pid, (user, _) in values.items()),
                          sum(system - before.get(pid, (0.0, 0.0))[1] for pid, (_, system) in values.items()))
        return used


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _postgres(args) -> tuple[services.Service, bool]:
    """(the server, private?): a private embedded one unless DATABASE_URL is set; pg_stat_statements
    preloaded exactly when ``--statements`` asks for it (a restart of the private server when that changes)."""
    import psycopg

    private = not os.environ.get("DATABASE_URL", "").strip()
    database = services.ensure_postgres(pgdata=PGDATA) if private else services.ensure_postgres()
    with psycopg.connect(database.url, autocommit=True) as connection:
        loaded = "pg_stat_statements" in connection.execute("SHOW shared_preload_libraries").fetchone()[0]
        if private and loaded != bool(args.statements):
            if args.statements:
                connection.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
            else:
                connection.execute("ALTER SYSTEM RESET shared_preload_libraries")
    if private and loaded != bool(args.statements):
        services.embedded_restart(PGDATA)
    return database, private


def _meter(database: services.Service, private: bool, broker: services.Service, children: dict,
           url: str) -> CpuMeter:
    """The processes of the path: gunicorn, the Celery workers, the fleet, PostgreSQL, Redis, this client."""
    import psycopg
    import redis

    meter = CpuMeter()
    meter.add("API (gunicorn)", lambda: [children["api"].pid])
    if "agents" in children:
        meter.add("agents' ingress (gunicorn)", lambda: [children["agents"].pid])
    meter.add("Celery workers", lambda: [child.pid for child in children["workers"]])
    meter.add("agents (fleet)", lambda: [children["fleet"].pid])
    if "scale_fleet" in children:
        meter.add("scale-mode nodes", lambda: [children["scale_fleet"].pid])
        meter.add("Prometheus", lambda: [children["prometheus"].pid] if "prometheus" in children else [])
    watch = psycopg.connect(url, autocommit=True)
    own = watch.execute("SELECT pg_backend_pid()").fetchone()[0]
    if private:  # the postmaster's whole tree: backends, WAL writer, checkpointer, autovacuum
        postmaster = psutil.Process(own).ppid()
        meter.add("PostgreSQL (server)", lambda: [postmaster])
    else:
        meter.add("PostgreSQL (backends)", lambda: [-pid for (pid,) in watch.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> %s", [own])])
    try:
        redis_pid = redis.Redis.from_url(broker.url).info("server")["process_id"]
    except (redis.RedisError, KeyError):
        pass
    else:
        meter.add("Redis" if broker.how == "started" else "Redis (shared server)", lambda: [-redis_pid])
    meter.add("bench client", lambda: [-os.getpid()])
    return meter


def _print_cpu(used: dict[str, tuple[float, float]], busy: float, leases: int) -> None:
    total = sum(user + system for user, system in used.values())
    print(f"CPU per lease (ms, user + system, first request to last ACTIVE, {leases} leases):")
    for name, (user, system) in used.items():
        print(f"  {name:<26} {(user + system) * 1000 / leases:7.2f}  ({system * 1000 / leases:.2f} in the kernel)")
    cores = psutil.cpu_count()
    print(f"  {'all of the above':<26} {total * 1000 / leases:7.2f}  -> at most "
          f"{cores * leases / total:.0f} leases/s on {cores} cores doing nothing else")
    print(f"  machine busy: {busy:.1f} CPU s in that time, {total:.1f} of them this benchmark's")


def _statements_reset(url: str):
    import psycopg

    connection = psycopg.connect(url, autocommit=True)
    try:
        connection.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        connection.execute("SELECT pg_stat_statements_reset()")
    except psycopg.Error as error:
        print(f"no statement statistics: {error}".strip())
        return None
    return connection


def _print_statements(connection, limit: int, leases: int) -> None:
    mine = "dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
    calls, spent = connection.execute(
        f"SELECT sum(calls), sum(total_exec_time) FROM pg_stat_statements WHERE {mine}").fetchone()  # noqa: S608
    print(f"SQL: {calls / leases:.1f} statements, {spent / leases:.2f} ms executing per lease; costliest:")
    rows = connection.execute(f"SELECT calls, total_exec_time, query FROM pg_stat_statements WHERE {mine} "  # noqa: S608
                              "ORDER BY total_exec_time DESC LIMIT %s", [limit])
    for count, milliseconds, query in rows:
        print(f"  {count / leases:6.2f}/lease {milliseconds / leases:6.3f} ms  {' '.join(query.split())[:130]}")


def _queue_delete(url: str, queue: str) -> None:
    """The run's Celery queue (and its bindings) goes with it."""
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=3) as connection:
            connection.default_channel.queue_delete(queue)
    except Exception as error:  # noqa: BLE001 - tidying only
        print(f"queue {queue} not deleted: {error}", file=sys.stderr)


def _wait_http(url: str, process: subprocess.Popen, log: Path, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1):  # noqa: S310 - loopback
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer in {timeout} s")


class Client:
    """One keep-alive HTTP/1.1 connection, as a tenant's script with a session would hold."""

    def __init__(self, port: int, token: str):
        self.port = port
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> tuple:
        for attempt in range(2):
            try:
                self.connection.request(method, path, body=body, headers={**self.headers, **(headers or {})})
                response = self.connection.getresponse()
                return response.status, response.read()
            except (http.client.HTTPException, ConnectionError):
                # the server closed an idle connection: open another and send again (POSTs carry an
                # Idempotency-Key, so a request that did arrive is not made twice)
                self.connection.close()
                self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                if attempt:
                    raise
        raise AssertionError("unreachable")


def _paced(clients: list[Client], body: bytes, *, rate: float, count: int, first: int) -> tuple[list[float], float]:
    """``count`` lease requests at ``rate`` per second spread over the clients (open loop: a request is sent at
    its time, or at once when its client is late); (each request's latency in seconds, wall seconds)."""
    latencies: list[float] = []
    lock = threading.Lock()
    start = time.monotonic() + 0.05

    def run(number: int) -> None:
        mine = []
        for index in range(number, count, len(clients)):
            delay = start + index / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            sent = time.perf_counter()
            status, answer = clients[number].call("POST", "/api/v1/leases", body,
                                                  {"Idempotency-Key": f"bench-{first + index}"})
            mine.append(time.perf_counter() - sent)
            assert status in (200, 201), (status, answer[:500])
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, time.monotonic() - start


def _scale(args, *, clients, body, children, folder: Path, env: dict, site: str, enroll_token: str, meter) -> None:
    """Target 3 of issue 16: the API's latency while ``--rate`` leases/s flow, without and then with
    ``--scale-nodes`` more nodes heartbeating (every AGENT_HEARTBEAT_SECONDS) and scraped by Prometheus (every
    15 s); both phases in one run, so their ratio does not depend on what else the machine does."""
    from django.conf import settings
    from django.utils import timezone

    from agent.protocol import WINDOW
    from broker.models import AgentNonce, Lease, LeaseEvent, Node

    def phase(label: str, first: int) -> dict:
        before = Lease.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        cpu = meter()
        cpu.begin()
        began = timezone.now()
        latencies, wall = _paced(clients, body, rate=args.rate, count=args.leases, first=first)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            cpu.poll()
            if Lease.objects.filter(pk__gt=before, state="active").count() >= args.leases:
                break
            time.sleep(0.25)
        used = cpu.since()
        ended = timezone.now()
        # signed agent requests in the window (heartbeats, and the rare workload report): each claims one nonce,
        # kept until 2 x WINDOW after it arrived
        signed = AgentNonce.objects.filter(expires_at__gte=began + timezone.timedelta(seconds=2 * WINDOW),
                                           expires_at__lt=ended + timezone.timedelta(seconds=2 * WINDOW)).count()
        times: dict[int, dict[str, float]] = {}
        for lease_id, state, at in LeaseEvent.objects.filter(lease_id__gt=before, to_state__in=["requested", "active"]
                                                             ).values_list("lease_id", "to_state", "at"):
            times.setdefault(lease_id, {})[state] = at.timestamp()
        done = [t for t in times.values() if "active" in t]
        to_active = [t["active"] - t["requested"] for t in done]
        count = len(done) or 1
        figures = {
            "requests": args.leases, "active": len(done), "sent_per_second": round(args.leases / wall, 1),
            "api_p50_ms": round(statistics.median(latencies) * 1000, 1),
            "api_p99_ms": round(_pct(latencies, 0.99) * 1000, 1),
            "api_max_ms": round(max(latencies) * 1000, 1),
            "to_active_p50_s": round(statistics.median(to_active), 3),
            "to_active_p99_s": round(_pct(to_active, 0.99), 3),
            "cpu_ms_per_lease": {name: round((user + system) * 1000 / count, 2)
                                 for name, (user, system) in used.items()},
            "signed_agent_requests": signed,
            "signed_agent_requests_per_second": round(signed / (ended - began).total_seconds(), 1),
        }
        if "agents' ingress (gunicorn)" in used and signed:
            figures["ingress_cpu_ms_per_agent_request"] = round(sum(used["agents' ingress (gunicorn)"]) * 1000 / signed,
                                                                2)
        print(f"{label}: {args.leases} requests at {figures['sent_per_second']}/s; API latency p50 "
              f"{figures['api_p50_ms']} ms, p99 {figures['api_p99_ms']} ms, max {figures['api_max_ms']} ms; "
              f"request -> ACTIVE p50 {figures['to_active_p50_s']} s, p99 {figures['to_active_p99_s']} s")
        print("  CPU ms per lease: " + ", ".join(f"{name} {ms}" for name, ms in figures["cpu_ms_per_lease"].items()))
        print(f"  signed agent requests (heartbeats): {signed}, {figures['signed_agent_requests_per_second']}/s"
              + (f"; the agents' ingress: {figures['ingress_cpu_ms_per_agent_request']} CPU ms each"
                 if "ingress_cpu_ms_per_agent_request" in figures else ""))
        return figures

    alone = phase(f"without the {args.scale_nodes} nodes", 0)

    def harness() -> None:
        """--harness-nice: the 1,000 simulated nodes and Prometheus stand for other machines; niced, they take
        the broker's cores only when its processes leave them idle (their CPU is still counted)."""
        if args.harness_nice:
            os.nice(args.harness_nice)

    port = free_port()
    state = folder / "scale-fleet"
    children["scale_fleet"] = subprocess.Popen(
        [str(BIN / "python"), "-m", "agent.fleet", "--nodes", str(args.scale_nodes), "--prefix", "load",
         "--listen", f"127.0.0.1:{port}", "--state-dir", str(state), "--shape", "h100-80gb:8:mig",
         "--broker-url", site, "--log-level", "ERROR"], cwd=ROOT, env={**env, "GPUB_ENROLLMENT_TOKEN": enroll_token},
        stdout=open(folder / "scale-fleet.log", "w"), stderr=subprocess.STDOUT, preexec_fn=harness)  # noqa: SIM115
    _wait_http(f"http://127.0.0.1:{port}/healthz", children["scale_fleet"], folder / "scale-fleet.log", timeout=120)
    started = time.monotonic()
    while time.monotonic() - started < 300:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz") as response:
            if json.loads(response.read())["enrolled"] == args.scale_nodes:
                break
        time.sleep(1)
    print(f"{args.scale_nodes} more nodes enrolled in {time.monotonic() - started:.0f} s")
    binary = shutil.which("prometheus")
    prometheus_port = None
    if binary:
        prometheus_port = free_port()
        config = (ROOT / "infra" / "prometheus.yml").read_text().replace(
            "__TARGETS__", str(state / "prometheus-targets.json"))
        (folder / "prometheus.yml").write_text(config)
        children["prometheus"] = subprocess.Popen(
            [binary, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prometheus_port}"], preexec_fn=harness,
            stdout=open(folder / "prometheus.log", "w"), stderr=subprocess.STDOUT)  # noqa: SIM115
        _wait_http(f"http://127.0.0.1:{prometheus_port}/-/ready", children["prometheus"], folder / "prometheus.log")
    else:
        print("prometheus: not installed (apt-get install prometheus): the nodes heartbeat but nobody scrapes them")

    def targets_up() -> int:
        if prometheus_port is None:
            return 0
        query = urllib.parse.urlencode({"query": "count(up == 1)"})
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{prometheus_port}/api/v1/query?{query}") as response:
                result = json.loads(response.read())["data"]["result"]
        except OSError:
            return 0
        return int(float(result[0]["value"][1])) if result else 0

    # steady state: every node heartbeating and (with Prometheus) scraped at least once
    wait_until = time.monotonic() + max(30.0, settings.AGENT_HEARTBEAT_SECONDS * 2)
    while time.monotonic() < wait_until and (prometheus_port is not None and targets_up() < args.scale_nodes):
        time.sleep(1)
    loaded = phase(f"with the {args.scale_nodes} nodes heartbeating and scraped", args.leases)

    recent = timezone.now() - timezone.timedelta(seconds=settings.AGENT_HEARTBEAT_SECONDS * 2)
    beating = Node.objects.filter(node_id__startswith="load-", last_heartbeat_at__gte=recent).count()
    up = targets_up()
    ratio = loaded["api_p99_ms"] / alone["api_p99_ms"]
    print(f"nodes heartbeating (within {settings.AGENT_HEARTBEAT_SECONDS * 2} s): {beating}/{args.scale_nodes}; "
          f"Prometheus targets up: {up}/{args.scale_nodes}")
    print(f"API p99 with / without the nodes: {ratio:.2f}")
    write("leasing_scale", {
        "rate_per_second": args.rate, "seconds_per_phase": args.seconds, "base_nodes": args.nodes,
        "scale_nodes": args.scale_nodes, "heartbeat_seconds": settings.AGENT_HEARTBEAT_SECONDS,
        "scrape_interval_seconds": 15 if prometheus_port else None, "nodes_heartbeating": beating,
        "prometheus_targets_up": up, "agents_ingress": not args.agents_on_api,
        "without": alone, "with": loaded, "api_p99_ratio": round(ratio, 2),
    }, settings=vars(args), quick=args.quick)


def table(names: list[str]) -> str:
    """The docs' table (docs/leasing.md, "Benchmark") made from results files: one column per file."""
    runs = [load(name) for name in names]
    groups = list(dict.fromkeys(group for run in runs for group in run["figures"]["cpu_ms_per_lease"]))
    rows = [("results file", [f"`{run['name']}.json`" for run in runs]),
            ("commit", [f"{run['commit'][:7]}{' (dirty)' if run['dirty'] else ''}" for run in runs]),
            ("date (UTC)", [run["date"][:16].replace("T", " ") for run in runs]),
            ("leases, nodes", [f"{run['settings']['leases']}, {run['settings']['nodes']}" for run in runs]),
            ("leases/s, request → ACTIVE", [str(run["figures"]["leases_per_second"]) for run in runs]),
            ("latency p50 / p99 (s)", [f"{run['figures']['latency_p50_s']} / {run['figures']['latency_p99_s']}"
                                       for run in runs])]
    rows += [(f"CPU ms per lease: {group}", [str(run["figures"]["cpu_ms_per_lease"].get(group, "–")) for run in runs])
             for group in groups]
    rows += [("**CPU ms per lease, all**", [f"**{run['figures']['cpu_ms_per_lease_total']}**" for run in runs]),
             ("machine busy (CPU s, this benchmark's)", [
                 f"{run['figures']['machine_busy_cpu_seconds']} ({run['figures']['benchmark_cpu_seconds']})"
                 for run in runs])]
    lines = ["| | " + " | ".join(f"({number})" for number in range(1, len(runs) + 1)) + " |",
             "|---|" + "---|" * len(runs)]
    lines += [f"| {label} | " + " | ".join(values) + " |" for label, values in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--leases", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="300 leases on 20 nodes (under 2 minutes)")
    parser.add_argument("--profile", action="store_true",
                        help="also sample the CPU of every process and print the top costs of each (config.profiling;"
                             " it costs a few percent, so its run is recorded apart)")
    parser.add_argument("--clients", type=int, default=8, help="client threads, one connection each")
    parser.add_argument("--workers", type=int, default=2, help="Celery worker processes (2 children each)")
    parser.add_argument("--web-workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--threads", type=int, default=4, help="threads per gunicorn worker")
    parser.add_argument("--agent-workers", type=int, default=1,
                        help="worker processes of the agents' ingress (gunicorn config.agent_wsgi, --threads each)")
    parser.add_argument("--agents-on-api", action="store_true",
                        help="no agents' ingress: the agents call the API's gunicorn (the single-port set-up)")
    parser.add_argument("--scale-nodes", type=int, default=0, metavar="N",
                        help="the scale mode: leases paced at --rate for --seconds, first with the fleet alone, then "
                             "with N more simulated nodes enrolled, heartbeating and scraped by Prometheus; prints "
                             "the API's request latency of both phases and their ratio")
    parser.add_argument("--rate", type=float, default=100.0, help="scale mode: lease requests per second")
    parser.add_argument("--harness-nice", type=int, default=0, metavar="N",
                        help="scale mode: run the added simulated nodes and Prometheus at this nice level (they "
                             "stand for machines of their own; 0: as the broker's processes)")
    parser.add_argument("--seconds", type=float, default=20.0, help="scale mode: seconds per phase")
    parser.add_argument("--label", default="", help="added to the results file's name (e.g. before: a run of older "
                                                    "code, leasing_before.json)")
    parser.add_argument("--pause", type=float, default=0.0, metavar="SECONDS",
                        help="wait this long before submitting, with the PIDs printed (to attach a profiler)")
    parser.add_argument("--statements", type=int, default=0, metavar="N",
                        help="also print the N costliest SQL statements (pg_stat_statements; it costs a little)")
    parser.add_argument("--table", nargs="+", metavar="NAME",
                        help="print the docs' markdown table of these results files (bench/results/NAME.json) and stop")
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
        return
    if args.quick:
        args.leases, args.nodes, args.seconds = 300, 20, 8.0
    if args.scale_nodes:  # both phases' leases fit on the base fleet (56 1g slots per node), whatever phase B adds
        args.leases = int(args.rate * args.seconds)
        args.nodes = max(args.nodes, -(-2 * args.leases // 56) + 1)
    print(time.strftime("%Y-%m-%d %H:%M"), f"on {psutil.cpu_count()} cores;", vars(args))

    import psycopg

    database, private = _postgres(args)
    broker = services.ensure_broker(redis_db=3)
    url = services._with_database(database.url, DATABASE)
    with psycopg.connect(database.url, autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        connection.execute(f"CREATE DATABASE {DATABASE}")
    queue = f"bench-{os.getpid()}"
    port = free_port()
    env = {**os.environ, "DATABASE_URL": url, "CELERY_BROKER_URL": broker.url, "SECRET_KEY": "bench",
           "CELERY_TASK_DEFAULT_QUEUE": queue, "RUNTIME_ENV_FILE": "/dev/null", "LOG_LEVEL": "WARNING",
           "ALLOWED_HOSTS": "127.0.0.1", "DJANGO_SETTINGS_MODULE": "config.settings",
           "NODE_ADDRESS_NETWORKS": services.LOCAL_NODE_ADDRESS_NETWORKS}
    os.environ.update(env)
    manage = [str(BIN / "python"), "manage.py"]
    subprocess.run([*manage, "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    setup = ("from tests.factories import make_tenant, make_member, make_project, make_quota, make_token;"
             "from broker import services;"
             "t = make_tenant('bench'); u = make_member(t, 'bencher', 'member'); p = make_project(t, 'load');"
             f"make_quota(p, 'H100-80GB', deserved={args.nodes * 8 * 1000}, limit={args.nodes * 8 * 1000});"
             f"print(make_token(t, u)[1]);"
             f"print(services.enrollment_token_create(uses={args.nodes + args.scale_nodes}))")
    output = subprocess.run([*manage, "shell", "-c", setup], cwd=ROOT, env=env, check=True, capture_output=True,
                            text=True).stdout.split()
    api_token, enroll_token = output[-2], output[-1]
    folder = Path(tempfile.mkdtemp(prefix="bench-leasing-"))
    samples = folder / "profile"
    logs = {name: open(folder / f"{name}.log", "w") for name in ("api", "agents", "workers", "fleet")}  # noqa: SIM115
    children: dict = {"workers": []}
    finished = False
    try:
        children["api"] = processes.start(
            [str(BIN / "gunicorn"), "config.wsgi", "--bind", f"127.0.0.1:{port}", "--workers",
             str(args.web_workers), "--threads", str(args.threads), "--log-level", "warning"], cwd=ROOT, env=env,
            stdout=logs["api"], stderr=subprocess.STDOUT)
        for number in range(args.workers):
            children["workers"].append(processes.start(
                [str(BIN / "celery"), "-A", "config", "worker", "--concurrency", "2", "--queues", queue, "--hostname",
                 f"bench{number}@%h", "--loglevel", "WARNING", "--without-gossip", "--without-mingle",
                 "--without-heartbeat"], cwd=ROOT, env=env, stdout=logs["workers"], stderr=subprocess.STDOUT))
        site = f"http://127.0.0.1:{port}"
        _wait_http(site + "/healthz", children["api"], folder / "api.log")
        if not args.agents_on_api:  # as make run and the image run it: the agents' own gunicorn (config.agent_wsgi)
            agents_port = free_port()
            children["agents"] = processes.start(
                [str(BIN / "gunicorn"), "config.agent_wsgi", "--bind", f"127.0.0.1:{agents_port}", "--workers",
                 str(args.agent_workers), "--worker-class", "gthread", "--threads", str(args.threads),
                 "--log-level", "warning"], cwd=ROOT, env=env, stdout=logs["agents"], stderr=subprocess.STDOUT)
            site = f"http://127.0.0.1:{agents_port}"
            _wait_http(site + "/healthz", children["agents"], folder / "agents.log")
        fleet_port = free_port()
        children["fleet"] = processes.start(
            [str(BIN / "python"), "-m", "agent.fleet", "--nodes", str(args.nodes), "--listen",
             f"127.0.0.1:{fleet_port}", "--state-dir", str(folder / "fleet"), "--shape", "h100-80gb:8:mig",
             "--broker-url", site, "--log-level", "ERROR"], cwd=ROOT,
            env={**env, "GPUB_ENROLLMENT_TOKEN": enroll_token},
            stdout=logs["fleet"], stderr=subprocess.STDOUT)
        _wait_http(f"http://127.0.0.1:{fleet_port}/healthz", children["fleet"], folder / "fleet.log")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{fleet_port}/healthz") as response:
                if json.loads(response.read())["enrolled"] == args.nodes:
                    break
            time.sleep(0.5)
        print(f"{args.nodes} nodes ({args.nodes * 8} GPUs, {args.nodes * 56} 1g slots) enrolled")
        clients = [Client(port, api_token) for _ in range(args.clients)]
        for client in clients:  # every connection open, and the web worker behind it past its first request
            assert client.call("GET", "/api/v1/leases?limit=1")[0] == 200
        if args.pause:
            print(f"pids: api {children['api'].pid} workers {' '.join(str(c.pid) for c in children['workers'])} "
                  f"fleet {children['fleet'].pid}; submitting in {args.pause:.0f} s", flush=True)
            time.sleep(args.pause)

        body = json.dumps({"project": "load", "gpu": {"kind": "mig", "profile": "1g.10gb"},
                           "duration_seconds": 3600}).encode()

        def submit(number: int) -> None:
            for index in range(number, args.leases, args.clients):
                status, answer = clients[number].call("POST", "/api/v1/leases", body,
                                                      {"Idempotency-Key": f"bench-{index}"})
                assert status in (200, 201), (status, answer[:500])  # 200: a resent request's first answer

        import django

        django.setup()  # before the measured window: the client's own start-up is not the path's cost
        from broker.models import Lease, LeaseEvent

        if args.scale_nodes:
            _scale(args, clients=clients, body=body, children=children, folder=folder, env=env, site=site,
                   enroll_token=enroll_token, meter=lambda: _meter(database, private, broker, children, url))
            finished = True
            return

        meter = _meter(database, private, broker, children, url)
        statements = _statements_reset(url) if args.statements else None
        machine = psutil.cpu_times()
        recorders = profile_start({"api": [children["api"].pid], "celery": [c.pid for c in children["workers"]],
                                   "agents": [children["fleet"].pid], "client": [-os.getpid()]},
                                  samples) if args.profile else []
        meter.begin()
        started = time.monotonic()
        threads = [threading.Thread(target=submit, args=(n,)) for n in range(args.clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        submitted = time.monotonic() - started
        while time.monotonic() - started < 300:
            meter.poll()
            if Lease.objects.filter(state="active").count() >= args.leases:
                break
            time.sleep(0.2)
        used = meter.since()
        profile_stop(recorders)
        after = psutil.cpu_times()
        busy = (sum(after) - after.idle - getattr(after, "iowait", 0)) - (
            sum(machine) - machine.idle - getattr(machine, "iowait", 0))
        events = LeaseEvent.objects.filter(to_state__in=["requested", "active"]).values_list("lease_id", "to_state",
                                                                                            "at")
        times: dict[int, dict[str, float]] = {}
        for lease_id, state, at in events:
            times.setdefault(lease_id, {})[state] = at.timestamp()
        done = [t for t in times.values() if "active" in t]
        latencies = [t["active"] - t["requested"] for t in done]
        span = max(t["active"] for t in done) - min(t["requested"] for t in done)
        print(f"submitted {args.leases} requests in {submitted:.1f} s ({args.leases / submitted:.0f}/s over HTTP)")
        print(f"active: {len(done)}/{args.leases}; {len(done) / span:.1f} leases/s from request to ACTIVE; "
              f"latency p50 {statistics.median(latencies):.2f} s, p99 {_pct(latencies, 0.99):.2f} s, "
              f"max {max(latencies):.2f} s")
        _print_cpu(used, busy, len(done) or 1)
        if statements is not None:
            _print_statements(statements, args.statements, len(done) or 1)
        profile = None
        if args.profile:
            print("top CPU costs per process (py-spy samples, first request to last ACTIVE; --profile):")
            profile = profile_report(samples, len(done) or 1)
            kept = ROOT / "var" / "bench-profile"
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(samples, kept)
            print(f"folded stacks (flamegraph.pl, speedscope): {kept.relative_to(ROOT)}/<process>.folded")
        count = len(done) or 1
        figures = {
            "leases": args.leases, "active": len(done), "leases_per_second": round(len(done) / span, 1),
            "latency_p50_s": round(statistics.median(latencies), 3), "latency_p99_s": round(_pct(latencies, 0.99), 3),
            "latency_max_s": round(max(latencies), 3), "requests_per_second_http": round(args.leases / submitted, 1),
            "cpu_ms_per_lease": {name: round((user + system) * 1000 / count, 2)
                                 for name, (user, system) in used.items()},
            "cpu_ms_per_lease_total": round(sum(u + s for u, s in used.values()) * 1000 / count, 2),
            "machine_busy_cpu_seconds": round(busy, 1),
            "benchmark_cpu_seconds": round(sum(u + s for u, s in used.values()), 1),
        }
        if profile is not None:
            figures["profile"] = profile
        write("leasing" + ("_profile" if args.profile else "") + (f"_{args.label}" if args.label else ""), figures,
              settings=vars(args), quick=args.quick)
        finished = True
    finally:
        everything = [children.get("prometheus"), children.get("scale_fleet"), children.get("fleet"),
                      *children["workers"], children.get("agents"), children.get("api")]
        processes.stop_all([child for child in everything if child is not None], timeout=30)
        for log in logs.values():
            log.close()
        _queue_delete(broker.url, queue)
        broker.shutdown()
        database.shutdown()
        if finished:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(f"logs of the API, the workers and the fleet: {folder}", file=sys.stderr)


if __name__ == "__main__":
    main()
