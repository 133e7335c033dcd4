"""The one way a service writes its audit row (Zulip's ``RealmAuditLog`` idea): who did what to which object.

Every service that changes something a platform admin or a tenant owner must be able to trace calls
``audit_record`` inside its own transaction, so the row exists exactly when the change does. It lives with the
``AuditEvent`` model it writes, in ``tenants`` (the lowest app), so that every app above can call it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from tenants.access import Actor, require_admin_read, restrict
from tenants.models import AuditEvent, Tenant


def audit_record(*, tenant: Tenant | None, by: Actor | Any | None, action: str, target: str,
                 data: dict[str, Any] | None = None) -> AuditEvent:
    """Append one ``AuditEvent``: ``tenant`` None for platform-wide changes (nodes, list prices), ``by`` the
    ``Actor`` or user who made the change (recorded only when it is an authenticated user; None or an anonymous
    user: a task, a command or the system), ``action`` a dotted verb (``lease.release``), ``target`` what it
    was done to, ``data`` what a reader needs to understand it (JSON)."""
    user = by.user if isinstance(by, Actor) else by
    return AuditEvent.objects.create(
        tenant=tenant, actor=user if user is not None and user.is_authenticated else None, action=action,
        target=target, data=data or {})


# --- readers -------------------------------------------------------------------------------------------


def audit_event_list(*, actor: Actor, username: str = "", kind: str = "", target: str = "",
                     since: datetime | None = None, until: datetime | None = None) -> QuerySet[AuditEvent]:
    """The tenant's audit trail, newest first, for its admins and owners (through ``restrict``: another
    tenant's events and the platform's own are never in it). ``kind`` matches an action exactly or as a dotted
    prefix (``token`` matches ``token.create`` and ``token.use``); ``since`` inclusive, ``until`` exclusive."""
    require_admin_read(actor, "The audit trail is")
    events = restrict(AuditEvent.objects.select_related("actor"), actor)
    if username:
        events = events.filter(actor__username=username)
    if kind:
        events = events.filter(Q(action=kind) | Q(action__startswith=f"{kind}."))
    if target:
        events = events.filter(target=target)
    if since is not None:
        events = events.filter(created_at__gte=since)
    if until is not None:
        events = events.filter(created_at__lt=until)
    return events.order_by("-created_at", "-id")
