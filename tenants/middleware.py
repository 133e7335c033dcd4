"""Portal side: the current tenant of a logged-in user (``request.actor``), chosen in the session; and the end of
a password session once the user's tenant has switched local passwords off."""

import logging

from django.contrib import auth, messages
from django.contrib.auth import BACKEND_SESSION_KEY
from django.utils.functional import SimpleLazyObject

from tenants.audit import audit_record
from tenants.selectors import actor_for_request
from tenants.sso import BACKEND_PATH, password_refusal_text, password_sign_in_blocker

log = logging.getLogger(__name__)


class PasswordSessionMiddleware:
    """Ends, at its next request, a session that was opened with a local password when a tenant of the user's
    has since switched local passwords off (``TenantSignIn.local_passwords_disabled``): the switch takes effect
    for sessions already open, not only for the next sign-in. Sessions opened through single sign-on and staff
    sessions (staff keep their password, with the second factor) are left alone. One indexed query per request
    of a signed-in, non-staff password session; API calls with a bearer token carry no session and are not
    touched (their tokens stay valid: switching passwords off is not a revocation)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        session = getattr(request, "session", None)
        user = getattr(request, "user", None)
        if (session is not None and user is not None and session.get(BACKEND_SESSION_KEY)
                and session.get(BACKEND_SESSION_KEY) != BACKEND_PATH and user.is_authenticated
                and not user.is_staff):
            blocker = password_sign_in_blocker(user)
            if blocker is not None:
                refusal = password_refusal_text(blocker)
                username = user.get_username()
                audit_record(tenant=blocker.tenant, by=user, action="signin.session_ended", target=username,
                             data={"reason": "local passwords switched off", "via": "password"})
                log.info("password session ended: local passwords are off", extra={"user": username})
                auth.logout(request)
                messages.warning(request, f"You were signed out: {refusal}")
        return self.get_response(request)


class CurrentTenantMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path.startswith("/api/"):
            return self.get_response(request)  # DRF resolves the actor after authenticating the token
        request.actor = SimpleLazyObject(
            lambda: actor_for_request(request) if request.user.is_authenticated else None
        )
        return self.get_response(request)
