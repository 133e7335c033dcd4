"""The real OpenID provider of the SSO tests (``infra/oidc_provider``: django-oauth-toolkit in its own process on
a loopback port) and a person's way through it: the broker's start page, the provider's sign-in form, back to
the broker's callback."""

from __future__ import annotations

import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urljoin, urlsplit

import requests

from core.processes import free_port, start, stop, wait_http

CLIENT_ID = "gpubroker-test"
CALLBACK = "http://testserver/accounts/sso/callback"  # Django's test client's host
USERS = {  # name: (password, e-mail, groups); wrong-audience and expired misbehave on purpose (validator.py)
    "alice": ("pw-alice", "alice@acme.test", "gpu-admins"),
    "bob": ("pw-bob", "bob@acme.test", ""),
    "dana": ("pw-dana", "dana@acme.test", "vision-team,ml-platform"),
    "eve": ("pw-eve", "eve@evil.test", ""),
    "wrong-audience": ("pw-wa", "wa@acme.test", ""),
    "expired": ("pw-ex", "ex@acme.test", ""),
}


@dataclass
class Provider:
    process: subprocess.Popen
    base: str
    client_secret: str

    @property
    def issuer(self) -> str:
        return f"{self.base}/o"


def provider_start(data: Path) -> Provider:
    port = free_port()
    secret = secrets.token_urlsafe(24)
    command = [sys.executable, "-m", "infra.oidc_provider", "--port", str(port), "--data", str(data),
               "--client-id", CLIENT_ID, "--client-secret", secret, "--redirect-uri", CALLBACK]
    for name, (password, email, groups) in USERS.items():
        command += ["--user", f"{name}:{password}:{email}:{groups}"]
    process = start(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    # a fresh SQLite database is migrated first: seconds, a minute or more on a loaded 2-core machine
    wait_http(f"{base}/o/.well-known/openid-configuration", process, timeout=240)
    return Provider(process=process, base=base, client_secret=secret)


def provider_stop(provider: Provider) -> None:
    stop(provider.process)


def provider_sign_in(provider: Provider, authorize_url: str, username: str, password: str | None = None,
                     callback: str = CALLBACK, browser: requests.Session | None = None) -> str:
    """A person at the provider: follow the broker's redirect, sign in, and get the callback URL back
    (``browser``: the person's cookie jar, when the broker is reached over HTTP too)."""
    browser = browser or requests.Session()
    answer = browser.get(authorize_url, allow_redirects=False, timeout=10)
    assert answer.status_code == 302, answer.text[:500]
    login_url = urljoin(provider.base, answer.headers["Location"])
    browser.get(login_url, timeout=10)
    answer = browser.post(login_url, timeout=10, allow_redirects=False, data={
        "username": username, "password": password or USERS[username][0],
        "csrfmiddlewaretoken": browser.cookies["oidc_provider_csrftoken"],
        "next": dict(parse_qsl(urlsplit(login_url).query))["next"]})
    assert answer.status_code == 302, answer.text[:500]
    answer = browser.get(urljoin(provider.base, answer.headers["Location"]), allow_redirects=False, timeout=10)
    assert answer.status_code == 302 and answer.headers["Location"].startswith(callback), answer.text[:500]
    return answer.headers["Location"]


def sso_sign_in(client, provider: Provider, username: str, org: str = "acme", password: str | None = None):
    """The whole way: the broker's start page, the provider, the broker's callback (its response returned)."""
    begun = client.get("/accounts/sso/start", {"org": org})
    assert begun.status_code == 302, begun.content[:500]
    callback = urlsplit(provider_sign_in(provider, begun["Location"], username, password))
    return client.get(callback.path, dict(parse_qsl(callback.query)))
