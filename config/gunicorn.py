"""gunicorn settings (``gunicorn -c python:config.gunicorn config.wsgi``), used by make run, the image and the
manifests. With ``PROMETHEUS_MULTIPROC_DIR``, a worker that exits has its live gauges removed from the
metrics folder (prometheus_client's multi-process mode); its counters stay, as counters must. Each worker learns
its thread count as ``WEB_THREADS`` before it loads Django, so the settings derived from it (how many log follows
may wait in one process, ``WORKLOAD_LOG_FOLLOW_WAITERS``) fit the threads it really has."""

from __future__ import annotations

import os


def child_exit(server, worker):
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)


def post_fork(server, worker):
    os.environ["WEB_THREADS"] = str(worker.cfg.threads)
