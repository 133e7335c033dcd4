"""The interface every agent backend implements (``sim`` and ``nvml``), and the request it validates.

Backends are synchronous and not thread-safe: the HTTP server serialises every call to one backend
(one lock per node) and runs them off its event loop. A backend raises ``AgentError`` subclasses; the
server turns them into problem responses with the status and the reason, and nothing has changed.

Instances are keyed by the broker's allocation id. ``create`` is idempotent: the same id with the same
spec returns the existing instance; the same id with another spec is ``Conflict``. ``set_mode`` is
idempotent too (the GPU's mode again changes nothing) and never touches a GPU that holds an instance.
"""

from __future__ import annotations

import abc
import contextlib
import os
from dataclasses import asdict, dataclass

from agent.protocol import AgentError, Conflict, InvalidRequest, NotFound, NotPermitted, problem_body

KINDS = ("whole", "mig", "share")
MODES = ("whole", "mig", "shared")


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """What the broker asks for on one GPU: a whole GPU, a MIG profile at a start slot, or a share."""

    kind: str
    gpu: str  # GPU UUID
    profile: str = ""  # mig: "3g.40gb"
    start: int = -1  # mig: memory slot
    milli: int = 0  # share: thousandths of the GPU's compute
    memory_mib: int = 0  # share: memory cap

    @classmethod
    def from_json(cls, body: object) -> InstanceSpec:
        """Validate the JSON body of ``PUT /v1/instances/{id}``; errors name the field."""
        if not isinstance(body, dict):
            raise InvalidRequest("the body must be a JSON object", field="body")
        unknown = sorted(set(body) - {"kind", "gpu", "profile", "start", "milli", "memory_mib"})
        if unknown:
            raise InvalidRequest(f"unknown field {unknown[0]!r}", field=unknown[0])
        kind = body.get("kind")
        if kind not in KINDS:
            raise InvalidRequest(f"kind must be one of {', '.join(KINDS)}", field="kind")
        gpu = body.get("gpu")
        if not isinstance(gpu, str) or not gpu:
            raise InvalidRequest("gpu must be the GPU's UUID", field="gpu")

        def integer(name: str, low: int, high: int | None = None) -> int:
            value = body.get(name)
            wrong_type = not isinstance(value, int) or isinstance(value, bool)
            if wrong_type or value < low or (high is not None and value > high):
                bound = f"{low}..{high}" if high is not None else f">= {low}"
                raise InvalidRequest(f"{name} must be an integer {bound}", field=name)
            return value

        def absent(*names: str) -> None:
            for name in names:
                if name in body:
                    raise InvalidRequest(f"{name} does not apply to kind {kind!r}", field=name)

        if kind == "mig":
            profile = body.get("profile")
            if not isinstance(profile, str) or not profile:
                raise InvalidRequest("profile is required for a MIG instance (e.g. '1g.10gb')", field="profile")
            absent("milli", "memory_mib")
            return cls(kind, gpu, profile=profile, start=integer("start", 0, 7))
        if kind == "share":
            absent("profile", "start")
            return cls(kind, gpu, milli=integer("milli", 1, 1000), memory_mib=integer("memory_mib", 1))
        absent("profile", "start", "milli", "memory_mib")
        return cls(kind, gpu)

    def to_json(self) -> dict:
        data = {"kind": self.kind, "gpu": self.gpu}
        if self.kind == "mig":
            data.update(profile=self.profile, start=self.start)
        elif self.kind == "share":
            data.update(milli=self.milli, memory_mib=self.memory_mib)
        return data


def mode_from_json(body: object) -> str:
    """Validate the JSON body of ``PUT /v1/gpus/{uuid}/mode`` (``{"mode": "whole" | "mig" | "shared"}``)."""
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", field="body")
    unknown = sorted(set(body) - {"mode"})
    if unknown:
        raise InvalidRequest(f"unknown field {unknown[0]!r}", field=unknown[0])
    mode = body.get("mode")
    if mode not in MODES:
        raise InvalidRequest(f"mode must be one of {', '.join(MODES)}", field="mode")
    return mode


