"""A client for the agent protocol: signs every request, sets timeouts, retries idempotent calls.

Used by the broker's workers and by the tests. Standard library only (``urllib``). Every call in the
protocol is idempotent (PUT with the same body returns the same instance, DELETE of a missing instance
succeeds, a notice overwrites), so all of them are retried on connection errors, timeouts and 5xx, with
exponential back-off and jitter; each attempt is signed afresh (new timestamp and nonce). 4xx answers
are not retried: they raise ``AgentHTTPError`` with the problem body.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from urllib.parse import quote, urlencode, urlsplit

from agent.signing import sign

MAX_BATCH = 64  # instances per PUT /v1/instances (the agent's limit)

# Called after every call with (node_id, method, path, outcome, seconds); outcome is "ok", "refused" (4xx) or
# "unreachable". The broker registers its metrics here (observability.apps); an observer must not raise.
OBSERVERS: list = []


class AgentHTTPError(Exception):
    def __init__(self, status: int, problem: dict):
        self.status = status
        self.problem = problem
        super().__init__(f"{status}: {problem.get('detail') or problem}")


class AgentUnreachable(Exception):
    """No answer after every retry (connection refused, timeout, 5xx)."""


class AgentClient:
    def __init__(self, base_url: str, node_id: str, secret: str, *, timeout: float = 5.0, retries: int = 3,
                 backoff: float = 0.2, sleep=time.sleep):
        if urlsplit(base_url).scheme not in ("http", "https"):
            raise ValueError(f"agent URL must be http(s)://…, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.prefix = urlsplit(self.base_url).path
        self.node_id = node_id
        self.secret = secret
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.sleep = sleep

    # -- protocol ---------------------------------------------------------------------------------
    def inventory(self) -> dict:
        return self.request("GET", "/v1/inventory")

    def instance(self, allocation_id: str) -> dict:
        return self.request("GET", f"/v1/instances/{quote(allocation_id, safe='')}")

    def create(self, allocation_id: str, spec: dict) -> dict:
        return self.request("PUT", f"/v1/instances/{quote(allocation_id, safe='')}", spec)

    def create_many(self, specs: dict[str, dict]) -> dict[str, dict]:
        """Create several instances with one request per ``MAX_BATCH`` (``PUT /v1/instances``): allocation id
        → ``{"status": 201 | 200, "instance": {...}}`` or ``{"status": 4xx | 5xx, "problem": {...}}``. An
        agent that predates the call (404/405) gets one ``PUT /v1/instances/{id}`` per instance instead."""
        answers: dict[str, dict] = {}
        ids = list(specs)
        for first in range(0, len(ids), MAX_BATCH):
            chunk = {allocation_id: specs[allocation_id] for allocation_id in ids[first:first + MAX_BATCH]}
            try:
                answers.update(self.request("PUT", "/v1/instances", {"instances": chunk})["instances"])
            except AgentHTTPError as error:
                if error.status not in (404, 405):
                    raise
                for allocation_id, spec in chunk.items():
                    try:
                        answers[allocation_id] = {"status": 200, "instance": self.create(allocation_id, spec)}
                    except AgentHTTPError as refused:
                        answers[allocation_id] = {"status": refused.status, "problem": refused.problem}
        return answers

    def destroy(self, allocation_id: str) -> dict:
        return self.request("DELETE", f"/v1/instances/{quote(allocation_id, safe='')}")

    def notice(self, allocation_id: str, deadline: float, reason: str = "") -> dict:
        return self.request("POST", f"/v1/instances/{quote(allocation_id, safe='')}/notice",
                            {"deadline": deadline, "reason": reason})

    def set_gpu_mode(self, gpu_uuid: str, mode: str) -> dict:
        """Put a GPU in ``whole``, ``mig`` or ``shared`` mode (``PUT /v1/gpus/{uuid}/mode``): its inventory
        entry after the change. Refused (``AgentHTTPError``) with 409 while the GPU holds an instance."""
        return self.request("PUT", f"/v1/gpus/{quote(gpu_uuid, safe='')}/mode", {"mode": mode})

    # -- workloads (docs/agent-protocol.md, "Workloads") -------------------------------------------
    def workload_start(self, workload_id: str, spec: dict) -> dict:
        """Start a workload on instances of the node (``PUT /v1/workloads/{id}``; the same id and body again
        returns it as it is)."""
        return self.request("PUT", f"/v1/workloads/{quote(workload_id, safe='')}", spec)

    def workload(self, workload_id: str) -> dict:
        return self.request("GET", f"/v1/workloads/{quote(workload_id, safe='')}")

    def workloads(self) -> list[dict]:
        return self.request("GET", "/v1/workloads")["workloads"]

    def workload_stop(self, workload_id: str, grace_seconds: float = 10, reason: str = "") -> dict:
        return self.request("POST", f"/v1/workloads/{quote(workload_id, safe='')}/stop",
                            {"grace_seconds": grace_seconds, "reason": reason})

    def workload_logs(self, workload_id: str, *, stream: str = "stdout", offset: int | None = None,
                      tail: int | None = None, limit: int | None = None) -> dict:
        query = {"stream": stream, "offset": offset, "tail": tail, "limit": limit}
        encoded = urlencode({k: v for k, v in query.items() if v is not None})
        return self.request("GET", f"/v1/workloads/{quote(workload_id, safe='')}/logs?{encoded}")

    def faults(self, **switches) -> dict:
        return self.request("POST", "/v1/faults", switches)

    def healthz(self) -> dict:
        return self.request("GET", "/healthz", signed=False)

    def metrics(self) -> str:
        return self.request("GET", "/metrics", signed=False, raw=True)

    # -- transport --------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: dict | None = None, *, signed: bool = True, raw: bool = False):
        if not OBSERVERS:
            return self._request(method, path, body, signed=signed, raw=raw)
        started, outcome = time.perf_counter(), "unreachable"
        try:
            answer = self._request(method, path, body, signed=signed, raw=raw)
            outcome = "ok"
            return answer
        except AgentHTTPError:
            outcome = "refused"
            raise
        finally:
            for observer in OBSERVERS:
                observer(self.node_id, method, path, outcome, time.perf_counter() - started)

    def _request(self, method: str, path: str, body: dict | None = None, *, signed: bool = True, raw: bool = False):
        data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        attempt = 0
        while True:
            headers = {"Accept": "application/json"}
            if body is not None:
                headers["Content-Type"] = "application/json"
            if signed:
                bare, _, query = path.partition("?")
                headers.update(sign(self.secret, self.node_id, method, self.prefix + bare, data, query=query))
            request = urllib.request.Request(self.base_url + path, data=data or None, method=method,  # noqa: S310
                                             headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 (checked)
                    payload = response.read()
                    return payload.decode() if raw else (json.loads(payload) if payload else {})
            except urllib.error.HTTPError as error:
                payload = error.read()
                try:
                    problem = json.loads(payload)
                except ValueError:
                    problem = {"detail": payload.decode(errors="replace")[:500]}
                if error.code < 500 or attempt >= self.retries:
                    if error.code >= 500:
                        raise AgentUnreachable(f"{method} {path}: {error.code} after {attempt + 1} attempts: "
                                               f"{problem.get('detail')}") from None
                    raise AgentHTTPError(error.code, problem) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
                if attempt >= self.retries:
                    raise AgentUnreachable(f"{method} {path}: {error} after {attempt + 1} attempts") from None
            attempt += 1
            self.sleep(self.backoff * 2 ** (attempt - 1) * random.uniform(0.5, 1.0))
