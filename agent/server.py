"""The agent's HTTP server (aiohttp): protocol v1, see docs/agent-protocol.md.

One ``AgentNode`` = one node: its backend, its secret and a lock. ``node_app(node)`` serves it at the
root (one agent per machine) or under ``/n/{node_id}`` inside a fleet (``agent.fleet``). Backend calls
are serialised per node and run off the event loop (the sim backend fsyncs every change).

``/healthz`` and ``/metrics`` are read-only and unsigned, as dcgm-exporter's are (Prometheus cannot sign);
``metrics_token`` makes ``/metrics`` require ``Authorization: Bearer <token>``. Everything under ``/v1``
must be signed by the broker (``agent.protocol``); an unsigned, forged, stale or replayed request is 401
and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hmac
import json
import logging
import os
import pty
import re
import signal
import struct
import termios
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from agent import __version__, relay
from agent.backend import Backend, InstanceSpec, mode_from_json
from agent.metrics import render
from agent.protocol import (
    PROTOCOL,
    TYPE_BASE,
    AgentError,
    Conflict,
    InvalidRequest,
    NonceCache,
    NotFound,
    SignatureError,
    Unavailable,
    problem_body,
    spec_from_json,
    verify,
)
from agent.workloads import WorkloadManager

logger = logging.getLogger("agent")
ALLOCATION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
MAX_BODY = 64 * 1024
# a request relayed to a workload's port (GET/POST … /v1/workloads/{id}/port/{tail}): its body may be larger than
# a protocol call's; it is signed like every /v1 request (the broker's interactive proxy signs it)
RELAY_MAX_BODY = 8 * 1024 * 1024
RELAY_ROUTE = "workload_port"
MAX_BATCH = 64  # instances in one PUT /v1/instances
TICK_SECONDS = 0.2  # how often a node with live workloads reaps exits, kills at deadlines, restarts
NODE_KEY = web.AppKey("node", object)


@dataclass
class AgentNode:
    node_id: str
    backend: Backend
    secret: str
    hostname: str
    metrics_token: str = ""
    nonces: NonceCache = field(default_factory=NonceCache)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    workloads: WorkloadManager | None = None
    workload_changed: asyncio.Event = field(default_factory=asyncio.Event)  # BrokerLink reports on it
    _ticker: asyncio.Task | None = None
    relay_session: aiohttp.ClientSession | None = None  # to workloads' ports on this node (workload_port)

    def inventory(self) -> dict:
        """The backend's inventory with the host's CPU and memory (``host_cpu_milli``, ``host_memory_mib``:
        ``Backend.host``) and ``workload_roots``: the directories this node's workloads may name paths
        under (``<root>/<tenant>/<project>``; [] on a node that runs none), so the broker refuses, at the request
        and in its preview, a path the node would refuse."""
        data = self.backend.inventory()
        roots = [str(root) for root in self.workloads.roots] if self.workloads is not None else []
        host = self.backend.host()
        return {**data, "workload_roots": roots, "host_cpu_milli": host["cpu_milli"],
                "host_memory_mib": host["memory_mib"]}

    def kick(self) -> None:
        """Make sure a ticker runs while this node has live workloads (none runs on an idle node, so a
        fleet of 1000 nodes without workloads wakes nothing)."""
        self.workload_changed.set()
        if self.workloads is None or (self._ticker is not None and not self._ticker.done()):
            return
        self._ticker = asyncio.get_running_loop().create_task(self._tick_while_active())

    async def _tick_while_active(self) -> None:
        while self.workloads.active():
            await asyncio.sleep(TICK_SECONDS)
            try:
                if await self.call(self.workloads.tick):
                    self.workload_changed.set()
            except Exception:  # keep ticking: a failed tick must not orphan the node's workloads
                logger.exception("workload tick of %s failed", self.node_id)

    async def call(self, function, *args):
        """Run one backend call: serialised for this node, off the event loop."""
        async with self.lock:
            return await asyncio.get_running_loop().run_in_executor(None, function, *args)

    async def change(self, function, *args):
        """Run a backend call that changes the device, then wait the device time it models (the sim's
        ``create_latency_seconds`` / ``mode_change_latency_seconds``) with ``asyncio.sleep``: after the
        lock is released, so this node's other requests and the other nodes of a fleet go on meanwhile."""
        take_latency = getattr(self.backend, "take_latency", None)

        def run():
            try:
                result = function(*args)
            finally:
                owed = take_latency() if take_latency is not None else 0.0
            return result, owed

        result, owed = await self.call(run)
        if owed > 0:
            await asyncio.sleep(owed)
        return result


