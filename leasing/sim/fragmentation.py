"""The openb fragmentation experiment, by the published method (USENIX ATC 2023, FGD).

Tasks are drawn with replacement from the task list until their summed GPU request reaches 130% of the
cluster's GPU capacity, in a seeded order; each is placed once through the scheduling core
(``Scheduler.place``, the same code as the live service) and never retried. After each task the GPU
allocation ratio is recorded against the arrived workload (0..130%).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

from leasing.scheduler.placement import workload_from_needs
from leasing.scheduler.plan import Scheduler
from leasing.scheduler.types import Request, Snapshot
from leasing.sim.openb import Task, load_nodes, load_tasks

ARRIVED_MAX = 130


@dataclass
class SeedResult:
    seed: int
    ratio_by_arrived: dict[int, float]  # arrived % -> allocation ratio (0..1)
    unallocated_gpus: float
    seconds: float
    tasks: int
    failed: int


def draw(tasks: list[Task], capacity_milli: int, seed: int) -> list[Task]:
    rng = random.Random(seed)
    drawn, total = [], 0
    while total < ARRIVED_MAX / 100 * capacity_milli:
        task = tasks[rng.randrange(len(tasks))]
        drawn.append(task)
        total += task.gpu_milli
    return drawn


def run_seed(nodes_csv: Path, pods_csv: Path, policy: str, seed: int) -> SeedResult:
    nodes, gpus = load_nodes(nodes_csv)
    tasks = load_tasks(pods_csv)
    snapshot = Snapshot(nodes=nodes, gpus=gpus, enforce_quotas=False)
    workload = workload_from_needs([task.need for task in tasks])
    scheduler = Scheduler(snapshot, policy=policy, seed=seed, workload=workload)
    capacity = sum(scheduler.cluster.capacity_milli_by_model.values())
    started = time.perf_counter()
    arrived = allocated = failed = 0
    ratios: dict[int, float] = {0: 0.0}
    next_mark = 1
    sequence = draw(tasks, capacity, seed)
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
                      failed)


def summarise(policy: str, nodes_csv: Path, pods_csv: Path, results: list[SeedResult]) -> dict:
    marks = sorted(results[0].ratio_by_arrived)
    return {
        "policy": policy,
        "nodes": str(nodes_csv),
        "pods": str(pods_csv),
        "seeds": [r.seed for r in results],
        "alloc_ratio": {str(m): round(sum(r.ratio_by_arrived[m] for r in results) / len(results) * 100, 3)
                        for m in marks},
        "unallocated_gpus_at_130": round(sum(r.unallocated_gpus for r in results) / len(results), 1),
        "seconds_per_seed": round(sum(r.seconds for r in results) / len(results), 2),
        "failed_tasks_per_seed": round(sum(r.failed for r in results) / len(results), 1),
    }
