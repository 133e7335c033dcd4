"""Request budgets and the failed-token throttle, all counted in the shared cache (``CACHES``)."""

from __future__ import annotations

import math
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


# One Redis round trip per request: a sliding-window counter over two fixed windows (the current one and the
# one before, weighted by how much of it still lies inside the sliding window). KEYS: the current and the previous
# window's counters; ARGV: the limit, the window in seconds, the seconds elapsed in the current window. Counts the
# request when it is within the budget; answers {counted (1 or 0), the current count, the previous count} as they
# were before it, from which ``_over`` says how long to wait.
_SLIDING_WINDOW = """
local limit, window, elapsed = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local previous = tonumber(redis.call('GET', KEYS[2]) or '0')
if previous * (window - elapsed) / window + current >= limit then
  return {0, current, previous}
end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], math.ceil(2 * window) + 1)
return {1, current, previous}
"""

def _acting_tenant_id(request) -> int | None:
    """The tenant the permission check resolved for this request (``request.actor``), if any."""
    actor = getattr(request, "actor", None)
    tenant = getattr(actor, "tenant", None) if actor is not None else None
    return getattr(tenant, "pk", None)


class TenantRateThrottle(SimpleRateThrottle):
    """One request budget per tenant, shared by all its tokens and members' sessions, so one noisy tenant
    cannot starve the others, and minting a second token does not double a tenant's budget (an unauthenticated
    request counts against its address, a staff session without a tenant against its user).

    The budget (``API_RATE_LIMIT``, e.g. 6000/min) is a sliding window, counted as a sliding-window counter:
    the requests of the current fixed window plus those of the previous one weighted by the share of it still
    inside the sliding window. On Redis that is one script, one round trip and two small integers per tenant
    (DRF's ``SimpleRateThrottle`` read and rewrote the pickled list of every request's time, up to 6,000 floats,
    on each request). On another cache (PostgreSQL's, where no Redis answers) the same counter is kept with the
    cache's ``add`` and atomic ``incr``."""

    scope = "tenant"
    _scripts: dict[int, object] = {}

    def get_cache_key(self, request, view):
        token = getattr(request, "auth", None)
        if token is not None and getattr(token, "tenant_id", None) is not None:
            ident = f"tenant:{token.tenant_id}"
        elif (tenant_id := _acting_tenant_id(request)) is not None:  # a portal session on the API
            ident = f"tenant:{tenant_id}"
        elif request.user and request.user.is_authenticated:  # staff without a tenant
            ident = f"user:{request.user.pk}"
        else:
            ident = f"ip:{client_ip(request) or 'unknown'}"
        return self.cache_format % {"scope": self.scope, "ident": ident}

    def allow_request(self, request, view):
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        now = self.timer()
        window = int(now // self.duration)
        elapsed = now - window * self.duration
        current, previous = f"{key}:w{window}", f"{key}:w{window - 1}"
        self._wait: float | None = None
        backend = getattr(self.cache, "_cache", None)
        if hasattr(backend, "get_client") and hasattr(self.cache, "make_and_validate_key"):  # Redis
            client = backend.get_client(write=True)
            script = self._scripts.get(id(client))
            if script is None:
                script = self._scripts.setdefault(id(client), client.register_script(_SLIDING_WINDOW))
            counted, count, before = script(keys=[self.cache.make_and_validate_key(current),
                                                  self.cache.make_and_validate_key(previous)],
                                            args=[self.num_requests, self.duration, repr(elapsed)])
            if not counted:
                self._wait = self._seconds_to_wait(int(count), int(before), elapsed)
            return bool(counted)
        return self._allow_generic(current, previous, elapsed)

    def _over(self, count: int, before: int, elapsed: float) -> bool:
        """Whether a request now would exceed the budget: this window's ``count`` and the previous one's
        ``before``, weighted by the share of it still inside the sliding window (the script's test)."""
        return before * (self.duration - elapsed) / self.duration + count >= self.num_requests

    def _seconds_to_wait(self, count: int, before: int, elapsed: float) -> float:
        """Until the previous window's weight has fallen enough for one more request, else until this window
        ends; at least 1."""
        if count >= self.num_requests or before == 0:
            wait = self.duration - elapsed
        else:
            wait = self.duration * (1 - (self.num_requests - count) / before) - elapsed
            if wait <= 0:
                wait = self.duration - elapsed
        return float(max(1, math.ceil(wait)))

    def _allow_generic(self, current: str, previous: str, elapsed: float) -> bool:
        """The same counter on a cache without scripts (two reads, then ``add`` and ``incr``)."""
        counts = self.cache.get_many([current, previous])
        count, before = counts.get(current, 0), counts.get(previous, 0)
        if self._over(count, before, elapsed):
            self._wait = self._seconds_to_wait(count, before, elapsed)
            return False
        timeout = 2 * self.duration + 1
        if not self.cache.add(current, 1, timeout=timeout):
            try:
                self.cache.incr(current)
            except ValueError:  # expired between add and incr
                self.cache.set(current, 1, timeout=timeout)
        return True

    def wait(self):
        """Seconds until a request is allowed again (the 429's Retry-After), at least 1."""
        return getattr(self, "_wait", None) or 1.0


class FailedTokenThrottle:
    """Failed bearer-token authentications, in fixed windows on the shared cache, counted so that bad tokens
    sent from an address never lock a valid token out there (issue 27 item 7).

    Two kinds of counter, each refusing (429 until its window ends, ``wait()``) past
    ``API_TOKEN_FAILURE_LIMIT`` failures in ``API_TOKEN_FAILURE_WINDOW_SECONDS``:

    - per (token prefix, address), for a token whose prefix names a real token but which fails (wrong secret,
      revoked, expired, its user gone): only that prefix is refused from that address, before its hash is
      compared; every other token from the address works;
    - per address, for tokens that name no token at all (unparseable, or a prefix no token has): past the cap
      such tokens get 429 at once from that address, but a token whose prefix exists is never refused by it
      (it goes on to its own counter and its hash check).

    Counting uses the cache's atomic ``incr`` so concurrent web processes never lose a failure.
    """

    def __init__(self) -> None:
        self.limit = settings.API_TOKEN_FAILURE_LIMIT
        self.window_seconds = settings.API_TOKEN_FAILURE_WINDOW_SECONDS

    def _key(self, request, prefix: str | None, window_start: int) -> str:
        scope = f"prefix:{prefix}" if prefix else "unknown"
        return f"throttle:token-failures:{client_ip(request) or 'unknown'}:{scope}:{window_start}"

    def wait(self, request, *, prefix: str | None) -> float | None:
        """Seconds until this address may try the token of ``prefix`` (None: tokens that name no token) again;
        ``None`` when it may now."""
        now = time.time()
        start = int(now // self.window_seconds) * self.window_seconds
        if (cache.get(self._key(request, prefix, start)) or 0) < self.limit:
            return None
        return max(start + self.window_seconds - now, 1.0)

    def record_failure(self, request, *, prefix: str | None) -> None:
        start = int(time.time() // self.window_seconds) * self.window_seconds
        key = self._key(request, prefix, start)
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