def problem(status: int, code: str, title: str, detail: str, field_name: str | None = None) -> web.Response:
    body = {"type": TYPE_BASE + code, "title": title, "status": status, "detail": detail, "code": code,
            "field": field_name}
    return web.json_response(body, status=status, content_type="application/problem+json")


def _node(request: web.Request) -> AgentNode:
    return request.app[NODE_KEY]


# aiohttp's own refusals, typed as this server types its answers (a body past ``client_max_size`` raises 413
# from ``request.read()``; it was typed ``method_not_allowed``, the one code for every status but 404)
HTTP_ERRORS = {400: ("bad_request", "Bad request"), 404: ("not_found", "Not Found"),
               405: ("method_not_allowed", "Method Not Allowed"), 413: ("too_large", "Request too large")}


@web.middleware
async def problem_middleware(request: web.Request, handler):
    """aiohttp's errors (404, 405, 413, ...) as problem+json too, each typed by its status."""
    try:
        return await handler(request)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        code, title = HTTP_ERRORS.get(error.status, ("http_error", error.reason))
        detail = (f"bodies are limited to {MAX_BODY} bytes" if error.status == 413
                  else f"{request.method} {request.path}: {error.reason}")
        return problem(error.status, code, title, detail)


@web.middleware
async def protocol_middleware(request: web.Request, handler):
    node = _node(request)
    if request.path.endswith("/healthz") or request.path.endswith("/metrics"):
        return await handler(request)
    body = await request.read()
    limit = RELAY_MAX_BODY if request.match_info.route.name == RELAY_ROUTE else MAX_BODY
    if len(body) > limit:
        return problem(413, "too_large", "Request too large", f"bodies are limited to {limit} bytes")
    try:
        verify(request.headers, request.method, request.rel_url.raw_path, request.rel_url.raw_query_string, body,
               lambda node_id: node.secret if node_id == node.node_id else None, node.nonces)
    except SignatureError as error:
        logger.warning("refused %s %s: %s", request.method, request.path, error)
        return problem(401, "unauthenticated", "Not authenticated", str(error))
    hang = getattr(node.backend, "take_hang", None)
    if hang is not None and (seconds := hang()):
        await asyncio.sleep(seconds)  # fault injection (sim): the next request hangs
    try:
        return await handler(request)
    except AgentError as error:
        return problem(error.status, error.code, type(error).__name__, error.message, error.field)


async def _json_body(request: web.Request) -> object:
    raw = await request.read()
    if not raw:
        raise InvalidRequest("a JSON body is required", field="body")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise InvalidRequest(f"the body is not valid JSON: {error}", field="body") from None


def _allocation_id(request: web.Request) -> str:
    value = request.match_info["allocation_id"]
    if not ALLOCATION_ID.match(value):
        raise InvalidRequest("allocation_id must be 1-128 of A-Z a-z 0-9 . _ : - (starting alphanumeric)",
                             field="allocation_id")
    return value


async def healthz(request: web.Request) -> web.Response:
    node = _node(request)
    return web.json_response({"status": "ok", "node_id": node.node_id, "backend": node.backend.name,
                              "version": __version__, "protocol": PROTOCOL})


async def metrics(request: web.Request) -> web.Response:
    node = _node(request)
    if node.metrics_token:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if not hmac.compare_digest(given, node.metrics_token):
            return problem(401, "unauthenticated", "Not authenticated", "metrics need the bearer token")
    # off the event loop like every backend call: NVML reads block (a slow driver call must not stall the
    # other requests, nor the other nodes of a fleet)
    readings = await node.call(node.backend.readings, time.time())
    extra = [
        "# HELP gpubroker_agent_instances Instances this agent holds.",
        "# TYPE gpubroker_agent_instances gauge",
        f'gpubroker_agent_instances{{Hostname="{node.hostname}"}} '
        f"{len({i.allocation_id for i in readings.instances}) + sum(1 for g in readings.gpus if g.allocation_id)}",
    ]
    return web.Response(text=render(readings, node.hostname, extra=extra),
                        content_type="text/plain", charset="utf-8", headers={"X-Prometheus-Format": "0.0.4"})


