"""API token format and hashing.

A token reads ``gpub_<prefix>_<secret>``: the prefix (10 lowercase letters/digits) is stored in clear
for lookup and display; the whole token is stored only as its SHA-256. Tokens carry 256 bits of
randomness, so a fast hash is enough (as GitHub and Healthchecks do); the comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import string

TOKEN_PREFIX = "gpub"
_ALPHABET = string.ascii_lowercase + string.digits


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_generate() -> tuple[str, str, str]:
    """Return ``(token, prefix, hash)`` for a new token."""
    prefix = "".join(secrets.choice(_ALPHABET) for _ in range(10))
    token = f"{TOKEN_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    return token, prefix, token_hash(token)


def token_parse_prefix(token: str) -> str | None:
    """The prefix of a well-formed token, or None."""
    parts = token.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX or len(parts[1]) != 10 or not parts[2]:
        return None
    return parts[1]


def token_matches(token: str, stored_hash: str) -> bool:
    return hmac.compare_digest(token_hash(token), stored_hash)
