"""Retention: how long each kind of data is kept, and the one purge that removes what is older.

The policy is in settings (``RETENTION_*_DAYS``, docs/security.md "Retention"): each *kind* is a name, the
setting that gives its age limit in days, and a ``purge(cutoff)`` that deletes that kind's rows older than
``cutoff`` and returns how many it removed. Tenants holds the registry (it is the lowest app); each app registers
its own kinds in its ``AppConfig.ready`` (the broker its lease events, billing its utilisation samples), so
tenants never imports them. Invoices and the usage they were computed from are not a kind: they are kept as the
law requires (``RETENTION_INVOICE_YEARS``, reported, never purged here).

``retention_apply`` is the only path: one transaction that sets ``gpubroker.retention_purge`` for itself (the
append-only triggers of audit and lease events let a DELETE through only then, migration tenants 0006), runs
every kind's purge and writes one ``retention.purge`` audit row with what it removed. Running it again removes
nothing and writes nothing (idempotent): the periodic task (``tenants.retention_apply``) and the command
(``manage.py retention_apply``) call it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from tenants.audit import audit_record
from tenants.models import AuditEvent


@dataclass(frozen=True)
class RetentionKind:
    """``name`` as reported; ``setting`` the settings name of its age limit in days; ``purge(cutoff)`` deletes
    its rows older than ``cutoff`` (inside ``retention_apply``'s transaction) and returns how many;
    ``count(cutoff)`` says how many it would (``--dry-run``); ``description`` what the rows are."""

    name: str
    setting: str
    purge: Callable[[datetime], int]
    count: Callable[[datetime], int]
    description: str


_kinds: dict[str, RetentionKind] = {}


def retention_kind_register(kind: RetentionKind) -> Callable[[], None]:
    """Add a kind (the last registration of a name wins); returns its removal (for tests)."""
    _kinds[kind.name] = kind
    return lambda: _kinds.pop(kind.name, None)


def retention_kinds() -> tuple[RetentionKind, ...]:
    return tuple(_kinds[name] for name in sorted(_kinds))


def retention_policy() -> list[dict]:
    """The policy as configured: each kind with its age limit in days, then the records kept by law."""
    rows = [{"kind": kind.name, "days": getattr(settings, kind.setting), "setting": kind.setting,
             "action": "purged", "description": kind.description} for kind in retention_kinds()]
    rows.append({"kind": "invoices", "days": settings.RETENTION_INVOICE_YEARS * 366,
                 "setting": "RETENTION_INVOICE_YEARS", "action": "kept",
                 "description": "invoices, their lines and the metered usage behind them: never purged here"})
    return rows


def retention_apply(*, now: datetime | None = None, dry_run: bool = False) -> dict:
    """Purge every registered kind's rows older than its limit, in one transaction with its audit row.
    Returns ``{"removed": {kind: rows}, "cutoffs": {kind: iso}, "dry_run": bool}``; a ``dry_run`` counts and
    removes nothing."""
    now = now or timezone.now()
    cutoffs = {kind.name: now - timedelta(days=getattr(settings, kind.setting)) for kind in retention_kinds()}
    report = {"removed": {}, "cutoffs": {name: cutoff.isoformat() for name, cutoff in cutoffs.items()},
              "dry_run": dry_run}
    if dry_run:
        report["removed"] = {kind.name: kind.count(cutoffs[kind.name]) for kind in retention_kinds()}
        return report
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL gpubroker.retention_purge = 'on'")
        for kind in retention_kinds():
            report["removed"][kind.name] = kind.purge(cutoffs[kind.name])
        with connection.cursor() as cursor:  # nothing after the purge deletes under the setting
            cursor.execute("SET LOCAL gpubroker.retention_purge = 'off'")
        if any(report["removed"].values()):
            audit_record(tenant=None, by=None, action="retention.purge", target="retention",
                         data={"removed": report["removed"], "cutoffs": report["cutoffs"]})
    return report


# -- the tenants' own kind: audit events -------------------------------------------------------------------------
def _audit_old(cutoff: datetime):
    return AuditEvent.objects.filter(created_at__lt=cutoff)


retention_kind_register(RetentionKind(
    name="audit_events", setting="RETENTION_AUDIT_DAYS",
    purge=lambda cutoff: _audit_old(cutoff).delete()[0],
    count=lambda cutoff: _audit_old(cutoff).count(),
    description="the audit trail (changes, sign-ins, token use), every tenant's and the platform's"))
