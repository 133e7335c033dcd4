"""The agent protocol: the one module of the agent that the broker imports (docs/agent-protocol.md).

Both sides speak it: the broker's workers call nodes through ``AgentClient`` and check the nodes' own requests
with ``verify``; the node-side daemon (the rest of ``agent/``, which nothing in the broker imports) signs its
heartbeats with ``sign``, checks the broker's requests with ``verify`` and answers refusals as ``AgentError``
problems. The workload spec (``spec_from_json``) is checked by both: by the broker before it is stored, by the
node before it runs.

- **Signing** between the broker and its node agents (both directions). Every request after enrollment
  carries::

      X-Gpub-Node: <node id>
      X-Gpub-Timestamp: <unix seconds>
      X-Gpub-Nonce: <random hex>
      X-Gpub-Signature: v1=<hex HMAC-SHA256(secret, canonical)>

      canonical = "v1\\n" METHOD "\\n" PATH "\\n" QUERY "\\n" TIMESTAMP "\\n" NONCE "\\n" hex(SHA-256(body))

  A receiver accepts a request only when the node is known, the timestamp is within ``WINDOW`` seconds of its
  clock, the nonce has not been seen within the window (a captured request cannot be replayed) and the
  signature matches (compared in constant time).
- **Refusals**: ``AgentError`` and its kinds, each with its HTTP status; ``problem_body`` is how a node answers
  one (the fields of the broker's API errors).
- **The workload spec**: the body of ``PUT /v1/workloads/{id}``, validated field by field.
- **The client**: signs every request, sets timeouts, retries idempotent calls. Every call in the protocol is
  idempotent (PUT with the same body returns the same instance, DELETE of a missing instance succeeds, a
  notice overwrites), so all of them are retried on connection errors, timeouts and 5xx, with exponential
  back-off and jitter; each attempt is signed afresh (new timestamp and nonce). 4xx answers are not retried:
  they raise ``AgentHTTPError`` with the problem body.

Standard library only (``urllib``; ``gpus.performance`` for a workload's ``perf``): the node side installs it
without Django, and the architecture test loads it in a bare interpreter.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import random
import re
import secrets
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from pathlib import Path
from urllib.parse import quote, urlencode, urlsplit

PROTOCOL = "v1"


# -- signing -------------------------------------------------------------------------------------------------
WINDOW = 300
HEADER_NODE = "X-Gpub-Node"
HEADER_TIMESTAMP = "X-Gpub-Timestamp"
HEADER_NONCE = "X-Gpub-Nonce"
HEADER_SIGNATURE = "X-Gpub-Signature"


class SignatureError(Exception):
    """Why a request was refused (the receiver answers 401 with this reason)."""


def canonical(method: str, path: str, query: str, timestamp: str, nonce: str, body: bytes) -> bytes:
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join(("v1", method.upper(), path, query, timestamp, nonce, digest)).encode()


def sign(secret: str, node_id: str, method: str, path: str, body: bytes = b"", query: str = "",
         *, now: float | None = None, nonce: str | None = None) -> dict[str, str]:
    """The headers that authenticate one request."""
    timestamp = str(int(time.time() if now is None else now))
    nonce = nonce or secrets.token_hex(16)
    mac = hmac.new(secret.encode(), canonical(method, path, query, timestamp, nonce, body), hashlib.sha256)
    return {HEADER_NODE: node_id, HEADER_TIMESTAMP: timestamp, HEADER_NONCE: nonce,
            HEADER_SIGNATURE: "v1=" + mac.hexdigest()}


class NonceCache:
    """Nonces seen within the window (bounded: the oldest are forgotten first, and they are stale by then)."""

    def __init__(self, limit: int = 100_000):
        self.limit = limit
        self._seen: OrderedDict[str, float] = OrderedDict()

    def add(self, nonce: str, now: float) -> bool:
        """False when ``nonce`` was already seen within the window."""
        while self._seen:
            oldest, at = next(iter(self._seen.items()))
            if at >= now - 2 * WINDOW and len(self._seen) < self.limit:
                break
            self._seen.pop(oldest)
        if nonce in self._seen:
            return False
        self._seen[nonce] = now
        return True


def verify(headers, method: str, path: str, query: str, body: bytes, secret_for, nonces: NonceCache,
           *, now: float | None = None) -> str:
    """The node id of a correctly signed request, else ``SignatureError``. ``secret_for(node) -> str | None``."""
    now = time.time() if now is None else now
    node_id = headers.get(HEADER_NODE, "")
    timestamp = headers.get(HEADER_TIMESTAMP, "")
    nonce = headers.get(HEADER_NONCE, "")
    signature = headers.get(HEADER_SIGNATURE, "")
    if not (node_id and timestamp and nonce and signature):
        raise SignatureError("unsigned request: X-Gpub-Node, X-Gpub-Timestamp, X-Gpub-Nonce and "
                             "X-Gpub-Signature are required")
    secret = secret_for(node_id)
    if not secret:
        raise SignatureError(f"unknown node {node_id!r}")
    try:
        stamp = int(timestamp)
    except ValueError:
        raise SignatureError("X-Gpub-Timestamp must be unix seconds") from None
    if abs(now - stamp) > WINDOW:
        raise SignatureError(f"stale request: timestamp is {int(now - stamp)} s from this clock "
                             f"(window {WINDOW} s)")
    expected = "v1=" + hmac.new(secret.encode(), canonical(method, path, query, timestamp, nonce, body),
                                hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        raise SignatureError("bad signature")
    if not nonces.add(nonce, now):
        raise SignatureError("replayed request: this nonce was already used")
    return node_id


# -- refusals ------------------------------------------------------------------------------------------------
class AgentError(Exception):
    """A request the agent refuses; ``status`` is the HTTP status, ``field`` the input at fault."""

    status = 400
    code = "invalid"

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


TYPE_BASE = "https://gpubroker.dev/problems/"


def problem_body(error: AgentError) -> dict:
    """The problem+json body for a refusal (the fields of the broker's API errors)."""
    return {"type": TYPE_BASE + error.code, "title": type(error).__name__, "status": error.status,
            "detail": error.message, "code": error.code, "field": error.field}


class InvalidRequest(AgentError):
    status = 422
    code = "invalid"


class NotFound(AgentError):
    status = 404
    code = "not_found"


class Conflict(AgentError):
    status = 409
    code = "conflict"


class Unavailable(AgentError):
    """The device or the library is not there or does not answer (NVML missing, GPU lost, injected)."""

    status = 503
    code = "unavailable"


class NotPermitted(AgentError):
    status = 403
    code = "not_permitted"


# -- one environment for several instances --------------------------------------------------------------------
MPS_THREADS = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MPS_MEMORY = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"


def instances_env(instances: list[dict]) -> dict[str, str]:
    """The one environment that makes all of ``instances`` (one node's, in order; each with the ``access`` the
    agent reported, its ``kind`` and ``memory_mib``) visible to one process: ``CUDA_VISIBLE_DEVICES`` lists every
    device, comma-separated — never one line per instance, where the last would win and a gang lease's job
    would see one GPU of several (issue 29) — and for shares the MPS limits, the memory cap per visible index
    (``0=20480M,1=20480M``) and the lowest compute percentage. Any other variable the instances agree on is
    kept; where they differ their values are joined with commas, in order."""
    env: dict[str, str] = {"CUDA_VISIBLE_DEVICES": ",".join(
        str((i.get("access") or {}).get("CUDA_VISIBLE_DEVICES") or i.get("device_uuid") or "") for i in instances)}
    others: dict[str, list[str]] = {}
    for instance in instances:
        for name, value in (instance.get("access") or {}).items():
            if name not in ("CUDA_VISIBLE_DEVICES", MPS_THREADS, MPS_MEMORY) and str(value) not in others.get(name, []):
                others.setdefault(name, []).append(str(value))
    env.update({name: ",".join(values) for name, values in others.items()})
    shares = [(index, i) for index, i in enumerate(instances) if i.get("kind") == "share"]
    if shares:
        percentages = [int(i["access"][MPS_THREADS]) for _, i in shares if (i.get("access") or {}).get(MPS_THREADS)]
        if percentages:
            env[MPS_THREADS] = str(min(percentages))
        env[MPS_MEMORY] = ",".join(f"{index}={i.get('memory_mib', 0)}M" for index, i in shares)
    return env


# -- the workload spec ---------------------------------------------------------------------------------------
WORKLOAD_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}$")
RESTART_POLICIES = ("never", "on-preemption", "on-failure")
RESERVED_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "RESTART_COUNT", "CHECKPOINT_DIR", "PORT")
RESERVED_PREFIXES = ("CUDA_MPS_", "GPUB_")
MAX_ENV_BYTES = 32 * 1024
MAX_ARGV_BYTES = 64 * 1024
MAX_ARGS = 256
MAX_INSTANCES = 16
MAX_RESTARTS = 100
SPEC_FIELDS = ("instances", "command", "image", "args", "env", "secret_env", "scope", "workdir", "checkpoint_dir",
               "restart_policy", "max_restarts", "restart_count", "port", "host_port", "perf", "cpu_milli",
               "memory_mib")
