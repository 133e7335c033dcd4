"""Where the broker takes part in tenants' decisions, without tenants importing it (the inverse of
``broker.extensions``: tenants sits below the broker in docs/architecture.md's table of layers).

The broker registers, in its ``AppConfig.ready``:

- **a tenant status listener** (``TenantStatusListener``): ``tenant_set_status`` calls ``prepare`` first in its
  transaction (the broker waits for a running schedule cycle and keeps cycles out until commit), ``changed``
  in the same transaction once the status row has changed (the broker holds the tenant's waiting leases, or
  gives them back), and ``settled`` after commit with the tenant as it now is (a suspended tenant's leases that
  hold capacity are released, each in its own transaction);
- **the quota usage** of live allocations, that ``GET /api/v1/quotas`` shows beside each quota;
- **the fleet's node pools** (``fleet_pools``), that a project's pools are checked against.

A deployment without the broker changes a tenant's status with no listener and shows quotas with no usage.
Tests may register their own and remove them (the ``unregister`` callables returned).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from tenants.access import Actor


@dataclass(frozen=True)
class TenantStatusChange:
    """A status change of ``tenant`` (re-read after the transaction for ``settled``): ``by`` the actor as lease
    events name it (``staff:<user>`` or ``broker``), ``note`` the reason as it ends a lease's reason (" (...)")."""

    tenant: object  # tenants.models.Tenant
    status: str
    by: str
    note: str
    now: datetime


@dataclass(frozen=True)
class TenantStatusListener:
    prepare: Callable[[], None]
    changed: Callable[[TenantStatusChange], None]
    settled: Callable[[TenantStatusChange], None]


QuotaUsage = dict[tuple[int, str], dict[str, int]]  # (project id, tier) -> {"in_use": milli, "over": milli}
_status_listeners: list[TenantStatusListener] = []
_quota_usage: list[Callable[[Actor], QuotaUsage]] = []
_fleet_pools: list[Callable[[], set[str]]] = []


def _register(registry: list, item) -> Callable[[], None]:
    if item not in registry:
        registry.append(item)
    return lambda: registry.remove(item) if item in registry else None


def tenant_status_listener_register(listener: TenantStatusListener) -> Callable[[], None]:
    return _register(_status_listeners, listener)


def tenant_status_listeners() -> tuple[TenantStatusListener, ...]:
    """The registered listeners, in registration order."""
    return tuple(_status_listeners)


def quota_usage_register(source: Callable[[Actor], QuotaUsage]) -> Callable[[], None]:
    """``source(actor)`` → the usage of the actor's tenant's live allocations; the last registered wins."""
    return _register(_quota_usage, source)


def quota_usage(*, actor: Actor) -> QuotaUsage:
    """The registered source's usage; empty without one."""
    return _quota_usage[-1](actor) if _quota_usage else {}


def fleet_pools_register(source: Callable[[], set[str]]) -> Callable[[], None]:
    """``source()`` → the node pools of the fleet; the last registered wins."""
    return _register(_fleet_pools, source)


def fleet_pools() -> set[str]:
    """The registered source's pools; empty without one (then no project can be bound to a pool)."""
    return _fleet_pools[-1]() if _fleet_pools else set()
