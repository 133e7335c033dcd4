"""One Celery worker process shared by the tests of a session, handed to each test idle.

Starting a worker costs about two seconds of CPU (Django, Celery, the apps' tasks) and stopping it a warm shutdown;
a test that only needs *a* worker consuming its tasks gets this one instead (``celery_worker`` in
``tests/support/fixtures.py``). Between tests it is brought back to the state a fresh worker would start in:
nothing queued, nothing held back (reserved or waiting for its ETA), nothing running.

A worker reads its settings from the environment once, at start: a test that sets one for it
(``monkeypatch.setenv("WORKLOAD_HOST_PORTS", ...)`` before taking the worker) gets a worker started with that
environment, as it did when every test started its own. ``attach`` compares the environment with the one the
session's worker was started with and, where they differ, replaces the worker. A test that kills or restarts
workers, or needs several racing, still starts its own (``tests.support.processes.start_workers``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

from core import processes
from tests.support.processes import ROOT, worker_command, worker_env

IDLE_TIMEOUT_SECONDS = 30.0  # as long as a warm shutdown was given (stop_workers), and a margin
NOT_SETTINGS = frozenset({"PYTEST_CURRENT_TEST"})  # changes with every test; no worker reads it


def _environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name not in NOT_SETTINGS}


def _cycle_flag_clear() -> None:
    """The schedule-cycle flag is kept per database and *queue* (broker/services/triggers.py): with one queue for
    the session, a flag left set by the last test (its cycle purged or revoked above) would swallow this test's
    triggers for up to 10 s. A worker of its own, on a new queue, started with no flag; so does this one."""
    from broker.services import cycle_flag_clear

    cycle_flag_clear()


class SessionWorker:
    def __init__(self, process: subprocess.Popen, queue: str, node: str, environment: dict[str, str]):
        self.process = process
        self.queue = queue
        self.node = node  # the worker's node name (remote control answers to it)
        self.environment = environment  # the test process's environment when it was started

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(cls) -> SessionWorker:
        queue = f"session-{os.getpid()}-{time.monotonic_ns()}"
        node = f"w-{queue}@{socket.gethostname()}"
        environment = _environment()
        process = processes.start(worker_command(queue, node), cwd=ROOT, env=worker_env(queue))
        worker = cls(process, queue, node, environment)
        worker._wait_ready()
        return worker

    def _wait_ready(self, timeout: float = 60.0) -> None:
        from config.celery import app

        processes.wait_until(lambda: app.control.ping(destination=[self.node], timeout=1.0), timeout, 0.2,
                             process=self.process, what=f"Celery worker {self.node} answering a ping")

    def attach(self) -> None:
        """The test process sends to this worker's queue from now on; a new worker where the last one died or
        the environment changed since it started."""
        from config.celery import app

        if self.process.poll() is not None or _environment() != self.environment:
            self.stop()
            replacement = SessionWorker.start()
            self.process, self.queue, self.node = replacement.process, replacement.queue, replacement.node
            self.environment = replacement.environment
        app.conf.task_default_queue = self.queue
        _cycle_flag_clear()

    def detach(self) -> None:
        """Back to idle: the queue purged, the tasks held back revoked, the running ones finished, the cycle flag
        cleared. The test process sends to the default queue again."""
        from config.celery import app

        try:
            if self.process.poll() is None:
                self._drain(app)
                _cycle_flag_clear()  # a cycle it asked for may have been purged or revoked with its flag still set
        finally:
            app.conf.task_default_queue = "celery"

    def _drain(self, app) -> None:
        inspect = app.control.inspect(destination=[self.node], timeout=5.0)
        revoked: set[str] = set()
        deadline = time.monotonic() + IDLE_TIMEOUT_SECONDS
        while True:
            self._purge(app)
            held = {task["id"] for task in (inspect.reserved() or {}).get(self.node, [])}
            held |= {entry["request"]["id"] for entry in (inspect.scheduled() or {}).get(self.node, [])}
            if held - revoked:
                app.control.revoke(sorted(held - revoked), destination=[self.node])
                revoked |= held
            running = (inspect.active() or {}).get(self.node, [])
            if not running and not (held - revoked) and self._queued(app) == 0:
                return
            if time.monotonic() > deadline:
                # as a warm shutdown that timed out: a fresh worker for the next test
                processes.stop(self.process, timeout=0.1)
                return
            time.sleep(0.1)

    def _purge(self, app) -> None:
        with app.connection_for_write() as connection:
            connection.default_channel.queue_purge(self.queue)

    def _queued(self, app) -> int:
        with app.connection_for_write() as connection:
            try:
                return connection.default_channel.queue_declare(self.queue, passive=True).message_count
            except Exception:
                return 0

    def stop(self) -> None:
        processes.stop_all([self.process], timeout=20)