# the host CPU (milli-CPUs) and memory (MiB) a lease asked for on this node (its per-unit ask times the units it
# holds here, set by the broker): the workload's cgroup / --cpus / --memory; 0 = the node's share per GPU
MAX_CPU_MILLI = 16_384_000
MAX_MEMORY_MIB = 1 << 28
# an ``env`` name that says it holds a credential is refused: such values go in ``secret_env``, which is never
# shown (docs/security.md, "Workload secrets"). A word of the name (split at "_") or the whole name.
SECRET_WORDS = ("TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "KEY", "KEYS", "APIKEY", "CREDENTIAL",
                "CREDENTIALS")
SCOPE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}(/[a-z0-9][a-z0-9-]{0,62}){0,3}$")
PERF_FIELDS = ("architecture", "task", "precision", "batch_size", "seq_len", "image_size")


def _string_list(body: dict, name: str, *, required: bool = False) -> list[str]:
    value = body.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and "\0" not in v for v in value):
        raise InvalidRequest(f"{name} must be a list of strings", field=name)
    if required and (not value or not value[0]):
        raise InvalidRequest(f"{name} must name the program to run, e.g. [\"python\", \"train.py\"]", field=name)
    if len(value) > MAX_ARGS:
        raise InvalidRequest(f"{name} has {len(value)} items; at most {MAX_ARGS}", field=name)
    return list(value)


