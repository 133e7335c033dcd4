"""A real Celery worker process consumes from the configured broker (Redis where one runs)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def worker():
    queue = f"test-{os.getpid()}-{time.monotonic_ns()}"
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool", "solo", "--queues", queue,
         "--loglevel", "WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat"],
        cwd=ROOT, env=os.environ.copy(),
    )
    yield queue
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def test_celery_worker_process_runs_a_task(worker):
    from config.celery import ping

    result = ping.apply_async(queue=worker)
    assert result.get(timeout=60) == "pong"
