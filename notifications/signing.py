"""Webhook signatures (Stripe's scheme, our header): ``Gpub-Signature: t=<unix>,v1=<hex>[,v1=<hex>]``.

Each ``v1`` is HMAC-SHA256 over ``f"{t}.{body}"`` (the exact bytes sent) with one of the endpoint's live
secrets: the current one and, for a grace period after a rotation, the previous one. A receiver accepts
the event when any ``v1`` matches one of its secrets and ``t`` is recent (docs/notifications.md).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SIGNATURE_HEADER = "Gpub-Signature"
SECRET_PREFIX = "whsec_"
DEFAULT_TOLERANCE_SECONDS = 300


def secret_generate() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    signed = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def signature_header(signing_secrets: list[str], timestamp: int, body: bytes) -> str:
    return ",".join([f"t={timestamp}"] + [f"v1={signature(s, timestamp, body)}" for s in signing_secrets])


def signature_verify(header: str, body: bytes, secret: str, *, now: int,
                     tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS) -> bool:
    """What a receiver does (the snippet in docs/notifications.md is this function, standalone)."""
    items = [part.split("=", 1) for part in header.split(",") if "=" in part]
    timestamps = [value for key, value in items if key == "t"]
    if len(timestamps) != 1 or not (timestamps[0].isascii() and timestamps[0].isdigit()):
        return False
    timestamp = int(timestamps[0])
    if abs(now - timestamp) > tolerance_seconds:
        return False
    expected = signature(secret, timestamp, body)
    return any(hmac.compare_digest(expected, value) for key, value in items if key == "v1")
