"""``Authorization: Bearer <token>`` for the REST API."""

from __future__ import annotations

from django.db.models import OuterRef, Subquery
from django.utils import timezone
from rest_framework import authentication, exceptions

from tenants import services
from tenants.models import ApiToken, Membership
from tenants.tokens import token_matches, token_parse_prefix


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, credentials = header.partition(" ")
        if scheme.lower() != self.keyword.lower():
            return None
        credentials = credentials.strip()
        prefix = token_parse_prefix(credentials)
        if not credentials or prefix is None:
            raise exceptions.AuthenticationFailed("Malformed bearer token; expected gpub_<prefix>_<secret>.")
        # one query: the token, its tenant and user, and the user's current role in that tenant (read fresh
        # on every request, so a removed member or a changed role counts at once)
        role = (Membership.objects.filter(user=OuterRef("user_id"), tenant=OuterRef("tenant_id")).order_by()
                .values("role")[:1])  # (user, tenant) is unique, like the prefix: no ordering to compile
        found = list(ApiToken.objects.select_related("tenant", "user").annotate(member_role=Subquery(role))
                     .filter(prefix=prefix).order_by()[:1])
        token = found[0] if found else None
        if token is None or not token_matches(credentials, token.secret_hash):
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
        token.role = token.member_role
        return token.user, token

    def authenticate_header(self, request):
        return f'{self.keyword} realm="api"'
