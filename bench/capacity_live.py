"""Time-to-GPU of MIG requests in the live service, without and with the capacity loop's warm pools.

    .venv/bin/python bench/capacity_live.py                # the figures (about 8 minutes: 2 x 200 s of arrivals)
    .venv/bin/python bench/capacity_live.py --quick        # a smoke run (under 2 minutes)

The issue's target: p95 time-to-GPU under 1 s for warm-pool profiles in the live service. This runs the
whole service on this machine as ``bench/leasing.py`` does (its helpers are imported, not copied): a
PostgreSQL server (``DATABASE_URL``'s, else a private embedded one), the Celery broker as ``make run`` finds
it, gunicorn, ``--workers`` Celery worker processes, **Celery beat** with ``CAPACITY_PLAN_SECONDS =
--plan-every`` (so ``capacity.plan_run`` runs from beat exactly as in production, beside the other periodic
tasks), and a fleet of ``--nodes`` simulated nodes of 8 x H100 in MIG mode.

The agents answer a MIG create ``--create-latency`` seconds late per instance (default 2 s): creating a GPU
instance and its compute instance on a real H100 takes seconds, and that cold path is exactly what a warm
pool removes. With no latency both paths would take milliseconds and the comparison would say nothing.

Two phases on the same service, each ``--leases`` requests for a 1g.10gb slice arriving as a Poisson
process at ``--rate`` per second (the same seeded sequence of gaps in both), each released by a client
thread (DELETE) ``--hold`` seconds after it was asked for, or as soon as it is active when that is later
(a client gives back only what it got):

1. **cold**: every capacity-loop kind off (``capacity.services.policy_set``): every lease pays the cold path.
2. **warm**: ``warm_pool = auto`` with ``cold_provision_seconds`` = the refill time of a member: the plan
   period (the planner notices a member used) plus the create latency times the members one planner run
   makes on one node (rate x plan period, rounded up: the planner puts a refill on one GPU, whose node makes
   them one after the other), and ``warm_min_arrivals = 3``; the other kinds stay
   off. First a warm-up with no requests: the history window (``CAPACITY_HISTORY_SECONDS``, by default one
   phase's arrivals, ``--leases / --rate``) holds the cold phase's requests, so the planner sizes the pool
   from them (Poisson: P(more arrivals during one refill than the pool holds) < 5 %), and the bench waits
   until the agents have made it. Then the same arrival process.

Time-to-GPU per lease = its ACTIVE event - its ``requested_at`` (from the database). A warm-phase lease is
*bound warm* when its allocation has ``bound_at`` (it took a pool member, no agent call on its path); the
rest went the cold way. Bound leases whose member was still being made when they were asked for
(``warm_at`` after ``requested_at``) are shown apart: they waited for an agent call after all. CPU per
lease of each phase is measured as in ``bench/leasing.py`` (process trees, first request of the phase to
its last ACTIVE; beat and the planner's agent calls included, and the releases that fall inside it). The
warm pool's price is the GPU-hours its members were held by nobody (``capacity.selectors.warm_holding``). On a
busy machine the absolute seconds move; the ratio p95 bound-warm / p95 cold of the same run moves much
less, so it is printed too.

Results go to ``bench/results/capacity_live.json`` (``--json``; ``--quick`` writes to ``bench/results/quick/``,
which git ignores, so a smoke run never replaces the figures).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.leasing import BIN, Client, _meter, _pct, _postgres, _print_cpu, _queue_delete, _wait_http  # noqa: E402
from bench.record import RESULTS, results_dir, write  # noqa: E402
from core import processes  # noqa: E402
from core.processes import free_port  # noqa: E402
from infra import services  # noqa: E402

PROFILE = "1g.10gb"
MODEL = "H100-80GB"
MODE_KINDS = ("mode_switch", "mig_layout", "warm_pool", "idle_reclaim", "right_size", "quota_advice")
WARM_MIN_ARRIVALS = 3
DEFAULTS = {"leases": 200, "rate": 1.0, "hold": 20.0, "nodes": 4, "plan_every": 5, "create_latency": 2.0}
QUICK = {"leases": 30, "rate": 1.0, "hold": 5.0, "nodes": 2, "plan_every": 2, "create_latency": 2.0}


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    quick_flags = ", ".join(f"--{name.replace('_', '-')} {value}" for name, value in QUICK.items())
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: {quick_flags} unless given")
    parser.add_argument("--leases", type=int, help="requests per phase")
    parser.add_argument("--rate", type=float, help="arrivals per second (Poisson)")
    parser.add_argument("--hold", type=float, metavar="SECONDS",
                        help="each lease is released this long after it was asked for (or once active, if later)")
    parser.add_argument("--nodes", type=int, help="simulated nodes of 8 x H100 in MIG mode")
    parser.add_argument("--plan-every", type=int, metavar="SECONDS", help="CAPACITY_PLAN_SECONDS (beat)")
    parser.add_argument("--create-latency", type=float, metavar="SECONDS",
                        help="the agents' time per MIG instance created")
    parser.add_argument("--history", type=int, metavar="SECONDS",
                        help="CAPACITY_HISTORY_SECONDS (default: one phase, leases / rate; at least 60)")
    parser.add_argument("--seed", type=int, default=1, help="of the arrival gaps (the same in both phases)")
    parser.add_argument("--workers", type=int, default=2, help="Celery worker processes (2 children each)")
    parser.add_argument("--web-workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--threads", type=int, default=4, help="threads per gunicorn worker")
    parser.add_argument("--database", default="gpubroker_bench_capacity", help="dropped and made afresh")
    parser.add_argument("--json", type=Path, help="where the results go")
    parser.add_argument("--log-level", default="WARNING", help="of the API, the workers and beat")
    parser.add_argument("--keep-logs", action="store_true", help="keep the logs folder (always kept on failure)")
    quick = "--quick" in sys.argv[1:]
    parser.set_defaults(**(QUICK if quick else DEFAULTS))
    args = parser.parse_args()
    if args.leases < 1 or args.rate <= 0 or args.hold <= 0 or args.nodes < 1 or args.plan_every < 1 \
            or args.create_latency < 0:
        parser.error("--leases, --rate, --hold, --nodes and --plan-every must be positive, --create-latency >= 0")
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", args.database):
        parser.error("--database: lower-case letters, digits and _ only (it is dropped and created by name)")
    args.history = args.history or max(60, math.ceil(args.leases / args.rate))
    if args.history < 60:
        parser.error("--history: CAPACITY_HISTORY_SECONDS is at least 60")
    args.json = args.json or ((results_dir() if os.environ.get("BENCH_RESULTS_DIR") else RESULTS / "quick")
                              if quick else results_dir()) / "capacity_live.json"
    per_run = max(1, math.ceil(args.rate * args.plan_every))  # members one planner run refills, on one node
    args.cold_provision_seconds = math.ceil(args.plan_every + args.create_latency * per_run)
    return args


# -- the service -------------------------------------------------------------------------------------------
def _setup(env: dict, nodes: int) -> tuple[str, str]:
    """A tenant with a project and quota for the whole fleet: (API token, enrollment token)."""
    setup = ("from tests.factories import make_tenant, make_member, make_project, make_quota, make_token;"
             "from broker import services;"
             "t = make_tenant('bench'); u = make_member(t, 'bencher', 'member'); p = make_project(t, 'load');"
             f"make_quota(p, '{MODEL}', deserved={nodes * 8 * 1000}, limit={nodes * 8 * 1000});"
             f"print(make_token(t, u)[1]); print(services.enrollment_token_create(uses={nodes}))")
    output = subprocess.run([str(BIN / "python"), "manage.py", "shell", "-c", setup], cwd=ROOT, env=env, check=True,
                            capture_output=True, text=True).stdout.split()
    return output[-2], output[-1]


def _start(args, env: dict, queue: str, folder: Path, logs: dict, children: dict, enroll_token: str) -> int:
    """gunicorn, the workers, beat and the fleet; returns the API's port once every node has enrolled."""
    port = free_port()
    children["api"] = processes.start(
        [str(BIN / "gunicorn"), "config.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", str(args.web_workers),
         "--threads", str(args.threads), "--log-level", args.log_level.lower()], cwd=ROOT, env=env, stdout=logs["api"],
        stderr=subprocess.STDOUT)
    for number in range(args.workers):
        children["workers"].append(processes.start(
            [str(BIN / "celery"), "-A", "config", "worker", "--concurrency", "2", "--queues", queue, "--hostname",
             f"capbench{number}@%h", "--loglevel", args.log_level, "--without-gossip", "--without-mingle",
             "--without-heartbeat"], cwd=ROOT, env=env, stdout=logs["workers"], stderr=subprocess.STDOUT))
    # schedule cycles on a queue of their own with a worker of their own (as make run does): agent calls of
    # seconds (cold creates, warm-pool members) never hold a cycle back
    children["workers"].append(processes.start(
        [str(BIN / "celery"), "-A", "config", "worker", "--concurrency", "1", "--queues", env["CELERY_SCHEDULER_QUEUE"],
         "--hostname", "capbench-scheduler@%h", "--loglevel", args.log_level, "--without-gossip", "--without-mingle",
         "--without-heartbeat"], cwd=ROOT, env=env, stdout=logs["workers"], stderr=subprocess.STDOUT))
    children["beat"] = processes.start(
        [str(BIN / "celery"), "-A", "config", "beat", "--loglevel", args.log_level, "--schedule",
         str(folder / "celerybeat-schedule")], cwd=ROOT, env=env, stdout=logs["beat"], stderr=subprocess.STDOUT)
    site = f"http://127.0.0.1:{port}"
    _wait_http(site + "/healthz", children["api"], folder / "api.log")
    fleet_port = free_port()
    children["fleet"] = processes.start(
        [str(BIN / "python"), "-m", "agent.fleet", "--nodes", str(args.nodes), "--listen", f"127.0.0.1:{fleet_port}",
         "--state-dir", str(folder / "fleet"), "--shape", "h100-80gb:8:mig", "--broker-url", site,
         "--create-latency", str(args.create_latency), "--log-level", "ERROR"], cwd=ROOT,
        env={**env, "GPUB_ENROLLMENT_TOKEN": enroll_token}, stdout=logs["fleet"], stderr=subprocess.STDOUT)
    _wait_http(f"http://127.0.0.1:{fleet_port}/healthz", children["fleet"], folder / "fleet.log")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{fleet_port}/healthz") as response:
            if json.loads(response.read())["enrolled"] == args.nodes:
                return port
        time.sleep(0.5)
    raise TimeoutError(f"{args.nodes} nodes did not enroll in 120 s (logs: {folder})")


