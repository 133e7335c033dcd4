"""The Celery application. Tasks live in each app's ``tasks.py``; periodic ones are declared in
``settings.CELERY_BEAT_SCHEDULE``. Log records in workers carry the task id as request id."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import task_postrun, task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("gpubroker")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

_tokens: dict[str, object] = {}


@task_prerun.connect
def _bind_task_context(task_id=None, task=None, **_):
    from core.logging import request_id_var

    _tokens[task_id] = request_id_var.set(f"task:{task_id}")
    _close_old_connections(task)


@task_postrun.connect
def _unbind_task_context(task_id=None, task=None, **_):
    from core.logging import request_id_var

    token = _tokens.pop(task_id, None)
    if token is not None:
        request_id_var.reset(token)
    _close_old_connections(task)


def _close_old_connections(task) -> None:
    """A task in a worker is a request: its database connection lives CONN_MAX_AGE and a broken one is
    replaced, as in Django's request cycle (settings.CELERY_DB_REUSE_MAX keeps Celery's Django fixup from
    closing it after every task). A task run eagerly uses its caller's connection, which is left alone."""
    from django.db import close_old_connections

    if task is not None and not getattr(task.request, "is_eager", False):
        close_old_connections()


@app.task(name="health.ping")
def ping() -> str:
    """Round trip through the broker; used by tests and operators to prove a worker consumes."""
    return "pong"
