"""A real HTTP receiver on 127.0.0.1 (``http.server`` in a thread) that answers a script of statuses (the
receiver-side signature check read from docs/notifications.md is ``tests.support.webhooks.documented_verify``)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@dataclass
class Hit:
    path: str
    headers: dict
    body: bytes
    at: float
    answered: int


@dataclass
class Receiver:
    url: str
    script: list[int]
    hits: list[Hit] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    location: str = ""

    def accepted(self) -> list[Hit]:
        return [h for h in self.hits if 200 <= h.answered < 300]


@pytest.fixture
def receiver():
    """``receiver.script``: the statuses of the first requests, in order (then 200)."""
    state = Receiver(url="", script=[])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with state.lock:
                number = len(state.hits)
                status = state.script[number] if number < len(state.script) else 200
                state.hits.append(Hit(self.path, {k.lower(): v for k, v in self.headers.items()}, body,
                                      time.monotonic(), status))
            self.send_response(status)
            if 300 <= status < 400:
                self.send_header("Location", state.location)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/gpub"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