def _stop(children: dict) -> None:
    """Beat first (nothing more is sent), then the fleet, the workers and the API."""
    everything = [children.get("beat"), children.get("fleet"), *children["workers"], children.get("api")]
    processes.stop_all([child for child in everything if child is not None], timeout=30)


# -- the clients ---------------------------------------------------------------------------------------------
class Releaser(threading.Thread):
    """Gives each lease back (DELETE) when its hold is over, on one keep-alive connection; a lease not yet
    active then is looked at again every half second (a client gives back only what it got)."""

    def __init__(self, port: int, token: str):
        super().__init__(daemon=True)
        self.client = Client(port, token)
        self.due: list[tuple[float, int]] = []
        self.wake = threading.Condition()
        self.stopping = False
        self.errors: list[str] = []

    def add(self, at: float, lease_id: int) -> None:
        with self.wake:
            heapq.heappush(self.due, (at, lease_id))
            self.wake.notify()

    def stop(self) -> None:
        with self.wake:
            self.stopping = True
            self.wake.notify()
        self.join(30)

    def run(self) -> None:
        from django.db import connection

        try:
            self._loop()
        finally:
            connection.close()

    def _loop(self) -> None:
        from broker.models import Lease

        while True:
            with self.wake:
                while not self.stopping and (not self.due or self.due[0][0] > time.monotonic()):
                    self.wake.wait(self.due[0][0] - time.monotonic() if self.due else None)
                if self.stopping:
                    return
                _, lease_id = heapq.heappop(self.due)
            if Lease.objects.filter(pk=lease_id, state__in=("requested", "queued", "provisioning")).exists():
                self.add(time.monotonic() + 0.5, lease_id)
                continue
            status, answer = self.client.call("DELETE", f"/api/v1/leases/{lease_id}")
            if status != 202:
                self.errors.append(f"DELETE {lease_id}: {status} {answer[:200]!r}")


