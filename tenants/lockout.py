"""A way in for the real user while sign-in is locked out (docs/security.md "Lockouts as a denial of service").

The lockout (django-axes, ``config/settings.py`` ``AXES_*``) counts failures per (username, address) and per
address. Someone who shares the user's address (an office's NAT) can still lock the user out there. The user
then asks for an unlock link on the locked-out page: a signed, expiring, single-use link mailed to the account's
address. Following it gives that browser a signed cookie naming the account; while it lasts,
``LoginLockoutBackend`` lets that one account past the lockout to the password check (failures still count).
The link never signs anyone in: who reads the mailbox still needs the password. The attacker's own counters are
left as they were.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.core.cache import cache
from django.core.mail import send_mail

from core.errors import Conflict, ValidationFailed
from tenants.audit import audit_record

UNLOCK_LINK_SALT = "tenants.lockout.unlock-link"
UNLOCK_COOKIE = "login_unlock"
UNLOCK_COOKIE_SALT = "tenants.lockout.unlock-cookie"


def login_unlock_send(*, username: str, link_for) -> bool:
    """Mail an unlock link to the active account ``username`` has, if it has an e-mail address.

    ``link_for(token)`` turns the signed token into the absolute URL to mail. At most one mail per account per
    ``LOGIN_UNLOCK_RESEND_SECONDS`` (the form cannot be used to flood a mailbox). Answers whether a mail went
    out; callers must not tell the requester (no account enumeration).
    """
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None or not user.email:
        return False
    if not cache.add(f"login-unlock:sent:{user.pk}", 1, timeout=settings.LOGIN_UNLOCK_RESEND_SECONDS):
        return False
    token = signing.dumps({"user": user.pk, "nonce": secrets.token_urlsafe(16)}, salt=UNLOCK_LINK_SALT)
    minutes = max(1, settings.LOGIN_UNLOCK_LINK_SECONDS // 60)
    send_mail("Unlock your GPU broker sign-in",
              f"Someone (we hope you) asked to unlock sign-in for {user.get_username()} after too many failed "
              f"attempts.\n\nThis link works once, within {minutes} minutes, in the browser you open it in:\n"
              f"{link_for(token)}\n\nYou still need your password. If you did not ask, ignore this mail: "
              f"someone may be guessing your password; consider changing it.\n",
              None, [user.email])
    return True


def login_unlock_redeem(*, token: str, ip_address: str | None):
    """Check an unlock link's token and spend it; answer its user.

    Refuses (``ValidationFailed``) a token that is forged, altered or older than ``LOGIN_UNLOCK_LINK_SECONDS``,
    or whose account is gone or deactivated; refuses (``Conflict``) one already used: its nonce is claimed in
    the shared cache with ``add``, so two web processes cannot both spend it.
    """
    max_age = settings.LOGIN_UNLOCK_LINK_SECONDS
    try:
        data = signing.loads(token, salt=UNLOCK_LINK_SALT, max_age=max_age)
    except signing.SignatureExpired:
        raise ValidationFailed("This unlock link has expired; ask for a new one.", field="token") from None
    except signing.BadSignature:
        raise ValidationFailed("This unlock link is not valid.", field="token") from None
    user = get_user_model().objects.filter(pk=data.get("user"), is_active=True).first()
    if user is None:
        raise ValidationFailed("This unlock link is not valid.", field="token")
    if not cache.add(f"login-unlock:used:{data.get('nonce')}", 1, timeout=max_age + 60):
        raise Conflict("This unlock link has already been used; ask for a new one.")
    audit_record(tenant=None, by=None, action="login.unlock", target=f"user:{user.pk}",
                 data={"address": ip_address})
    return user


def login_unlocked_username(request) -> str | None:
    """The account this browser was unlocked for by a followed link, while its cookie lasts; else None."""
    try:
        return request.get_signed_cookie(UNLOCK_COOKIE, default=None, salt=UNLOCK_COOKIE_SALT,
                                         max_age=settings.AXES_COOLOFF_TIME.total_seconds())
    except (signing.BadSignature, ValueError):
        return None


def login_unlock_cookie_set(response, *, user) -> None:
    """Give the browser that followed the link the cookie ``login_unlocked_username`` reads."""
    response.set_signed_cookie(UNLOCK_COOKIE, user.get_username(), salt=UNLOCK_COOKIE_SALT,
                               max_age=int(settings.AXES_COOLOFF_TIME.total_seconds()),
                               secure=settings.SESSION_COOKIE_SECURE, httponly=True, samesite="Lax")
