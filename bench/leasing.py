"""Leases per second from request to ACTIVE, and the latency, on the simulated fleet.

    .venv/bin/python bench/leasing.py --leases 400 --nodes 50 --clients 8 --workers 2

Starts the whole path on this machine in a scratch database (``gpubroker_bench``): PostgreSQL and the
Celery broker as ``make run`` finds them, gunicorn (the REST API), ``--workers`` Celery worker processes
(2 children each), and a fleet of ``--nodes`` simulated nodes (8 x H100 in MIG mode each) enrolled with
the broker. ``--clients`` threads POST ``--leases`` requests for 1g.10gb MIG slices over HTTP, each with
an Idempotency-Key. Figures come from the lease events in the database: latency = ACTIVE event −
REQUESTED event per lease; throughput = leases / (last ACTIVE − first REQUESTED).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra import services  # noqa: E402
from tests.agent.conftest import free_port, wait_http  # noqa: E402

BIN = Path(sys.executable).parent


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--leases", type=int, default=400)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--web-workers", type=int, default=2)
    args = parser.parse_args()
    print(time.strftime("%Y-%m-%d %H:%M"), f"on {os.cpu_count()} cores;", vars(args))

    database = services.ensure_postgres()
    broker = services.ensure_broker(redis_db=3)
    url = services._with_database(database.url, "gpubroker_bench")
    import psycopg

    with psycopg.connect(database.url, autocommit=True) as connection:
        connection.execute("DROP DATABASE IF EXISTS gpubroker_bench WITH (FORCE)")
        connection.execute("CREATE DATABASE gpubroker_bench")
    queue = f"bench-{os.getpid()}"
    port = free_port()
    env = {**os.environ, "DATABASE_URL": url, "CELERY_BROKER_URL": broker.url, "SECRET_KEY": "bench",
           "CELERY_TASK_DEFAULT_QUEUE": queue, "RUNTIME_ENV_FILE": "/dev/null", "LOG_LEVEL": "WARNING",
           "ALLOWED_HOSTS": "127.0.0.1", "DJANGO_SETTINGS_MODULE": "config.settings"}
    os.environ.update(env)
    manage = [str(BIN / "python"), "manage.py"]
    subprocess.run([*manage, "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    setup = ("from tests.factories import make_tenant, make_member, make_project, make_quota, make_token;"
             "from broker import services;"
             "t = make_tenant('bench'); u = make_member(t, 'bencher', 'member'); p = make_project(t, 'load');"
             f"make_quota(p, 'H100-80GB', deserved={args.nodes * 8 * 1000}, limit={args.nodes * 8 * 1000});"
             f"print(make_token(t, u)[1]); print(services.enrollment_token_create(uses={args.nodes}))")
    output = subprocess.run([*manage, "shell", "-c", setup], cwd=ROOT, env=env, check=True, capture_output=True,
                            text=True).stdout.split()
    api_token, enroll_token = output[-2], output[-1]
    children = []
    folder = tempfile.mkdtemp(prefix="bench-leasing-")
    try:
        children.append(subprocess.Popen(
            [str(BIN / "gunicorn"), "config.wsgi", "--bind", f"127.0.0.1:{port}", "--workers",
             str(args.web_workers), "--threads", "4", "--log-level", "warning"], cwd=ROOT, env=env))
        for number in range(args.workers):
            children.append(subprocess.Popen(
                [str(BIN / "celery"), "-A", "config", "worker", "--concurrency", "2", "--queues", queue, "--hostname",
                 f"bench{number}@%h", "--loglevel", "WARNING", "--without-gossip", "--without-mingle",
                 "--without-heartbeat"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        site = f"http://127.0.0.1:{port}"
        wait_http(site + "/healthz", children[0])
        fleet_port = free_port()
        children.append(subprocess.Popen(
            [str(BIN / "python"), "-m", "agent.fleet", "--nodes", str(args.nodes), "--listen",
             f"127.0.0.1:{fleet_port}", "--state-dir", folder, "--shape", "h100-80gb:8:mig", "--broker-url", site,
             "--enrollment-token", enroll_token, "--log-level", "ERROR"], cwd=ROOT, env=env))
        wait_http(f"http://127.0.0.1:{fleet_port}/healthz", children[-1])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{fleet_port}/healthz") as response:
                if json.loads(response.read())["enrolled"] == args.nodes:
                    break
            time.sleep(0.5)
        print(f"{args.nodes} nodes ({args.nodes * 8} GPUs, {args.nodes * 56} 1g slots) enrolled")

        def submit(number: int) -> None:
            for index in range(number, args.leases, args.clients):
                body = json.dumps({"project": "load", "gpu": {"kind": "mig", "profile": "1g.10gb"},
                                   "duration_seconds": 3600}).encode()
                request = urllib.request.Request(  # noqa: S310 - loopback
                    site + "/api/v1/leases", data=body, method="POST",
                    headers={"Authorization": f"Bearer {api_token}", "Content-Type": "application/json",
                             "Idempotency-Key": f"bench-{index}"})
                with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
                    assert response.status == 201

        started = time.monotonic()
        threads = [threading.Thread(target=submit, args=(n,)) for n in range(args.clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        submitted = time.monotonic() - started
        import django

        django.setup()
        from broker.models import Lease, LeaseEvent

        while time.monotonic() - started < 300:
            if Lease.objects.filter(state="active").count() >= args.leases:
                break
            time.sleep(0.5)
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
    finally:
        for child in reversed(children):
            child.terminate()
        for child in children:
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
        broker.shutdown()
        database.shutdown()


if __name__ == "__main__":
    main()
