"""Leases per second with 1 Celery worker and with 3, in one run, on the scaled-out deployment.

    .venv/bin/python bench/scaleout.py            # 300 leases per phase, 100 nodes
    .venv/bin/python bench/scaleout.py --quick    # 100 leases per phase, 40 nodes

The setup of the scale-out test (tests/deploy/cluster.py): 2 gunicorn web servers, 2 scheduler workers, 2 beat
contenders under ``run_as_leader``, simulated nodes over HTTP (each MIG create answers ``--create-latency``
seconds later, as a real GPU's does) — against a database of its own (``gpubroker_scaleout`` on
``DATABASE_URL``'s server, else the embedded one) and the Celery broker ``make run`` would use
(``CELERY_BROKER_URL`` first). Phase 1 runs with one worker process (``worker@host1``); then two more start
(``worker@host2``, ``worker@host3``) and phase 2 sends as many leases again. Each phase: ``--clients``
concurrent clients POST the leases over both web servers; the phase ends when all of them are ACTIVE.

Figures: leases/s per phase from the lease events (first REQUESTED to last ACTIVE of that phase's leases), the
**ratio** phase 2 / phase 1, and CPU seconds per lease per part (process trees; PostgreSQL: the backends of the
bench database). On a machine shared with other work the rates move with the load; the ratio, measured minutes
apart in one run, and the CPU per lease are the figures to compare. Results: ``bench/results/scaleout.json``
(``--quick``: in ``bench/results/quick/``) through ``bench.record``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.leasing import CpuMeter  # noqa: E402
from bench.record import write  # noqa: E402
from infra import services  # noqa: E402
from tests.deploy.cluster import Cluster  # noqa: E402

DATABASE = "gpubroker_scaleout"


def _meter(cluster: Cluster, url: str) -> CpuMeter:
    import psycopg

    meter = CpuMeter()
    for name, role in (("web (2 gunicorn)", "web"), ("Celery workers", "worker"), ("scheduler workers", "scheduler"),
                       ("beat contenders", "beat"), ("agents (fleets)", "fleet")):
        meter.add(name, lambda role=role: [p.pid for p in cluster.processes.get(role, []) if p.poll() is None])
    watch = psycopg.connect(url, autocommit=True)
    own = watch.execute("SELECT pg_backend_pid()").fetchone()[0]
    meter.add("PostgreSQL (backends)", lambda: [-pid for (pid,) in watch.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> %s", [own])])
    meter.add("bench clients", lambda: [-os.getpid()])
    return meter


def _phase(cluster: Cluster, meter: CpuMeter, leases: int, clients: int, key: str) -> dict:
    since = cluster.sql("SELECT coalesce(max(id), 0) FROM broker_lease")[0][0]
    already = cluster.sql("SELECT count(*) FROM broker_lease WHERE state = 'active'")[0][0]
    machine = psutil.cpu_times()
    meter.begin()
    submitted = cluster.submit(leases, clients=clients, key=key)
    deadline = time.monotonic() + 900
    while cluster.sql("SELECT count(*) FROM broker_lease WHERE state = 'active'")[0][0] < already + leases:
        if time.monotonic() > deadline:
            raise TimeoutError(f"phase {key}: not every lease ACTIVE in 900 s (logs in {cluster.folder})")
        meter.poll()
        time.sleep(0.3)
    used = meter.since()
    after = psutil.cpu_times()
    busy = (sum(after) - after.idle - getattr(after, "iowait", 0)) - (
        sum(machine) - machine.idle - getattr(machine, "iowait", 0))
    count, rate = cluster.lease_rate(since)
    cpu = {name: round((user + system) * 1000 / count, 2) for name, (user, system) in used.items()}
    return {"leases": count, "leases_per_second": round(rate, 2), "submit_seconds": round(submitted, 2),
            "cpu_ms_per_lease": cpu, "cpu_ms_per_lease_total": round(sum(cpu.values()), 2),
            "machine_cpu_seconds": round(busy, 1), "bench_cpu_seconds": round(sum(u + s for u, s in used.values()), 1)}


def _print(label: str, phase: dict) -> None:
    print(f"{label}: {phase['leases']} leases ACTIVE, {phase['leases_per_second']:.2f} leases/s "
          f"(submitted in {phase['submit_seconds']:.1f} s); CPU per lease {phase['cpu_ms_per_lease_total']:.1f} ms "
          f"(machine busy: {phase['machine_cpu_seconds']:.0f} CPU s, {phase['bench_cpu_seconds']:.0f} of them this "
          "benchmark's)")
    for name, milliseconds in phase["cpu_ms_per_lease"].items():
        print(f"    {name:<24} {milliseconds:8.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--leases", type=int, default=300, help="leases per phase")
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=2, help="children per Celery worker process")
    parser.add_argument("--create-latency", type=float, default=0.25, metavar="SECONDS",
                        help="each simulated MIG create answers this much later")
    parser.add_argument("--quick", action="store_true", help="100 leases per phase, 40 nodes")
    args = parser.parse_args()
    if args.quick:
        args.leases, args.nodes = 100, 40
    print(time.strftime("%Y-%m-%d %H:%M"), f"on {psutil.cpu_count()} cores, load {os.getloadavg()[0]:.1f};",
          vars(args), flush=True)

    import psycopg

    database = services.ensure_postgres()
    broker = services.ensure_broker(redis_db=3)
    url = services._with_database(database.url, DATABASE)
    with psycopg.connect(database.url, autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        connection.execute(f"CREATE DATABASE {DATABASE}")
    folder = Path(tempfile.mkdtemp(prefix="bench-scaleout-"))
    cluster = Cluster(url, broker.url, folder, web=2, workers=3, schedulers=2, beats=2, nodes=args.nodes,
                      concurrency=args.concurrency, create_latency_seconds=args.create_latency)
    for command in (["migrate", "-v", "0"], ["createcachetable"]):
        subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=cluster.env, check=True)
    finished = False
    try:
        cluster.start(workers=1)
        print(f"up: 2 web, 1 worker, 2 scheduler workers, 2 beat contenders ({cluster.leaders()}), "
              f"{args.nodes} nodes enrolled; broker {broker.url.split('://')[0]} ({broker.how})", flush=True)
        meter = _meter(cluster, url)
        one = _phase(cluster, meter, args.leases, args.clients, "one")
        _print("1 worker ", one)
        cluster.start_workers(2, first=2)
        cluster._wait("two more workers", cluster.workers_ready, 180)
        three = _phase(cluster, meter, args.leases, args.clients, "three")
        _print("3 workers", three)
        ratio = three["leases_per_second"] / one["leases_per_second"]
        print(f"ratio 3 workers / 1 worker: {ratio:.2f} (leases/s)")
        cycles = cluster.cycles()
        overlaps = sum(1 for a, b in itertools.pairwise(cycles) if b[0] < a[1])
        print(f"schedule cycles: {len(cycles)} ran, {overlaps} overlapping")
        write("scaleout", {
            "ratio_3_workers_to_1": round(ratio, 2), "one_worker": one, "three_workers": three,
            "cycles": len(cycles), "cycles_overlapping": overlaps, "cores": psutil.cpu_count(),
            "broker": broker.url.split("://")[0]}, settings=vars(args), quick=args.quick)
        finished = True
    finally:
        cluster.stop()
        broker.shutdown()
        database.shutdown()
        if finished:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(f"logs of every process: {folder}", file=sys.stderr)


if __name__ == "__main__":
    main()
