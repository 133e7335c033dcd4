"""Every benchmark by one command (issue 16, "reproducible results").

    python -m bench list                  # what there is, what each needs, how long it takes
    python -m bench all                   # every benchmark at its recorded size -> bench/results/*.json
    python -m bench all --quick           # every benchmark at a smoke size -> bench/results/quick/ (git ignores it)
    python -m bench run billing openb     # some of them
    python -m bench docs                  # rewrite the docs' tables from bench/results/*.json
    python -m bench docs --check          # exit 1 if a docs table differs from its results file
    python -m bench stale                 # which results files are older than the code they measure

``make bench`` is ``python -m bench all``; ``make bench BENCH_ARGS=--quick`` the smoke run. Each benchmark runs
as its own process with this interpreter, one after the other (they measure CPU and would disturb each other),
and writes its results through ``bench/record.py``. A full run takes hours on a 2-core machine (``list`` says
how long each took); ``--quick`` takes minutes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PHILLY = "bench/traces/philly/philly_jobs_until_2017-11-14.csv"


@dataclass(frozen=True)
class Benchmark:
    name: str
    about: str
    full: tuple[str, ...]  # arguments after the interpreter; "{results}" is replaced by the results folder
    quick: tuple[str, ...]
    results: tuple[str, ...]  # the results files (bench/results/<name>.json) a full run writes
    needs: str  # the real parts it starts or uses
    minutes: float  # about how long the full run took on the 2-core development machine
    # the source whose figures these are, besides the benchmark's own module: a change to it after a results
    # file's commit makes that file stale (bench/staleness.py)
    measures: tuple[str, ...] = ()
    # needs an NVIDIA GPU (a lent machine, docs/tiering.md §4.1): ``all`` leaves it out; ``run NAME`` runs it
    device: bool = False

    def sources(self) -> tuple[str, ...]:
        """The benchmark's module (a script, or the package ``-m`` runs) and what it measures, as paths."""
        first = self.full[1].replace(".", "/") if self.full[0] == "-m" else self.full[0]
        return (first, *self.measures)

    def argv(self, quick: bool, results: Path) -> list[str]:
        """The arguments, with the results folder as the command would be typed at the repository's root."""
        shown = str(results.relative_to(ROOT)) if results.is_relative_to(ROOT) else str(results)
        return [part.replace("{results}", shown) for part in (self.quick if quick else self.full)]


# what the benchmarks of the whole live service measure: the broker, its configuration, tenants and the agents
LIVE_SERVICE = ("broker", "config", "tenants", "agent", "gpus")

OPENB_TRACES = ("default", "multigpu20", "multigpu30", "gpushare20", "gpushare40", "gpushare60", "gpushare80",
                "gpuspec10", "gpuspec20")

BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("agent_ops", "create+delete operations per second on one node agent (fsync per change)",
              ("bench/agent_ops.py", "ops", "--seconds", "8"), ("bench/agent_ops.py", "ops", "--quick"),
              ("agent_ops",), "an agent process", 0.5,
              measures=("agent", "gpus")),
    Benchmark("agent_scrape", "1,000 simulated nodes' /metrics, one pass and a real Prometheus scraping them",
              ("bench/agent_ops.py", "scrape", "--nodes", "1000", "--prometheus-seconds", "75"),
              ("bench/agent_ops.py", "scrape", "--quick"), ("agent_scrape",), "a fleet process, Prometheus", 3,
              measures=("agent", "gpus")),
    Benchmark("openb", "placement quality on the Alibaba openb traces (FGD's method): default against faithful FGD",
              ("-m", "bench.sim", "fragmentation", "--trace", "all", "--seeds", "42-51", "--json-dir", "{results}",
               "--jobs", "2"),
              ("-m", "bench.sim", "fragmentation", "--trace", "all", "--quick", "--json-dir", "{results}", "--jobs",
               "2"),
              tuple(f"openb_{trace}" for trace in OPENB_TRACES), "nothing (pure replay)", 10,
              measures=("broker/scheduler", "gpus")),
    Benchmark("quota", "quota replay of the Philly trace: static partitions, FIFO and ours (with every 10th job's "
              "estimated start against its actual one), ours also with reservations and backfill",
              ("-m", "bench.sim", "quota", "--jobs", PHILLY, "--load", "0.8", "--policy", "all",
               "--estimate-every", "10", "--reservations", "both", "--json-dir", "{results}"),
              ("-m", "bench.sim", "quota", "--jobs", PHILLY, "--load", "0.8", "--policy", "all", "--limit", "6000",
               "--estimate-every", "50", "--reservations", "both", "--json-dir", "{results}"),
              ("philly_quota_static", "philly_quota_fifo", "philly_quota_ours", "philly_quota_ours_reserve"),
              "nothing (pure replay)", 4,
              measures=("broker/scheduler", "gpus")),
    Benchmark("capacity", "closed-loop capacity replay, a month of Philly arrivals at load 0.8: static partitions, "
              "FIFO, quotas without the loop, advise with a person's delay, the shipped default, auto",
              ("-m", "bench.sim", "capacity", "--days", "30", "--jobs", "2", "--json-dir", "{results}",
               "--plot", "docs/img/capacity-month.png"),
              ("-m", "bench.sim", "capacity", "--days", "0.5", "--json-dir", "{results}"),
              tuple(f"capacity_{setting}" for setting in ("static", "fifo", "off", "advise", "default", "auto")),
              "nothing (pure replay)", 12,
              measures=("capacity/planner", "broker/scheduler", "gpus")),
    Benchmark("capacity_loads", "the same month at offered loads 0.6 and 0.95: static, off and the shipped default",
              ("-m", "bench.sim", "capacity", "--days", "30", "--load", "0.6,0.95", "--setting",
               "static,off,default", "--jobs", "2", "--json-dir", "{results}"),
              ("-m", "bench.sim", "capacity", "--days", "0.5", "--load", "0.6,0.95", "--setting",
               "static,off,default", "--json-dir", "{results}"),
              tuple(f"capacity_load{pct}_{setting}" for pct in (60, 95) for setting in ("static", "off", "default")),
              "nothing (pure replay)", 8,
              measures=("capacity/planner", "broker/scheduler", "gpus")),
    Benchmark("idle_structure", "the capacity month's idle GPU-hours by class and stretch length, and the most an idle "
              "rule acting after W minutes could remove (an upper bound from the work alone)",
              ("bench/idle_structure.py",), ("bench/idle_structure.py", "--quick"), ("idle_structure",),
              "nothing (pure)", 1,
              measures=("bench/sim/capacity.py", "bench/sim/philly.py", "agent/data/genai_series.json.gz",
                        "bench/traces/philly")),
    Benchmark("billing", "a month's close (metering + invoice_run) for 1,000 tenants on 10,000 GPUs",
              ("bench/billing.py", "--workers", "2"), ("bench/billing.py", "--quick", "--workers", "2"), ("billing",),
              "PostgreSQL", 15,
              measures=("billing", "broker/models.py")),
    Benchmark("billing_hourly", "one hour's metering run at 100,000 GPUs", ("bench/billing.py", "--hourly"),
              ("bench/billing.py", "--hourly", "--nodes", "1250", "--tenants", "100"), ("billing_hourly",),
              "PostgreSQL", 5,
              measures=("billing", "broker/models.py")),
    Benchmark("leasing", "the lease path, request to ACTIVE, on the whole live service: leases/s, CPU per lease",
              ("bench/leasing.py",), ("bench/leasing.py", "--quick"), ("leasing",),
              "PostgreSQL, Redis, gunicorn, Celery workers, a simulated fleet", 4,
              measures=LIVE_SERVICE),
    Benchmark("leasing_profile", "the same with py-spy sampling every process: the top costs per process",
              ("bench/leasing.py", "--leases", "300", "--nodes", "20", "--profile"),
              ("bench/leasing.py", "--quick", "--profile"), ("leasing_profile",),
              "the same, and py-spy", 3,
              measures=LIVE_SERVICE),
    Benchmark("leasing_scale", "API latency with and without 1,000 more nodes heartbeating and scraped",
              ("bench/leasing.py", "--scale-nodes", "1000"), ("bench/leasing.py", "--quick", "--scale-nodes", "100"),
              ("leasing_scale",), "the same, and Prometheus", 10,
              measures=(*LIVE_SERVICE, "observability")),
    Benchmark("scheduler_cycle", "one schedule cycle at 100,000 GPUs and 10,000 queued requests: the core alone",
              ("bench/scheduler_cycle.py",), ("bench/scheduler_cycle.py", "--quick"), ("scheduler_cycle",),
              "nothing (pure)", 2,
              measures=("broker/scheduler", "gpus")),
    Benchmark("scheduler_cycle_db", "the same cycle read from and written to PostgreSQL",
              ("bench/scheduler_cycle.py", "--db"), ("bench/scheduler_cycle.py", "--db", "--quick"),
              ("scheduler_cycle_db",), "PostgreSQL", 10,
              measures=("broker/scheduler", "broker/snapshot.py", "broker/services/cycle.py", "gpus")),
    Benchmark("scaleout", "leases/s with 1 worker, then 3, against 2 web servers, 2 schedulers and 100 nodes",
              ("bench/scaleout.py",), ("bench/scaleout.py", "--quick"), ("scaleout",),
              "PostgreSQL, Redis, gunicorn x2, Celery workers, beat contenders, simulated fleets", 5,
              measures=LIVE_SERVICE),
    Benchmark("pipelines", "ESG against even-split+greedy and the A* optimum on generated pipelines; planning time",
              ("bench/pipelines.py",), ("bench/pipelines.py", "--quick"), ("pipelines",), "nothing (pure)", 2,
              measures=("pipelines/planner", "gpus")),
    Benchmark("splits", "model splits: heuristic against equal layers and the DP optimum",
              ("bench/splits.py",), ("bench/splits.py", "--quick"), ("splits",), "nothing (pure)", 3,
              measures=("pipelines/planner", "gpus")),
    Benchmark("tiering", "auto-tiering on held-out architectures: cost regret and target misses by policy",
              ("bench/tiering.py", "--json", "{results}/tiering.json"),
              ("bench/tiering.py", "--quick", "--json", "{results}/tiering.json"), ("tiering",), "nothing (pure)", 18,
              measures=("tiering/engine", "gpus")),
    Benchmark("tiering_measured", "the performance model against measured GPUs (cross-validated by architecture), "
              "the tier decisions measurements change, the forest's regret and misses with the measured truth",
              ("bench/tiering.py", "--truth", "measured", "--json", "{results}/tiering_measured.json"),
              ("bench/tiering.py", "--truth", "measured", "--quick", "--json", "{results}/tiering_measured.json"),
              ("tiering_measured",), "nothing (pure)", 8,
              measures=("tiering/engine", "gpus")),
    Benchmark("device_perf", "the performance model's cases measured on the GPU at hand (eager, graph, MIG devices "
              "already enabled), the architectures it was fitted on and 24 held out",
              ("bench/device_perf.py", "--held-out", "--budget-seconds", "330", "--json",
               "{results}/device_perf.json"),
              ("bench/device_perf.py", "--dry-run", "--quick", "--json", "{results}/device_perf.json"),
              ("device_perf",), "an NVIDIA GPU, torch, transformers, torchvision", 2.5, device=True),
    Benchmark("device_perf_repeat", "the same again at once on the same GPU: the run-to-run noise of each mode",
              ("bench/device_perf.py", "--held-out", "--budget-seconds", "240", "--json",
               "{results}/device_perf_repeat.json"),
              ("bench/device_perf.py", "--dry-run", "--quick", "--json", "{results}/device_perf_repeat.json"),
              ("device_perf_repeat",), "an NVIDIA GPU, torch, transformers, torchvision", 2.5, device=True),
    Benchmark("device_perf_eager", "the eager cases alone, peak memory counted as a fresh process would",
              ("bench/device_perf.py", "--held-out", "--only-modes", "eager", "--budget-seconds", "150", "--json",
               "{results}/device_perf_eager.json"),
              ("bench/device_perf.py", "--dry-run", "--quick", "--only-modes", "eager", "--json",
               "{results}/device_perf_eager.json"),
              ("device_perf_eager",), "an NVIDIA GPU, torch, transformers, torchvision", 1.5, device=True),
    Benchmark("tiering_error", "the performance model's error against measured GPUs alone (cross-validated by "
              "architecture, no forest): seconds, where tiering_measured's forest takes most of an hour",
              ("bench/tiering.py", "--truth", "measured", "--no-forest", "--json", "{results}/tiering_error.json"),
              ("bench/tiering.py", "--truth", "measured", "--no-forest", "--json", "{results}/tiering_error.json"),
              ("tiering_error",), "nothing (pure)", 0.1,
              measures=("gpus",)),
    Benchmark("capacity_live", "warm pools in the live service: p95 time to GPU warm against cold",
              ("bench/capacity_live.py",), ("bench/capacity_live.py", "--quick"), ("capacity_live",),
              "PostgreSQL, Redis, gunicorn, Celery workers and beat, a simulated fleet", 9,
              measures=(*LIVE_SERVICE, "capacity", "bench/leasing.py")),
)


