"""Billing's events for a tenant (``credit.expiring``, ``dunning.*``), told through the teller the notifications
app registers at start-up (``notifications.apps``). The notification outbox sits above billing in the layers
(docs/architecture.md), so billing never imports it: it calls ``tell`` and the outbox does the rest, in the
caller's transaction."""

from __future__ import annotations

from collections.abc import Callable

_teller: Callable[..., object] | None = None


def teller_register(teller: Callable[..., object]) -> None:
    """Called once by the notifications app's ``ready()`` with ``notification_emit``."""
    global _teller
    _teller = teller


def tell(**event) -> object:
    """``notification_emit(**event)``: tenant, kind, data, key, now (and lease)."""
    if _teller is None:
        raise RuntimeError("no notification teller is registered: the notifications app is not installed")
    return _teller(**event)
