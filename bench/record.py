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
    """The commit the figures were produced at; ``dirty`` when tracked files had uncommitted changes."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT, check=True).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "dirty": None}


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed: ``python bench/x.py --flag`` or ``python -m pkg ...`` (never an absolute path)."""
    argv = list(sys.argv if argv is None else argv)
    head = argv[0] if argv else ""
    with contextlib.suppress(ValueError, OSError):
        head = str(Path(head).resolve().relative_to(ROOT))
    if head.endswith("__main__.py"):
        head = "-m " + head.removesuffix("/__main__.py").replace("/", ".")
    return "python " + " ".join(shlex.quote(part) for part in [head, *argv[1:]] if part)


def write(name: str, figures: dict[str, Any], *, settings: dict[str, Any] | None = None, command: str | None = None,
          directory: Path | None = None) -> Path:
    """Write ``<directory>/<name>.json`` (``bench/results`` by default) and return its path."""
    directory = Path(directory) if directory is not None else RESULTS
    directory.mkdir(parents=True, exist_ok=True)
    payload = {
        "name": name,
        "command": command if command is not None else command_line(),
        **commit(),
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