async def inventory(request: web.Request) -> web.Response:
    node = _node(request)
    data = await node.call(node.inventory)
    return web.json_response({"node_id": node.node_id, "protocol": PROTOCOL, "agent_version": __version__,
                              "backend": node.backend.name,
                              **(node.workloads.report() if node.workloads else {}), **data})


async def instance_get(request: web.Request) -> web.Response:
    node = _node(request)
    return web.json_response(await node.call(node.backend.instance, _allocation_id(request)))


async def instance_put(request: web.Request) -> web.Response:
    node = _node(request)
    allocation_id = _allocation_id(request)
    spec = InstanceSpec.from_json(await _json_body(request))
    instance, created = await node.change(node.backend.create, allocation_id, spec)
    if created:
        logger.info("created %s: %s", allocation_id, json.dumps(spec.to_json(), sort_keys=True))
    return web.json_response(instance, status=201 if created else 200)


async def instances_put(request: web.Request) -> web.Response:
    """Create several instances in one call: ``{"instances": {allocation_id: spec, ...}}`` →
    ``{"instances": {allocation_id: {"status": 201 | 200, "instance": ...} | {"status": 4xx, "problem":
    ...}}}``. Each item is exactly a ``PUT /v1/instances/{allocation_id}``; the sim saves its state once
    for the whole call, before answering."""
    node = _node(request)
    body = await _json_body(request)
    items = body.get("instances") if isinstance(body, dict) else None
    if not isinstance(items, dict) or not 1 <= len(items) <= MAX_BATCH:
        raise InvalidRequest(f"instances must be an object of 1 to {MAX_BATCH} allocation id: spec",
                             field="instances")
    answers, specs = {}, {}
    for allocation_id, raw in items.items():
        try:
            if not ALLOCATION_ID.match(allocation_id):
                raise InvalidRequest("allocation_id must be 1-128 of A-Z a-z 0-9 . _ : - (starting alphanumeric)",
                                     field="allocation_id")
            specs[allocation_id] = InstanceSpec.from_json(raw)
        except AgentError as error:
            answers[allocation_id] = {"status": error.status, "problem": problem_body(error)}
    if specs:
        answers.update(await node.change(node.backend.create_many, specs))
    for allocation_id, answer in answers.items():
        if answer["status"] == 201:
            logger.info("created %s: %s", allocation_id, json.dumps(specs[allocation_id].to_json(), sort_keys=True))
    return web.json_response({"instances": answers})


async def instance_delete(request: web.Request) -> web.Response:
    node = _node(request)
    allocation_id = _allocation_id(request)
    resize = request.query.get("resize") == "1"  # an elastic lease gives it back and keeps the rest

    def destroy():
        if node.workloads is not None and resize:
            node.workloads.shrink(allocation_id)  # its workload is told its new size (SIGUSR1), not stopped
        elif node.workloads is not None:
            node.workloads.release(allocation_id)  # nothing runs on a device that is going away
        return node.backend.destroy(allocation_id)

    existed = await node.call(destroy)
    if node.workloads is not None:
        node.kick()
    if existed:
        logger.info("destroyed %s", allocation_id)
    return web.json_response({"allocation_id": allocation_id, "existed": existed})


async def instance_notice(request: web.Request) -> web.Response:
    node = _node(request)
    allocation_id = _allocation_id(request)
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", field="body")
    deadline = body.get("deadline")
    if not isinstance(deadline, int | float) or isinstance(deadline, bool) or deadline <= 0:
        raise InvalidRequest("deadline must be a unix time in seconds", field="deadline")
    reason = body.get("reason", "")
    if not isinstance(reason, str) or len(reason) > 500:
        raise InvalidRequest("reason must be a string of at most 500 characters", field="reason")
    def notice():
        noticed = node.backend.notice(allocation_id, float(deadline), reason)
        if node.workloads is not None:
            node.workloads.notice(allocation_id, float(deadline), reason)  # SIGTERM now, SIGKILL at the deadline
        return noticed

    instance = await node.call(notice)
    if node.workloads is not None:
        node.kick()
    logger.info("preemption notice for %s: deadline %s (%s)", allocation_id, deadline, reason)
    return web.json_response(instance)