def env_name_looks_secret(name: str) -> bool:
    """True for a variable name that says it holds a credential (``HF_TOKEN``, ``DB_PASSWORD``, ``AWS_SECRET_
    ACCESS_KEY``, ``API_KEY``): a word of it, split at ``_``, is one of ``SECRET_WORDS``."""
    words = name.upper().split("_")
    return any(word in SECRET_WORDS for word in words) or name.upper().endswith(("TOKEN", "SECRET", "PASSWORD"))


def scoped_roots(roots: list[Path], scope: str) -> list[Path]:
    """The directories a workload of ``scope`` (``<tenant>/<project>``, set by the broker) may name: the scope
    under each root. Without a scope (a node operator's direct call), the roots themselves."""
    return [root / scope for root in roots] if scope else list(roots)


def check_path(name: str, value: object, roots: list[Path], *, resolve: bool = False) -> str:
    """An absolute, normalised path inside one of ``roots`` (``field`` names the input at fault). With
    ``resolve`` (on the node, where the file system is) the path with its symbolic links resolved must stay
    inside the resolved root too, so a link a workload left in its directory cannot lead another run out."""
    if value in (None, ""):
        return ""
    if not isinstance(value, str) or "\0" in value or not value.startswith("/"):
        raise InvalidRequest(f"{name} must be an absolute path", field=name)
    if os.path.normpath(value) != value.rstrip("/") or "/../" in f"{value}/":
        raise InvalidRequest(f"{name} must be a normalised path (no '..', '.', '//')", field=name)
    path = Path(value)
    inside = [root for root in roots if path == root or path.is_relative_to(root)]
    if not inside:
        allowed = ", ".join(str(r) for r in roots) or "(none configured)"
        raise InvalidRequest(f"{name} {value!r} is outside the allowed roots: {allowed}", field=name)
    if resolve:
        real, real_root = Path(os.path.realpath(path)), Path(os.path.realpath(inside[0]))
        if not (real == real_root or real.is_relative_to(real_root)):
            raise InvalidRequest(f"{name} {value!r} leads outside {inside[0]} through a symbolic link", field=name)
    return value


