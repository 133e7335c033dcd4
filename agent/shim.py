"""The wrapper every workload run goes through: ``python -I shim.py EXIT_FILE -- COMMAND ...``.

It starts COMMAND as its child (in the same process group and session, which the agent made new for
it), waits for it and writes how it ended to EXIT_FILE (temp file, fsync, rename) before exiting with the
same status. So the agent learns a run's true exit status even when the agent itself was not running at
the moment the workload ended (``kill -9`` of the agent, then a restart). SIGTERM, SIGINT and SIGHUP
sent to the process group reach the child; the shim notes them and keeps waiting, so the child decides
how to stop (checkpoint, then exit). SIGKILL at the deadline kills the shim too: then there is no exit
file, and the agent, which sent it, records the kill itself.

Standard library only; the agent runs it with ``-I`` (no site packages, no PYTHON* variables).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


def _write(path: str, result: dict) -> None:
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        json.dump(result, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: shim.py EXIT_FILE -- COMMAND [ARG ...]\n")
        return 2
    exit_file, command = argv[0], argv[2:]
    received: list[tuple[int, float]] = []

    def note(signum, _frame):
        received.append((signum, time.time()))

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, note)  # a handler (not SIG_IGN): the child gets the default disposition back
    started = time.time()
    try:
        child = subprocess.Popen(command)  # restore_signals: the child gets SIGPIPE etc. as a normal process
    except OSError as error:
        sys.stderr.write(f"gpubroker: cannot start {command[0]!r}: {error}\n")
        sys.stderr.flush()
        _write(exit_file, {"exit_code": 127, "signal": None, "started_at": started, "ended_at": time.time(),
                           "error": f"cannot start {command[0]!r}: {error.strerror or error}"})
        return 127
    code = child.wait()
    _write(exit_file, {"exit_code": code if code >= 0 else None, "signal": -code if code < 0 else None,
                       "started_at": started, "ended_at": time.time(), "child_pid": child.pid,
                       "signals_received": [s for s, _ in received]})
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