async def gpu_mode_put(request: web.Request) -> web.Response:
    """``{"mode": "whole" | "mig" | "shared"}`` → the GPU's inventory entry after the change (the same mode
    again changes nothing); refused when the GPU holds an instance (409), see docs/agent-protocol.md."""
    node = _node(request)
    gpu_uuid = request.match_info["gpu_uuid"]
    mode = mode_from_json(await _json_body(request))
    entry = await node.change(node.backend.set_mode, gpu_uuid, mode)
    logger.info("GPU %s is in %s mode", gpu_uuid, entry["mode"])
    return web.json_response(entry)


async def faults(request: web.Request) -> web.Response:
    node = _node(request)
    apply = getattr(node.backend, "apply_faults", None)
    if apply is None:
        raise NotFound(f"the {node.backend.name} backend has no fault switches")
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", field="body")
    return web.json_response(await node.call(apply, body))


def _manager(node: AgentNode) -> WorkloadManager:
    if node.workloads is None:
        raise NotFound("this node runs no workloads")
    return node.workloads


def _workload_id(request: web.Request) -> str:
    value = request.match_info["workload_id"]
    if not ALLOCATION_ID.match(value):
        raise InvalidRequest("workload_id must be 1-128 of A-Z a-z 0-9 . _ : - (starting alphanumeric)",
                             field="workload_id")
    return value


async def workloads_get(request: web.Request) -> web.Response:
    node = _node(request)
    return web.json_response({"workloads": await node.call(_manager(node).all)})


async def workload_put(request: web.Request) -> web.Response:
    """Start a workload on instances of this node (idempotent: the same id and body again returns it)."""
    node = _node(request)
    manager = _manager(node)
    workload_id = _workload_id(request)
    spec = spec_from_json(await _json_body(request), manager.roots, resolve=True)

    def start():
        nonlocal spec
        instances = []
        for position, allocation_id in enumerate(spec["instances"]):
            try:
                instances.append(node.backend.instance(allocation_id))
            except NotFound:
                raise NotFound(f"no instance {allocation_id!r} on this node", field=f"instances[{position}]") from None
        if spec.get("perf") is not None:
            # a simulated node runs the performance model's workload: its instances' DCGM series follow it, and
            # the process learns the throughput it stands for (GPUB_PERF_THROUGHPUT, samples/s or tokens/s)
            load = getattr(node.backend, "perf_load", None)
            if load is None:
                raise InvalidRequest("perf is for simulated nodes only (the performance model's workload); a real "
                                     "node runs the real one", field="perf")
            throughput = load(spec["instances"], spec["perf"])
            spec = {**spec, "env": {**spec["env"], "GPUB_PERF_THROUGHPUT": f"{throughput:.6g}"}}
        return manager.start(workload_id, spec, instances)

    workload, created = await node.call(start)
    node.kick()
    if created:
        logger.info("workload %s started on %s: %s", workload_id, ",".join(spec["instances"]),
                    " ".join(workload["argv"])[:200])
    return web.json_response(workload, status=201 if created else 200)


async def workload_get(request: web.Request) -> web.Response:
    node = _node(request)
    return web.json_response(await node.call(_manager(node).status, _workload_id(request)))


async def workload_grow(request: web.Request) -> web.Response:
    """``{"instances": [allocation_id, ...]}``: instances of this node join the workload's devices (an elastic lease
    took units back): its units file and SIGUSR1, as a shrink (``WorkloadManager.grow``)."""
    node = _node(request)
    manager = _manager(node)
    workload_id = _workload_id(request)
    body = await _json_body(request)
    items = body.get("instances") if isinstance(body, dict) else None
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH or not all(
            isinstance(item, str) and ALLOCATION_ID.match(item) for item in items):
        raise InvalidRequest(f"instances must be a list of 1 to {MAX_BATCH} allocation ids", field="instances")

    def grow():
        instances = []
        for position, allocation_id in enumerate(items):
            try:
                instances.append(node.backend.instance(allocation_id))
            except NotFound:
                raise NotFound(f"no instance {allocation_id!r} on this node", field=f"instances[{position}]") from None
        return manager.grow(workload_id, instances)

    workload = await node.call(grow)
    node.kick()
    logger.info("workload %s grew by %s", workload_id, ",".join(items))
    return web.json_response(workload)