def _arrive(phase: str, args, port: int, token: str, releaser: Releaser) -> tuple[list[int], list[str]]:
    """``--leases`` requests at Poisson times (seeded gaps), each POSTed from a pool of connections so a slow
    answer never delays the next arrival; returns (lease ids in arrival order, errors)."""
    gaps = random.Random(args.seed)
    body = json.dumps({"project": "load", "gpu": {"kind": "mig", "profile": PROFILE, "model": MODEL},
                       "duration_seconds": 3600}).encode()
    local = threading.local()
    ids: list[int | None] = [None] * args.leases
    errors: list[str] = []

    def post(index: int) -> None:
        if not hasattr(local, "client"):
            local.client = Client(port, token)
        status, answer = local.client.call("POST", "/api/v1/leases", body, {"Idempotency-Key": f"{phase}-{index}"})
        if status not in (200, 201):  # 200: a resent request's first answer
            errors.append(f"POST {index}: {status} {answer[:300]!r}")
            return
        ids[index] = json.loads(answer)["id"]
        releaser.add(time.monotonic() + args.hold, ids[index])

    start = time.monotonic()
    at = 0.0
    with ThreadPoolExecutor(max_workers=8) as pool:
        for index in range(args.leases):
            if index:
                at += gaps.expovariate(args.rate)
            time.sleep(max(0.0, start + at - time.monotonic()))
            pool.submit(post, index)
    return [i for i in ids if i is not None], errors