def held_refusal(gpu_label: str, mode: str, allocation_ids: list[str]) -> Conflict:
    """The refusal of a mode change on a GPU that holds instances (a reset would destroy them)."""
    return Conflict(f"GPU {gpu_label} holds instance(s) {', '.join(allocation_ids)}; its mode cannot change to "
                    f"{mode} until they are destroyed", field="gpu")


@dataclass(slots=True)
class GpuReading:
    """Whole-GPU telemetry (power and energy exist only here: never per instance)."""

    index: int
    uuid: str
    model: str
    power_w: float
    energy_mj: int  # monotonically growing
    util_pct: float | None  # None on MIG-mode GPUs (the device does not report it there)
    fb_used_mib: int | None  # None on MIG and shared GPUs (reported per instance / share)
    fb_free_mib: int | None
    allocation_id: str = ""  # the holder of a whole GPU


@dataclass(slots=True)
class InstanceReading:
    """Telemetry of one MIG instance or share."""

    gpu_index: int
    gpu_uuid: str
    model: str
    allocation_id: str
    engine_active: float  # ratio 0..1 of the instance's own capacity (MIG: its slices; share: its milli)
    fb_used_mib: int
    fb_free_mib: int
    gpu_instance_id: int | None = None  # MIG only
    profile: str = ""  # MIG only


@dataclass(slots=True)
class Readings:
    gpus: list[GpuReading]
    instances: list[InstanceReading]

    def to_json(self) -> dict:
        return {"gpus": [asdict(g) for g in self.gpus], "instances": [asdict(i) for i in self.instances]}


def _cgroup_text(*paths: str) -> str:
    """The first of ``paths`` that reads (stripped), else ""."""
    for path in paths:
        try:
            with open(path, encoding="ascii") as handle:
                return handle.read().strip()
        except OSError:
            continue
    return ""


def cgroup_limits(root: str = "/sys/fs/cgroup") -> dict:
    """The CPU and memory limits of the cgroup this process runs in, ``{"cpu_milli", "memory_mib"}``, 0 where
    there is none (or none can be read): cgroup v2's ``cpu.max`` and ``memory.max`` at ``root`` (a container sees
    its own cgroup there), else cgroup v1's ``cpu.cfs_quota_us``/``cpu.cfs_period_us`` and
    ``memory.limit_in_bytes`` (a v1 "no limit" is a huge number: anything at or above 2**60 counts as none)."""
    cpu_milli = memory_mib = 0
    cpu_max = _cgroup_text(f"{root}/cpu.max").split()
    if len(cpu_max) == 2 and cpu_max[0] != "max":
        with contextlib.suppress(ValueError, ZeroDivisionError):
            cpu_milli = int(cpu_max[0]) * 1000 // int(cpu_max[1])
    elif not cpu_max:
        quota = _cgroup_text(f"{root}/cpu/cpu.cfs_quota_us", f"{root}/cpu,cpuacct/cpu.cfs_quota_us")
        period = _cgroup_text(f"{root}/cpu/cpu.cfs_period_us", f"{root}/cpu,cpuacct/cpu.cfs_period_us")
        with contextlib.suppress(ValueError, ZeroDivisionError):
            if int(quota) > 0:
                cpu_milli = int(quota) * 1000 // int(period)
    memory = _cgroup_text(f"{root}/memory.max") or _cgroup_text(f"{root}/memory/memory.limit_in_bytes")
    with contextlib.suppress(ValueError):
        if memory and memory != "max" and int(memory) < 1 << 60:
            memory_mib = int(memory) >> 20
    return {"cpu_milli": cpu_milli, "memory_mib": memory_mib}


