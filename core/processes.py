"""One process launcher: start a child, wait until it is ready, stop it (``make run``, the tests, the benchmarks).

* ``start`` runs a command as the leader of its own session (``start_new_session``), so its PID is also its
  process group: a stop reaches the child and whatever it forked (Celery's and gunicorn's workers) and nothing
  else on the machine. A terminal's Ctrl-C reaches only the caller, which stops its children in order.
* ``wait_http`` / ``wait_port`` / ``wait_file`` / ``wait_until`` wait for readiness, failing early (with the tail
  of the child's stderr where it was captured) when the child exits first.
* ``stop`` sends SIGTERM (to the child, or to its whole group), waits ``timeout`` seconds, then SIGKILLs the group;
  what the child left behind in its group is killed once it has exited. Processes are only ever signalled by the
  PID this module started: never by name.

Standard library only: it sits below every app and imports no Django.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent

T = TypeVar("T")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS's choice)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def start(command: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | str | None = ROOT,
          stdout=None, stderr=None, own_group: bool = True) -> subprocess.Popen:
    """``command`` as a child process; ``own_group`` (the default) makes it the leader of its own session, so that
    ``stop`` can reach what it forks. ``env`` replaces the environment (pass ``{**os.environ, ...}`` to extend it);
    ``stdout``/``stderr`` as ``subprocess.Popen`` takes them (``subprocess.PIPE`` lets a failed wait show why)."""
    process = subprocess.Popen(list(command), cwd=cwd, env=None if env is None else dict(env), stdout=stdout,
                               stderr=stderr, start_new_session=own_group)
    process.own_group = own_group  # what ``stop`` may signal besides the child itself
    return process


def _exited(process: subprocess.Popen | None) -> str | None:
    """Why waiting is pointless: the child exited (with the tail of its stderr where it was captured)."""
    if process is None or process.poll() is None:
        return None
    tail = ""
    if process.stderr is not None:
        try:
            tail = process.stderr.read()
        except (OSError, ValueError):
            tail = ""
        if isinstance(tail, bytes):
            tail = tail.decode(errors="replace")
        tail = f": {tail[-2000:]}" if tail else ""
    return f"process {process.pid} exited with {process.returncode}{tail}"


def wait_until(predicate: Callable[[], T], timeout: float = 30.0, step: float = 0.1, *,
               process: subprocess.Popen | None = None, what: str = "the condition") -> T:
    """The first truthy value of ``predicate()`` within ``timeout`` seconds; AssertionError when none came (or
    RuntimeError as soon as ``process``, where given, exits)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        exited = _exited(process)
        if exited:
            raise RuntimeError(f"{exited} while waiting for {what}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not true within {timeout} s")
        time.sleep(step)


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """``url`` answers with a 2xx status."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - a loopback URL we built
            return 200 <= response.status < 300
    except OSError:
        return False


def wait_http(url: str, process: subprocess.Popen | None = None, timeout: float = 20.0, step: float = 0.05) -> None:
    """Until ``url`` answers (any status below 400); RuntimeError as soon as ``process`` exits, TimeoutError
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exited = _exited(process)
        if exited:
            raise RuntimeError(exited)
        try:
            with urllib.request.urlopen(url, timeout=1):  # noqa: S310 - a loopback URL we built
                return
        except OSError:
            time.sleep(step)
    raise TimeoutError(f"{url} did not answer in {timeout} s")


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_port(host: str, port: int, process: subprocess.Popen | None = None, timeout: float = 20.0) -> None:
    """Until something accepts TCP connections on ``host:port``."""
    wait_until(lambda: port_open(host, port), timeout, 0.05, process=process, what=f"{host}:{port} accepting")


def wait_file(path: Path, process: subprocess.Popen | None = None, timeout: float = 20.0) -> Path:
    """Until ``path`` exists (a child that writes a ready file, a pid file, a targets file)."""
    wait_until(path.exists, timeout, 0.05, process=process, what=f"{path} to exist")
    return path


def signal_group(pgid: int, sig: int) -> bool:
    """Signal a child's own process group; False when nothing is left in it."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def stop(process: subprocess.Popen | None, timeout: float = 20.0, *, whole_group: bool = False) -> int | None:
    """SIGTERM the child (its whole process group with ``whole_group``), wait up to ``timeout`` seconds, then
    SIGKILL its group; once it has exited (or where it had already died), whatever it left in its own group is
    killed too. The exit status (None when there was no process). Only a child started with its own group by
    ``start`` has its group signalled; any other is signalled by its PID alone."""
    if process is None:
        return None
    group = getattr(process, "own_group", False)
    pid = process.pid
    if process.poll() is None:
        if group and whole_group:
            signal_group(pid, signal.SIGTERM)
        else:
            process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            if group:
                signal_group(pid, signal.SIGKILL)
            else:
                process.kill()
            process.wait()
    if group:
        signal_group(pid, signal.SIGKILL)  # what it forked and left behind
    return process.returncode


def stop_all(children: Sequence[subprocess.Popen], timeout: float = 20.0) -> None:
    """``stop`` for several children at once: all are sent SIGTERM first, so they shut down side by side (a
    Celery worker's warm shutdown takes a second or two each)."""
    for process in children:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + timeout
    for process in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        stop(process, timeout=0.1)  # SIGKILL what is still there, and its group's leftovers


def describe_exit(returncode: int) -> str:
    """``status 1`` or ``signal SIGKILL`` (Popen reports death by a signal as a negative code)."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"status {returncode}"