def _env_object(body: dict, name: str, *, secret: bool) -> tuple[dict[str, str], int]:
    """``env`` or ``secret_env``: NAME → string; platform names refused; in ``env`` a name that says it holds a
    credential is refused too, pointing to ``secret_env``. Returns the object and its size in bytes."""
    env = body.get(name, {})
    if not isinstance(env, dict):
        raise InvalidRequest(f"{name} must be an object of NAME: value strings", field=name)
    size = 0
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_NAME.match(key):
            raise InvalidRequest(f"{name} name {key!r} is not a valid variable name", field=f"{name}.{key}")
        if key in RESERVED_ENV or key.startswith(RESERVED_PREFIXES):
            raise InvalidRequest(f"{name} {key} is set by the platform (the leased devices, restarts, deadline)",
                                 field=f"{name}.{key}")
        if not secret and env_name_looks_secret(key):
            raise InvalidRequest(f"env {key} looks like a credential: put it in secret_env, which is given to the "
                                 "workload the same way but never shown by any answer, page, log or event",
                                 field=f"{name}.{key}")
        if not isinstance(value, str) or "\0" in value:
            raise InvalidRequest(f"{name} {key} must be a string", field=f"{name}.{key}")
        size += len(key.encode()) + len(value.encode()) + 2
    return dict(env), size


def spec_from_json(body: object, roots: list[Path], *, resolve: bool = False) -> dict:
    """Validate the JSON body of ``PUT /v1/workloads/{id}``; errors name the field. Returns the normalised
    spec (every field present). ``secret_env`` holds values the workload gets in its environment but that
    nothing shows; ``scope`` (``<tenant>/<project>``, set by the broker) narrows the paths to ``<root>/<scope>``
    of each root; ``resolve`` (the node) checks the paths with their symbolic links resolved too."""
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", field="body")
    unknown = sorted(set(body) - set(SPEC_FIELDS))
    if unknown:
        raise InvalidRequest(f"unknown field {unknown[0]!r}", field=unknown[0])
    instances = body.get("instances")
    if (not isinstance(instances, list) or not 1 <= len(instances) <= MAX_INSTANCES
            or not all(isinstance(i, str) and WORKLOAD_ID.match(i) for i in instances)
            or len(set(instances)) != len(instances)):
        raise InvalidRequest(f"instances must list 1 to {MAX_INSTANCES} distinct allocation ids of this node",
                             field="instances")
    image = body.get("image") or ""
    if image and (not isinstance(image, str) or not IMAGE.match(image)):
        raise InvalidRequest("image must be an image reference such as 'nvcr.io/nvidia/pytorch:24.05-py3'",
                             field="image")
    command = _string_list(body, "command", required=not image)
    args = _string_list(body, "args")
    if sum(len(a.encode()) + 1 for a in command + args) > MAX_ARGV_BYTES:
        raise InvalidRequest(f"command and args together must be at most {MAX_ARGV_BYTES} bytes", field="args")
    env, size = _env_object(body, "env", secret=False)
    secret_env, secret_size = _env_object(body, "secret_env", secret=True)
    both = sorted(set(env) & set(secret_env))
    if both:
        raise InvalidRequest(f"{both[0]} is in env and in secret_env: give it once", field=f"secret_env.{both[0]}")
    if size + secret_size > MAX_ENV_BYTES:
        what = f"env is {size} bytes" if not secret_size else f"env and secret_env are {size + secret_size} bytes"
        raise InvalidRequest(f"{what}; at most {MAX_ENV_BYTES}", field="env" if size > secret_size else "secret_env")
    scope = body.get("scope") or ""
    if not isinstance(scope, str) or (scope and not SCOPE.match(scope)):
        raise InvalidRequest("scope must be <tenant>/<project> slugs", field="scope")
    roots = scoped_roots(roots, scope)
    policy = body.get("restart_policy", "never")
    if policy not in RESTART_POLICIES:
        raise InvalidRequest(f"restart_policy must be one of {', '.join(RESTART_POLICIES)}", field="restart_policy")

    def integer(name: str, default: int, low: int, high: int) -> int:
        value = body.get(name, default)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise InvalidRequest(f"{name} must be an integer {low}..{high}", field=name)
        return value

    port = body.get("port")
    if port is not None:
        port = integer("port", 0, 1024, 65535)
    host_port = body.get("host_port")
    if host_port is not None:
        if port is None:
            raise InvalidRequest("host_port maps an interactive workload's port: give port too", field="host_port")
        host_port = integer("host_port", 0, 1024, 65535)
    perf = perf_from_json(body.get("perf"))
    host = {"cpu_milli": integer("cpu_milli", 0, 0, MAX_CPU_MILLI),
            "memory_mib": integer("memory_mib", 0, 0, MAX_MEMORY_MIB)}
    return {"instances": list(instances), "command": command, "image": image, "args": args, "env": env,
            "secret_env": secret_env, "scope": scope,
            "workdir": check_path("workdir", body.get("workdir"), roots, resolve=resolve),
            "checkpoint_dir": check_path("checkpoint_dir", body.get("checkpoint_dir"), roots, resolve=resolve),
            "restart_policy": policy, "max_restarts": integer("max_restarts", 3, 0, MAX_RESTARTS),
            "restart_count": integer("restart_count", 0, 0, 1_000_000), "port": port, "host_port": host_port,
            "perf": perf, **host}


