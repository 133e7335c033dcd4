"""What asks for work: follow-up tasks sent after commit, and the schedule-cycle flag that lets one cycle serve many
triggers."""

from __future__ import annotations

import logging
from typing import Any

from celery import current_app
from django.core.cache import cache
from django.db import DatabaseError, connection, transaction

from core.task_registry import task as registered_task

logger = logging.getLogger(__name__)


def task(name: str) -> Any:
    """The broker's task ``name`` (registered by ``broker.tasks``: ``core.task_registry``)."""
    return registered_task("broker", name)


def enqueue(task_name: str, *args) -> None:
    """Send the task once the current transaction commits (a schedule cycle: ``schedule_cycle_request``)."""
    if task_name == "schedule_cycle" and not args:
        transaction.on_commit(schedule_cycle_request)
        return
    transaction.on_commit(lambda: task(task_name).delay(*args))


def enqueue_each(task_name: str, batches: list[list]) -> None:
    """``task(batch)`` for each batch, all sent by one callback once the current transaction commits (a schedule
    cycle sends one provisioning task per node: ~2,000 at fleet scale)."""
    if not batches:
        return
    def send() -> None:
        sending = task(task_name)
        for batch in batches:
            sending.delay(batch)

    transaction.on_commit(send)


# -- schedule-cycle triggers -------------------------------------------------------------------------
# Every request, release and requeue asks for a cycle, but one cycle serves many: a flag in the shared cache
# (Redis, or PostgreSQL's cache table where the broker is not Redis: settings CACHES) means "a cycle has been
# sent whose look at the queue after its commit is still to come". A trigger sets it (an atomic add) once its
# own transaction has committed, and sends the task only when it was not set already. A cycle, after it
# commits, clears the flag and only then looks for queued leases it did not see (sending the next cycle when
# there are). So a trigger that found the flag set committed before that look and is found by it; while
# cycles run back to back, requests send no tasks at all. A cycle that finds another one running skips: the
# running one's look comes after it. The flag expires (a lost message costs at most CYCLE_FLAG_SECONDS, and
# beat sends a cycle every 10 s anyway). The flag is shared by every web and worker process of a deployment
# (it used to live in the broker's Redis only, so with RabbitMQ every trigger sent a task).
CYCLE_FLAG_SECONDS = 10


def _cycle_flag_key() -> str:
    """This deployment's flag: one per database and Celery queue (under the cache's ``KEY_PREFIX``)."""
    return f"cycle-requested:{connection.settings_dict['NAME']}:{current_app.conf.task_default_queue}"


def schedule_cycle_request() -> None:
    """Ask for a schedule cycle; call it after the change it is for has committed (``enqueue`` does)."""
    import redis

    try:
        if not cache.add(_cycle_flag_key(), 1, timeout=CYCLE_FLAG_SECONDS):
            return  # a requested cycle has not read the queue yet: it will see this change
    except (redis.RedisError, DatabaseError) as error:
        logger.warning("schedule-cycle flag not set (%s); sending the task anyway", error)
    task("schedule_cycle").delay()


def cycle_flag_clear() -> None:
    """A cycle is about to look at the queue: changes committed after this must ask for another one."""
    import redis

    try:
        cache.delete(_cycle_flag_key())
    except (redis.RedisError, DatabaseError) as error:
        logger.warning("schedule-cycle flag not cleared (%s); it expires in %s s", error, CYCLE_FLAG_SECONDS)
