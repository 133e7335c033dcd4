from rest_framework.throttling import SimpleRateThrottle


class TenantRateThrottle(SimpleRateThrottle):
    """One request budget per token (or per session user), so one noisy script cannot starve others."""

    scope = "tenant"

    def get_cache_key(self, request, view):
        token = getattr(request, "auth", None)
        if token is not None and hasattr(token, "prefix"):
            ident = f"token:{token.prefix}"
        elif request.user and request.user.is_authenticated:
            ident = f"user:{request.user.pk}"
        else:
            ident = f"ip:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}
