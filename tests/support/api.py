"""The REST API over real HTTP, as a tenant's script would call it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


class Api:
    """``Api(live_server.url, token).call("POST", "/leases", body)`` → (status, decoded JSON body)."""

    def __init__(self, base: str, token: str):
        self.base = base.rstrip("/") + "/api/v1"
        self.token = token

    def call(self, method: str, path: str, body: dict | None = None, headers: dict | None = None):
        request = urllib.request.Request(
            self.base + path, method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")
