"""``Authorization: Bearer <token>`` for the REST API."""

from __future__ import annotations

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
        token = ApiToken.objects.select_related("tenant", "user").filter(prefix=prefix).first()
        if token is None or not token_matches(credentials, token.secret_hash):
            raise exceptions.AuthenticationFailed("Invalid token.")
        now = timezone.now()
        if token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("Token revoked.")
        if token.expires_at is not None and token.expires_at <= now:
            raise exceptions.AuthenticationFailed("Token expired.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("The token's user is deactivated.")
        membership = Membership.objects.filter(user=token.user, tenant=token.tenant).first()
        if membership is None:
            raise exceptions.AuthenticationFailed("The token's user is no longer a member of its tenant.")
        services.api_token_mark_used(token=token, now=now)
        token.role = membership.role  # the member's current role, read fresh on every request
        return token.user, token

    def authenticate_header(self, request):
        return f'{self.keyword} realm="api"'
