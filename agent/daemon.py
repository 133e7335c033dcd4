"""Running an agent: configuration, the backend, enrollment and heartbeats with the broker.

Configuration: a TOML file (``--config``) and/or flags (flags win)::

    node_id = "gpu-node-01"
    listen = "0.0.0.0:9400"
    broker_url = "https://broker.example/"      # optional: standalone without it
    enrollment_token_file = "/etc/gpubroker-agent/token"  # one-time token (0600 file); or the environment
                                                  # variable GPUB_ENROLLMENT_TOKEN; never a command-line flag
    backend = "sim"                               # or "nvml"
    state_dir = "/var/lib/gpubroker-agent"
    gpus = "h100-80gb:8:mig"                      # sim only
    secret = ""                                   # a fixed per-node secret instead of enrolling
    metrics_token = ""                            # optional bearer token for /metrics
    allow_mig_changes = false                     # nvml only: permit creating/destroying MIG instances
                                                  # and changing GPU modes
    create_latency_seconds = 0.0                  # sim only: each instance created answers this much later
    mode_change_latency_seconds = 0.0             # sim only: each GPU mode change answers this much later
    nvlink_domain_size = -1                       # sim only: GPUs per NVLink domain (-1: an NVLink model's
                                                  # group is one domain, as an HGX board; 0: no NVLink)
    host_cpu_milli = 0                            # sim only: the host's CPU in milli-cores and memory in MiB
    host_memory_mib = 0                           # (0: 14 cores and 256 GiB per GPU)
    workload_runtime = "process"                  # workloads on leases: "process", "docker" or "podman"
    workload_roots = ["/srv/gpubroker"]           # working and checkpoint directories must lie under one
                                                  # of these (default: STATE_DIR/work)
    restart_backoff_seconds = 1.0                 # first back-off of an on-failure restart (doubles, ≤ 60 s)
    shrink_grace_seconds = 10.0                   # an elastic lease's device given back (DELETE ?resize=1): a
                                                  # process of its workload still holding it is killed after this
    workload_log_max_bytes = 16777216             # a workload's stdout (and its stderr) keeps at most this
                                                  # much on the node, the newest bytes (4 KiB .. 1 GiB)
    container_devices = "cdi"                     # docker/podman: "cdi" (--device nvidia.com/gpu=<UUID>) or
                                                  # "none" (an engine with no GPU: the container engine test)
    mps_control = "nvidia-cuda-mps-control"       # shares enforced by one MPS control daemon per shared GPU
                                                  # (agent.mps); "" turns MPS off: shares reported unenforced
    mps_directory = ""                            # the daemons' pipe and log directories (default STATE_DIR/mps;
                                                  # their unix sockets need a path under 108 bytes)
    isolation = "auto"                            # process runtime: "uid" runs each workload as its tenant's
                                                  # own user, cgroup and view (agent/isolation.py); "none"
                                                  # as the agent's user (trusted nodes); "auto": uid when
                                                  # the agent is root, else none (with a warning)
    workload_uids = "200000-265535"               # the tenants' uids (one per tenant, kept in isolation.json)
    device_dir = "/dev"                           # where the nvidia<N> device nodes are
    cgroup_root = "/sys/fs/cgroup"                # cgroup v2 (controllers delegated) or the v1 hierarchies
    workload_cpus_per_gpu = 0.0                   # a workload's CPU and memory limits per leased GPU
    workload_memory_mib_per_gpu = 0               # (0: the node's CPUs / memory divided by its GPUs)
    workload_shared_paths = []                    # read-only in every workload's view (besides the agent's
                                                  # Python) even under a closed directory
    workload_network = "node"                     # "closed-local": the node's own services (whatever listens
                                                  # on TCP outside the workload uids, /run's unix sockets) are
                                                  # closed to workloads (needs isolation uid and iptables)
    workload_local_ports = []                     # node services' ports workloads may still reach (closed-local)

Enrollment (``POST {broker}/api/v1/agents/enroll``, the token in the body) returns the per-node secret,
saved as ``state_dir/secret`` (0600); later starts reuse it. Heartbeats (``POST
{broker}/api/v1/agents/{node}/heartbeat``) are signed like every other request; when the broker does not
answer they back off exponentially with jitter, up to ``MAX_BACKOFF``.

When the broker refuses a heartbeat (401) the agent keeps its secret and enrolls again, the request signed
with that secret (the broker gives a node that proves its secret a new one) and carrying the token if it
has one (accepted for a node id the broker does not know, or once a staff member approved it). A refusal
is logged with what to do (a new token; staff approval), and retried with back-off.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import secrets
import socket
import sys
import time
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from agent import __version__
from agent.backend import Backend
from agent.isolation import AGENT_CODE, NETWORKS, Cgroups, Isolation, UidMap, parse_uid_range, resolve_mode
from agent.protocol import PROTOCOL, AgentError, sign

logger = logging.getLogger("agent")
MAX_BACKOFF = 60.0
MAX_LATENCY_SECONDS = 600.0  # the sim's own bound (agent.sim.MAX_LATENCY_SECONDS)


@dataclass
class AgentConfig:
    node_id: str = ""
    listen: str = "127.0.0.1:9400"
    broker_url: str = ""
    enrollment_token: str = ""  # the config file's; else enrollment_token_file, else $GPUB_ENROLLMENT_TOKEN
    enrollment_token_file: str = ""
    backend: str = "sim"
    state_dir: str = "var/agent"
    gpus: str = "h100-80gb:8:mig"
    secret: str = ""
    metrics_token: str = ""
    hostname: str = ""
    advertise_url: str = ""
    allow_mig_changes: bool = False
    heartbeat_seconds: float = 15.0
    create_latency_seconds: float = 0.0  # sim only: modelled MIG creation time
    mode_change_latency_seconds: float = 0.0  # sim only: modelled GPU reset time
    nvlink_domain_size: int = -1  # sim only: GPUs per NVLink domain (-1: derived from the model; 0: none)
    host_cpu_milli: int = 0  # sim only: the host's CPU (0: per GPU); a real node reports its own
    host_memory_mib: int = 0  # sim only: the host's memory (0: per GPU)
    workload_runtime: str = "process"
    workload_roots: list = field(default_factory=list)
    restart_backoff_seconds: float = 1.0
    shrink_grace_seconds: float = 10.0
    workload_log_max_bytes: int = 16 * 1024 * 1024
    container_devices: str = "cdi"
    mps_control: str = "nvidia-cuda-mps-control"
    mps_directory: str = ""
    isolation: str = "auto"
    workload_uids: str = "200000-265535"
    device_dir: str = "/dev"
    cgroup_root: str = "/sys/fs/cgroup"
    workload_cpus_per_gpu: float = 0.0
    workload_memory_mib_per_gpu: int = 0
    workload_shared_paths: list = field(default_factory=list)
    workload_network: str = "node"
    workload_local_ports: list = field(default_factory=list)

    def validate(self) -> AgentConfig:
        if not self.node_id:
            raise ValueError("node_id is required (--node-id or node_id in the config file)")
        if self.backend not in ("sim", "nvml"):
            raise ValueError(f"backend must be sim or nvml, got {self.backend!r}")
        host, _, port = self.listen.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"listen must be HOST:PORT, got {self.listen!r}")
        for name in ("create_latency_seconds", "mode_change_latency_seconds"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= MAX_LATENCY_SECONDS:
                raise ValueError(f"{name} must be a number of seconds 0..{MAX_LATENCY_SECONDS:g}, got {value!r}")
            if value and self.backend != "sim":
                raise ValueError(f"{name} models device time in the sim backend only; a real GPU takes its own")
        for name, low, high in (("nvlink_domain_size", -1, 64), ("host_cpu_milli", 0, 1 << 40),
                                ("host_memory_mib", 0, 1 << 40)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ValueError(f"{name} must be an integer {low}..{high}, got {value!r}")
            if value not in (-1, 0) and self.backend != "sim":
                raise ValueError(f"{name} describes a simulated node; a real node reports its own")
        if self.workload_runtime not in ("process", "docker", "podman"):
            raise ValueError(f"workload_runtime must be process, docker or podman, got {self.workload_runtime!r}")
        if self.container_devices not in ("cdi", "none"):
            raise ValueError(f"container_devices must be cdi or none, got {self.container_devices!r}")
        if not isinstance(self.mps_control, str):
            raise ValueError(f"mps_control must be a program name or path (\"\" turns MPS off), "
                             f"got {self.mps_control!r}")
        if not isinstance(self.mps_directory, str) or (self.mps_directory and not self.mps_directory.startswith("/")):
            raise ValueError(f"mps_directory must be an absolute path (or \"\"), got {self.mps_directory!r}")
        if isinstance(self.workload_roots, str):
            self.workload_roots = [self.workload_roots]
        for root in self.workload_roots:
            if not isinstance(root, str) or not root.startswith("/"):
                raise ValueError(f"workload_roots must be absolute paths, got {root!r}")
        if not isinstance(self.restart_backoff_seconds, int | float) or not 0 < self.restart_backoff_seconds <= 60:
            raise ValueError("restart_backoff_seconds must be a number of seconds in (0, 60]")
        if (not isinstance(self.shrink_grace_seconds, int | float) or isinstance(self.shrink_grace_seconds, bool)
                or not 0 <= self.shrink_grace_seconds <= 3600):
            raise ValueError("shrink_grace_seconds must be a number of seconds 0..3600, "
                             f"got {self.shrink_grace_seconds!r}")
        if (not isinstance(self.workload_log_max_bytes, int) or isinstance(self.workload_log_max_bytes, bool)
                or not 4096 <= self.workload_log_max_bytes <= 1 << 30):
            raise ValueError("workload_log_max_bytes must be a number of bytes from 4096 to 1073741824")
        resolve_mode(self.isolation)  # the setting is known; "uid" is refused without root
        parse_uid_range(self.workload_uids)
        for name in ("device_dir", "cgroup_root"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).startswith("/"):
                raise ValueError(f"{name} must be an absolute path, got {getattr(self, name)!r}")
        if isinstance(self.workload_shared_paths, str):
            self.workload_shared_paths = [self.workload_shared_paths]
        if not all(isinstance(p, str) and p.startswith("/") for p in self.workload_shared_paths):
            raise ValueError(f"workload_shared_paths must be absolute paths, got {self.workload_shared_paths!r}")
        if self.workload_network not in NETWORKS:
            raise ValueError(f"workload_network must be one of {', '.join(NETWORKS)}, got {self.workload_network!r}")
        if isinstance(self.workload_local_ports, int | str):
            self.workload_local_ports = [self.workload_local_ports]
        try:
            self.workload_local_ports = [int(p) for p in self.workload_local_ports]
        except (TypeError, ValueError):
            raise ValueError(f"workload_local_ports must be TCP ports, got {self.workload_local_ports!r}") from None
        if not all(0 < p < 65536 for p in self.workload_local_ports):
            raise ValueError(f"workload_local_ports must be TCP ports, got {self.workload_local_ports!r}")
        if (not isinstance(self.workload_cpus_per_gpu, int | float) or isinstance(self.workload_cpus_per_gpu, bool)
                or not 0 <= self.workload_cpus_per_gpu <= 1024):
            raise ValueError("workload_cpus_per_gpu must be a number of CPUs 0..1024 (0: the node's per GPU)")
        if (not isinstance(self.workload_memory_mib_per_gpu, int) or isinstance(self.workload_memory_mib_per_gpu, bool)
                or not 0 <= self.workload_memory_mib_per_gpu <= 1 << 30):
            raise ValueError("workload_memory_mib_per_gpu must be a number of MiB (0: the node's per GPU)")
        if self.broker_url and not self.broker_url.startswith(("http://", "https://")):
            raise ValueError(f"broker_url must be http(s)://..., got {self.broker_url!r}")
        self.hostname = self.hostname or socket.gethostname()
        if not self.enrollment_token:
            self.enrollment_token = read_enrollment_token(self.enrollment_token_file)
        self.advertise_url = self.advertise_url or f"http://{self.listen}"
        return self

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host, int(port)


def load_config(path: str | None, overrides: dict) -> AgentConfig:
    values: dict = {}
    if path:
        with open(path, "rb") as handle:
            values = tomllib.load(handle)
        known = {f.name for f in fields(AgentConfig)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{path}: unknown setting {unknown[0]!r}; known: {', '.join(sorted(known))}")
    values.update({key: value for key, value in overrides.items() if value is not None})
    return AgentConfig(**values).validate()


def build_backend(config: AgentConfig, state_dir: Path | None = None) -> Backend:
    state = Path(state_dir or config.state_dir)
    if config.backend == "nvml":
        from agent.nvml_backend import NvmlBackend

        return NvmlBackend(state, config.hostname, allow_mig_changes=config.allow_mig_changes)
    from agent.sim import SimBackend, parse_gpu_specs

    return SimBackend(state, config.node_id, parse_gpu_specs(config.gpus),
                      create_latency_seconds=config.create_latency_seconds,
                      mode_change_latency_seconds=config.mode_change_latency_seconds,
                      nvlink_domain_size=None if config.nvlink_domain_size < 0 else config.nvlink_domain_size,
                      host_cpu_milli=config.host_cpu_milli, host_memory_mib=config.host_memory_mib)


def node_gpu_count(config: AgentConfig, backend: Backend | None = None) -> int:
    if backend is not None:
        return len(backend.inventory()["gpus"]) or 1
    if config.backend == "sim":  # "h100-80gb:8:mig,l4:2:shared"
        return sum(int(part.split(":")[1]) for part in config.gpus.split(",") if part.count(":") >= 1) or 1
    return 1


def build_isolation(config: AgentConfig, state_dir: Path, gpus: int = 1, uid_map: UidMap | None = None) -> Isolation:
    """The process runtime's isolation (``agent.isolation``): ``uid`` for a root agent unless configured
    ``none``; without it the agent logs a warning (its workloads run as the agent's own user)."""
    mode = resolve_mode(config.isolation) if config.workload_runtime == "process" else "none"
    if mode == "none" and config.workload_runtime == "process":
        logger.warning("node %s: workloads run as the agent's own user (isolation none%s): a workload can read "
                       "the agent's state, its secret and other workloads' files and environments; run the agent "
                       "as root (isolation uid) on a node that serves more than one tenant", config.node_id,
                       "" if config.isolation == "none" else ": the agent is not root")
    cpus = config.workload_cpus_per_gpu or (os.cpu_count() or 1) / gpus
    memory_mib = config.workload_memory_mib_per_gpu or (os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
                                                        // (1 << 20) // gpus)
    return Isolation(mode=mode, state_dir=state_dir, uids=parse_uid_range(config.workload_uids),
                     device_dir=Path(config.device_dir),
                     cgroups=Cgroups(config.cgroup_root) if mode == "uid" else None,
                     cpu_milli_per_gpu=int(cpus * 1000), memory_bytes_per_gpu=int(memory_mib) << 20,
                     shared_paths=[Path(sys.prefix), Path(sys.base_prefix), AGENT_CODE,
                                   *(Path(p) for p in config.workload_shared_paths)], uid_map=uid_map,
                     network=config.workload_network if mode == "uid" else "node",
                     local_ports=list(config.workload_local_ports))


def build_workloads(config: AgentConfig, state_dir: Path | None = None, backend: Backend | None = None, *,
                    uid_map: UidMap | None = None):
    """The node's workload manager (``agent.workloads``) with the configured runtime, roots and isolation;
    with the backend, it knows each GPU's index (device node) and the node's GPU count (limits)."""
    from agent.workloads import ContainerRuntime, WorkloadManager, build_runtime

    state = Path(state_dir or config.state_dir)
    runtime = (ContainerRuntime(config.workload_runtime, cdi_devices=config.container_devices == "cdi")
               if config.workload_runtime in ("docker", "podman") else build_runtime(config.workload_runtime))
    manager = WorkloadManager(state, runtime,
                              roots=[Path(r) for r in config.workload_roots] or None,
                              backoff_seconds=config.restart_backoff_seconds,
                              shrink_grace_seconds=config.shrink_grace_seconds,
                              log_max_bytes=config.workload_log_max_bytes,
                              isolation=build_isolation(config, state, node_gpu_count(config, backend), uid_map))
    if backend is not None:
        manager.gpu_lookup = lambda uuid: next((g for g in backend.inventory()["gpus"] if g["uuid"] == uuid), None)
        manager.gpu_processes = getattr(backend, "compute_pids", None)  # NVML's view of a GPU's processes, if any
    return manager


# -- secret ---------------------------------------------------------------------------------------
TOKEN_ENV = "GPUB_ENROLLMENT_TOKEN"


def read_enrollment_token(path: str = "") -> str:
    """The enrollment token from a file (refused when others may read it) or ``$GPUB_ENROLLMENT_TOKEN``.
    Never from the command line: argv is visible to every user in ``ps``."""
    if path:
        file = Path(path)
        if not file.exists():
            return os.environ.get(TOKEN_ENV, "").strip()  # used up and removed: a stored secret will do
        if file.stat().st_mode & 0o077:
            raise ValueError(f"{path}: an enrollment token file must not be readable by others (chmod 600)")
        return file.read_text().strip()
    return os.environ.get(TOKEN_ENV, "").strip()


def stored_secret(state_dir: Path) -> str:
    path = state_dir / "secret"
    return path.read_text().strip() if path.exists() else ""


def _write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically, readable by the owner only, synced before the rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def store_secret(state_dir: Path, secret: str) -> None:
    _write_private(state_dir / "secret", secret)


def enrollment_id(state_dir: Path) -> str:
    """The id this agent's token enrollment is asked with, made once and kept (0600) until it is answered:
    a retry after a lost answer, even from a restarted agent, sends the same id and gets the same secret."""
    path = state_dir / "enrollment-id"
    if path.exists() and (stored := path.read_text().strip()):
        return stored
    value = secrets.token_urlsafe(24)
    _write_private(path, value)
    return value


def generated_secret(state_dir: Path) -> str:
    """A standalone node's secret: made once, kept in the state directory."""
    secret = stored_secret(state_dir)
    if not secret:
        secret = secrets.token_urlsafe(32)
        store_secret(state_dir, secret)
    return secret


def backoff_delay(failures: int, base: float = 1.0, cap: float = MAX_BACKOFF) -> float:
    """Exponential back-off with jitter (half to full of the step), capped."""
    return min(cap, base * 2 ** max(0, failures - 1)) * random.uniform(0.5, 1.0)


# -- broker exchange ------------------------------------------------------------------------------
class BrokerLink:
    """Enrollment and heartbeats for one node (many of them share one session in a fleet)."""

    def __init__(self, node, config: AgentConfig, state_dir: Path, session: aiohttp.ClientSession):
        self.node = node  # agent.server.AgentNode; its secret is set on enrollment
        self.config = config
        self.state_dir = state_dir
        self.session = session
        self.heartbeats = 0
        self.failures = 0
        self.last_error = ""
        self.must_enroll = not node.secret

    def _url(self, path: str) -> str:
        return self.config.broker_url.rstrip("/") + path

    async def enroll(self) -> None:
        """Until it succeeds: trade the token (or, holding a secret, a request signed with it) for the
        node's secret, kept on disk. A refusal is logged with what a person must do, and retried."""
        while self.must_enroll:
            inventory = await self.node.call(self.node.inventory)  # with the node's workload_roots
            body = {"node_id": self.config.node_id, "address": self.config.advertise_url,
                    "hostname": self.config.hostname, "agent_version": __version__, "protocol": PROTOCOL,
                    "inventory": {**inventory, **(self.node.workloads.report() if self.node.workloads else {})}}
            if self.config.enrollment_token:
                body["token"] = self.config.enrollment_token
                body["enrollment_id"] = enrollment_id(self.state_dir)
            raw = json.dumps(body).encode()
            url = self._url("/api/v1/agents/enroll")
            headers = {"Content-Type": "application/json"}
            if self.node.secret:  # proves it is this node: the broker re-enrolls it without a token
                headers.update(sign(self.node.secret, self.config.node_id, "POST", urlsplit(url).path, raw))
            try:
                async with self.session.post(url, data=raw, headers=headers) as response:
                    payload = await response.json(content_type=None)
                    if response.status in (200, 201) and payload.get("secret"):
                        store_secret(self.state_dir, payload["secret"])
                        (self.state_dir / "enrollment-id").unlink(missing_ok=True)  # answered: the next is new
                        self.node.secret = payload["secret"]
                        self.must_enroll = False
                        self.config.heartbeat_seconds = float(payload.get("heartbeat_seconds")
                                                              or self.config.heartbeat_seconds)
                        logger.info("enrolled %s with %s", self.config.node_id, self.config.broker_url)
                        return
                    self.last_error = f"{response.status}: {payload.get('detail', payload)}"
                    if response.status == 409:
                        logger.error(
                            "enrollment of %s refused: %s -- staff approval is needed (on the broker: manage.py "
                            "node_reenroll_approve %s, or gpu_release for a GPU another node holds); retrying",
                            self.config.node_id, payload.get("detail", payload), self.config.node_id)
                    elif response.status == 401:
                        logger.error(
                            "enrollment of %s refused: %s -- %s", self.config.node_id, payload.get("detail", payload),
                            "the broker does not accept this node's secret; an enrolled node id needs staff "
                            "approval (manage.py node_reenroll_approve) and a new enrollment token"
                            if not self.config.enrollment_token else
                            "the enrollment token is invalid, expired or spent: provide a new one")
            except (aiohttp.ClientError, TimeoutError, ValueError) as error:
                self.last_error = str(error) or type(error).__name__
            self.failures += 1
            delay = backoff_delay(self.failures)
            logger.warning("enrollment of %s failed (%s); retrying in %.1f s", self.config.node_id,
                           self.last_error, delay)
            await asyncio.sleep(delay)

    async def heartbeat_once(self) -> bool:
        inventory = await self.node.call(self.node.backend.inventory)
        body = json.dumps({
            "time": time.time(), "address": self.config.advertise_url, "agent_version": __version__,
            "gpus": len(inventory["gpus"]), "instances": [i["allocation_id"] for i in inventory["instances"]],
            **(self.node.workloads.report() if self.node.workloads else {}),
        }).encode()
        path = f"/api/v1/agents/{self.config.node_id}/heartbeat"
        headers = {"Content-Type": "application/json",
                   **sign(self.node.secret, self.config.node_id, "POST", urlsplit(self._url(path)).path, body)}
        try:
            async with self.session.post(self._url(path), data=body, headers=headers) as response:
                payload = await response.json(content_type=None)
                if response.status == 401:
                    # the broker no longer accepts this secret (its database was reset, the node removed or
                    # re-enrolled elsewhere): keep it (it proves who we are) and enroll again
                    logger.warning("broker refused %s's heartbeat (%s); enrolling again", self.config.node_id,
                                   payload.get("detail", payload))
                    self.last_error = f"401: {payload.get('detail', payload)}"
                    self.must_enroll = True
                    self.failures += 1
                    return False
                if response.status == 200:
                    self.heartbeats += 1
                    self.failures = 0
                    self.config.heartbeat_seconds = float(payload.get("heartbeat_seconds")
                                                          or self.config.heartbeat_seconds)
                    return True
                self.last_error = f"{response.status}: {payload.get('detail', payload)}"
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            self.last_error = str(error) or type(error).__name__
        self.failures += 1
        return False

    async def report_workloads_once(self) -> bool:
        """Send the workloads with events the broker has not acknowledged (``POST
        {broker}/api/v1/agents/{node}/workloads``); the broker answers the last event it recorded of each."""
        manager = self.node.workloads
        if manager is None:
            return True
        pending = await self.node.call(manager.pending)
        if not pending:
            return True
        body = json.dumps({"time": time.time(), "workloads": pending}).encode()
        path = f"/api/v1/agents/{self.config.node_id}/workloads"
        headers = {"Content-Type": "application/json",
                   **sign(self.node.secret, self.config.node_id, "POST", urlsplit(self._url(path)).path, body)}
        try:
            async with self.session.post(self._url(path), data=body, headers=headers) as response:
                payload = await response.json(content_type=None)
                if response.status == 200 and isinstance(payload.get("acked"), dict):
                    await self.node.call(manager.ack, payload["acked"])
                    return True
                self.last_error = f"{response.status}: {payload.get('detail', payload)}"
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            self.last_error = str(error) or type(error).__name__
        return False

    async def report_loop(self) -> None:
        """Report workload events as they happen (the ticker sets ``workload_changed``), and at least every
        heartbeat period until the broker has them all; back off while it does not answer."""
        failures = 0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.node.workload_changed.wait(), timeout=self.config.heartbeat_seconds)
            self.node.workload_changed.clear()
            if self.must_enroll or not self.node.secret:
                continue
            if await self.report_workloads_once():
                failures = 0
                continue
            failures += 1
            delay = backoff_delay(failures, cap=self.config.heartbeat_seconds)
            logger.warning("workload report of %s failed (%s); retrying in %.1f s", self.config.node_id,
                           self.last_error, delay)
            await asyncio.sleep(delay)
            self.node.workload_changed.set()

    async def run(self) -> None:
        reporter = asyncio.create_task(self.report_loop()) if self.node.workloads is not None else None
        try:
            await self._run()
        finally:
            if reporter is not None:
                reporter.cancel()
                await asyncio.gather(reporter, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await self.enroll()
            ok = await self.heartbeat_once()
            if ok:
                delay = self.config.heartbeat_seconds * random.uniform(0.9, 1.1)
            else:
                delay = backoff_delay(self.failures, base=1.0, cap=max(MAX_BACKOFF, self.config.heartbeat_seconds))
                logger.warning("heartbeat of %s failed (%s); retrying in %.1f s", self.config.node_id,
                               self.last_error, delay)
            await asyncio.sleep(delay)


# -- one agent ------------------------------------------------------------------------------------
def resolve_secret(config: AgentConfig, state_dir: Path) -> str:
    """The secret to start with: configured, stored from an earlier enrollment, or (standalone) made here."""
    if config.secret:
        return config.secret
    secret = stored_secret(state_dir)
    if secret:
        return secret
    if config.broker_url:
        if not config.enrollment_token:
            raise ValueError("no stored secret: an enrollment token is needed to enroll with the broker "
                         f"(enrollment_token_file, or the environment variable {TOKEN_ENV})")
        return ""  # enrolled by BrokerLink
    return generated_secret(state_dir)


def serve(config: AgentConfig) -> None:
    from aiohttp import web

    from agent.server import AgentNode, node_app

    state_dir = Path(config.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    from agent.mps import enforce_shares

    isolated_uids = config.workload_runtime == "process" and resolve_mode(config.isolation) == "uid"
    backend = enforce_shares(build_backend(config, state_dir), Path(state_dir or config.state_dir), config.mps_control,
                             config.mps_directory, isolated_uids=isolated_uids)
    node = AgentNode(config.node_id, backend, resolve_secret(config, state_dir), config.hostname,
                     metrics_token=config.metrics_token, workloads=build_workloads(config, state_dir, backend))
    app = node_app(node)

    async def broker_link(app_):
        if not config.broker_url:
            logger.info("standalone (no broker_url); secret in %s/secret", state_dir)
            yield
            return
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        task = asyncio.create_task(BrokerLink(node, config, state_dir, session).run())
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await session.close()

    app.cleanup_ctx.append(broker_link)
    host, port = config.host_port
    logger.info("agent %s (%s backend) listening on %s", config.node_id, backend.name, config.listen)
    # SIGTERM / SIGINT: aiohttp stops accepting, lets requests in flight finish, then runs the cleanups
    # (the backend persists its state), and the process exits 0
    web.run_app(app, host=host, port=port, shutdown_timeout=10, print=None, access_log=None)


def add_latency_flags(parser: argparse.ArgumentParser, *, default: float | None) -> None:
    """``--create-latency`` and ``--mode-change-latency`` (sim only), shared with ``agent.fleet``."""
    parser.add_argument("--create-latency", dest="create_latency_seconds", type=float, default=default,
                        metavar="SECONDS", help="sim: each instance created answers this much later (MIG creation)")
    parser.add_argument("--mode-change-latency", dest="mode_change_latency_seconds", type=float, default=default,
                        metavar="SECONDS", help="sim: each GPU mode change answers this much later (a GPU reset)")


def add_topology_flags(parser: argparse.ArgumentParser) -> None:
    """``--nvlink-domain-size``, ``--host-cpu-milli`` and ``--host-memory-mib`` (sim only), shared with
    ``agent.fleet``: what a simulated node reports of its NVLink domains and host (docs/agent-protocol.md)."""
    parser.add_argument("--nvlink-domain-size", dest="nvlink_domain_size", type=int, metavar="GPUS",
                        help="sim: GPUs per NVLink domain (default: an NVLink model's GPUs are one domain; 0: none)")
    parser.add_argument("--host-cpu-milli", dest="host_cpu_milli", type=int, metavar="MILLICORES",
                        help="sim: the host's CPU (default 14 cores per GPU)")
    parser.add_argument("--host-memory-mib", dest="host_memory_mib", type=int, metavar="MIB",
                        help="sim: the host's memory (default 256 GiB per GPU)")


def add_workload_flags(parser: argparse.ArgumentParser) -> None:
    """``--workload-runtime``, ``--workload-root`` (repeatable), ``--restart-backoff``, ``--shrink-grace-seconds``
    and ``--workload-log-max-bytes``, shared with ``agent.fleet``."""
    parser.add_argument("--workload-runtime", dest="workload_runtime", choices=("process", "docker", "podman"))
    parser.add_argument("--workload-root", dest="workload_roots", action="append", metavar="PATH",
                        help="working and checkpoint directories must lie under one (default STATE_DIR/work)")
    parser.add_argument("--restart-backoff", dest="restart_backoff_seconds", type=float, metavar="SECONDS")
    parser.add_argument("--shrink-grace-seconds", dest="shrink_grace_seconds", type=float, metavar="SECONDS",
                        help="a device an elastic lease gave back: a process of its workload still holding it "
                             "is killed after this (default 10)")
    parser.add_argument("--workload-log-max-bytes", dest="workload_log_max_bytes", type=int, metavar="BYTES",
                        help="a workload's stdout (and its stderr) keeps at most this much, the newest bytes")
    parser.add_argument("--container-devices", dest="container_devices", choices=("cdi", "none"),
                        help="docker/podman: attach each device by CDI name (cdi), or not (none: an engine "
                             "without a GPU, for the container engine test)")
    parser.add_argument("--isolation", choices=("auto", "uid", "none"),
                        help="process runtime: run workloads as their tenant's user (uid; auto when root)")
    parser.add_argument("--workload-uids", dest="workload_uids", metavar="FIRST-LAST",
                        help="the tenants' uids (default 200000-265535)")
    parser.add_argument("--device-dir", dest="device_dir", metavar="PATH", help="where nvidia<N> are (/dev)")
    parser.add_argument("--cgroup-root", dest="cgroup_root", metavar="PATH", help="default /sys/fs/cgroup")
    parser.add_argument("--workload-network", dest="workload_network", choices=NETWORKS,
                        help="closed-local: close the node's own services to workloads (isolation uid, iptables)")
    parser.add_argument("--workload-local-port", dest="workload_local_ports", action="append", type=int,
                        metavar="PORT", help="a node service's port workloads may still reach (closed-local)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent", description="GPU broker node agent")
    parser.add_argument("--config", help="TOML configuration file")
    for name in ("node-id", "listen", "broker-url", "enrollment-token-file", "backend", "state-dir", "gpus", "secret",
                 "metrics-token", "hostname", "advertise-url"):
        parser.add_argument(f"--{name}", dest=name.replace("-", "_"))
    parser.add_argument("--allow-mig-changes", action="store_true", default=None)
    parser.add_argument("--mps-control", dest="mps_control", metavar="PROGRAM",
                        help="the MPS control program enforcing shares (default nvidia-cuda-mps-control; "
                             "\"\" turns MPS off)")
    parser.add_argument("--mps-directory", dest="mps_directory", metavar="PATH",
                        help="the MPS daemons' pipe and log directories (default STATE_DIR/mps)")
    add_workload_flags(parser)
    add_latency_flags(parser, default=None)
    add_topology_flags(parser)
    parser.add_argument("--log-level", default="INFO")
    args = vars(parser.parse_args(argv))
    logging.basicConfig(level=args.pop("log_level"), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config_path = args.pop("config")
    try:
        config = load_config(config_path, args)
        serve(config)
    except (ValueError, OSError, AgentError) as error:
        logger.error("%s", error)
        return 2
    return 0
