"""A short run of the openb fragmentation simulator (the full one is a benchmark: docs/scheduling.md)."""

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.sim.fragmentation import run_seed
from broker.scheduler.placement import POLICIES

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
        [sys.executable, "-m", "bench.sim", "fragmentation", "--nodes", str(nodes), "--pods", str(pods),
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
    result = subprocess.run([sys.executable, "-m", "bench.sim", "fragmentation", "--nodes", str(tmp_path / "x.csv")],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "no such file" in result.stderr


def test_arrival_is_the_trace_shuffled_then_topped_up_to_130_percent():
    """A trace short of 130% of capacity: every task once, in a seeded order, then random extra tasks while
    the total stays within 130%."""
    import random

    from bench.sim.fragmentation import arrival
    from bench.sim.openb import load_tasks

    tasks = load_tasks(OPENB / "openb_pod_list_default.csv")
    total = sum(t.gpu_milli for t in tasks)
    capacity = int(total / 1.2)  # the trace is 120% of this capacity
    sequence = arrival(tasks, capacity, random.Random(7))
    assert sorted(t.name for t in sequence[: len(tasks)]) == sorted(t.name for t in tasks)
    assert [t.name for t in sequence[: len(tasks)]] != sorted(t.name for t in tasks)
    arrived = sum(t.gpu_milli for t in sequence)
    assert 1.3 * capacity - 8 * 1000 < arrived <= 1.3 * capacity
    assert [t.name for t in arrival(tasks, capacity, random.Random(7))] == [t.name for t in sequence]
    assert [t.name for t in arrival(tasks, capacity, random.Random(8))] != [t.name for t in sequence]


def test_arrival_trims_a_trace_above_130_percent():
    import random

    from bench.sim.fragmentation import arrival
    from bench.sim.openb import load_tasks

    tasks = load_tasks(OPENB / "openb_pod_list_default.csv")
    total = sum(t.gpu_milli for t in tasks)
    capacity = int(total / 2)  # the trace is 200% of this capacity
    sequence = arrival(tasks, capacity, random.Random(1))
    assert len({t.name for t in sequence}) == len(sequence) < len(tasks)  # a subset, each task once
    assert sum(t.gpu_milli for t in sequence) <= 1.3 * capacity


def test_shuffled_node_order_renames_nodes_and_their_gpus():
    import random

    from bench.sim.fragmentation import shuffle_nodes
    from bench.sim.openb import load_nodes

    nodes, gpus = load_nodes(OPENB / "openb_node_list_gpu_node.csv")
    renamed, regpus = shuffle_nodes(nodes, gpus, random.Random(3))
    ids = [n.id for n in renamed]
    assert len(set(ids)) == len(nodes)
    assert {i.split("-", 1)[1] for i in ids} == {n.id for n in nodes}
    assert sorted(int(i.split("-", 1)[0]) for i in ids) == list(range(len(nodes)))
    assert sorted(ids) != sorted(ids, key=lambda i: i.split("-", 1)[1])  # the order really changed
    assert all(g.node in set(ids) and g.id == f"{g.node}/{g.index}" for g in regpus)


def test_fragmentation_cli_writes_one_results_file_per_trace(small_trace, tmp_path):
    nodes, pods = small_trace
    result = subprocess.run(
        [sys.executable, "-m", "bench.sim", "fragmentation", "--nodes", str(nodes), "--pods", str(pods),
         "--policy", "default,fgd", "--seeds", "1-2", "--json-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "CPU s/seed" in result.stdout and "published FGD at 130%: 95.39" in result.stdout
    record = json.loads((tmp_path / "openb_default.json").read_text())
    assert {"command", "commit", "date", "machine", "settings", "figures"} <= set(record)
    figures = record["figures"]
    assert figures["published_fgd_alloc_at_130"] == 95.39
    assert set(figures["policies"]) == {"default", "fgd"}
    for summary in figures["policies"].values():
        assert summary["seeds"] == [1, 2] and len(summary["alloc_at_130_by_seed"]) == 2
        assert summary["alloc_at_130"] == pytest.approx(sum(summary["alloc_at_130_by_seed"]) / 2, abs=0.01)
        assert summary["cpu_seconds_per_seed"] > 0
    assert figures["lead_over_published_fgd"]["default"] == pytest.approx(
        figures["policies"]["default"]["alloc_at_130"] - 95.39, abs=0.001)


def test_fragmentation_cli_refuses_unknown_trace():
    result = subprocess.run([sys.executable, "-m", "bench.sim", "fragmentation", "--trace", "nosuch"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "no such trace: nosuch" in result.stderr
