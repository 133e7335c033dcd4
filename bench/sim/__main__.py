"""Trace simulator driving the scheduling core.

    python -m bench.sim fragmentation --trace all --json-dir bench/results [--quick] [--jobs 2]
    python -m bench.sim fragmentation --nodes NODES.csv --pods PODS.csv --policy NAME[,NAME…] \
        --seeds 42-51 --json OUT.json [--plot OUT.png]
    python -m bench.sim quota --jobs JOBS.csv --load 0.8 --policy static|fifo|ours --json OUT.json
    python -m bench.sim capacity --loop off|advise|auto|all --days 30 --json-dir bench/results
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench.sim import fragmentation


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
    from bench.record import write  # the benchmarks' one results format (the tree as found now, before the runs)

    parser = argparse.ArgumentParser(prog="python -m bench.sim fragmentation",
                                     description=fragmentation.__doc__)
    parser.add_argument("--trace", help="openb trace(s) by name, comma-separated, or 'all' "
                        f"({', '.join(fragmentation.TRACES)}); overrides --pods")
    parser.add_argument("--nodes", type=Path, default=fragmentation.OPENB / "openb_node_list_gpu_node.csv")
    parser.add_argument("--pods", type=Path, default=fragmentation.OPENB / "openb_pod_list_default.csv")
    parser.add_argument("--policy", default="default,fgd", help="one or more, comma-separated")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--quick", action="store_true",
                        help="seed 42 only (under 2 minutes for all traces with --jobs 2); "
                        "results files get a _quick suffix")
    parser.add_argument("--json", type=Path, help="write the summaries here (one trace; a list when several policies)")
    parser.add_argument("--json-dir", type=Path, help="write one results file per trace here (bench.record): "
                        "openb_<trace>.json with every policy's figures per seed and the published FGD figure")
    parser.add_argument("--plot", type=Path, help="PNG of allocation ratio vs arrived workload (one trace)")
    parser.add_argument("--jobs", type=int, default=1, help="parallel seed runs (processes)")
    parser.add_argument("--table", type=Path, metavar="DIR",
                        help="print the Markdown table of the openb_<trace>.json results files in DIR and exit")
    args = parser.parse_args(argv)
    if args.table:
        print(fragmentation.results_table(args.table))
        return 0
    if args.trace:
        names = list(fragmentation.TRACES) if args.trace == "all" else args.trace.split(",")
        unknown = [name for name in names if not (fragmentation.OPENB / f"openb_pod_list_{name}.csv").is_file()]
        if unknown:
            parser.error(f"no such trace: {', '.join(unknown)}")
        traces = [(name, fragmentation.OPENB / f"openb_pod_list_{name}.csv") for name in names]
    else:
        traces = [(args.pods.stem.removeprefix("openb_pod_list_"), args.pods)]
    for path in (args.nodes, *(pods for _, pods in traces)):
        if not path.is_file():
            parser.error(f"no such file: {path}")
    if (args.json or args.plot) and len(traces) > 1:
        parser.error("--json and --plot take one trace; use --json-dir for several")
    policies = args.policy.split(",")
    seeds = [42] if args.quick else _seeds(args.seeds)
    # every (trace, policy, seed) run in one pool, so that --jobs keeps its processes busy across traces
    work = [(str(args.nodes), str(pods), policy, seed) for _, pods in traces for policy in policies for seed in seeds]
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            done = list(pool.map(_run, work))
    else:
        done = [_run(item) for item in work]
    by_run = {(pods, policy, seed): result for (_, pods, policy, seed), result in zip(work, done, strict=True)}
    for name, pods in traces:
        summaries = [fragmentation.summarise(policy, args.nodes, pods,
                                             [by_run[(str(pods), policy, seed)] for seed in seeds])
                     for policy in policies]
        published = fragmentation.published_fgd(name)
        print(f"openb fragmentation: {pods.name}, seeds {','.join(map(str, seeds))}; published FGD at 130%: "
              f"{published if published is not None else '-'}")
        print(f"{'policy':<12} {'alloc@100%':>10} {'alloc@130%':>10} {'vs publ.':>8} {'unalloc GPUs':>13} "
              f"{'failed/seed':>11} {'s/seed':>7} {'CPU s/seed':>10}")
        for summary in summaries:
            ratio = summary["alloc_ratio"]
            lead = f"{summary['alloc_at_130'] - published:+.2f}" if published is not None else "-"
            print(f"{summary['policy']:<12} {ratio['100']:>10.2f} {summary['alloc_at_130']:>10.2f} {lead:>8} "
                  f"{summary['unallocated_gpus_at_130']:>13.1f} {summary['failed_tasks_per_seed']:>11.1f} "
                  f"{summary['seconds_per_seed']:>7.1f} {summary['cpu_seconds_per_seed']:>10.1f}")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(summaries[0] if len(summaries) == 1 else summaries, indent=1))
        if args.plot:
            plot_alloc(summaries, args.plot, title=f"openb {name}")
        if args.json_dir:
            figures = {
                "trace": name,
                "published_fgd_alloc_at_130": published,
                "policies": {summary["policy"]: summary for summary in summaries},
            }
            if published is not None:
                figures["lead_over_published_fgd"] = {s["policy"]: round(s["alloc_at_130"] - published, 3)
                                                      for s in summaries}
            settings = {"trace": name, "nodes": args.nodes, "pods": pods, "policies": policies, "seeds": seeds,
                        "quick": args.quick, "jobs": args.jobs}
            write(f"openb_{name}", figures, settings=settings, directory=args.json_dir)
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
        from bench.sim.quota import main_quota

        return main_quota(rest)
    if command == "capacity":
        from bench.sim.capacity import main_capacity

        return main_capacity(rest)
    print(f"unknown command {command!r}; use fragmentation, quota or capacity", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
