"""Trace simulator driving the scheduling core.

    python -m leasing.sim fragmentation --nodes NODES.csv --pods PODS.csv --policy NAME[,NAME…] \
        --seeds 42-51 --json OUT.json [--plot OUT.png]
    python -m leasing.sim quota --jobs JOBS.csv --load 0.8 --policy static|fifo|ours --json OUT.json
    python -m leasing.sim capacity --loop off|advise|auto|all --days 30 --json-dir bench/results
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from leasing.sim import fragmentation


def _seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        if "-" in part:
            low, high = part.split("-")
            seeds.extend(range(int(low), int(high) + 1))
        else:
            seeds.append(int(part))
    return seeds


def _run(args: tuple) -> fragmentation.SeedResult:
    nodes, pods, policy, seed = args
    return fragmentation.run_seed(Path(nodes), Path(pods), policy, seed)


def main_fragmentation(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m leasing.sim fragmentation",
                                     description=fragmentation.__doc__)
    parser.add_argument("--nodes", type=Path, default=Path("bench/traces/openb/openb_node_list_gpu_node.csv"))
    parser.add_argument("--pods", type=Path, default=Path("bench/traces/openb/openb_pod_list_default.csv"))
    parser.add_argument("--policy", default="default", help="one or more, comma-separated")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--json", type=Path, help="write the results here (a list when several policies)")
    parser.add_argument("--plot", type=Path, help="PNG of allocation ratio vs arrived workload")
    parser.add_argument("--jobs", type=int, default=1, help="parallel seed runs (processes)")
    args = parser.parse_args(argv)
    for path in (args.nodes, args.pods):
        if not path.is_file():
            parser.error(f"no such file: {path}")
    policies = args.policy.split(",")
    seeds = _seeds(args.seeds)
    summaries = []
    for policy in policies:
        work = [(str(args.nodes), str(args.pods), policy, seed) for seed in seeds]
        if args.jobs > 1:
            with ProcessPoolExecutor(args.jobs) as pool:
                results = list(pool.map(_run, work))
        else:
            results = [_run(item) for item in work]
        summaries.append(fragmentation.summarise(policy, args.nodes, args.pods, results))
    print(f"openb fragmentation: {args.pods.name}, seeds {args.seeds}")
    print(f"{'policy':<12} {'alloc@100%':>10} {'alloc@110%':>10} {'alloc@130%':>10} {'unalloc GPUs':>13} "
          f"{'failed/seed':>11} {'s/seed':>7}")
    for summary in summaries:
        ratio = summary["alloc_ratio"]
        print(f"{summary['policy']:<12} {ratio['100']:>10.2f} {ratio['110']:>10.2f} {ratio['130']:>10.2f} "
              f"{summary['unallocated_gpus_at_130']:>13.1f} {summary['failed_tasks_per_seed']:>11.1f} "
              f"{summary['seconds_per_seed']:>7.1f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summaries[0] if len(summaries) == 1 else summaries, indent=1))
    if args.plot:
        plot_alloc(summaries, args.plot, title=f"openb {args.pods.stem.removeprefix('openb_pod_list_')}")
    return 0


def plot_alloc(summaries: list[dict], path: Path, *, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.2), dpi=120)
    for summary in summaries:
        marks = sorted(int(k) for k in summary["alloc_ratio"])
        axis.plot(marks, [summary["alloc_ratio"][str(m)] for m in marks],
                  label=f"{summary['policy']} ({summary['alloc_ratio']['130']:.2f}%)")
    axis.set_xlabel("arrived workload (% of GPU capacity)")
    axis.set_ylabel("GPU allocation ratio (%)")
    axis.set_xlim(60, 130)
    axis.set_ylim(60, 100)
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right")
    axis.set_title(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "fragmentation":
        return main_fragmentation(rest)
    if command == "quota":
        from leasing.sim.quota import main_quota

        return main_quota(rest)
    if command == "capacity":
        from leasing.sim.capacity import main_capacity

        return main_capacity(rest)
    print(f"unknown command {command!r}; use fragmentation, quota or capacity", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
