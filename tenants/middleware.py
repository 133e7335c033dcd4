"""Portal side: the current tenant of a logged-in user (``request.actor``), chosen in the session."""

from django.utils.functional import SimpleLazyObject

from tenants.selectors import actor_for_request


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