async def workload_stop(request: web.Request) -> web.Response:
    """``{"grace_seconds": 10, "reason": "..."}``: SIGTERM now, SIGKILL after the grace."""
    node = _node(request)
    workload_id = _workload_id(request)
    body = await _json_body(request) if await request.read() else {}
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", field="body")
    grace = body.get("grace_seconds", 10)
    if not isinstance(grace, int | float) or isinstance(grace, bool) or not 0 <= grace <= 3600:
        raise InvalidRequest("grace_seconds must be a number of seconds 0..3600", field="grace_seconds")
    reason = body.get("reason", "")
    if not isinstance(reason, str) or len(reason) > 500:
        raise InvalidRequest("reason must be a string of at most 500 characters", field="reason")
    manager = _manager(node)
    workload = await node.call(lambda: manager.stop(workload_id, grace_seconds=float(grace), reason=reason))
    node.kick()
    return web.json_response(workload)


async def workload_logs(request: web.Request) -> web.Response:
    """``?stream=stdout|stderr&offset=N`` or ``&tail=N``, ``&limit=N`` (at most 256 KiB)."""
    node = _node(request)
    query = request.rel_url.query

    def number(name: str) -> int | None:
        if name not in query:
            return None
        if not (query[name].isascii() and query[name].isdigit()):  # int() refuses "²", which isdigit() accepts
            raise InvalidRequest(f"{name} must be a non-negative integer", field=name)
        return int(query[name])

    manager = _manager(node)
    workload_id = _workload_id(request)
    offset, tail, limit = number("offset"), number("tail"), number("limit")
    if offset is not None and tail is not None:
        raise InvalidRequest("give offset or tail, not both", field="tail")
    return web.json_response(await node.call(lambda: manager.logs(
        workload_id, query.get("stream", "stdout"), offset=offset, tail=tail,
        limit=64 * 1024 if limit is None else limit)))


async def workload_port(request: web.Request) -> web.StreamResponse:
    """Relay one signed request (HTTP, or a WebSocket upgrade) to a running interactive workload's port on this
    node, at ``127.0.0.1:<host port>``: the workload listens on the node's loopback (a container's port is published
    there only), so it is reached through this relay, which only the broker can sign, and not from the network
    (docs/agent-protocol.md, "Interactive ports"). The path after ``/port/`` and the query go on as they came."""
    node = _node(request)
    manager = _manager(node)
    workload_id = _workload_id(request)
    workload = await node.call(manager.status, workload_id)
    spec = workload["spec"]
    if not spec.get("port"):
        raise NotFound("this workload has no port", field="port")
    if workload["state"] != "running":
        raise Conflict(f"the workload is {workload['state']}, not running: its port has no listener", field="port")
    tail = request.rel_url.raw_path.split(f"/v1/workloads/{workload_id}/port/", 1)[1]
    url = f"http://127.0.0.1:{spec.get('host_port') or spec['port']}/{tail}"
    if request.rel_url.raw_query_string:
        url += "?" + request.rel_url.raw_query_string
    if node.relay_session is None:
        node.relay_session = relay.client_session()
    headers = relay.relay_headers(request.headers)
    try:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await relay.relay_websocket(request, node.relay_session, "ws://" + url[len("http://"):], headers,
                                               max_msg_size=RELAY_MAX_BODY)
        return await relay.relay_http(request, node.relay_session, url, headers, await request.read())
    except (aiohttp.ClientError, OSError) as error:
        raise Unavailable(f"the workload's port {spec.get('host_port') or spec['port']} does not answer: {error}",
                          field="port") from None


# the shell relay's frames (docs/agent-protocol.md, "Shells"): binary = one channel byte, then data; text = JSON control
SHELL_STDIN, SHELL_STDOUT, SHELL_STDERR = 0, 1, 2
SHELL_MAX_COMMAND = 8192


