"""The published figures are the ones a command wrote (issue 16, "reproducible results").

- every results file in ``bench/results`` is one a registered benchmark writes (``python -m bench list``), in
  ``bench/record.py``'s format, from a committed tree;
- every benchmark table in the docs equals what ``bench/docs.py`` makes from those files (``python -m bench docs``
  rewrites them), and every table's renderer is used somewhere;
- ``python -m bench`` runs a benchmark end to end and writes its file where it says;
- every results file's commit is in the history, an ancestor of ``HEAD`` (else the file cannot be traced to
  any code: the test fails); one older than the code it measures (``bench/staleness.py``) is *reported* as a
  ``StaleResults`` warning, not failed: recording again needs a quiet machine, not a code change. A shallow clone
  without the commits says "unknown" and skips.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

from bench import docs
from bench.__main__ import BENCHMARKS, by_name, results_files, staleness
from bench.record import RESULTS, ROOT
from bench.staleness import FRESH, MISSING, STALE, UNKNOWN, freshness

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


class StaleResults(UserWarning):
    """A results file older than the code it measures: re-run its benchmark (``python -m bench stale``)."""


def test_results_files_trace_to_an_ancestor_commit_and_stale_ones_are_reported():
    states = staleness()
    if all(state.state == UNKNOWN for state in states):
        pytest.skip(f"git cannot say: {states[0].detail}")
    for state in states:
        if state.state == STALE:
            warnings.warn(StaleResults(state.line()), stacklevel=1)
    missing = [state.line() for state in states if state.state == MISSING]
    assert not missing, "results files whose commit is not in this branch's history:\n" + "\n".join(missing)


def _git(repo, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=repo,
                          capture_output=True, text=True, check=True).stdout.strip()


def test_staleness_compares_content_so_a_move_is_not_a_change(tmp_path):
    """On a scratch repository: a measured module renamed with its imports (and docstring) rewritten is fresh;
    an edit of its code is stale, naming the file; an unmeasured file changing is nothing; a commit not in the
    history, or off the branch, is missing; a shallow clone without the commit is unknown."""
    repo = tmp_path / "repo"
    (repo / "old" / "core").mkdir(parents=True)
    (repo / "old" / "core" / "plan.py").write_text(
        '"""The planner (old.core)."""\nfrom old.core import types\n\n\ndef plan(x):\n    return x + 1\n')
    (repo / "old" / "core" / "types.py").write_text("LIMIT = 3\n")
    (repo / "notes.txt").write_text("a\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "one")
    recorded = _git(repo, "rev-parse", "HEAD")

    _git(repo, "mv", "old", "new")
    (repo / "new" / "core" / "plan.py").write_text(
        '"""The planner, moved (new.core)."""\nfrom new.core import types\n\n\ndef plan(x):\n    return x + 1\n')
    (repo / "notes.txt").write_text("b\n")
    _git(repo, "commit", "-q", "-am", "the move")
    state = freshness("plan", recorded, ("new/core",), root=repo)
    assert (state.state, state.changed) == (FRESH, ())

    (repo / "new" / "core" / "plan.py").write_text(
        '"""The planner, moved."""\nfrom new.core import types\n\n\ndef plan(x):\n    return x + 2\n')
    _git(repo, "commit", "-q", "-am", "a real change")
    state = freshness("plan", recorded, ("new/core",), root=repo)
    assert (state.state, state.changed) == (STALE, ("new/core/plan.py",))
    assert "new/core/plan.py" in state.line() and recorded[:10] in state.line()
    assert freshness("plan", recorded, ("notes-elsewhere",), root=repo).state == FRESH

    assert freshness("plan", "0" * 40, ("new/core",), root=repo).state == MISSING
    _git(repo, "checkout", "-q", "-b", "side", recorded)
    (repo / "notes.txt").write_text("c\n")
    _git(repo, "commit", "-q", "-am", "off the branch")
    side = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "main")
    state = freshness("plan", side, ("new/core",), root=repo)
    assert state.state == MISSING and "not an ancestor" in state.detail

    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)], check=True)
    assert freshness("plan", recorded, ("new/core",), root=shallow).state == UNKNOWN


def test_docs_check_ignores_the_stale_mark_that_docs_writes():
    table = "| a |\n|---|\n| 1 |\n"
    marked = table + "\n" + docs.STALE_MARK + " the code these figures measure changed …\n"
    assert docs.without_marks(marked) == table
    assert docs.without_marks(table) == table
