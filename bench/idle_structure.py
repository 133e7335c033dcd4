"""How the capacity replay's idle GPU-hours are shaped, and what any idle reclaim could remove from them.

    python bench/idle_structure.py            # the month at load 0.8 -> bench/results/idle_structure.json
    python bench/idle_structure.py --quick    # half a day -> bench/results/quick/

Issue 30 asks that ``auto`` (with suspension of resumable idle training) at least halve ``off``'s idle allocated
GPU-hours. Three waves measured +1.0 % to +2.2 %. This benchmark asks the question the replay cannot answer by
running: how much of the month's idle time is *reachable* by a rule that acts after a lease has been idle for a
window (the planner's idle rules: a trailing window of samples under the threshold, then a notice)?

It takes the month's jobs exactly as ``bench.sim.capacity.Replay`` builds them (the same trace window, classes,
shapes, GenAI series and offsets) and walks each job's series over its run inside the window as if it started on
arrival (what the baseline ``off`` nearly does: it starts 45,657 of 46,205 jobs). For each job it finds the
maximal stretches of idle samples (under 5 % engine activity, the replay's ``IDLE_PCT``; and at exactly 0 %, the
strict measure of the published Philly study cited in docs/capacity.md). A rule that acts after ``W`` minutes of
idle (window plus notice) can at most remove the idle minutes beyond ``W`` of each stretch — and only if a
suspended job, once resumed, skipped the rest of the stretch it was suspended in (the replay assumes it does not:
the job resumes where it stopped). So ``reachable_share[W]`` is an **upper bound** on what any idle reclaim or
suspension with that window could cut, however the loop is tuned; it is computed from the work alone, not from a
run of the loop, and says so.

The figures' truth is the replay's own model of utilisation (the GenAI series given to Philly jobs), not a
measurement of training jobs: docs/capacity.md sets it beside the published Philly telemetry.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.sim.capacity import FULL, IDLE_PCT, Replay  # noqa: E402

WINDOWS_MIN = (5, 10, 15, 20, 30, 45, 60, 90, 120)  # idle window + notice, minutes
# the rules as the replay's ``auto`` applies them (capacity.planner.types.DEFAULT_IDLE_RULES and the replay's
# training rule): window + notice in minutes, and what the step does to the rest of the lease
RULES = {
    "training suspended (60 min under 5 %, 30 min notice; requeued)": 90,
    "over-quota preempted (15 min, 5 min notice; requeued)": 20,
    "interactive released (30 min, 15 min notice; the session ends)": 45,
}
STRETCH_BUCKETS = ((0, 10), (10, 30), (30, 60), (60, 120), (120, 360), (360, 10**9))  # minutes
DURATION_BUCKETS = (("under 6 h", 0, 6 * 3600), ("6 to 24 h", 6 * 3600, 86400), ("24 h and more", 86400, 10**12))


def _bucket_label(low: int, high: int) -> str:
    if high >= 10**9:
        return f"{low // 60} h and more"
    if low >= 60:
        return f"{low // 60} to {high // 60} h"
    return f"{low} to {high} min"


def walk(util: list[int], offset: int, minutes: int, threshold: int) -> tuple[list[int], int]:
    """The idle stretches (lengths in minutes, each clipped to the run) and the idle minutes of a run of
    ``minutes`` from ``offset`` through ``util`` (cyclic): a sample is idle when under ``threshold`` %, or at 0 %
    when ``threshold`` is 0."""
    length = len(util)
    stretches, run, idle = [], 0, 0
    for i in range(minutes):
        value = util[(offset + i) % length]
        if value < threshold or (threshold == 0 and value == 0):
            run += 1
        elif run:
            stretches.append(run)
            idle += run
            run = 0
    if run:
        stretches.append(run)
        idle += run
    return stretches, idle


def measure(days: float, load_factor: float) -> dict:
    replay = Replay(loop="off", days=days, load_factor=load_factor, tick=300.0, cold_mig=30.0, cold_whole=10.0,
                    warm_bind=0.5, price_minor=420, history_hours=6.0, queue_cap=64, start_day=20.0)
    work: Counter = Counter()  # GPU-minutes of each class's runs inside the window
    idle: Counter = Counter()  # idle GPU-minutes (under IDLE_PCT)
    idle_zero: Counter = Counter()  # idle GPU-minutes at exactly 0 %
    by_duration: Counter = Counter()
    by_duration_idle: Counter = Counter()
    by_duration_zero: Counter = Counter()
    stretch_minutes: Counter = Counter()  # idle GPU-minutes by the length of the stretch they are in
    beyond = Counter()  # W -> idle GPU-minutes beyond W minutes of their stretch
    rule_reach = Counter()  # the replay's auto rules applied by class (and over quota for every lease)
    stretches_total = 0
    for job in replay.jobs:
        minutes = int(max(0.0, min(job.remaining, replay.end - job.arrival)) // 60)
        if minutes <= 0:
            continue
        gpus = replay._unit_milli(job.shape) * job.shape.count / FULL
        util = replay.series[job.series][0]
        stretches, idle_min = walk(util, job.offset, minutes, IDLE_PCT)
        _, zero_min = walk(util, job.offset, minutes, 0)
        klass = job.klass.value
        work[klass] += gpus * minutes
        idle[klass] += gpus * idle_min
        idle_zero[klass] += gpus * zero_min
        if klass == "training":
            label = next(lab for lab, low, high in DURATION_BUCKETS if low <= job.remaining < high)
            by_duration[label] += gpus * minutes
            by_duration_idle[label] += gpus * idle_min
            by_duration_zero[label] += gpus * zero_min
        stretches_total += len(stretches)
        for stretch in stretches:
            low, high = next(b for b in STRETCH_BUCKETS if b[0] <= stretch < b[1])
            stretch_minutes[_bucket_label(low, high)] += gpus * stretch
            for window in WINDOWS_MIN:
                beyond[window] += gpus * max(0, stretch - window)
            rule_reach["over-quota"] += gpus * max(0, stretch - 20)
            if klass == "training":
                rule_reach["training"] += gpus * max(0, stretch - 90)
        if klass == "interactive":  # a release ends the session: every idle minute after the first long stretch
            released = False
            for stretch in stretches:
                if released:
                    rule_reach["interactive"] += gpus * stretch
                elif stretch > 45:
                    rule_reach["interactive"] += gpus * (stretch - 45)
                    released = True
    total_idle = sum(idle.values())

    def hours(minutes: float) -> float:
        return round(minutes / 60, 1)

    def share(part: float, whole: float) -> float:
        return round(100 * part / whole, 2) if whole else 0.0

    halving = [w for w in WINDOWS_MIN if beyond[w] >= total_idle / 2]
    return {
        "days": days,
        "offered_load": load_factor,
        "gpus": replay.gpus,
        "jobs": len(replay.jobs),
        "idle_threshold_pct": IDLE_PCT,
        "series": len(replay.series),
        "work_gpu_hours": hours(sum(work.values())),
        "idle_gpu_hours": hours(total_idle),
        "idle_share_pct": share(total_idle, sum(work.values())),
        "idle_zero_share_pct": share(sum(idle_zero.values()), sum(work.values())),
        "by_class": {k: {"work_gpu_hours": hours(work[k]), "idle_gpu_hours": hours(idle[k]),
                         "idle_share_pct": share(idle[k], work[k]), "idle_zero_share_pct": share(idle_zero[k], work[k]),
                         "share_of_idle_pct": share(idle[k], total_idle)} for k in sorted(work)},
        "training_by_duration": {label: {"work_gpu_hours": hours(by_duration[label]),
                                         "idle_share_pct": share(by_duration_idle[label], by_duration[label]),
                                         "idle_zero_share_pct": share(by_duration_zero[label], by_duration[label])}
                                 for label, _, _ in DURATION_BUCKETS},
        "idle_stretches": stretches_total,
        "idle_by_stretch_length_pct": {_bucket_label(low, high): share(stretch_minutes[_bucket_label(low, high)],
                                                                       total_idle) for low, high in STRETCH_BUCKETS},
        # the upper bound on what a rule acting after W minutes of idle (window + notice) could remove
        "reachable_share_pct": {str(w): share(beyond[w], total_idle) for w in WINDOWS_MIN},
        "halving_needs_window_min_at_most": max(halving) if halving else None,
        "auto_rules_reachable_pct": {
            "training suspended after 90 min": share(rule_reach["training"], total_idle),
            "interactive released after 45 min": share(rule_reach["interactive"], total_idle),
            "every lease preempted over quota after 20 min": share(rule_reach["over-quota"], total_idle),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/idle_structure.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--quick", action="store_true", help="half a day (a smoke run: bench/results/quick/)")
    args = parser.parse_args(argv)
    days = 0.5 if args.quick else args.days
    wall, cpu = time.perf_counter(), time.process_time()
    figures = measure(days, args.load)
    figures["wall_seconds"] = round(time.perf_counter() - wall, 1)
    figures["cpu_seconds"] = round(time.process_time() - cpu, 1)
    print(f"{figures['jobs']:,} jobs, {figures['work_gpu_hours']:,} GPU-h of work in the window, "
          f"{figures['idle_gpu_hours']:,} idle ({figures['idle_share_pct']} % under {IDLE_PCT} %, "
          f"{figures['idle_zero_share_pct']} % at 0 %)")
    for klass, row in figures["by_class"].items():
        print(f"  {klass}: {row}")
    print("training idle by duration:", figures["training_by_duration"])
    print("idle by stretch length (% of idle):", figures["idle_by_stretch_length_pct"])
    print("reachable by a rule acting after W min (% of idle, upper bound):", figures["reachable_share_pct"])
    print("auto's rules (upper bound, % of idle):", figures["auto_rules_reachable_pct"])
    print("halving needs a window of at most", figures["halving_needs_window_min_at_most"], "min")
    from bench.record import command_line, write

    write("idle_structure", figures, settings=vars(args), quick=args.quick,
          command=command_line(["bench/idle_structure.py", *(sys.argv[1:] if argv is None else argv)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
