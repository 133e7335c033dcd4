"""What asks for work: follow-up tasks sent after commit, and the schedule-cycle flag that lets one cycle serve many
triggers."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import connection, transaction

logger = logging.getLogger(__name__)


def enqueue(task_name: str, *args) -> None:
    """Send the task once the current transaction commits (a schedule cycle: ``schedule_cycle_request``)."""
    if task_name == "schedule_cycle" and not args:
        transaction.on_commit(schedule_cycle_request)
        return
    from leasing import tasks

    transaction.on_commit(lambda: getattr(tasks, task_name).delay(*args))


# -- schedule-cycle triggers -------------------------------------------------------------------------
# Every request, release and requeue asks for a cycle, but one cycle serves many: a flag in the Celery
# broker's Redis means "a cycle has been sent whose look at the queue after its commit is still to come".
# A trigger sets it (SET NX) once its own transaction has committed, and sends the task only when it was
# not set already. A cycle, after it commits, clears the flag and only then looks for queued leases it did
# not see (sending the next cycle when there are). So a trigger that found the flag set committed before
# that look and is found by it; while cycles run back to back, requests send no tasks at all. A cycle that
# finds another one running skips: the running one's look comes after it. The flag expires (a lost message
# costs at most CYCLE_FLAG_SECONDS, and beat sends a cycle every 10 s anyway); without Redis (amqp,
# filesystem) every trigger sends its task, as before.
CYCLE_FLAG_SECONDS = 10
_cycle_flags: dict[str, object] = {}


def _cycle_flag():
    """(Redis client, key) of this deployment's flag (its database and queue), or None without Redis."""
    from config.celery import app

    url = settings.CELERY_BROKER_URL
    if not url.startswith(("redis://", "rediss://")):
        return None
    client = _cycle_flags.get(url)
    if client is None:
        import redis

        client = _cycle_flags[url] = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    key = f"gpubroker:cycle-requested:{connection.settings_dict['NAME']}:{app.conf.task_default_queue}"
    return client, key


def schedule_cycle_request() -> None:
    """Ask for a schedule cycle; call it after the change it is for has committed (``enqueue`` does)."""
    import redis

    from leasing import tasks

    flag = _cycle_flag()
    if flag is not None:
        client, key = flag
        try:
            if not client.set(key, b"1", nx=True, ex=CYCLE_FLAG_SECONDS):
                return  # a requested cycle has not read the queue yet: it will see this change
        except redis.RedisError as error:
            logger.warning("schedule-cycle flag not set (%s); sending the task anyway", error)
    tasks.schedule_cycle.delay()


def cycle_flag_clear() -> None:
    """A cycle is about to look at the queue: changes committed after this must ask for another one."""
    import redis

    flag = _cycle_flag()
    if flag is not None:
        client, key = flag
        try:
            client.delete(key)
        except redis.RedisError as error:
            logger.warning("schedule-cycle flag not cleared (%s); it expires in %s s", error, CYCLE_FLAG_SECONDS)


