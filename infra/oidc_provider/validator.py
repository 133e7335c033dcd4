"""The claims this provider puts in ID tokens and userinfo: e-mail (verified), name and groups; and the two
test users that misbehave on purpose (a wrong audience, an expired token) so the broker's refusals meet
tokens signed by a real provider."""

from datetime import timedelta

from django.utils import timezone
from oauth2_provider.oauth2_validators import OAuth2Validator

WRONG_AUDIENCE_USER = "wrong-audience"
EXPIRED_USER = "expired"


class ClaimsValidator(OAuth2Validator):
    oidc_claim_scope = None  # every claim to every client that asked for openid (a test provider)

    def get_additional_claims(self, request):
        user = request.user
        return {"email": user.email, "email_verified": True, "name": user.get_full_name() or user.username,
                "preferred_username": user.username,
                "groups": sorted(group.name for group in user.groups.all())}

    def get_id_token_dictionary(self, token, token_handler, request):
        claims, expiration_time = super().get_id_token_dictionary(token, token_handler, request)
        if request.user.username == WRONG_AUDIENCE_USER:
            claims["aud"] = "another-client"
        if request.user.username == EXPIRED_USER:
            past = timezone.now() - timedelta(hours=1)
            claims["iat"] = claims["auth_time"] = int(past.timestamp()) - 300
            claims["exp"] = int(past.timestamp())
        return claims, expiration_time
