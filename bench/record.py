"""One format for every benchmark's results file (issue 16, "reproducible results").

Each benchmark calls :func:`write` once per results file. The file holds what a reader needs to trust or redo
the figures: the command line as it was typed, the git commit (and whether the tree had uncommitted changes),
the date, the machine (cores, CPU model, Python) and the figures themselves. A results file is written whole by
one run: nothing here merges runs.

    from bench.record import write
    write("billing", {"month_close_seconds": 41.2, ...}, settings=vars(args))

The docs' tables are made from these files (``python -m bench docs``), and a test checks that each figure in the
docs equals its file.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def machine() -> dict[str, Any]:
    """Cores, CPU model, memory and Python of the machine running the benchmark."""
    model = platform.processor() or platform.machine()
    memory_gib = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 1024**2, 1)
                break
    except OSError:
        pass
    return {"cores": os.cpu_count(), "cpu": model, "memory_gib": memory_gib, "python": platform.python_version(),
            "system": platform.system()}


def commit() -> dict[str, Any]:
    """The commit the figures were produced at; ``dirty`` when tracked files had uncommitted changes (results files
    and the plots benchmarks draw into docs/img aside: a run that writes several of them must not call its own later
    files dirty; ``python -m bench run capacity capacity_loads`` called the second dirty for the first's plot)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT, check=True).stdout.strip()

    # a copy of the tree sent elsewhere (a lent GPU machine) may carry no .git, or a stale one: whoever sends a
    # committed, clean tree names its commit here
    told = os.environ.get("BENCH_COMMIT", "").strip()
    if told:
        return {"commit": told, "dirty": False}
    try:
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results",
                      ":(exclude)docs/img")
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(changed)}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "dirty": None}


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed: ``python bench/x.py --flag`` or ``python -m pkg ...`` (never an absolute path).
    ``argv[0]`` may itself be ``-m package`` for a module's command."""
    argv = list(sys.argv if argv is None else argv)
    head = argv[0] if argv else ""
    if not head.startswith("-m "):
        with contextlib.suppress(ValueError, OSError):
            head = str(Path(head).resolve().relative_to(ROOT))
        head = ("-m " + head.removesuffix("/__main__.py").replace("/", ".") if head.endswith("__main__.py")
                else shlex.quote(head))
    return " ".join(["python", head, *(shlex.quote(part) for part in argv[1:])])


def results_dir() -> Path:
    """``bench/results``, or ``$BENCH_RESULTS_DIR`` (``python -m bench all --quick`` points it at
    ``bench/results/quick``, which git ignores, so a smoke run never replaces recorded figures)."""
    override = os.environ.get("BENCH_RESULTS_DIR", "").strip()
    return Path(override) if override else RESULTS


_AT_START = None


def _commit_at_start() -> dict[str, Any]:
    """The tree as the benchmark process found it when it first recorded (see the module's import below): edits
    made while a long run goes on must not change what its file says it ran."""
    global _AT_START
    if _AT_START is None:
        _AT_START = commit()
    return _AT_START


def write(name: str, figures: dict[str, Any], *, settings: dict[str, Any] | None = None, command: str | None = None,
          directory: Path | None = None, quick: bool = False) -> Path:
    """Write ``<directory>/<name>.json`` (:func:`results_dir` by default) and return its path. A ``quick`` (smoke)
    run goes to ``bench/results/quick/`` unless told otherwise, never over the recorded figures."""
    if directory is None:
        override = os.environ.get("BENCH_RESULTS_DIR", "").strip()
        directory = RESULTS / "quick" if quick and not override else results_dir()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    payload = {
        "name": name,
        "command": command if command is not None else command_line(),
        **_commit_at_start(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in (settings or {}).items()},
        "figures": figures,
    }
    path = directory / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")
    tmp.replace(path)
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return path


def load(name: str, directory: Path | None = None) -> dict[str, Any]:
    """The results file ``name`` as written by :func:`write`."""
    directory = Path(directory) if directory is not None else RESULTS
    return json.loads((directory / f"{name}.json").read_text())


_commit_at_start()  # at import: benchmarks import this module before they start measuring
