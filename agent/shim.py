"""The wrapper every workload run goes through:
``python -I shim.py EXIT_FILE [--log-dir DIR --log-max-bytes N --banner TEXT] -- COMMAND ...``.

It starts COMMAND as its child (in the same process group and session, which the agent made new for
it), waits for it and writes how it ended to EXIT_FILE (temp file, fsync, rename) before exiting with the
same status. So the agent learns a run's true exit status even when the agent itself was not running at
the moment the workload ended (``kill -9`` of the agent, then a restart). SIGTERM, SIGINT and SIGHUP
sent to the process group reach the child; the shim notes them and keeps waiting, so the child decides
how to stop (checkpoint, then exit). SIGKILL at the deadline kills the shim too: then there is no exit
file, and the agent, which sent it, records the kill itself.

With ``--log-dir`` it also captures the child's stdout and stderr through pipes into **bounded logs**
(``BoundedLog``): each stream is a series of segment files ``<stream>-<first byte's offset>.log`` of at
most half of ``--log-max-bytes``, of which the newest two are kept, so a chatty workload never holds
more than ``--log-max-bytes`` per stream on the node and the newest half of it at least is always there.
Offsets are positions in the whole stream since the workload's first run (``log_read`` reads them back;
bytes before its ``first_offset`` were dropped). The shim is the only writer of its run's logs, and a run
starts only after the one before it ended, so no two writers ever share a segment.

Standard library only; the agent runs it with ``-I`` (no site packages, no PYTHON* variables, not even
this file's directory on ``sys.path``), so it imports nothing of the agent.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

STREAMS = ("stdout", "stderr")
SEGMENT = re.compile(r"^(stdout|stderr)-([0-9]{20})\.log$")
DRAIN_SECONDS = 2.0  # after the child's exit, how long a grandchild holding its pipes may keep them


def log_segments(directory: Path, stream: str) -> list[tuple[int, Path]]:
    """The stream's segment files as (offset of their first byte, path), oldest first."""
    found = []
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in entries:
        match = SEGMENT.match(name)
        if match and match.group(1) == stream:
            found.append((int(match.group(2)), Path(directory) / name))
    return sorted(found)


class BoundedLog:
    """Appends a stream's bytes to segments of at most ``max_bytes // 2`` and keeps the newest two: at
    most ``max_bytes`` on disk, at least the newest ``max_bytes // 2`` readable."""

    def __init__(self, directory: Path, stream: str, max_bytes: int):
        self.directory, self.stream = Path(directory), stream
        self.segment_bytes = max(1, max_bytes // 2)
        segments = log_segments(self.directory, stream)
        if segments:
            self.base, path = segments[-1]
            self.size = path.stat().st_size
        else:
            self.base, self.size = 0, 0
        self.fd = self._open(self.base)

    def _open(self, base: int) -> int:
        return os.open(self.directory / f"{self.stream}-{base:020d}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                       0o640)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            room = self.segment_bytes - self.size
            if room <= 0:
                self._rotate()
                continue
            written = os.write(self.fd, view[:room])
            self.size += written
            view = view[written:]

    def _rotate(self) -> None:
        base = self.base + self.size
        fd = self._open(base)
        os.close(self.fd)
        self.fd, self.base, self.size = fd, base, 0
        for _base, old in log_segments(self.directory, self.stream)[:-2]:
            old.unlink(missing_ok=True)

    def close(self) -> None:
        os.close(self.fd)


def log_read(directory: Path, stream: str, *, offset: int | None = None, tail: int | None = None,
             limit: int = 65536) -> dict:
    """Bytes of a bounded log: from ``offset`` (or its first kept byte, if that one was dropped) or the last
    ``tail`` bytes, at most ``limit``. ``size`` is the stream's length since the first run, ``first_offset``
    its first byte still kept. A segment that the writer drops while this reads is read again."""
    for _attempt in range(5):
        try:
            segments = [(base, path, path.stat().st_size) for base, path in log_segments(directory, stream)]
            first = segments[0][0] if segments else 0
            size = segments[-1][0] + segments[-1][2] if segments else 0
            start = max(first, size - tail) if tail is not None else min(max(offset or 0, first), size)
            data, position = bytearray(), start
            for base, path, length in segments:
                if position >= base + length or len(data) >= limit:
                    continue
                with open(path, "rb") as handle:
                    handle.seek(position - base)
                    chunk = handle.read(min(limit - len(data), base + length - position))
                data += chunk
                position += len(chunk)
            return {"offset": start, "next_offset": start + len(data), "size": size, "first_offset": first,
                    "data": bytes(data)}
        except FileNotFoundError:
            continue
    raise OSError(f"the {stream} log of {directory} kept changing while it was read")


def _copy(source, log: BoundedLog) -> None:
    with source:
        while chunk := os.read(source.fileno(), 65536):
            log.write(chunk)


def _write(path: str, result: dict) -> None:
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        json.dump(result, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def main(argv: list[str]) -> int:
    options: dict[str, str] = {}
    rest = argv[1:]
    while rest and rest[0] in ("--log-dir", "--log-max-bytes", "--banner") and len(rest) > 1:
        options[rest[0]], rest = rest[1], rest[2:]
    if not argv or len(rest) < 2 or rest[0] != "--":
        sys.stderr.write("usage: shim.py EXIT_FILE [--log-dir DIR --log-max-bytes N --banner TEXT] -- COMMAND ...\n")
        return 2
    exit_file, command = argv[0], rest[1:]
    logs = ({stream: BoundedLog(Path(options["--log-dir"]), stream, int(options.get("--log-max-bytes", 16 << 20)))
             for stream in STREAMS} if "--log-dir" in options else {})
    if logs and options.get("--banner"):
        logs["stdout"].write(options["--banner"].encode() + b"\n")
    received: list[tuple[int, float]] = []

    def note(signum, _frame):
        received.append((signum, time.time()))

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, note)  # a handler (not SIG_IGN): the child gets the default disposition back
    # an elastic lease's resize (agent.workloads.shrink) signals the group: the shim outlives it, the child decides
    signal.signal(signal.SIGUSR1, lambda _signum, _frame: None)
    started = time.time()
    pipe = subprocess.PIPE if logs else None
    try:  # restore_signals: the child gets SIGPIPE etc. as a normal process
        child = subprocess.Popen(command, stdout=pipe, stderr=pipe)
    except OSError as error:
        message = f"gpubroker: cannot start {command[0]!r}: {error}\n"
        if logs:
            logs["stderr"].write(message.encode())
        else:
            sys.stderr.write(message)
            sys.stderr.flush()
        _write(exit_file, {"exit_code": 127, "signal": None, "started_at": started, "ended_at": time.time(),
                           "error": f"cannot start {command[0]!r}: {error.strerror or error}"})
        return 127
    copiers = [threading.Thread(target=_copy, args=(getattr(child, stream), logs[stream]), daemon=True)
               for stream in logs]
    for copier in copiers:
        copier.start()
    code = child.wait()
    drain_until = time.monotonic() + DRAIN_SECONDS
    for copier in copiers:  # what the child wrote before it exited is in the pipes: into the logs first
        copier.join(max(0.0, drain_until - time.monotonic()))
    _write(exit_file, {"exit_code": code if code >= 0 else None, "signal": -code if code < 0 else None,
                       "started_at": started, "ended_at": time.time(), "child_pid": child.pid,
                       "signals_received": [s for s, _ in received]})
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
