"""Webhook events as Stripe sends them, signed as Stripe signs them.

Stripe's scheme (https://docs.stripe.com/webhooks#verify-manually): the ``Stripe-Signature`` header is
``t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<raw body>" keyed with the endpoint secret>``; receivers refuse
signatures that do not match and timestamps older than their tolerance (the SDKs default to 300 s).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
import urllib.error
import urllib.request
from typing import Any

from tests.stripe_server.state import API_VERSION


def build_event(event_type: str, obj: dict[str, Any], *, created: int | None = None,
                event_id: str | None = None) -> dict[str, Any]:
    """An event object (``evt_…``) whose ``data.object`` is ``obj`` (e.g. an invoice from the server)."""
    return {
        "id": event_id or "evt_" + secrets.token_hex(12), "object": "event", "api_version": API_VERSION,
        "created": int(time.time()) if created is None else created, "data": {"object": obj}, "livemode": False,
        "pending_webhooks": 1, "request": {"id": None, "idempotency_key": None}, "type": event_type,
    }


def encode(event: dict[str, Any]) -> bytes:
    return json.dumps(event, indent=2).encode()


def sign(payload: bytes, secret: str, timestamp: int) -> str:
    signed = f"{timestamp}.".encode() + payload
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def signature_header(payload: bytes, secret: str, *, timestamp: int | None = None, forged: bool = False,
                     stale_seconds: int = 0) -> str:
    """A ``Stripe-Signature`` header for ``payload``: valid, or ``forged`` (signed with another secret), or
    ``stale_seconds`` old (a correct signature over an old timestamp, as a replayed capture would carry)."""
    timestamp = (int(time.time()) if timestamp is None else timestamp) - stale_seconds
    key = "whsec_forged_" + secrets.token_hex(8) if forged else secret
    return f"t={timestamp},v1={sign(payload, key, timestamp)}"


def deliver(url: str, event: dict[str, Any], secret: str, *, forged: bool = False, stale_seconds: int = 0,
            signature: str | None = None, timeout: float = 10.0) -> tuple[int, dict[str, Any]]:
    """POST ``event`` to ``url`` over HTTP as Stripe would; returns (status, JSON body). ``signature`` replaces
    the header entirely (``""`` sends none)."""
    payload = encode(event)
    header = signature if signature is not None else signature_header(
        payload, secret, forged=forged, stale_seconds=stale_seconds)
    request = urllib.request.Request(url, data=payload, method="POST", headers={
        "Content-Type": "application/json; charset=utf-8", "User-Agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
        **({"Stripe-Signature": header} if header else {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def post_signed(client: Any, path: str, event: dict[str, Any], secret: str, *, forged: bool = False,
                stale_seconds: int = 0, signature: str | None = None) -> Any:
    """The same delivery through a Django test client (no socket); returns the client's response."""
    payload = encode(event)
    header = signature if signature is not None else signature_header(
        payload, secret, forged=forged, stale_seconds=stale_seconds)
    extra = {"HTTP_STRIPE_SIGNATURE": header} if header else {}
    return client.generic("POST", path, payload, content_type="application/json", **extra)
