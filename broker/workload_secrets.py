"""A workload's ``secret_env`` at rest (docs/security.md, "Workload secrets"): the values a tenant gives its
workload's environment that no answer, page, log or event may show. The broker keeps them only as one Fernet
token per workload (AES-128-CBC with HMAC-SHA256, from the ``cryptography`` package), opens them only to send
them to the node that starts the workload (over the signed agent protocol), and compares two requests' secrets
only by a keyed digest (the idempotency hash), so no plain copy lands in any column.

Keys: ``WORKLOAD_SECRET_KEYS`` (the first encrypts, each decrypts: rotation), else one derived with HKDF-SHA256
from ``SECRET_KEY`` (and, to decrypt only, from each of ``SECRET_KEY_FALLBACKS``)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from functools import cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

_INFO = b"gpubroker workload secret_env v1"


def _derived(secret_key: str) -> bytes:
    raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(secret_key.encode())
    return base64.urlsafe_b64encode(raw)


@cache
def _fernet(keys: tuple[str, ...], secret_key: str, fallbacks: tuple[str, ...]) -> MultiFernet:
    material = [key.encode() for key in keys] or [_derived(secret_key), *(_derived(k) for k in fallbacks)]
    return MultiFernet([Fernet(key) for key in material])


def _box() -> MultiFernet:
    return _fernet(tuple(settings.WORKLOAD_SECRET_KEYS), settings.SECRET_KEY,
                   tuple(getattr(settings, "SECRET_KEY_FALLBACKS", ())))


def secret_env_seal(values: dict[str, str]) -> str:
    """The values as one Fernet token ("" for none)."""
    if not values:
        return ""
    return _box().encrypt(json.dumps(values, sort_keys=True).encode()).decode()


class SecretsUnreadable(Exception):
    """The sealed secrets do not open with any configured key (the keys were changed without keeping the old
    one among ``WORKLOAD_SECRET_KEYS`` or ``SECRET_KEY_FALLBACKS``)."""


def secret_env_open(sealed: str) -> dict[str, str]:
    """The values sealed by ``secret_env_seal`` ({} for "")."""
    if not sealed:
        return {}
    try:
        return json.loads(_box().decrypt(sealed.encode()))
    except InvalidToken:
        raise SecretsUnreadable("the workload's secret_env does not decrypt with the configured keys") from None


def secret_env_digest(values: dict[str, str]) -> str:
    """A keyed digest of the values (HMAC-SHA256 under a key derived from the secrets' key): two requests with
    the same secrets have the same digest, and the digest tells nothing of the values without the key."""
    key = hashlib.sha256(b"digest:" + (settings.WORKLOAD_SECRET_KEYS or [settings.SECRET_KEY])[0].encode()).digest()
    return hmac.new(key, json.dumps(values, sort_keys=True).encode(), hashlib.sha256).hexdigest()