def by_name() -> dict[str, Benchmark]:
    return {bench.name: bench for bench in BENCHMARKS}


def results_files() -> set[str]:
    """Every results file a full run of every benchmark writes (stems)."""
    return {name for bench in BENCHMARKS for name in bench.results}


def staleness() -> list:
    """The freshness of every registered results file (``bench/staleness.py``), in the order of ``BENCHMARKS``."""
    from bench.record import RESULTS
    from bench.staleness import results_freshness

    return [results_freshness(name, root=ROOT, results=RESULTS, sources=bench.sources())
            for bench in BENCHMARKS for name in bench.results]


def run(selected: list[Benchmark], quick: bool) -> int:
    results = ROOT / "bench" / "results" / ("quick" if quick else "")
    results.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "BENCH_RESULTS_DIR": str(results), "PYTHONUNBUFFERED": "1"}
    outcome = []
    for bench in selected:
        argv = [sys.executable, *bench.argv(quick, results)]
        print(f"\n== {bench.name}: {' '.join(argv[1:])}", flush=True)
        began = time.monotonic()
        code = subprocess.run(argv, cwd=ROOT, env=env, check=False).returncode
        outcome.append((bench.name, code, time.monotonic() - began))
    print("\n== summary (results in " + str(results.relative_to(ROOT)) + ")")
    for name, code, seconds in outcome:
        print(f"  {name:16} {'ok' if code == 0 else f'FAILED (exit {code})':18} {seconds:8.1f} s")
    return 0 if all(code == 0 for _, code, _ in outcome) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the benchmarks")
    everything = sub.add_parser("all", help="run every benchmark")
    everything.add_argument("--quick", action="store_true", help="smoke sizes, results in bench/results/quick/")
    some = sub.add_parser("run", help="run the named benchmarks")
    some.add_argument("names", nargs="+", choices=sorted(by_name()))
    some.add_argument("--quick", action="store_true", help="smoke sizes, results in bench/results/quick/")
    docs = sub.add_parser("docs", help="rewrite the docs' tables from the results files")
    docs.add_argument("--check", action="store_true", help="change nothing; exit 1 where a table differs")
    sub.add_parser("stale", help="results files older than the code they measure (exit 1: a commit not in history)")
    args = parser.parse_args(argv)
    if args.command == "list":
        for bench in BENCHMARKS:
            print(f"{bench.name:16} ~{bench.minutes:g} min  {bench.about}\n{'':16} needs: {bench.needs}\n"
                  f"{'':16} writes: {', '.join(f'{r}.json' for r in bench.results)}")
        return 0
    if args.command == "docs":
        from bench.docs import update

        changed = update(check=args.check)
        for line in changed:
            print(("differs: " if args.check else "rewrote: ") + line)
        if not args.check:  # the tables just marked: say which files, and why
            for state in staleness():
                if state.state not in ("fresh", "unknown"):
                    print(state.line())
        return 1 if (args.check and changed) else 0
    if args.command == "stale":
        states = staleness()
        for state in states:
            print(state.line())
        return 1 if any(state.state == "missing" for state in states) else 0
    if args.command == "all":
        selected = [bench for bench in BENCHMARKS if not bench.device or args.quick]
        for bench in BENCHMARKS:
            if bench not in selected:
                print(f"{bench.name}: needs a GPU ({bench.needs}); run `python -m bench run {bench.name}` on one")
    else:
        selected = [by_name()[name] for name in args.names]
    return run(selected, args.quick)


if __name__ == "__main__":
    sys.exit(main())
