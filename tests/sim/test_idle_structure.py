"""``bench/idle_structure.py``: the idle stretches of a run, and the bound it draws from them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.idle_structure import walk

ROOT = Path(__file__).resolve().parents[2]


def test_walk_finds_the_idle_stretches_of_a_run_through_a_cyclic_series():
    util = [0, 0, 50, 3, 4, 60, 0]  # under 5 %: 0, 0, 3, 4, 0
    # from offset 5 for 9 minutes: 60 | 0, 0, 0 (the wrap joins the last sample to the first two) | 50 | 3, 4 | 60 | 0
    assert walk(util, 5, 9, 5) == ([3, 2, 1], 6)
    assert walk(util, 5, 9, 0) == ([3, 1], 4)  # at exactly 0 %: 3 and 4 are not idle
    assert walk(util, 0, 2, 5) == ([2], 2)  # a stretch cut by the run's end counts only its minutes in the run
    assert walk(util, 2, 1, 5) == ([], 0)
    assert walk(util, 0, 0, 5) == ([], 0)


def test_the_quick_run_writes_a_bound_that_falls_as_the_rule_waits_longer(tmp_path):
    done = subprocess.run([sys.executable, "bench/idle_structure.py", "--quick"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "BENCH_RESULTS_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    figures = json.loads((tmp_path / "idle_structure.json").read_text())["figures"]
    assert figures["jobs"] > 0 and 0 < figures["idle_gpu_hours"] <= figures["work_gpu_hours"]
    reach = [figures["reachable_share_pct"][w] for w in sorted(figures["reachable_share_pct"], key=int)]
    assert all(0 <= r <= 100 for r in reach) and reach == sorted(reach, reverse=True), reach
    assert abs(sum(figures["idle_by_stretch_length_pct"].values()) - 100) < 0.1
    assert abs(sum(c["share_of_idle_pct"] for c in figures["by_class"].values()) - 100) < 0.1
    # the over-quota rule (20 min) reaches exactly what any rule acting after 20 min would
    assert figures["auto_rules_reachable_pct"]["every lease preempted over quota after 20 min"] == \
        figures["reachable_share_pct"]["20"]
    windows = [int(w) for w, r in figures["reachable_share_pct"].items() if r >= 50]
    assert figures["halving_needs_window_min_at_most"] == (max(windows) if windows else None)
