"""``Authorization: Bearer <token>`` for the REST API, and the login lockout of the portal and admin.

Failed token authentications are counted per (token prefix, address), and per address for tokens that name no
token (``tenants.throttling.FailedTokenThrottle``): bad tokens never lock a valid one out;
failed password logins by django-axes, per (username, address) and per address (``LoginLockoutBackend``); a
browser that followed an unlock link (``tenants.lockout``) passes the lockout for its one account.
"""

from __future__ import annotations

import math

from axes.backends import AxesBackend
from axes.helpers import get_cool_off
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import OuterRef, Subquery
from django.shortcuts import render
from django.utils import timezone
from rest_framework import authentication, exceptions

from core.prepared import PreparedQuery
from tenants import services
from tenants.lockout import login_unlocked_username
from tenants.models import ApiToken, Membership, Tenant
from tenants.throttling import FailedTokenThrottle
from tenants.tokens import token_matches, token_parse_prefix


class LoginLockoutBackend(AxesBackend):
    """django-axes' lockout check, first in ``AUTHENTICATION_BACKENDS``: a locked-out (username, address) or
    address is refused before ``ModelBackend`` hashes the password (so a burst of guesses cannot tie up the web
    workers). A browser holding an unlock cookie for ``username`` (``tenants.lockout``) goes on to the password
    check: the real user's way in while someone at their address keeps them locked out.

    Only logins that come with a request are counted and checked (the portal and admin sign-in forms); a
    call without one (``Client.login`` in tests, a shell) has no address to count and goes to the next
    backend.
    """

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        if username is not None and login_unlocked_username(request) == username:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


def login_lockout_response(request, original_response=None, credentials=None):
    """The page shown while locked out: 429 with Retry-After (the cool-off), the form that mails an unlock
    link, and how staff unlock."""
    cool_off = get_cool_off(request)
    seconds = math.ceil(cool_off.total_seconds()) if cool_off else None
    response = render(request, "registration/locked_out.html",
                      {"minutes": math.ceil(seconds / 60) if seconds else None,
                       "username": (credentials or {}).get("username") or request.POST.get("username", ""),
                       "failure_limit": settings.AXES_FAILURE_LIMIT},
                      status=settings.AXES_HTTP_RESPONSE_CODE)
    if seconds:
        response["Retry-After"] = str(seconds)
    return response


_token_prepared: PreparedQuery | None = None


def _fields(model) -> list[str]:
    return [field.attname for field in model._meta.concrete_fields]


def _token_lookup() -> PreparedQuery:
    """The token of a prefix with its tenant, its user and the member's role and projects, as one SQL statement
    compiled once (``core.prepared``: compiling the ORM's join and subquery cost more CPU than PostgreSQL
    answering it)."""
    global _token_prepared
    if _token_prepared is None:
        user_model = get_user_model()

        def build(prefix):
            member = Membership.objects.filter(user=OuterRef("user_id"), tenant=OuterRef("tenant_id")).order_by()
            # (user, tenant) is unique, like the prefix: no ordering to compile
            return (ApiToken.objects.filter(prefix=prefix).order_by()
                    .annotate(member_role=Subquery(member.values("role")[:1]),
                              member_project_ids=Subquery(member.values("project_ids")[:1]))
                    .values(*_fields(ApiToken), *(f"tenant__{name}" for name in _fields(Tenant)),
                            *(f"user__{name}" for name in _fields(user_model)), "member_role",
                            "member_project_ids")[:1])

        _token_prepared = PreparedQuery(build, prefix="\x00prefix")
    return _token_prepared


def _token_from_row(row: dict) -> ApiToken:
    user_model = get_user_model()
    token = ApiToken.from_db("default", _fields(ApiToken), [row[name] for name in _fields(ApiToken)])
    token.tenant = Tenant.from_db("default", _fields(Tenant), [row[f"tenant__{name}"] for name in _fields(Tenant)])
    token.user = user_model.from_db("default", _fields(user_model),
                                    [row[f"user__{name}"] for name in _fields(user_model)])
    token.member_role = row["member_role"]
    token.member_project_ids = row["member_project_ids"]  # the member's own project limit (None: none)
    return token


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, credentials = header.partition(" ")
        if scheme.lower() != self.keyword.lower():
            return None
        return self._authenticate_credentials(request, credentials.strip())

    @staticmethod
    def _refuse_throttled(wait: float):
        raise exceptions.Throttled(wait=wait, detail="Too many failed authentications with this token from "
                                                     "this address; try again later.")

    def _authenticate_credentials(self, request, credentials: str):
        throttle = FailedTokenThrottle()
        prefix = token_parse_prefix(credentials)
        if not credentials or prefix is None:
            if (wait := throttle.wait(request, prefix=None)) is not None:
                self._refuse_throttled(wait)
            throttle.record_failure(request, prefix=None)
            raise exceptions.AuthenticationFailed("Malformed bearer token; expected gpub_<prefix>_<secret>.")
        # failures of this prefix from this address: refused before the lookup and the hash
        if (wait := throttle.wait(request, prefix=prefix)) is not None:
            self._refuse_throttled(wait)
        # one query: the token, its tenant and user, and the user's current role in that tenant (read fresh
        # on every request, so a removed member or a changed role counts at once), compiled once per process
        found = _token_lookup().rows(prefix=prefix)
        if not found:  # names no token: the address's cap, which a token that exists never meets
            if (wait := throttle.wait(request, prefix=None)) is not None:
                self._refuse_throttled(wait)
            throttle.record_failure(request, prefix=None)
            raise exceptions.AuthenticationFailed("Invalid token.")
        token = _token_from_row(found[0])
        try:
            self._check_token(token, credentials)
        except exceptions.AuthenticationFailed:
            throttle.record_failure(request, prefix=prefix)
            raise
        token.role = token.member_role
        return token.user, token

    @staticmethod
    def _check_token(token: ApiToken, credentials: str) -> None:
        if not token_matches(credentials, token.secret_hash):
            raise exceptions.AuthenticationFailed("Invalid token.")
        now = timezone.now()
        if token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("Token revoked.")
        if token.expires_at is not None and token.expires_at <= now:
            raise exceptions.AuthenticationFailed("Token expired.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("The token's user is deactivated.")
        if token.member_role is None:
            raise exceptions.AuthenticationFailed("The token's user is no longer a member of its tenant.")
        services.api_token_mark_used(token=token, now=now)

    def authenticate_header(self, request):
        return f'{self.keyword} realm="api"'
