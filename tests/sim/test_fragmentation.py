"""A short run of the openb fragmentation simulator (the full one is a benchmark: docs/scheduling.md)."""

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from leasing.scheduler.placement import POLICIES
from leasing.sim.fragmentation import run_seed

ROOT = Path(__file__).resolve().parents[2]
OPENB = ROOT / "bench" / "traces" / "openb"


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    """The first 60 openb nodes and the whole default task list."""
    folder = tmp_path_factory.mktemp("openb")
    lines = (OPENB / "openb_node_list_gpu_node.csv").read_text().splitlines()
    nodes = folder / "nodes.csv"
    nodes.write_text("\n".join(lines[:1] + lines[1:600:10]) + "\n")
    return nodes, OPENB / "openb_pod_list_default.csv"


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_fragmentation_every_policy_runs_and_records_ratios(small_trace, policy):
    nodes, pods = small_trace
    result = run_seed(nodes, pods, policy, seed=1)
    ratios = [result.ratio_by_arrived[m] for m in range(131)]
    assert ratios[0] == 0.0
    assert all(0 <= r <= 1 for r in ratios)
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(ratios))  # tasks never finish
    assert result.failed > 0  # 130% arrived cannot all fit


def test_fragmentation_default_beats_random_on_small_trace(small_trace):
    nodes, pods = small_trace
    default = [run_seed(nodes, pods, "default", seed=s).ratio_by_arrived[130] for s in (1, 2)]
    random = [run_seed(nodes, pods, "random", seed=s).ratio_by_arrived[130] for s in (1, 2)]
    assert sum(default) > sum(random)


def test_fragmentation_same_seed_same_result(small_trace):
    nodes, pods = small_trace
    first = run_seed(nodes, pods, "fgd", seed=3).ratio_by_arrived
    assert first == run_seed(nodes, pods, "fgd", seed=3).ratio_by_arrived


def test_fragmentation_cli_writes_json(small_trace, tmp_path):
    nodes, pods = small_trace
    out = tmp_path / "out.json"
    result = subprocess.run(
        [sys.executable, "-m", "leasing.sim", "fragmentation", "--nodes", str(nodes), "--pods", str(pods),
         "--policy", "best-fit", "--seeds", "1-2", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "best-fit" in result.stdout and "alloc@130%" in result.stdout
    data = json.loads(out.read_text())
    assert data["policy"] == "best-fit" and data["seeds"] == [1, 2]
    assert set(data["alloc_ratio"]) == {str(m) for m in range(131)}
    assert {"unallocated_gpus_at_130", "seconds_per_seed"} <= set(data)


def test_fragmentation_cli_refuses_missing_file(tmp_path):
    result = subprocess.run([sys.executable, "-m", "leasing.sim", "fragmentation", "--nodes", str(tmp_path / "x.csv")],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "no such file" in result.stderr