def host_resources(meminfo: str = "/proc/meminfo", cgroup_root: str = "/sys/fs/cgroup") -> dict:
    """This machine's CPUs the agent may run work on (``os.sched_getaffinity``, else ``os.cpu_count``) in
    milli-cores, and its memory (``MemTotal`` of ``/proc/meminfo``, else the physical pages) in MiB, each capped
    by the agent's own cgroup limit (``cgroup_limits``: an agent in a container with 8 CPUs and 64 GiB may hand
    out no more, whatever the host has); 0 where neither can be read."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 0
    memory_mib = 0
    try:
        with open(meminfo, encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    memory_mib = int(line.split()[1]) // 1024  # kB
                    break
    except (OSError, ValueError, IndexError):
        pass
    if not memory_mib:
        try:
            memory_mib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20
        except (AttributeError, OSError, ValueError):
            memory_mib = 0
    cpu_milli = cpus * 1000
    limits = cgroup_limits(cgroup_root)
    if limits["cpu_milli"]:
        cpu_milli = min(cpu_milli, limits["cpu_milli"]) if cpu_milli else limits["cpu_milli"]
    if limits["memory_mib"]:
        memory_mib = min(memory_mib, limits["memory_mib"]) if memory_mib else limits["memory_mib"]
    return {"cpu_milli": cpu_milli, "memory_mib": memory_mib}


class Backend(abc.ABC):
    """One node's GPUs. ``inventory`` and ``instance`` return JSON-ready dicts (see docs/agent-protocol.md)."""

    name: str = ""

    @abc.abstractmethod
    def inventory(self) -> dict:
        """``{"gpus": [...], "instances": [...]}``: every GPU (uuid, index, model, name, memory_mib = usable =
        memory_total_mib - memory_reserved_mib, mig_capable, mig_mode, mode, mig_layout, shares when shared)
        and every instance this agent holds (whole and share: ``device_uuid`` is the GPU's UUID). Every backend
        answers the same shape: tests/agent/test_backend_conformance.py."""

    @abc.abstractmethod
    def create(self, allocation_id: str, spec: InstanceSpec) -> tuple[dict, bool]:
        """(the instance, created now?) — the same id and spec again returns the same instance."""

    def create_many(self, specs: dict[str, InstanceSpec]) -> dict[str, dict]:
        """Create several instances; each answer is ``{"status": 201 | 200, "instance": {...}}`` or
        ``{"status": 4xx | 5xx, "problem": {...}}`` (one refusal does not stop the others)."""
        answers = {}
        for allocation_id, spec in specs.items():
            try:
                instance, created = self.create(allocation_id, spec)
            except AgentError as error:
                answers[allocation_id] = {"status": error.status, "problem": problem_body(error)}
                continue
            answers[allocation_id] = {"status": 201 if created else 200, "instance": instance}
        return answers

    @abc.abstractmethod
    def destroy(self, allocation_id: str) -> bool:
        """Destroy the instance; False when it was already gone (which is success)."""

    @abc.abstractmethod
    def notice(self, allocation_id: str, deadline: float, reason: str) -> dict:
        """Record a preemption notice on the instance (``NotFound`` when there is none)."""

    @abc.abstractmethod
    def readings(self, now: float) -> Readings:
        """Telemetry for ``/metrics``."""

    def set_mode(self, gpu_uuid: str, mode: str) -> dict:
        """Put the GPU in ``mode`` (one of ``MODES``) and return its inventory entry. The same mode again
        changes nothing. Refused, changing nothing: an unknown GPU (``NotFound``), ``mig`` on a model
        without MIG (``InvalidRequest``), a GPU holding any instance (``Conflict``)."""
        raise NotPermitted(f"the {self.name} backend cannot change GPU modes", field="mode")

    def gpu(self, gpu_uuid: str) -> dict:
        """One GPU's inventory entry (``NotFound`` when the node has no such GPU)."""
        for item in self.inventory()["gpus"]:
            if item["uuid"] == gpu_uuid:
                return item
        raise NotFound(f"no GPU {gpu_uuid!r} on this node", field="gpu")

    def instance(self, allocation_id: str) -> dict:
        for item in self.inventory()["instances"]:
            if item["allocation_id"] == allocation_id:
                return item
        raise NotFound(f"no instance for allocation {allocation_id!r}", field="allocation_id")

    def host(self) -> dict:
        """The host's CPU and memory that work on this node can use: ``{"cpu_milli", "memory_mib"}`` (the
        inventory's ``host_cpu_milli`` and ``host_memory_mib``; 0 where it cannot be read: not tracked). A real
        node's: ``host_resources()``; the simulated backend answers its configured host."""
        return host_resources()

    def close(self) -> None:  # noqa: B027 - optional hook
        """Persist and release what the backend holds (called on shutdown)."""
