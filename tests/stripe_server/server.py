"""A Stripe-compatible HTTP server for the test suite: a real server on 127.0.0.1, a free port, one thread.

What it checks on every request, in Stripe's order:

1. injected faults (``fail``, ``rate_limit``, ``hang``) — the next N matching requests;
2. authentication: ``Authorization: Bearer sk_test_…`` (or Basic with the key as user) equal to its key → 401;
3. the route: method + path of an endpoint in :mod:`tests.stripe_server.spec` → 404 "Unrecognized request URL";
4. idempotency (POST): a stored result for the ``Idempotency-Key`` is replayed with ``Idempotent-Replayed: true``
   when method, path and parameters are the same; otherwise 400 ``idempotency_error``. Keys expire after 24 h
   of the server's clock (:meth:`StripeTestServer.travel` moves it). https://docs.stripe.com/api/idempotent_requests
5. the parameters against the endpoint's documented table → 400 ``invalid_request_error`` naming ``param``
   (such a failure is not stored under the key: Stripe saves results only once the endpoint began to run);
6. the endpoint itself (:mod:`tests.stripe_server.state`): 404 ``resource_missing``, 400 for invalid state
   transitions, 402 ``card_error`` for a declined payment; its answer, success or error, is stored under the key.

Every request is recorded (:attr:`StripeTestServer.requests`) with method, path, parameters, idempotency key,
status and whether it was a replay or a fault, so tests can assert on what reached "Stripe".
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tests.stripe_server.params import ApiError, decode_form, parse_params
from tests.stripe_server.spec import ENDPOINTS, route
from tests.stripe_server.state import API_VERSION, StripeState

IDEMPOTENCY_TTL_SECONDS = 24 * 3600
DEFAULT_API_KEY = "sk_test_gpubroker_0123456789abcdef"
DEFAULT_WEBHOOK_SECRET = "whsec_gpubroker_test_0123456789abcdef"


@dataclass
class RecordedRequest:
    method: str
    path: str
    params: dict[str, Any]
    idempotency_key: str | None
    headers: dict[str, str]
    status: int = 0
    replayed: bool = False
    fault: str | None = None
    response: dict[str, Any] | None = None


@dataclass
class Fault:
    kind: str  # "status" or "hang"
    remaining: int
    status: int = 500
    seconds: float = 0.0
    path: re.Pattern | None = None
    method: str | None = None
    after: bool = False  # the request runs and its result is stored; only this answer is lost
    skip: int = 0  # matching requests let through before the fault starts

    def matches(self, method: str, path: str) -> bool:
        return (self.remaining > 0 and (self.method is None or self.method == method)
                and (self.path is None or bool(self.path.search(path))))

    def describe(self) -> str:
        if self.kind == "hang":
            return f"hang {self.seconds:g}s" + (" after running" if self.after else "")
        return f"{self.status}" + (" after running" if self.after else "")


@dataclass
class StoredResult:
    method: str
    path: str
    params: dict[str, Any]
    status: int
    body: dict[str, Any]
    request_id: str
    created: int


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


def fault_body(status: int) -> dict[str, Any]:
    if status == 429:
        return ApiError(429, "Request rate limit exceeded. Learn more about rate limits here "
                             "https://docs.stripe.com/rate-limits.", code="rate_limit").body()
    return ApiError(status, "An unknown error occurred on Stripe's side (fault injected by the Stripe test server).",
                    type="api_error").body()


class StripeTestServer:
    """Start with :meth:`start` (or ``with StripeTestServer() as server``); ``server.url`` is the API base."""

    def __init__(self, *, api_key: str = DEFAULT_API_KEY, webhook_secret: str = DEFAULT_WEBHOOK_SECRET,
                 seed: int | None = 0):
        if not api_key.startswith("sk_test_"):
            raise ValueError("the Stripe test server takes test-mode secret keys only (sk_test_…)")
        self.api_key = api_key
        self.webhook_secret = webhook_secret
        self.requests: list[RecordedRequest] = []
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._offset = 0
        self._faults: list[Fault] = []
        self._keys: dict[str, StoredResult] = {}
        self.state = StripeState(clock=self.now, seed=seed)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle --------------------------------------------------------------------------------------------

    def start(self) -> StripeTestServer:
        app = self

        class Handler(_Handler):
            server_app = app

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="stripe-test-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes requests that hang
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._httpd = self._thread = None

    def __enter__(self) -> StripeTestServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "the server is not running"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    # --- clock and idempotency keys ---------------------------------------------------------------------------

    def now(self) -> int:
        return int(time.time()) + self._offset

    def travel(self, seconds: int) -> None:
        """Move the server's clock forward (e.g. past the 24 h life of idempotency keys)."""
        with self._lock:
            self._offset += seconds

    def expire_idempotency_keys(self) -> None:
        with self._lock:
            self._keys.clear()

    # --- faults -----------------------------------------------------------------------------------------------

    def fail(self, times: int = 1, *, status: int = 500, path: str | None = None, method: str | None = None,
             after: bool = False, skip: int = 0) -> Fault:
        """The next ``times`` requests matching ``method`` and ``path`` (a regex searched in the path) answer
        ``status`` (500 ``api_error`` by default; 429 is a rate limit), after letting ``skip`` of them through.
        Nothing runs — unless ``after``: then the request runs and its result is stored under its idempotency
        key, and only this answer is lost."""
        return self._add(Fault("status", times, status=status, path=re.compile(path) if path else None,
                               method=method, after=after, skip=skip))

    def rate_limit(self, times: int = 1, *, path: str | None = None, method: str | None = None) -> Fault:
        return self.fail(times, status=429, path=path, method=method)

    def hang(self, seconds: float, times: int = 1, *, path: str | None = None, method: str | None = None,
             after: bool = True, skip: int = 0) -> Fault:
        """The next ``times`` matching requests answer only after ``seconds`` (so a client with a shorter
        timeout gives up). With ``after`` (default) the request has run by then, like a slow network on the
        way back; without it nothing runs and the late answer is a 500."""
        return self._add(Fault("hang", times, seconds=seconds, path=re.compile(path) if path else None,
                               method=method, after=after, skip=skip))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _add(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path):
                    if fault.skip:
                        fault.skip -= 1
                        continue
                    fault.remaining -= 1
                    return fault
        return None

    # --- what tests look at -----------------------------------------------------------------------------------

    def calls(self, method: str | None = None, path: str | None = None) -> list[RecordedRequest]:
        """Recorded requests, optionally only ``method`` and a ``path`` that fully matches the regex."""
        with self._lock:
            return [r for r in self.requests
                    if (method is None or r.method == method) and (path is None or re.fullmatch(path, r.path))]

    def created(self, path: str) -> list[RecordedRequest]:
        """POSTs to ``path`` that created something: answered 200 and not replays."""
        return [r for r in self.calls("POST", path) if r.status == 200 and not r.replayed]

    @property
    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return copy.deepcopy(self.state.events)

    def last_event(self, event_type: str, object_id: str | None = None) -> dict[str, Any]:
        for event in reversed(self.events):
            if event["type"] == event_type and (object_id is None or event["data"]["object"]["id"] == object_id):
                return event
        raise LookupError(f"no {event_type} event" + (f" for {object_id}" if object_id else ""))

    def invoice(self, invoice_id: str) -> dict[str, Any]:
        with self._lock:
            return self.state.invoice_json(self.state.invoices[invoice_id])

    def invoices(self) -> list[dict[str, Any]]:
        with self._lock:
            return [self.state.invoice_json(invoice) for invoice in self.state.invoices.values()]

    def customers(self) -> list[dict[str, Any]]:
        with self._lock:
            return [self.state.customer_json(customer) for customer in self.state.customers.values()]

    def decline_payments(self, times: int = 1) -> None:
        """The next ``times`` invoice payments (``POST /v1/invoices/{id}/pay``) are declined (402)."""
        with self._lock:
            self.state.declines += times

    # --- one request ------------------------------------------------------------------------------------------

    def handle(self, method: str, target: str, headers: dict[str, str], raw_body: bytes) -> Answer:
        url = urlsplit(target)
        path = url.path
        key = headers.get("idempotency-key") if method == "POST" else None
        record = RecordedRequest(method, path, {}, key, {
            name: value for name, value in headers.items()
            if name in ("stripe-version", "content-type", "user-agent", "stripe-account")})
        with self._lock:
            self.requests.append(record)
        answer = self._answer(method, path, url.query, headers, raw_body, key, record)
        record.status = answer.status
        record.response = answer.body
        return answer

    def _answer(self, method: str, path: str, query: str, headers: dict[str, str], raw_body: bytes,
                key: str | None, record: RecordedRequest) -> Answer:
        try:
            params = decode_form(parse_qsl(query, keep_blank_values=True))
            if method == "POST":
                params.update(decode_form(parse_qsl(raw_body.decode("utf-8"), keep_blank_values=True)))
        except (ApiError, UnicodeDecodeError) as error:
            record.params = {}
            if isinstance(error, ApiError):
                return Answer(error.status, error.body())
            return Answer(400, ApiError(400, "Invalid request: the body is not UTF-8.").body())
        record.params = params

        fault = self._take_fault(method, path)
        if fault is not None:
            record.fault = fault.describe()
            if not fault.after:
                if fault.kind == "hang":
                    return Answer(500, fault_body(500), delay=fault.seconds)
                return Answer(fault.status, fault_body(fault.status))

        refused = self._check_request(method, path, headers, key)
        if refused is not None:
            return refused
        endpoint, object_id, _ = route(method, path)
        assert endpoint is not None

        with self._lock:
            answer = self._run(method, path, params, key, endpoint, object_id, record)
        if fault is not None:  # an "after" fault: the request ran, its answer is late or lost
            if fault.kind == "hang":
                answer.delay = fault.seconds
            else:
                return Answer(fault.status, fault_body(fault.status))
        return answer

    def _run(self, method: str, path: str, params: dict[str, Any], key: str | None, endpoint: Any,
             object_id: str | None, record: RecordedRequest) -> Answer:
        """Idempotency, parameter checks and the endpoint itself (called under the lock)."""
        now = self.now()
        for stale in [k for k, stored in self._keys.items() if stored.created <= now - IDEMPOTENCY_TTL_SECONDS]:
            del self._keys[stale]
        if key and key in self._keys:
            stored = self._keys[key]
            if (stored.method, stored.path) != (method, path):
                return Answer(400, ApiError(
                    400, "Keys for idempotent requests can only be used for the same endpoint they were first "
                         f"used for ('{stored.method} {stored.path}' vs '{method} {path}'). Try using a key "
                         f"other than '{key}' if you meant to execute a different request.",
                    type="idempotency_error").body())
            if stored.params != params:
                return Answer(400, ApiError(
                    400, "Keys for idempotent requests can only be used with the same parameters they were "
                         f"first used with. Try using a key other than '{key}' if you meant to execute a "
                         "different request.", type="idempotency_error").body())
            record.replayed = True
            return Answer(stored.status, copy.deepcopy(stored.body),
                          {"Idempotent-Replayed": "true", "Original-Request": stored.request_id})
        try:
            parsed = parse_params(endpoint.params, params)
        except ApiError as error:  # not stored: the endpoint never began to run
            return Answer(error.status, error.body())
        try:
            status, body = getattr(self.state, endpoint.name)(parsed, object_id)
        except ApiError as error:
            status, body = error.status, error.body()
        request_id = self.state.new_id("req")
        if key:
            self._keys[key] = StoredResult(method, path, params, status, copy.deepcopy(body), request_id, now)
        return Answer(status, body, {"Request-Id": request_id})

    def _check_request(self, method: str, path: str, headers: dict[str, str], key: str | None) -> Answer | None:
        """Authentication, route, content type, API version and key format; None when all is well."""
        auth = headers.get("authorization", "")
        api_key = ""
        if auth.startswith("Bearer "):
            api_key = auth[len("Bearer "):].strip()
        elif auth.startswith("Basic "):
            try:
                api_key = base64.b64decode(auth[len("Basic "):]).decode().split(":", 1)[0]
            except (binascii.Error, UnicodeDecodeError):
                api_key = ""
        if not api_key:
            return Answer(401, ApiError(401, "You did not provide an API key. You need to provide your API key in "
                                             "the Authorization header, using Bearer auth (e.g. 'Authorization: "
                                             "Bearer YOUR_SECRET_KEY').").body())
        if api_key != self.api_key:
            shown = api_key[:8] + "*" * max(0, len(api_key) - 12) + api_key[-4:]
            return Answer(401, ApiError(401, f"Invalid API Key provided: {shown}").body())

        endpoint, _, other_method = route(method, path)
        if endpoint is None:
            known = ", ".join(f"{e.method} {e.path}" for e in ENDPOINTS)
            return Answer(404, ApiError(404, f"Unrecognized request URL ({method}: {path}). Please see "
                                             "https://docs.stripe.com/api. (The Stripe test server implements: "
                                             f"{known}{'; not this method' if other_method else ''}.)").body())
        if method == "POST":
            content_type = headers.get("content-type", "").split(";")[0].strip()
            if content_type not in ("application/x-www-form-urlencoded", ""):
                return Answer(400, ApiError(400, f"Invalid request: unsupported Content-Type {content_type}. "
                                                 "Stripe v1 takes application/x-www-form-urlencoded.").body())
        version = headers.get("stripe-version")
        if version is not None and not re.fullmatch(r"\d{4}-\d{2}-\d{2}(\.[a-z]+)?", version):
            return Answer(400, ApiError(400, f"Invalid Stripe API version: {version}").body())
        if key is not None and (not key or len(key) > 255):
            return Answer(400, ApiError(400, "Idempotency keys are 1 to 255 characters long.").body())
        return None


class _Handler(BaseHTTPRequestHandler):
    server_app: StripeTestServer
    protocol_version = "HTTP/1.0"

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw_body = self.rfile.read(length) if length else b""
        headers = {name.lower(): value for name, value in self.headers.items()}
        app = self.server_app
        answer = app.handle(self.command, self.path, headers, raw_body)
        if answer.delay and app._stopping.wait(answer.delay):
            return  # stopping: drop the connection
        payload = json.dumps(answer.body, indent=2).encode()
        try:
            self.send_response(answer.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("Stripe-Version", headers.get("stripe-version", API_VERSION))
            if "idempotency-key" in headers and self.command == "POST":
                self.send_header("Idempotency-Key", headers["idempotency-key"])
            for name, value in answer.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)

    do_GET = do_POST = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return
