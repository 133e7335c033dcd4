"""Sign-in secrets at rest: a tenant's OpenID client secret and a user's TOTP secret are kept as Fernet tokens
(AES-128-CBC with HMAC-SHA256, the ``cryptography`` package), under a key derived with HKDF-SHA256 from
``SECRET_KEY`` (and, to open only, from each of ``SECRET_KEY_FALLBACKS``: rotation). Never shown, logged or
answered once stored; a column dump alone reveals nothing."""

from __future__ import annotations

import base64
from functools import cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

from core.errors import ApplicationError

_INFO = b"gpubroker sign-in secrets v1"


class SecretUnreadable(ApplicationError):
    status = 500
    code = "secret_unreadable"


@cache
def _box(secret_key: str, fallbacks: tuple[str, ...]) -> MultiFernet:
    def derive(key: str) -> Fernet:
        raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(key.encode())
        return Fernet(base64.urlsafe_b64encode(raw))

    return MultiFernet([derive(secret_key), *(derive(key) for key in fallbacks)])


def _current() -> MultiFernet:
    return _box(settings.SECRET_KEY, tuple(getattr(settings, "SECRET_KEY_FALLBACKS", ())))


def secret_seal(value: str) -> str:
    return _current().encrypt(value.encode()).decode() if value else ""


def secret_open(sealed: str) -> str:
    if not sealed:
        return ""
    try:
        return _current().decrypt(sealed.encode()).decode()
    except InvalidToken:
        raise SecretUnreadable("A stored sign-in secret does not open with SECRET_KEY or SECRET_KEY_FALLBACKS; "
                               "set it again.") from None
