"""Request signing between the broker and its node agents (both directions).

Every request after enrollment carries::

    X-Gpub-Node: <node id>
    X-Gpub-Timestamp: <unix seconds>
    X-Gpub-Nonce: <random hex>
    X-Gpub-Signature: v1=<hex HMAC-SHA256(secret, canonical)>

    canonical = "v1\\n" METHOD "\\n" PATH "\\n" QUERY "\\n" TIMESTAMP "\\n" NONCE "\\n" hex(SHA-256(body))

A receiver accepts a request only when the node is known, the timestamp is within ``WINDOW`` seconds
of its clock, the nonce has not been seen within the window (a captured request cannot be replayed)
and the signature matches (compared in constant time).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict

WINDOW = 300
HEADER_NODE = "X-Gpub-Node"
HEADER_TIMESTAMP = "X-Gpub-Timestamp"
HEADER_NONCE = "X-Gpub-Nonce"
HEADER_SIGNATURE = "X-Gpub-Signature"


class SignatureError(Exception):
    """Why a request was refused (the receiver answers 401 with this reason)."""


def canonical(method: str, path: str, query: str, timestamp: str, nonce: str, body: bytes) -> bytes:
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join(("v1", method.upper(), path, query, timestamp, nonce, digest)).encode()


def sign(secret: str, node_id: str, method: str, path: str, body: bytes = b"", query: str = "",
         *, now: float | None = None, nonce: str | None = None) -> dict[str, str]:
    """The headers that authenticate one request."""
    timestamp = str(int(time.time() if now is None else now))
    nonce = nonce or secrets.token_hex(16)
    mac = hmac.new(secret.encode(), canonical(method, path, query, timestamp, nonce, body), hashlib.sha256)
    return {HEADER_NODE: node_id, HEADER_TIMESTAMP: timestamp, HEADER_NONCE: nonce,
            HEADER_SIGNATURE: "v1=" + mac.hexdigest()}


class NonceCache:
    """Nonces seen within the window (bounded: the oldest are forgotten first, and they are stale by then)."""

    def __init__(self, limit: int = 100_000):
        self.limit = limit
        self._seen: OrderedDict[str, float] = OrderedDict()

    def add(self, nonce: str, now: float) -> bool:
        """False when ``nonce`` was already seen within the window."""
        while self._seen:
            oldest, at = next(iter(self._seen.items()))
            if at >= now - 2 * WINDOW and len(self._seen) < self.limit:
                break
            self._seen.pop(oldest)
        if nonce in self._seen:
            return False
        self._seen[nonce] = now
        return True


def verify(headers, method: str, path: str, query: str, body: bytes, secret_for, nonces: NonceCache,
           *, now: float | None = None) -> str:
    """The node id of a correctly signed request, else ``SignatureError``. ``secret_for(node) -> str | None``."""
    now = time.time() if now is None else now
    node_id = headers.get(HEADER_NODE, "")
    timestamp = headers.get(HEADER_TIMESTAMP, "")
    nonce = headers.get(HEADER_NONCE, "")
    signature = headers.get(HEADER_SIGNATURE, "")
    if not (node_id and timestamp and nonce and signature):
        raise SignatureError("unsigned request: X-Gpub-Node, X-Gpub-Timestamp, X-Gpub-Nonce and "
                             "X-Gpub-Signature are required")
    secret = secret_for(node_id)
    if not secret:
        raise SignatureError(f"unknown node {node_id!r}")
    try:
        stamp = int(timestamp)
    except ValueError:
        raise SignatureError("X-Gpub-Timestamp must be unix seconds") from None
    if abs(now - stamp) > WINDOW:
        raise SignatureError(f"stale request: timestamp is {int(now - stamp)} s from this clock "
                             f"(window {WINDOW} s)")
    expected = "v1=" + hmac.new(secret.encode(), canonical(method, path, query, timestamp, nonce, body),
                                hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        raise SignatureError("bad signature")
    if not nonces.add(nonce, now):
        raise SignatureError("replayed request: this nonce was already used")
    return node_id
