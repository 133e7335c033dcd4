"""The profiler's samples credential (docs/security.md, "Workload secrets"): what a profiling lease's workload
holds to report its throughput, and nothing else.

It reads ``gpubs_<signed>``: the run, the candidate slice (one lease of the run per slice) and an expiry,
signed with Django's ``signing`` (HMAC-SHA256 under ``SECRET_KEY``, salted for this one use). Only
``LeaseSampleApi`` accepts it (``SamplesCredentialAuthentication``), and only for the lease of that run and
slice, while the run is running and before the expiry; every other route parses bearer tokens as API tokens
(``gpub_<prefix>_<secret>``) and refuses it with 401. No API token is minted for a profiling run any more, and
none can be derived from this credential: it holds no secret of the tenant's, only a signature the broker checks.
It reaches the workload through ``secret_env`` (never shown), so even a viewer who reads every answer never
sees it; the workload that holds it can post samples for its own lease, which is what it is for.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import AnonymousUser
from django.core import signing
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

PREFIX = "gpubs_"
_SALT = "gpubroker.tiering.samples-credential"


@dataclass(frozen=True)
class SamplesCredential:
    """A verified credential: it may post samples for the lease of ``run_id``'s candidate ``slice_key``."""

    run_id: int
    slice_key: str


def samples_credential_issue(*, run_id: int, slice_key: str, expires_at: datetime) -> str:
    return PREFIX + signing.dumps({"run": run_id, "slice": slice_key, "exp": int(expires_at.timestamp())},
                                  salt=_SALT)


def samples_credential_check(value: str, *, now: datetime) -> SamplesCredential | None:
    """The credential ``value`` stands for, or None (not one, a bad signature, expired)."""
    if not value.startswith(PREFIX):
        return None
    try:
        data = signing.loads(value[len(PREFIX):], salt=_SALT)
    except signing.BadSignature:
        return None
    if (not isinstance(data, dict) or not isinstance(data.get("run"), int) or not isinstance(data.get("slice"), str)
            or not isinstance(data.get("exp"), int) or data["exp"] <= now.timestamp()):
        return None
    return SamplesCredential(data["run"], data["slice"])


class SamplesCredentialAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer gpubs_…`` on the samples route only (``LeaseSampleApi`` lists it before the API
    token's authentication, which refuses the same header everywhere else). Another bearer token is left to the
    next authentication; a ``gpubs_`` one that does not verify is 401, counted as a failed token."""

    keyword = "Bearer"

    def authenticate(self, request):
        from tenants.throttling import FailedTokenThrottle

        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, value = header.partition(" ")
        value = value.strip()
        if scheme.lower() != self.keyword.lower() or not value.startswith(PREFIX):
            return None
        credential = samples_credential_check(value, now=timezone.now())
        if credential is None:  # a bad one only: the address's cap for tokens that name none never refuses a good one
            throttle = FailedTokenThrottle()
            wait = throttle.wait(request, prefix=None)
            if wait is not None:
                raise exceptions.Throttled(wait=wait, detail="Too many failed token authentications from this "
                                                             "address; try again later.")
            throttle.record_failure(request, prefix=None)
            raise exceptions.AuthenticationFailed("Invalid or expired samples credential.")
        return AnonymousUser(), credential

    def authenticate_header(self, request):
        return f'{self.keyword} realm="api"'


class SamplesCredentialScheme(OpenApiAuthenticationExtension):
    target_class = "tiering.credentials.SamplesCredentialAuthentication"
    name = "samplesCredential"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "gpubs_<signed>",
                "description": "A profiling lease's samples credential (in its workload's secret_env as "
                               "PERF_TOKEN): posts samples for that lease only; refused on every other route."}
