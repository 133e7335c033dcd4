"""The openb fragmentation experiment, by the published method (USENIX ATC 2023, FGD).

The arrival sequence is the authors' (kubernetes-scheduler-simulator, ``shufflePod`` with a workload tuning
ratio of 1.3): the task list, sorted by name, is shuffled once with the seed; when its summed GPU request
exceeds 130% of the cluster's GPU capacity, tasks at random positions are removed until it does not; when
it falls short, tasks drawn at random from the list are appended while the total stays within 130%. The
nodes are then put in an order shuffled with the same seed (the authors prefix each node name with its
place in a random permutation), and a node id here carries that prefix, so the scheduling core's
"lowest node id wins a tie" breaks ties in the seed's node order, as the authors' simulator does.

Each task is placed once through the scheduling core (``Scheduler.place``, the same code as the live
service) and never retried. After each task the GPU allocation ratio is recorded against the arrived
workload (0..130%).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, replace
from pathlib import Path

from bench.sim.openb import Task, load_nodes, load_tasks
from broker.scheduler.placement import workload_from_needs
from broker.scheduler.plan import Scheduler
from broker.scheduler.state import FULL
from broker.scheduler.types import Gpu, Node, Request, Snapshot

ARRIVED_MAX = 130


@dataclass
class SeedResult:
    seed: int
    ratio_by_arrived: dict[int, float]  # arrived % -> allocation ratio (0..1)
    unallocated_gpus: float
    seconds: float
    tasks: int
    failed: int
    cpu_seconds: float = 0.0


def arrival(tasks: list[Task], capacity_milli: int, rng: random.Random) -> list[Task]:
    """The authors' arrival sequence: the list shuffled once, then trimmed or topped up to 130%."""
    ordered = sorted(tasks, key=lambda task: task.name)
    sequence = list(ordered)
    rng.shuffle(sequence)
    target = ARRIVED_MAX / 100 * capacity_milli
    total = sum(task.gpu_milli for task in sequence)
    if total > target:  # trim: drop tasks at random positions
        while total > target:
            total -= sequence.pop(rng.randrange(len(sequence))).gpu_milli
        return sequence
    while True:  # top up: append random tasks of the list while the total stays within the target
        task = ordered[rng.randrange(len(ordered))]
        if total + task.gpu_milli > target:
            break
        sequence.append(task)
        total += task.gpu_milli
    return sequence


def shuffle_nodes(nodes: tuple[Node, ...], gpus: tuple[Gpu, ...], rng: random.Random):
    """Node ids prefixed with their place in a random permutation (``0042-openb-node-0007``), so that the
    lowest id is the first node of the seed's order, and the GPUs renamed to match."""
    ordered = sorted(nodes, key=lambda node: node.id)
    permutation = list(range(len(ordered)))
    rng.shuffle(permutation)
    names = {node.id: f"{rank:04d}-{node.id}" for node, rank in zip(ordered, permutation, strict=True)}
    renamed_nodes = tuple(replace(node, id=names[node.id]) for node in nodes)
    renamed_gpus = tuple(replace(gpu, id=f"{names[gpu.node]}/{gpu.index}", node=names[gpu.node]) for gpu in gpus)
    return renamed_nodes, renamed_gpus


def run_seed(nodes_csv: Path, pods_csv: Path, policy: str, seed: int) -> SeedResult:
    started, cpu_started = time.perf_counter(), time.process_time()
    nodes, gpus = load_nodes(nodes_csv)
    tasks = load_tasks(pods_csv)
    rng = random.Random(seed)
    capacity = sum(FULL for _ in gpus)
    sequence = arrival(tasks, capacity, rng)
    nodes, gpus = shuffle_nodes(nodes, gpus, rng)
    snapshot = Snapshot(nodes=nodes, gpus=gpus, enforce_quotas=False)
    workload = workload_from_needs([task.need for task in tasks])
    scheduler = Scheduler(snapshot, policy=policy, seed=seed, workload=workload)
    assert capacity == sum(scheduler.cluster.capacity_milli_by_model.values())
    arrived = allocated = failed = 0
    ratios: dict[int, float] = {0: 0.0}
    next_mark = 1
    for index, task in enumerate(sequence):
        request = Request(f"t{index}", "sim", "sim", shape=None)  # type: ignore[arg-type]
        decision = scheduler.place(request, "", task.need, preemptible=False, now=float(index))
        if decision is None:
            failed += 1
        else:
            allocated += task.gpu_milli
        arrived += task.gpu_milli
        while next_mark <= ARRIVED_MAX and arrived >= next_mark / 100 * capacity:
            ratios[next_mark] = allocated / capacity
            next_mark += 1
    while next_mark <= ARRIVED_MAX:
        ratios[next_mark] = allocated / capacity
        next_mark += 1
    return SeedResult(seed, ratios, (capacity - allocated) / 1000, time.perf_counter() - started, len(sequence),
                      failed, time.process_time() - cpu_started)


