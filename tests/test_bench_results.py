"""The published figures are the ones a command wrote (issue 16, "reproducible results").

- every results file in ``bench/results`` is one a registered benchmark writes (``python -m bench list``), in
  ``bench/record.py``'s format, from a committed tree;
- every benchmark table in the docs equals what ``bench/docs.py`` makes from those files (``python -m bench docs``
  rewrites them), and every table's renderer is used somewhere;
- ``python -m bench`` runs a benchmark end to end and writes its file where it says.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import docs
from bench.__main__ import BENCHMARKS, by_name, results_files
from bench.record import RESULTS, ROOT

REQUIRED = {"name", "command", "commit", "dirty", "date", "machine", "settings", "figures"}


def _results() -> list:
    return sorted(p for p in RESULTS.iterdir() if p.is_file())


def test_every_results_file_is_written_by_a_registered_benchmark():
    known = results_files()
    stray = [p.name for p in _results() if p.suffix != ".json" or p.stem not in known]
    assert not stray, f"bench/results holds files no registered benchmark writes (stale or hand-made): {stray}"


@pytest.mark.parametrize("path", _results(), ids=lambda p: p.name)
def test_results_file_format(path):
    payload = json.loads(path.read_text())
    missing = REQUIRED - payload.keys()
    assert not missing, f"{path.name} lacks {sorted(missing)} (write it through bench/record.py)"
    assert payload["name"] == path.stem
    assert payload["command"].startswith("python "), payload["command"]
    assert len(payload["commit"]) == 40, "the commit the figures came from"
    assert payload["dirty"] is False, f"{path.name} was written from a tree with uncommitted changes"
    assert {"cores", "cpu", "python"} <= payload["machine"].keys()


def test_every_benchmark_writes_what_it_registers():
    for bench in BENCHMARKS:
        assert bench.results, bench.name
        assert bench.full and bench.quick, bench.name
    names = [name for bench in BENCHMARKS for name in bench.results]
    assert len(names) == len(set(names)), "two benchmarks claim one results file"


def test_docs_tables_equal_their_results_files():
    differs = docs.update(check=True)
    assert not differs, ("these docs tables differ from their results files; run `python -m bench docs` "
                         f"(and commit) or re-run the benchmark: {differs}")


def test_every_renderer_is_used_and_every_block_has_one():
    used = {name for path in docs.documents() for name, _ in docs.blocks(path.read_text())}
    assert used <= docs.RENDERERS.keys(), f"blocks without a renderer: {sorted(used - docs.RENDERERS.keys())}"
    assert docs.RENDERERS.keys() <= used, f"renderers no document uses: {sorted(docs.RENDERERS.keys() - used)}"


def test_python_m_bench_runs_a_benchmark_and_records_it(tmp_path):
    """The quick agent benchmark through the runner: a real agent process, its results file in the quick folder
    (pointed elsewhere here so the checkout's folder is untouched)."""
    bench = by_name()["agent_ops"]
    env = {"BENCH_RESULTS_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, *bench.argv(True, tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    payload = json.loads((tmp_path / "agent_ops.json").read_text())
    assert payload["command"] == "python bench/agent_ops.py ops --quick"
    assert payload["settings"]["quick"] is True
    assert [run["client_threads"] for run in payload["figures"]["runs"]] == [1, 4]
    assert all(run["operations"] > 0 for run in payload["figures"]["runs"])
