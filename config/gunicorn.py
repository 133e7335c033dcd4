"""gunicorn settings (``gunicorn -c python:config.gunicorn config.wsgi``), used by make run, the image and the
manifests. With ``PROMETHEUS_MULTIPROC_DIR``, a worker that exits has its live gauges removed from the
metrics folder (prometheus_client's multi-process mode); its counters stay, as counters must."""

from __future__ import annotations

import os


def child_exit(server, worker):
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