def summarise(policy: str, nodes_csv: Path, pods_csv: Path, results: list[SeedResult]) -> dict:
    marks = sorted(results[0].ratio_by_arrived)
    count = len(results)
    return {
        "policy": policy,
        "nodes": str(nodes_csv),
        "pods": str(pods_csv),
        "seeds": [r.seed for r in results],
        "alloc_at_130_by_seed": [round(r.ratio_by_arrived[ARRIVED_MAX] * 100, 3) for r in results],
        "alloc_at_130": round(sum(r.ratio_by_arrived[ARRIVED_MAX] for r in results) / count * 100, 3),
        "alloc_ratio": {str(m): round(sum(r.ratio_by_arrived[m] for r in results) / count * 100, 3) for m in marks},
        "unallocated_gpus_at_130": round(sum(r.unallocated_gpus for r in results) / count, 1),
        "failed_tasks_per_seed": round(sum(r.failed for r in results) / count, 1),
        "seconds_per_seed": round(sum(r.seconds for r in results) / count, 2),
        "cpu_seconds_per_seed": round(sum(r.cpu_seconds for r in results) / count, 2),
        "seconds_by_seed": [round(r.seconds, 2) for r in results],
        "cpu_seconds_by_seed": [round(r.cpu_seconds, 2) for r in results],
    }


OPENB = Path("bench/traces/openb")
TRACES = ("default", "multigpu20", "multigpu30", "gpushare20", "gpushare40", "gpushare60", "gpushare80", "gpuspec10",
          "gpuspec20")


def published_fgd(trace: str, path: Path = OPENB / "fgd-published.csv") -> float | None:
    """FGD's allocation ratio at 130% arrived as published for ``trace`` (USENIX ATC 2023), None if not given."""
    import csv

    with path.open() as handle:
        for row in csv.DictReader(handle):
            if row["trace"] == trace:
                return float(row["FGD"])
    return None


def results_table(directory: Path) -> str:
    """The Markdown table of docs/scheduling.md, made from the ``openb_<trace>.json`` results files."""
    import json

    rows = ["| trace | default | fgd (faithful) | FGD published | default − published | target (published + 0.5) "
            "| unallocated GPUs default / fgd | CPU s per seed default / fgd |",
            "|---|---|---|---|---|---|---|---|"]
    for trace in TRACES:
        path = Path(directory) / f"openb_{trace}.json"
        if not path.is_file():
            continue
        figures = json.loads(path.read_text())["figures"]
        default, fgd = figures["policies"]["default"], figures["policies"]["fgd"]
        published = figures["published_fgd_alloc_at_130"]
        if published is None:
            lead = target = "—"
            shown = "—"
        else:
            shown = f"{published:.2f}"
            lead = f"{default['alloc_at_130'] - published:+.2f}"
            met = default["alloc_at_130"] >= published + 0.5
            target = f"{published + 0.5:.2f} {'met' if met else '**missed**'}"
        rows.append(f"| {trace} | {default['alloc_at_130']:.2f} | {fgd['alloc_at_130']:.2f} | {shown} | {lead} "
                    f"| {target} | {default['unallocated_gpus_at_130']:.0f} / {fgd['unallocated_gpus_at_130']:.0f} "
                    f"| {default['cpu_seconds_per_seed']:.1f} / {fgd['cpu_seconds_per_seed']:.1f} |")
    return "\n".join(rows)
