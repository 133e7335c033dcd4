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


@dataclass
class DripReceiver:
    url: str
    opened: list[float] = field(default_factory=list)


def drip_receiver(answer: bytes, *, at_once: int, every_seconds: float = 2.0, give_up_seconds: float = 20.0):
    """A receiver on 127.0.0.1 (a plain socket server in a thread) that reads the request, writes the first
    ``at_once`` bytes of ``answer`` at once and then one byte every ``every_seconds``, repeating the last byte
    after ``answer`` ends, until the caller hangs up or ``give_up_seconds`` pass."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    state = DripReceiver(url=f"http://127.0.0.1:{listener.getsockname()[1]}/hooks/drip")
    stop = threading.Event()

    def serve(connection: socket.socket) -> None:
        with connection:
            connection.settimeout(1.0)
            request = b""
            while b"\r\n\r\n" not in request:
                request += connection.recv(65536)
            started = time.monotonic()
            try:
                connection.sendall(answer[:at_once])
                sent = at_once
                while not stop.is_set() and time.monotonic() - started < give_up_seconds:
                    time.sleep(every_seconds)
                    connection.sendall(answer[min(sent, len(answer) - 1):][:1])
                    sent += 1
            except OSError:
                pass  # the sender hung up

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            state.opened.append(time.monotonic())
            threading.Thread(target=serve, args=(connection,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    return state, lambda: (stop.set(), thread.join(), listener.close())


@pytest.fixture
def drip():
    """``drip(answer, at_once=n)``: a started drip receiver (stopped after the test)."""
    stoppers = []

    def start(answer: bytes, *, at_once: int = 0, **kwargs) -> DripReceiver:
        state, stop = drip_receiver(answer, at_once=at_once, **kwargs)
        stoppers.append(stop)
        return state

    yield start
    for stop in stoppers:
        stop()
