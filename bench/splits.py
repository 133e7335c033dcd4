"""The split planner against equal-layers and the dynamic-programming optimum, on real architectures.

    .venv/bin/python bench/splits.py [--fleets 30] [--seed 1] [--quick]

Models: GPT-2 XL, Llama-2 7B / 13B / 70B and BERT-large (layer tables computed from their published
configurations by ``leasing.pipelines.architectures``), batch 1 and 4, 512-token prompts (BERT: 128).
Fleets: 3 to 6 candidate GPUs (H100-80GB, A100-40GB, A100-80GB, L4) over 2 or 3 nodes, each GPU with
0-60 % of its memory already taken (the free memory a live fleet offers). For each case: the heuristic,
equal layers (the GPUs in the order listed) and the optimum (dynamic programming); latency (compute +
transfers), idle memory on the GPUs used, the objective, whether a split was found, planning time.
Writes bench/results/splits.json (command, commit, date, machine).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpus.catalogue import model_get
from leasing.pipelines.architectures import architecture
from leasing.pipelines.splits import SplitGpu, plan_equal_layers, plan_split, plan_split_optimal
from leasing.sim.capacity import _commit, _machine

ARCHS = ("gpt2_xl", "bert_large", "llama2_7b", "llama2_13b", "llama2_70b")
GPU_MODELS = ("H100-80GB", "A100-40GB", "A100-80GB", "L4")
RESULTS = Path(__file__).resolve().parent / "results"


def fleet(rng: random.Random) -> list[SplitGpu]:
    gpus = []
    nodes = rng.randint(2, 3)
    for index in range(rng.randint(3, 6)):
        model = model_get(rng.choice(GPU_MODELS))
        free = int(model.memory_mib * (1.0 - rng.uniform(0.0, 0.6)))
        gpus.append(SplitGpu(f"g{index}", f"node{rng.randrange(nodes)}", model.code, free, model.nvlink))
    return gpus


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fleets", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="a smoke run (5 fleets)")
    parser.add_argument("--out", type=Path, default=RESULTS / "splits.json")
    args = parser.parse_args()
    if args.quick:
        args.fleets = 5
    rng = random.Random(args.seed)
    began = time.perf_counter()
    rows = []
    fleets = [fleet(rng) for _ in range(args.fleets)]
    for name in ARCHS:
        arch = architecture(name)
        for batch in (1, 4):
            for number, gpus in enumerate(fleets):
                row = {"model": name, "batch": batch, "fleet": number, "gpus": len(gpus)}
                for method, planner in (("heuristic", plan_split), ("equal_layers", plan_equal_layers),
                                        ("optimal", plan_split_optimal)):
                    split = planner(arch.layers, gpus, batch)
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
    both = [r for r in rows if r["heuristic"]["feasible"] and r["equal_layers"]["feasible"]]
    if both:
        summary["equal_layers_over_heuristic"] = {
            "compared": len(both),
            "latency_mean": round(statistics.mean(r["equal_layers"]["latency_ms"] / r["heuristic"]["latency_ms"]
                                                  for r in both), 4),
            "idle_gib_mean_equal": round(statistics.mean(r["equal_layers"]["idle_mib"] for r in both) / 1024, 2),
            "idle_gib_mean_heuristic": round(statistics.mean(r["heuristic"]["idle_mib"] for r in both) / 1024, 2),
        }
    wall = time.perf_counter() - began
    document = {"command": " ".join(["python", "bench/splits.py", *sys.argv[1:]]), "commit": _commit(),
                "date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": _machine(),
                "note": "shared machine (2 cores, other engineers' tests running): planning times are upper bounds",
                "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                "wall_seconds": round(wall, 1), "summary": summary, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"wrote {args.out} in {wall:.1f} s (shared machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
