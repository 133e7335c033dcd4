"""The split planner against equal-layers and the dynamic-programming optimum, on real architectures.

    .venv/bin/python bench/splits.py [--fleets 30] [--seed 1] [--quick]

Models: GPT-2 XL, BERT-large, Llama-2 7B / 13B and Llama-3 8B (the catalogue's architectures, ``gpus.architectures``,
as layer tables by ``gpus.layers``; each layer's time by the calibrated roofline of ``gpus.performance``), batch 1
and 4, 512-token prompts.
Fleets: 3 to 6 candidate GPUs (A100-40GB, L4, A10, T4: no 80 GB part) over 2 or 3 nodes, each GPU with
20-80 % of its memory already taken (the free memory a live fleet offers), so the larger models must be split.
The summary also compares the methods on the cases whose optimum uses two GPUs or more (``multi_gpu``).
For each case: the heuristic, equal layers (the GPUs in the order listed) and the optimum (dynamic
programming); latency (compute + transfers), idle memory on the GPUs used, the objective, whether a split was
found, planning time.
Writes bench/results/splits.json through ``bench.record`` (``--quick``: bench/results/quick/, which git ignores).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.record import write
from gpus.catalogue import model_get
from gpus.layers import layers_of
from pipelines.planner.splits import SplitGpu, plan_equal_layers, plan_split, plan_split_optimal

ARCHS = ("gpt2-xl", "bert-large", "llama-2-7b", "llama-3-8b", "llama-2-13b")
GPU_MODELS = ("A100-40GB", "L4", "A10", "T4")


def fleet(rng: random.Random) -> list[SplitGpu]:
    gpus = []
    nodes = rng.randint(2, 3)
    for index in range(rng.randint(3, 6)):
        model = model_get(rng.choice(GPU_MODELS))
        free = int(model.memory_mib * (1.0 - rng.uniform(0.2, 0.8)))
        gpus.append(SplitGpu(f"g{index}", f"node{rng.randrange(nodes)}", model.code, free, model.nvlink))
    return gpus


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fleets", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="a smoke run (5 fleets)")
    args = parser.parse_args()
    if args.quick:
        args.fleets = 5
    rng = random.Random(args.seed)
    began = time.perf_counter()
    cpu = time.process_time()
    rows = []
    fleets = [fleet(rng) for _ in range(args.fleets)]
    for name in ARCHS:
        layers = layers_of(name)
        for batch in (1, 4):
            for number, gpus in enumerate(fleets):
                row = {"model": name, "batch": batch, "fleet": number, "gpus": len(gpus)}
                for method, planner in (("heuristic", plan_split), ("equal_layers", plan_equal_layers),
                                        ("optimal", plan_split_optimal)):
                    split = planner(layers, gpus, batch)
                    row[method] = {"feasible": split.feasible,
                                   "latency_ms": split.latency_ms if split.feasible else None,
                                   "idle_mib": split.idle_mib if split.feasible else None,
                                   "objective": split.objective if split.feasible else None,
                                   "gpus_used": len(split.groups), "seconds": split.seconds}
                rows.append(row)
    summary = {}
    for method in ("heuristic", "equal_layers", "optimal"):
        summary[method] = {
            "found": round(sum(r[method]["feasible"] for r in rows) / len(rows), 4),
            "seconds_mean": round(statistics.mean(r[method]["seconds"] for r in rows), 5),
            "seconds_max": round(max(r[method]["seconds"] for r in rows), 5),
        }
    for method in ("heuristic", "equal_layers"):
        both = [r for r in rows if r[method]["feasible"] and r["optimal"]["feasible"]]
        if not both:
            continue
        summary[method] |= {
            "compared": len(both),
            "latency_over_optimal_mean": round(statistics.mean(r[method]["latency_ms"] / r["optimal"]["latency_ms"]
                                                               for r in both), 4),
            "objective_over_optimal_mean": round(statistics.mean(r[method]["objective"] / r["optimal"]["objective"]
                                                                 for r in both), 4),
            "objective_over_optimal_max": round(max(r[method]["objective"] / r["optimal"]["objective"]
                                                    for r in both), 4),
            "idle_gib_mean": round(statistics.mean(r[method]["idle_mib"] for r in both) / 1024, 2),
            "optimal_idle_gib_mean": round(statistics.mean(r["optimal"]["idle_mib"] for r in both) / 1024, 2),
            "equal_to_optimal": round(sum(r[method]["objective"] <= r["optimal"]["objective"] * (1 + 1e-9)
                                          for r in both) / len(both), 4),
        }
    multi = [r for r in rows if r["optimal"]["feasible"] and r["optimal"]["gpus_used"] >= 2]
    summary["multi_gpu"] = {"cases": len(multi), "share_of_cases": round(len(multi) / len(rows), 4)}
    for method in ("heuristic", "equal_layers"):
        mine = [r for r in multi if r[method]["feasible"]]
        summary["multi_gpu"][method] = {
            "found": round(len(mine) / len(multi), 4) if multi else None,
            "objective_over_optimal_mean": round(statistics.mean(r[method]["objective"] / r["optimal"]["objective"]
                                                                 for r in mine), 4) if mine else None,
            "latency_over_optimal_mean": round(statistics.mean(r[method]["latency_ms"] / r["optimal"]["latency_ms"]
                                                               for r in mine), 4) if mine else None,
            "equal_to_optimal": round(sum(r[method]["objective"] <= r["optimal"]["objective"] * (1 + 1e-9)
                                          for r in mine) / len(mine), 4) if mine else None}
    both = [r for r in rows if r["heuristic"]["feasible"] and r["equal_layers"]["feasible"]]
    if both:
        summary["equal_layers_over_heuristic"] = {
            "compared": len(both),
            "latency_mean": round(statistics.mean(r["equal_layers"]["latency_ms"] / r["heuristic"]["latency_ms"]
                                                  for r in both), 4),
            "idle_gib_mean_equal": round(statistics.mean(r["equal_layers"]["idle_mib"] for r in both) / 1024, 2),
            "idle_gib_mean_heuristic": round(statistics.mean(r["heuristic"]["idle_mib"] for r in both) / 1024, 2),
        }
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    print(json.dumps(summary, indent=1))
    write("splits",
          {"summary": summary, "wall_seconds": round(wall, 1), "cpu_seconds": round(cpu, 1),
           "note": "shared machine (2 cores, other engineers' tests running): planning times are upper bounds",
           "rows": rows}, settings=vars(args), quick=args.quick)
    print(f"{wall:.1f} s wall, {cpu:.1f} s CPU (shared machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
