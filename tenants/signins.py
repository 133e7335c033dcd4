"""Sign-ins in the tenants' audit trail: each portal or admin sign-in, successful or not, is an ``AuditEvent``
(``signin.success``, ``signin.failed``) in every tenant the user belongs to, so each tenant's admins see their
members' sign-ins (``GET /api/v1/audit-events?kind=signin``). A failure for a username that names no user is
in no tenant's trail (there is no tenant to tell; django-axes counts it for the lockout).

Django's authentication signals are the one place every sign-in path passes through (the login form, the
admin, a future single sign-on backend), so the receivers below are thin: they call ``signin_record``.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction

from tenants.audit import audit_record
from tenants.models import Membership


def _address(request) -> str:
    return (request.META.get("REMOTE_ADDR", "") if request is not None else "")[:64]


def signin_record(*, user, username: str, succeeded: bool, request=None) -> int:
    """One audit row per tenant of ``user`` (None: the username names no user; nothing recorded). Returns
    the number of rows written."""
    if user is None:
        return 0
    tenants = [m.tenant for m in Membership.objects.filter(user=user).select_related("tenant").order_by("tenant_id")]
    data = {"address": _address(request)}
    with transaction.atomic():
        for tenant in tenants:
            audit_record(tenant=tenant, by=user if succeeded else None,
                         action="signin.success" if succeeded else "signin.failed", target=username, data=data)
    return len(tenants)


def on_user_logged_in(sender, request, user, **kwargs) -> None:
    signin_record(user=user, username=user.get_username(), succeeded=True, request=request)


def on_user_login_failed(sender, credentials, request=None, **kwargs) -> None:
    username = (credentials or {}).get("username") or ""
    if not isinstance(username, str) or not username:
        return
    user = get_user_model().objects.filter(username=username).first()
    signin_record(user=user, username=username, succeeded=False, request=request)
