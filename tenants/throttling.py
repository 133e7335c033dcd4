"""Request budgets and the failed-token throttle, all counted in the shared cache (``CACHES``)."""

from __future__ import annotations

import threading
import time

from django.conf import settings
from django.core.cache import cache
from django.http import HttpResponse
from django.urls import reverse
from rest_framework.throttling import BaseThrottle, SimpleRateThrottle


def client_ip(request) -> str | None:
    """The client's address, one definition for the login lockout and the API throttles.

    ``REMOTE_ADDR``; with ``TRUSTED_PROXY_COUNT`` = N > 0 (DRF's ``NUM_PROXIES``), the address the N-th
    proxy from us saw in ``X-Forwarded-For``. A client cannot choose its address by sending that header.
    ``None`` for a request without one (``Client.login`` in tests).
    """
    return BaseThrottle().get_ident(request) or None


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
            ident = f"ip:{client_ip(request) or 'unknown'}"
        return self.cache_format % {"scope": self.scope, "ident": ident}

    def wait(self):
        """Seconds until a request is allowed again. DRF answers None once the history holds more than the
        rate allows (it did, counted under a higher rate), and the 429 then had no Retry-After."""
        wait = super().wait()
        if wait is None and self.history:
            wait = max(1.0, self.duration - (self.now - self.history[-1]))  # until the oldest one expires
        return wait


class FailedTokenThrottle:
    """Failed bearer-token authentications per client address, in fixed windows on the shared cache.

    Past ``API_TOKEN_FAILURE_LIMIT`` failures in a window of ``API_TOKEN_FAILURE_WINDOW_SECONDS``, every
    bearer request from that address is refused until the window ends (``wait()``), the good ones too:
    whoever guesses from an address learns nothing more there for a while. Counting uses the cache's
    atomic ``incr`` so concurrent web processes never lose a failure.
    """

    def __init__(self) -> None:
        self.limit = settings.API_TOKEN_FAILURE_LIMIT
        self.window_seconds = settings.API_TOKEN_FAILURE_WINDOW_SECONDS

    def _window(self, now: float) -> int:
        return int(now // self.window_seconds) * self.window_seconds

    def _key(self, request, window_start: int) -> str:
        return f"throttle:token-failures:{client_ip(request) or 'unknown'}:{window_start}"

    def wait(self, request) -> float | None:
        """Seconds until this address may try a token again; ``None`` when it may now."""
        now = time.time()
        start = self._window(now)
        if (cache.get(self._key(request, start)) or 0) < self.limit:
            return None
        return max(start + self.window_seconds - now, 1.0)

    def record_failure(self, request) -> None:
        start = self._window(time.time())
        key = self._key(request, start)
        cache.add(key, 0, timeout=self.window_seconds + 5)
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, 1, timeout=self.window_seconds + 5)


class LoginConcurrencyMiddleware:
    """At most ``LOGIN_CONCURRENCY`` sign-in POSTs (portal and admin) at once per web process.

    Checking a password costs about a second of CPU (PBKDF2). A sign-in beyond the limit is answered at
    once with 429 and ``Retry-After: 1`` instead of taking a thread to wait: a burst of guesses then never
    holds every thread of a web worker, and health probes and pages keep answering. (The lockout stops
    the hashing for a locked-out address or account; this bounds the hashing before the lockout starts.)
    """

    def __init__(self, get_response):
        self.get_response = get_response
        self.slots = threading.BoundedSemaphore(settings.LOGIN_CONCURRENCY)
        self.paths: frozenset[str] | None = None

    def __call__(self, request):
        if request.method != "POST":
            return self.get_response(request)
        if self.paths is None:
            self.paths = frozenset({reverse("login"), reverse("admin:login")})
        if request.path not in self.paths:
            return self.get_response(request)
        if not self.slots.acquire(blocking=False):
            response = HttpResponse("Too many sign-ins at once; try again in a second.\n", status=429,
                                    content_type="text/plain; charset=utf-8")
            response["Retry-After"] = "1"
            return response
        try:
            return self.get_response(request)
        finally:
            self.slots.release()
