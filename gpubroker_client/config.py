"""Where the client finds the server and its token: the environment first (``GPUBROKER_URL``,
``GPUBROKER_TOKEN``), then the config file (``GPUBROKER_CONFIG``, else ``$XDG_CONFIG_HOME/gpubroker/config.toml``,
else ``~/.config/gpubroker/config.toml``) with ``url`` and ``token`` keys. The file holds a secret, so it is
refused (not read) while anyone but its owner may read or write it: ``chmod 600`` it."""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8000"


class ConfigError(Exception):
    """The configuration cannot be used (no token, an unsafe or unreadable file); the message says how to fix it."""


@dataclass(frozen=True)
class Config:
    url: str
    token: str = ""

    def __repr__(self) -> str:  # never the token
        return f"Config(url={self.url!r}, token={'<set>' if self.token else '<missing>'})"


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    if environ.get("GPUBROKER_CONFIG"):
        return Path(environ["GPUBROKER_CONFIG"])
    base = Path(environ["XDG_CONFIG_HOME"]) if environ.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "gpubroker" / "config.toml"


def _read_file(path: Path) -> dict:
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return {}
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{path} may be read by others (mode {stat.S_IMODE(mode):04o}); it holds your token: "
                          f"chmod 600 {path}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{path} cannot be read: {error}") from None
    unknown = sorted(set(data) - {"url", "token"})
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(unknown)} (the keys are url and token)")
    for key in ("url", "token"):
        if key in data and not isinstance(data[key], str):
            raise ConfigError(f"{path}: {key} must be a string")
    return data


def load_config(environ: Mapping[str, str] | None = None, *, require_token: bool = True) -> Config:
    """The URL and token to use; ``ConfigError`` when no token is found (and one is required) or the file is
    unsafe."""
    environ = os.environ if environ is None else environ
    path = config_path(environ)
    data = _read_file(path)
    url = (environ.get("GPUBROKER_URL") or data.get("url") or DEFAULT_URL).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"The server URL must start with http:// or https:// (got {url!r}).")
    token = environ.get("GPUBROKER_TOKEN") or data.get("token", "")
    if require_token and not token:
        raise ConfigError(f"No API token: set GPUBROKER_TOKEN or put token = \"...\" in {path} (mode 600). "
                          f"Create a token in the portal (Settings, API tokens) or with POST /api/v1/tokens.")
    return Config(url=url, token=token)
