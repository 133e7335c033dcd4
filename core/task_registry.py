"""Follow-up tasks sent by name, so an app's services never import the module of tasks that calls them.

A Celery task is a thin wrapper over one service (STYLE.md), so ``<app>/tasks.py`` imports ``<app>/services``;
a service that sends follow-up work after commit would import the tasks back, a circle the architecture test
refuses. Instead each tasks module registers its tasks when it is imported (``tasks_register``), its
``AppConfig.ready`` imports it in every process, and a service looks a task up (``task``) when it sends it: the
same task object, so ``.delay`` / ``.apply_async`` (and a test's patch of them) behave as before.
"""

from __future__ import annotations

from typing import Any

_tasks: dict[tuple[str, str], Any] = {}


def tasks_register(app: str, **tasks: Any) -> None:
    """Register ``app``'s tasks under their Python names (``tasks_register("broker", schedule_cycle=...)``)."""
    _tasks.update({(app, name): value for name, value in tasks.items()})


def task(app: str, name: str) -> Any:
    """``app``'s task ``name``; LookupError when its tasks module was never imported (its ``AppConfig.ready``)."""
    try:
        return _tasks[app, name]
    except KeyError:
        raise LookupError(f"no task {app}.{name}: {app}/tasks.py registers it when imported ({app}.apps)") from None