# -- what the database says -------------------------------------------------------------------------------------
def _served(ids: list[int]) -> set[int]:
    """The leases that reached ACTIVE, or ended without (released while waiting)."""
    from broker.models import Lease, LeaseEvent

    active = set(LeaseEvent.objects.filter(lease_id__in=ids, to_state="active").values_list("lease_id", flat=True))
    ended = set(Lease.objects.filter(pk__in=ids, state__in=("released", "expired", "failed")).values_list(
        "pk", flat=True))
    return active | ended


def _wait_served(ids: list[int], meter, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        meter.poll()
        if len(_served(ids)) >= len(ids):
            return True
        time.sleep(0.2)
    return False


def _time_to_gpu(ids: list[int]) -> tuple[dict[int, float], set[int], set[int], float]:
    """(seconds from request to first ACTIVE per lease that got one, those that bound a warm member, those
    whose member was still being made when they were asked for, the time of the last ACTIVE)."""
    from broker.models import Allocation, Lease, LeaseEvent

    requested = dict(Lease.objects.filter(pk__in=ids).values_list("pk", "requested_at"))
    active: dict[int, datetime] = {}
    for lease_id, at in LeaseEvent.objects.filter(lease_id__in=ids, to_state="active").order_by("at").values_list(
            "lease_id", "at"):
        active.setdefault(lease_id, at)
    seconds = {pk: (at - requested[pk]).total_seconds() for pk, at in active.items()}
    members = Allocation.objects.filter(lease_id__in=ids, bound_at__isnull=False)
    bound = set(members.values_list("lease_id", flat=True))
    early = {pk for pk, warm_at in members.values_list("lease_id", "warm_at") if warm_at > requested[pk]}
    last = max(active.values()).timestamp() if active else time.time()
    return seconds, bound, early, last


def _requested(ids: list[int]) -> list[datetime]:
    from broker.models import Lease

    return list(Lease.objects.filter(pk__in=ids).values_list("requested_at", flat=True))


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {"n": len(values), "p50_s": round(statistics.median(values), 3), "p95_s": round(_pct(values, 0.95), 3),
            "max_s": round(max(values), 3)}


def _line(name: str, figures: dict) -> str:
    if not figures["n"]:
        return f"  {name:<34} none"
    return (f"  {name:<34} n={figures['n']:<4} p50 {figures['p50_s']:6.2f} s  p95 {figures['p95_s']:6.2f} s  "
            f"max {figures['max_s']:6.2f} s")


def _busy(before, after) -> float:
    return (sum(after) - after.idle - getattr(after, "iowait", 0)) - (
        sum(before) - before.idle - getattr(before, "iowait", 0))


def _cpu(used: dict, busy: float, leases: int) -> dict:
    per = {name: round((user + system) * 1000 / leases, 2) for name, (user, system) in used.items()}
    per["all"] = round(sum(per.values()), 2)
    return {"ms_per_lease": per, "leases": leases, "machine_busy_cpu_s": round(busy, 1)}


def _policy(warm: bool, args) -> None:
    from capacity.services import policy_set

    values: dict = dict.fromkeys(MODE_KINDS, "off")
    if warm:
        values |= {"warm_pool": "auto", "cold_provision_seconds": args.cold_provision_seconds,
                   "warm_min_arrivals": WARM_MIN_ARRIVALS, "warm_target_p95_seconds": 1}
    policy_set(scope="", values=values)


def _pool() -> tuple[int, int, int | None]:
    """(warm members ready, being made, the size the last applied warm-pool adjustment left)."""
    from broker.models import Allocation
    from capacity.models import Adjustment

    members = Allocation.objects.filter(lease__isnull=True, freed_at__isnull=True, mig_profile=PROFILE)
    last = (Adjustment.objects.filter(kind="warm_pool", state="applied").order_by("-finished_at", "-pk")
            .values_list("change", flat=True).first())
    return (members.filter(state="warm").count(), members.filter(state="pending").count(),
            last["size_after"] if last else None)


def _warm_up(meter, limit: float) -> dict:
    """Wait (no requests) until the planner has sized the pool from the history and the agents have made it."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        meter.poll()
        ready, making, size = _pool()
        if size is not None and ready >= size > 0 and not making:
            return {"seconds": round(time.monotonic() - started, 1), "pool_ready": ready, "pool_target": size,
                    "reached": True}
        time.sleep(0.5)
    ready, making, size = _pool()
    return {"seconds": round(time.monotonic() - started, 1), "pool_ready": ready, "pool_target": size,
            "reached": False}


def _pool_figures(start: datetime, end: datetime) -> dict:
    from broker.models import Allocation
    from capacity.models import Adjustment
    from capacity.selectors import warm_holding

    made = Allocation.objects.filter(warm_at__isnull=False, warm_at__gte=start, warm_at__lt=end)
    held = warm_holding(start=start, end=end).get(f"{MODEL} {PROFILE}", {})
    adjustments = Adjustment.objects.filter(kind="warm_pool", proposed_at__gte=start)
    return {"members_created": made.count(), "members_bound": made.filter(bound_at__isnull=False).count(),
            "members_removed_unbound": made.filter(bound_at__isnull=True, freed_at__isnull=False).count(),
            "held_idle_gpu_hours": round(float(held.get("gpu_hours", 0)), 5),
            "held_idle_members": held.get("members", 0),
            "adjustments_applied": adjustments.filter(state="applied").count(),
            "adjustments_failed": adjustments.filter(state="failed").count(),
            "failed_outcomes": list(adjustments.filter(state="failed").values_list("outcome", flat=True)[:5])}


# -- the run -----------------------------------------------------------------------------------------------------
def _phase(name: str, args, port: int, token: str, releaser: Releaser, meter) -> dict:
    machine = psutil.cpu_times()
    meter.begin()
    ids, errors = _arrive(name, args, port, token, releaser)
    complete = _wait_served(ids, meter, limit=max(120.0, 4 * args.hold))
    used = meter.since()
    busy = _busy(machine, psutil.cpu_times())
    seconds, bound, early, last = _time_to_gpu(ids)
    print(f"{name} phase: {len(ids)} requests, {len(seconds)} active"
          f"{'' if complete else ' (gave up waiting for the rest)'}")
    _print_cpu(used, busy, len(seconds) or 1)
    return {"ids": ids, "seconds": seconds, "bound": bound, "early": early, "errors": errors, "complete": complete,
            "cpu": _cpu(used, busy, len(seconds) or 1), "last_active": last,
            "span_s": round(last - min(first.timestamp() for first in _requested(ids)), 1) if seconds else None}


def _report(cold: dict, warm: dict, warm_up: dict, pool: dict, wall: float) -> dict:
    cold_values = list(cold["seconds"].values())
    bound_values = [s for pk, s in warm["seconds"].items() if pk in warm["bound"]]
    miss_values = [s for pk, s in warm["seconds"].items() if pk not in warm["bound"]]
    early_values = [s for pk, s in warm["seconds"].items() if pk in warm["early"]]
    figures = {"cold_phase": _stats(cold_values), "warm_phase_all": _stats(list(warm["seconds"].values())),
               "warm_phase_bound_warm": _stats(bound_values), "warm_phase_cold_path": _stats(miss_values),
               "warm_phase_bound_member_in_making": _stats(early_values)}
    share = len(bound_values) / len(warm["seconds"]) if warm["seconds"] else 0.0
    ratio = (figures["warm_phase_bound_warm"]["p95_s"] / figures["cold_phase"]["p95_s"]
             if bound_values and cold_values and figures["cold_phase"]["p95_s"] > 0 else None)
    print("time to GPU (request to ACTIVE):")
    for name, values in figures.items():
        print(_line(name.replace("_", " "), values))
    print(f"  warm phase served warm: {share:.1%} ({len(bound_values)}/{len(warm['seconds'])})")
    if ratio is not None:
        print(f"  p95 bound warm / p95 cold: {ratio:.3f} (the figure a busy machine moves least)")
    target = figures["warm_phase_all"].get("p95_s")
    print(f"  target p95 < 1 s for the warm-pool profile: warm phase p95 {target} s -> "
          f"{'met' if target is not None and target < 1 else 'not met'}")
    print(f"warm-up: {warm_up['seconds']} s, pool {warm_up['pool_ready']} ready of {warm_up['pool_target']} target"
          f"{'' if warm_up['reached'] else ' (not reached: went on)'}")
    print(f"warm pool: {pool['members_created']} members made, {pool['members_bound']} bound, "
          f"{pool['members_removed_unbound']} removed unbound; held idle {pool['held_idle_gpu_hours']:.4f} GPU-hours "
          f"({pool['adjustments_applied']} adjustments applied, {pool['adjustments_failed']} failed)")
    print(f"wall time: {wall:.0f} s")
    errors = cold["errors"] + warm["errors"]
    for error in errors[:5]:
        print(f"error: {error}", file=sys.stderr)
    return {"time_to_gpu": figures, "warm_phase_served_warm_share": round(share, 3),
            "p95_bound_warm_over_p95_cold": round(ratio, 4) if ratio is not None else None,
            "target_p95_under_1s_met": target is not None and target < 1,
            "warm_up": warm_up, "warm_pool": pool,
            "cpu": {"cold_phase": cold["cpu"], "warm_phase": warm["cpu"]},
            "phase_seconds": {"cold_phase": cold["span_s"], "warm_phase": warm["span_s"]},
            "requests": {"cold_phase": len(cold["ids"]), "warm_phase": len(warm["ids"])},
            "not_active": {"cold_phase": len(cold["ids"]) - len(cold["seconds"]),
                           "warm_phase": len(warm["ids"]) - len(warm["seconds"])},
            "errors": errors[:20], "wall_seconds": round(wall, 1)}


def main() -> None:
    args = _arguments()
    began = time.monotonic()
    shown = {k: (_relative(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    print(time.strftime("%Y-%m-%d %H:%M"), f"on {psutil.cpu_count()} cores;", shown)

    import psycopg

    database, private = _postgres(argparse.Namespace(statements=0))
    broker = services.ensure_broker(redis_db=3)
    url = services._with_database(database.url, args.database)
    with psycopg.connect(database.url, autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {args.database} WITH (FORCE)")
        connection.execute(f"CREATE DATABASE {args.database}")
    queue = f"capbench-{os.getpid()}"
    env = {**os.environ, "DATABASE_URL": url, "CELERY_BROKER_URL": broker.url, "SECRET_KEY": "bench",
           "CELERY_TASK_DEFAULT_QUEUE": queue, "CELERY_SCHEDULER_QUEUE": f"{queue}-scheduler",
           "RUNTIME_ENV_FILE": "/dev/null", "LOG_LEVEL": args.log_level,
           "ALLOWED_HOSTS": "127.0.0.1", "DJANGO_SETTINGS_MODULE": "config.settings",
           "NODE_ADDRESS_NETWORKS": services.LOCAL_NODE_ADDRESS_NETWORKS,
           "CAPACITY_PLAN_SECONDS": str(args.plan_every), "CAPACITY_HISTORY_SECONDS": str(args.history)}
    os.environ.update(env)
    subprocess.run([str(BIN / "python"), "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    api_token, enroll_token = _setup(env, args.nodes)
    import django

    django.setup()
    from django.db import connection as django_connection
    from django.utils import timezone

    _policy(False, args)
    folder = Path(tempfile.mkdtemp(prefix="bench-capacity-"))
    logs = {name: open(folder / f"{name}.log", "w") for name in ("api", "workers", "beat", "fleet")}  # noqa: SIM115
    children: dict = {"workers": []}
    finished = False
    releaser = None
    try:
        port = _start(args, env, queue, folder, logs, children, enroll_token)
        print(f"{args.nodes} nodes ({args.nodes * 8} H100 in MIG mode, {args.nodes * 56} {PROFILE} slots) enrolled; "
              f"create latency {args.create_latency} s per instance, planner every {args.plan_every} s (beat), "
              f"history {args.history} s")
        meter = _meter(database, private, broker, children, url)
        meter.add("Celery beat", lambda: [children["beat"].pid])
        releaser = Releaser(port, api_token)
        releaser.start()

        cold = _phase("cold", args, port, api_token, releaser, meter)
        warm_from = timezone.now()
        _policy(True, args)
        meter.begin()
        warm_up = _warm_up(meter, limit=60.0 + 40 * args.create_latency)
        used = meter.since()
        warm_up["cpu_s"] = round(sum(user + system for user, system in used.values()), 1)
        warm = _phase("warm", args, port, api_token, releaser, meter)
        warm_to = datetime.fromtimestamp(warm["last_active"], tz=UTC)
        pool = _pool_figures(warm_from, warm_to)
        result = _report(cold, warm, warm_up, pool, time.monotonic() - began)
        settings = {**shown, "profile": PROFILE, "model": MODEL, "warm_min_arrivals": WARM_MIN_ARRIVALS,
                    "warm_target_p95_seconds": 1}
        write(args.json.stem, result, settings=settings, directory=args.json.parent)
        finished = True
    finally:
        if releaser is not None:
            releaser.stop()
        _stop(children)
        for log in logs.values():
            log.close()
        django_connection.close()
        _queue_delete(broker.url, queue)
        _queue_delete(broker.url, f"{queue}-scheduler")
        broker.shutdown()
        database.shutdown()
        if finished and not args.keep_logs:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(f"logs of the API, the workers, beat and the fleet: {folder}", file=sys.stderr)


if __name__ == "__main__":
    main()