def perf_from_json(value: object) -> dict | None:
    """The optional ``perf`` of a workload: the performance model's workload (``gpus.performance.Workload``)
    that the process stands for on a **simulated** node, whose DCGM series then follow that workload on the
    instance's slice (docs/tiering.md, "The profiler"). A real node refuses it (``agent.server``)."""
    if value is None:
        return None
    from gpus.performance import Workload, workload_problems

    if not isinstance(value, dict):
        raise InvalidRequest("perf must be an object: architecture, task, precision, batch_size, seq_len, "
                             "image_size", field="perf")
    unknown = sorted(set(value) - set(PERF_FIELDS))
    if unknown:
        raise InvalidRequest(f"unknown field {unknown[0]!r} in perf; known: {', '.join(PERF_FIELDS)}",
                             field=f"perf.{unknown[0]}")
    if not isinstance(value.get("architecture"), str):
        raise InvalidRequest("perf.architecture must name an architecture (e.g. 'bert-base')",
                             field="perf.architecture")
    defaults = {"task": "inference", "precision": "bf16", "batch_size": 1, "seq_len": 512, "image_size": 224}
    perf = {**defaults, **value}
    candidate = object.__new__(Workload)  # unchecked: workload_problems names the field
    for key in PERF_FIELDS:
        object.__setattr__(candidate, key, perf[key])
    problems = workload_problems(candidate)
    if problems:
        field, message = problems[0]
        raise InvalidRequest(f"perf.{field}: {message}", field=f"perf.{field}")
    return {key: perf[key] for key in PERF_FIELDS}


# -- the client ----------------------------------------------------------------------------------------------
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

    def destroy(self, allocation_id: str, *, resize: bool = False) -> dict:
        """Destroy an instance; ``resize``: an elastic lease gives it back while keeping the rest, so a workload that
        holds other instances is told its new size and signalled (SIGUSR1) instead of being stopped."""
        path = f"/v1/instances/{quote(allocation_id, safe='')}"
        return self.request("DELETE", path + ("?resize=1" if resize else ""))

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

    def workload_grow(self, workload_id: str, instances: list[str]) -> dict:
        """Instances of the node join the workload's devices (an elastic lease took units back): its units file and
        SIGUSR1 (``POST /v1/workloads/{id}/grow``)."""
        return self.request("POST", f"/v1/workloads/{quote(workload_id, safe='')}/grow", {"instances": instances})

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
