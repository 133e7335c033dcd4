"""Two would-be schedulers (run_as_leader): one runs its command, the other waits; when the leader dies the
standby takes over within a few seconds. Real processes against the test database."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

from tests.api.server import ROOT
from tests.api.server import test_database_url as database_url


def _start(marker_dir, name: str) -> subprocess.Popen:
    child = [sys.executable, "-c", f"import pathlib, time; pathlib.Path({str(marker_dir / name)!r}).write_text('x'); "
                                   "time.sleep(120)"]
    return subprocess.Popen([sys.executable, "manage.py", "run_as_leader", "--lock", "beat-test", "--retry-seconds",
                             "0.3", "--check-seconds", "0.5", "--", *child], cwd=ROOT,
                            env={**os.environ, "DATABASE_URL": database_url()}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)


def test_one_leader_at_a_time_and_a_standby_takes_over(transactional_db, tmp_path):
    first = _start(tmp_path, "first")
    second = None
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "first").exists():
            assert time.monotonic() < deadline and first.poll() is None, first.stdout.read() if first.poll() else ""
            time.sleep(0.1)
        second = _start(tmp_path, "second")
        # the second has tried the lock (and is waiting) before the leader dies: on a busy machine its start
        # alone takes seconds, and a fixed sleep let it start after the leader was gone
        ready, _, _ = select.select([second.stdout], [], [], 60)
        assert ready, "the second replica said nothing in 60 s"
        said = second.stdout.readline()
        assert b"standby" in said, said
        time.sleep(1)
        assert not (tmp_path / "second").exists(), "two leaders at once"
        assert second.poll() is None
        os.killpg(first.pid, 9)  # the leader's pod dies: PostgreSQL ends its session, the lock is free
        first.wait(10)
        deadline = time.monotonic() + 15
        while not (tmp_path / "second").exists():
            assert time.monotonic() < deadline, "the standby did not take over"
            time.sleep(0.1)
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, 15)
                process.wait(30)
    assert b"leading" in second.stdout.read()
