"""Typed reading of environment variables.

Every setting comes from the environment (12-factor). A value that is present but cannot be parsed
stops the process at start with an error that names the variable, instead of surfacing later as an
obscure failure deep inside a request.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class EnvError(ImproperlyConfigured):
    """A variable of the environment holds a value the service cannot use."""

    def __init__(self, name: str, raw: str, expected: str):
        self.name = name
        super().__init__(f"Environment variable {name}={raw!r} is invalid: expected {expected}.")


def read_env_file(path: Path) -> None:
    """Load KEY=VALUE lines from ``path`` without overriding variables already set."""
    if path.is_file():
        environ.Env.read_env(str(path), overwrite=False)


def _read(name: str, default: Any, parse: Callable[[str], Any], expected: str) -> Any:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return parse(raw.strip())
    except (ValueError, TypeError) as exc:
        raise EnvError(name, raw, expected) from exc


def env_str(name: str, default: str = "") -> str:
    return _read(name, default, str, "a string")


def env_bool(name: str, default: bool) -> bool:
    def parse(raw: str) -> bool:
        lowered = raw.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ValueError(raw)

    return _read(name, default, parse, "one of 1/0, true/false, yes/no, on/off")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    def parse(raw: str) -> int:
        value = int(raw)
        if minimum is not None and value < minimum:
            raise ValueError(raw)
        return value

    expected = "an integer" + (f" >= {minimum}" if minimum is not None else "")
    return _read(name, default, parse, expected)


def env_float(name: str, default: float, *, minimum: float, maximum: float) -> float:
    def parse(raw: str) -> float:
        value = float(raw)
        if not minimum <= value <= maximum:
            raise ValueError(raw)
        return value

    return _read(name, default, parse, f"a number from {minimum} to {maximum}")


def env_list(name: str, default: list[str]) -> list[str]:
    def parse(raw: str) -> list[str]:
        items = [item.strip() for item in raw.split(",") if item.strip()]
        if not items:
            raise ValueError(raw)
        return items

    return _read(name, default, parse, "a comma-separated list")


def env_int_list(name: str, default: list[int], *, minimum: int = 0) -> list[int]:
    """A comma-separated list of integers >= ``minimum`` (e.g. reminder days ``1,3,7``), sorted."""
    def parse(raw: str) -> list[int]:
        values = sorted(int(item) for item in raw.split(",") if item.strip())
        if not values or values[0] < minimum:
            raise ValueError(raw)
        return values

    return _read(name, default, parse, f"a comma-separated list of integers >= {minimum}")


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    def parse(raw: str) -> str:
        if raw not in choices:
            raise ValueError(raw)
        return raw

    return _read(name, default, parse, "one of " + ", ".join(choices))


def env_url(name: str, default: str, *, schemes: tuple[str, ...]) -> str:
    def parse(raw: str) -> str:
        parts = urlsplit(raw)
        if parts.scheme not in schemes:
            raise ValueError(raw)
        if parts.scheme.startswith("http") and not parts.netloc:
            raise ValueError(raw)
        return raw

    return _read(name, default, parse, "a URL with scheme " + " or ".join(f"{s}://" for s in schemes))


def env_database(name: str, default: str) -> dict[str, Any]:
    """Parse a PostgreSQL URL (``postgres://user:pass@host:port/db`` or a socket URL
    ``postgresql://user@/db?host=/path``) into Django's DATABASES entry."""

    def parse(raw: str) -> dict[str, Any]:
        parts = urlsplit(raw)
        if parts.scheme not in ("postgres", "postgresql", "pgsql"):
            raise ValueError(raw)
        if not parts.path.strip("/"):
            raise ValueError(raw)
        config = environ.Env.db_url_config(raw)
        config["ENGINE"] = "django.db.backends.postgresql"
        return config

    raw = os.environ.get(name) or default
    try:
        return parse(raw.strip())
    except (ValueError, TypeError, KeyError) as exc:
        raise EnvError(
            name, raw, "a PostgreSQL URL such as postgres://user:password@127.0.0.1:5432/gpubroker"
        ) from exc
