"""``--profile`` of the benchmarks: the top CPU costs of each kind of process, sampled by py-spy.

One ``py-spy record --subprocesses --nonblocking --format raw`` per process tree (gunicorn's master and its
workers, each Celery worker with its pool children, the fleet, the benchmark's own client) samples every
thread ``--rate`` times a second without stopping it and leaves out idle threads (blocked in a system call), so
the samples of a tree divided by the rate are its CPU seconds. :func:`stop` interrupts them (py-spy writes its
folded stacks then); :func:`report` sums the files per kind and prints, per unit of work (a lease), the CPU the
samples saw, the functions with the most inclusive CPU (a frame counted once per stack) below ``ceiling`` of the
total — the entry points every sample passes through say nothing — and the functions with the most CPU of their
own. The folded stacks stay in the folder (``<role>.folded``: flamegraph.pl, speedscope and inferno read them).

py-spy (requirements-dev.txt) attaches with ptrace: root or CAP_SYS_PTRACE in a container.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r":\d+\)$")


def available() -> str | None:
    """The py-spy binary, or None."""
    candidate = Path(sys.executable).parent / "py-spy"
    return str(candidate) if candidate.exists() else shutil.which("py-spy")


def start(groups: dict[str, list[int]], folder: Path, *, rate: int = 200) -> list[subprocess.Popen]:
    """One recorder per process tree (a negative pid: that process alone); ``folder/<role>-<pid>.txt`` once
    stopped."""
    binary = available()
    if binary is None:
        raise SystemExit("--profile needs py-spy (pip install -r requirements-dev.txt)")
    folder.mkdir(parents=True, exist_ok=True)
    recorders = []
    for role, pids in groups.items():
        for pid in pids:
            recorders.append(subprocess.Popen(
                [binary, "record", "--pid", str(abs(pid)), *(["--subprocesses"] if pid > 0 else []), "--gil",
                 "--nonblocking", "--format", "raw", "--rate", str(rate),
                 "--output", str(folder / f"{role}-{abs(pid)}.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return recorders


def stop(recorders: list[subprocess.Popen]) -> None:
    for recorder in recorders:
        recorder.send_signal(signal.SIGINT)
    for recorder in recorders:
        try:
            recorder.wait(30)
        except subprocess.TimeoutExpired:
            recorder.kill()


def _function(frame: str) -> str:
    return LINE.sub(")", frame)


def load(folder: Path, rate: int) -> dict[str, dict]:
    roles: dict[str, dict] = {}
    for path in sorted(Path(folder).glob("*-*.txt")):
        role = roles.setdefault(path.stem.rsplit("-", 1)[0], {
            "self": defaultdict(float), "total": defaultdict(float), "stacks": defaultdict(float), "seconds": 0.0})
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            seconds = int(count) / rate
            frames = [_function(frame) for frame in stack.split(";") if not frame.startswith("process ")]
            if not frames:
                continue
            role["seconds"] += seconds
            role["self"][frames[-1]] += seconds
            for frame in set(frames):
                role["total"][frame] += seconds
            role["stacks"][";".join(frames)] += seconds
    return roles


def report(folder: Path, units: int, *, rate: int = 200, unit: str = "lease", top: int = 12,
           ceiling: float = 0.9) -> dict:
    """Print the table; return {role: {"cpu_ms_per_unit", "inclusive": [[function, ms]], "self": [...]}}."""
    summary = {}
    per = 1000.0 / max(units, 1)
    for name, role in load(folder, rate).items():
        total = role["seconds"]
        print(f"{name}: {total * per:.2f} CPU ms per {unit} in the samples")
        inclusive = [(key, seconds) for key, seconds in sorted(role["total"].items(), key=lambda item: -item[1])
                     if seconds < ceiling * total][:top]
        own = sorted(role["self"].items(), key=lambda item: -item[1])[:top // 2]
        print(f"  {'inclusive ms':>12}  function")
        for key, seconds in inclusive:
            print(f"  {seconds * per:12.3f}  {key[:150]}")
        print(f"  {'self ms':>12}  function")
        for key, seconds in own:
            print(f"  {seconds * per:12.3f}  {key[:150]}")
        (Path(folder) / f"{name}.folded").write_text(
            "".join(f"{stack} {round(seconds * rate)}\n" for stack, seconds in role["stacks"].items()))
        summary[name] = {"cpu_ms_per_unit": round(total * per, 3),
                         "inclusive": [[key, round(seconds * per, 3)] for key, seconds in inclusive],
                         "self": [[key, round(seconds * per, 3)] for key, seconds in own]}
    return summary