def _terminal_size_set(fd: int, cols: int, rows: int) -> None:
    """A terminal's window size, each side clamped to 1-1000."""
    cols, rows = (min(max(int(value), 1), 1000) for value in (cols, rows))
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


async def _spawn_shell(plan: dict, *, pty_size: tuple[int, int] | None, term: str):
    """Start the shell's process: on a new pseudo-terminal (its controlling terminal) when ``pty_size`` is given,
    else with pipes. Returns (asyncio process, master fd or None)."""
    env = dict(plan["env"])
    if pty_size is None:
        process = await asyncio.create_subprocess_exec(
            *plan["argv"], cwd=plan["cwd"], env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True, close_fds=True)
        return process, None
    env["TERM"] = term
    master, slave = pty.openpty()
    _terminal_size_set(master, *pty_size)
    try:
        process = await asyncio.create_subprocess_exec(  # preexec_fn: one async-signal-safe ioctl
            *plan["argv"], cwd=plan["cwd"], env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
            close_fds=True, preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    os.set_blocking(master, False)
    return process, master


async def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            await asyncio.sleep(0.01)


async def workload_shell(request: web.Request) -> web.StreamResponse:
    """A shell or a command beside a running workload, over a WebSocket the broker signs (its SSH gateway,
    ``broker.ssh_gateway``): ``?command=`` (empty: a login shell), ``pty=1&cols=&rows=&term=`` for a terminal.
    Binary frames carry one channel byte then data (0 stdin from the broker; 1 stdout, 2 stderr from the node; a
    terminal's output is all on 1); text frames are JSON control: ``{"type": "resize", "cols", "rows"}`` and
    ``{"type": "eof"}`` from the broker, ``{"type": "exit", "code"}`` last from the node. The process runs as the
    workload's user in its cgroup (``WorkloadManager.shell_plan``) and is killed, with its process group, when the
    WebSocket closes."""
    node = _node(request)
    manager = _manager(node)
    workload_id = _workload_id(request)
    query = request.rel_url.query
    command = query.get("command", "")
    if len(command) > SHELL_MAX_COMMAND or "\x00" in command:
        raise InvalidRequest(f"command must be at most {SHELL_MAX_COMMAND} characters, without NUL", field="command")
    pty_size = None
    if query.get("pty") == "1":
        try:
            pty_size = (int(query.get("cols", "80")), int(query.get("rows", "24")))
        except ValueError:
            raise InvalidRequest("cols and rows must be whole numbers", field="cols") from None
    term = query.get("term", "xterm")
    if not re.fullmatch(r"[A-Za-z0-9._+-]{1,64}", term):
        term = "xterm"
    if request.headers.get("Upgrade", "").lower() != "websocket":
        raise InvalidRequest("a shell is a WebSocket: send Upgrade: websocket", field="Upgrade")
    plan = await node.call(manager.shell_plan, workload_id, command, pty_size is not None)
    try:
        process, master = await _spawn_shell(plan, pty_size=pty_size, term=term)
    except OSError as error:
        raise Unavailable(f"cannot start the shell: {error}", field="command") from None
    socket = web.WebSocketResponse(autoping=True, max_msg_size=RELAY_MAX_BODY)
    loop = asyncio.get_running_loop()
    logger.info("shell %s beside workload %s (terminal: %s)", process.pid, workload_id, pty_size is not None)

    async def pump_out(read, channel: int) -> None:
        while data := await read():
            await socket.send_bytes(bytes([channel]) + data)

    def master_reader():
        queue: asyncio.Queue = asyncio.Queue()

        def readable():
            try:
                data = os.read(master, 65536)
            except BlockingIOError:
                return
            except OSError:  # EIO: the terminal's last process is gone
                data = b""
            if not data:
                loop.remove_reader(master)
            queue.put_nowait(data)

        loop.add_reader(master, readable)
        return queue.get

    async def pump_in() -> None:
        async for message in socket:
            if message.type == aiohttp.WSMsgType.BINARY and message.data[:1] == bytes([SHELL_STDIN]):
                if master is not None:
                    await _write_fd(master, message.data[1:])
                elif not process.stdin.is_closing():
                    process.stdin.write(message.data[1:])
                    with contextlib.suppress(ConnectionError):
                        await process.stdin.drain()
            elif message.type == aiohttp.WSMsgType.TEXT:
                try:
                    control = json.loads(message.data)
                except ValueError:
                    continue
                if not isinstance(control, dict):
                    continue
                if control.get("type") == "eof":
                    if master is not None:
                        await _write_fd(master, b"\x04")
                    else:
                        process.stdin.close()
                elif control.get("type") == "resize" and master is not None:
                    with contextlib.suppress(TypeError, ValueError):
                        _terminal_size_set(master, control.get("cols") or 80, control.get("rows") or 24)

    outputs, inputs = [], None
    try:
        await socket.prepare(request)
        if master is not None:
            outputs = [asyncio.ensure_future(pump_out(master_reader(), SHELL_STDOUT))]
        else:
            outputs = [asyncio.ensure_future(pump_out(lambda: process.stdout.read(65536), SHELL_STDOUT)),
                       asyncio.ensure_future(pump_out(lambda: process.stderr.read(65536), SHELL_STDERR))]
        inputs = asyncio.ensure_future(pump_in())
        waiter = asyncio.ensure_future(process.wait())
        done, _pending = await asyncio.wait([waiter, inputs], return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            await asyncio.wait(outputs, timeout=5)  # the last output, then the exit status
            if not socket.closed:
                await socket.send_str(json.dumps({"type": "exit", "code": _exit_code(process.returncode)}))
    finally:
        if process.returncode is None:  # the broker went away: the shell and what it started go too
            for signum in (signal.SIGHUP, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signum)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(process.wait(), 0.5)
                if process.returncode is not None:
                    break
        for task in [*outputs, *([inputs] if inputs else [])]:
            task.cancel()
        await asyncio.gather(*outputs, *([inputs] if inputs else []), return_exceptions=True)
        if master is not None:
            loop.remove_reader(master)
            os.close(master)
        await socket.close()
    return socket


def _exit_code(returncode: int | None) -> int:
    """A shell's exit status as a shell reports it: 128 + the signal that ended it."""
    return 128 - returncode if returncode is not None and returncode < 0 else (returncode or 0)


def node_app(node: AgentNode) -> web.Application:
    app = web.Application(middlewares=[problem_middleware, protocol_middleware],
                          client_max_size=RELAY_MAX_BODY + 1024)
    app[NODE_KEY] = node
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/inventory", inventory)
    app.router.add_put("/v1/instances", instances_put)
    app.router.add_get("/v1/instances/{allocation_id}", instance_get)
    app.router.add_put("/v1/instances/{allocation_id}", instance_put)
    app.router.add_delete("/v1/instances/{allocation_id}", instance_delete)
    app.router.add_post("/v1/instances/{allocation_id}/notice", instance_notice)
    app.router.add_put("/v1/gpus/{gpu_uuid}/mode", gpu_mode_put)
    app.router.add_post("/v1/faults", faults)
    app.router.add_get("/v1/workloads", workloads_get)
    app.router.add_get("/v1/workloads/{workload_id}", workload_get)
    app.router.add_put("/v1/workloads/{workload_id}", workload_put)
    app.router.add_post("/v1/workloads/{workload_id}/stop", workload_stop)
    app.router.add_post("/v1/workloads/{workload_id}/grow", workload_grow)
    app.router.add_get("/v1/workloads/{workload_id}/logs", workload_logs)
    app.router.add_route("*", "/v1/workloads/{workload_id}/port/{tail:.*}", workload_port, name=RELAY_ROUTE)
    app.router.add_get("/v1/workloads/{workload_id}/shell", workload_shell)

    async def resume_workloads(_app):
        if node.workloads is not None and node.workloads.active():
            node.kick()  # after a restart: reap, kill at deadlines and restart what the state file holds

    app.on_startup.append(resume_workloads)

    async def close_backend(_app):
        if node._ticker is not None:
            node._ticker.cancel()
            await asyncio.gather(node._ticker, return_exceptions=True)
        if node.relay_session is not None:
            await node.relay_session.close()
        async with node.lock:
            node.backend.close()

    app.on_cleanup.append(close_backend)
    return app
