"""Workload isolation for the process runtime: tenant code never runs as the agent (docs/security.md,
"Workload isolation"; docs/agent-protocol.md, "Isolation").

With ``isolation = "uid"`` (the default ``"auto"`` when the agent runs as root) every run of a workload

- runs as an unprivileged **uid of its tenant** (group = the same number, no supplementary groups,
  ``no_new_privs``): the tenant (the first part of the workload's ``scope``; ``-`` for a node operator's
  unscoped call) is mapped deterministically into ``workload_uids`` (default 200000-265535) and the map is
  kept in ``STATE_DIR/isolation.json`` (0600), so a tenant keeps its uid across restarts and never shares
  one with another tenant;
- is in its own **cgroup** (``Cgroups``: v2 where the memory, cpu and pids controllers are available, v1
  otherwise) with a CPU quota, a memory limit and a pids limit derived from the lease: the host CPU and
  memory the lease asked for on this node (the workload's ``cpu_milli`` / ``memory_mib``, set by the broker
  from ``gpu.cpu_milli_per_unit`` / ``gpu.host_memory_mib_per_unit``), else the leased share of the node's
  GPUs times the node's CPUs and memory per GPU (``host_limits``; the container runtimes pass the same as
  ``--cpus`` / ``--memory``);
- reaches only its **leased GPUs' device nodes**: on v1 the devices controller allows the usual character
  devices, ``nvidiactl``, ``nvidia-uvm*``, ``nvidia-modeset`` and ``nvidia<N>`` of the leased GPUs only; on
  v2 (no devices controller without BPF) every other ``nvidia<N>`` is masked with ``/dev/null`` in the run's
  own mount namespace; a GPU an elastic lease gives back is taken the same ways from the running workload at
  once (``Isolation.revoke_device``: ``devices.deny`` on v1, ``/dev/null`` bound over it in its namespace
  otherwise);
- sees a **private file-system view** (a mount namespace of its own, made by the launcher below as root
  before it drops to the uid): ``/proc`` mounted again with ``hidepid=invisible`` (no other user's process,
  command line or environment is visible), an empty private ``/tmp``, ``/var/tmp`` and ``/dev/shm``, and
  each directory above its own that it could not traverse (the agent's 0700 state directory, a 0700
  temporary directory) replaced by an empty one holding just the path down to its own directories;
- owns its directories: its home (``STATE_DIR/workloads/<id>/home``, where ``GPUB_DEADLINE_FILE`` lies),
  its tenant's and project's directories under each root (``<root>/<tenant>/<project>``, 0700) and its
  working and checkpoint directories, created and ``fchown``-ed through directory descriptors that never
  follow a symbolic link.

The agent's state directory is 0700 root: secrets, logs, exit files and ``workloads.json`` are the
agent's alone. The launcher is this file run as a script (``python -I agent/isolation.py ...``, standard
library only, like ``agent/shim.py``); the shim starts it as the run's command::

    python -I isolation.py --uid U --gid G [--cgroup-procs FILE]... [--expose DIR]... [--mask-device PATH]...
                           [--private-tmp] [--hide-proc] [--cwd DIR] -- COMMAND ...

Standard library only (the launcher runs with ``-I``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_UIDS = (200000, 265535)
STATE_FILE = "isolation.json"
LAUNCHER = Path(__file__).resolve()
# the agent's own code, read-only in every run's view: the platform's workloads run from it (a profiling
# lease's agent/perf_workload.py, settings.TIERING_PROFILER_COMMAND); it holds no secret
AGENT_CODE = LAUNCHER.parent
CGROUP_PARENT = "gpubroker"
NVIDIA_MAJOR = 195
NVIDIACTL_MINOR, NVIDIA_MODESET_MINOR = 255, 254
# what every process needs: null, zero, full, random, urandom, tty, console-less ptmx and the pty slaves
BASE_DEVICE_RULES = ("c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm", "c 5:0 rwm", "c 5:2 rwm",
                     "c 136:* rwm")
PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")  # noqa: S108 - masked with empty ones, not used
PRIVATE_RUN = "/run"  # the node's services' unix sockets (PostgreSQL's, a container engine's): an empty one
NETWORKS = ("node", "closed-local")  # workload_network: see LocalServicesFirewall
PIDS_MAX = 4096
CPU_PERIOD_US = 100_000
# the smallest limits applied: 10 milli-CPUs is a quota of 1 ms per period (the kernel refuses less; Docker's
# --cpus 0.01), 6 MiB is Docker's smallest --memory
CPU_MILLI_MIN = 10
MEMORY_BYTES_MIN = 6 << 20
MODES = ("auto", "uid", "none")


class IsolationError(Exception):
    """A workload cannot be isolated as configured (``field`` names the input at fault, when there is one)."""

    def __init__(self, message: str, *, field: str = ""):
        super().__init__(message)
        self.field = field


def parse_uid_range(text: str) -> tuple[int, int]:
    """``"200000-265535"`` → (200000, 265535); at least 2 uids, none below 1000 (system users) or 0."""
    low, sep, high = str(text).partition("-")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(f"workload_uids must be FIRST-LAST (e.g. 200000-265535), got {text!r}")
    first, last = int(low), int(high)
    if not 1000 <= first < last <= 2**32 - 2:
        raise ValueError(f"workload_uids must be a range of at least 2 uids within 1000..{2**32 - 2}, got {text!r}")
    return first, last


# what the agent does as root for isolation: chown the tenant's directories (CHOWN), enter them (DAC_OVERRIDE),
# signal its processes (KILL), switch to its uid (SETGID, SETUID), make its mount namespace (SYS_ADMIN)
CAPABILITIES = {"CHOWN": 0, "DAC_OVERRIDE": 1, "KILL": 5, "SETGID": 6, "SETUID": 7, "SYS_ADMIN": 21}


def missing_capabilities(status: str = "/proc/self/status") -> list[str]:
    """The capabilities isolation needs that this process's effective set lacks (a container that dropped them)."""
    try:
        line = next(x for x in Path(status).read_text().splitlines() if x.startswith("CapEff:"))
    except (OSError, StopIteration):
        return sorted(CAPABILITIES)
    effective = int(line.split()[1], 16)
    return [name for name, bit in CAPABILITIES.items() if not effective >> bit & 1]


def resolve_mode(mode: str, *, euid: int | None = None, missing: list[str] | None = None) -> str:
    """The isolation actually used: ``auto`` is ``uid`` for a root agent with the capabilities it needs and
    ``none`` otherwise; ``uid`` without them is refused (an unprivileged process cannot switch users)."""
    if mode not in MODES:
        raise ValueError(f"isolation must be one of {', '.join(MODES)}, got {mode!r}")
    root = (os.geteuid() if euid is None else euid) == 0
    lacking = (missing_capabilities() if missing is None else missing) if root else []
    if mode == "auto":
        return "uid" if root and not lacking else "none"
    if mode == "uid" and not root:
        raise ValueError("isolation = \"uid\" needs the agent to run as root (it starts each workload as its "
                         "tenant's user); run it as root or set isolation = \"none\" on a trusted node")
    if mode == "uid" and lacking:
        raise ValueError(f"isolation = \"uid\" needs the capabilities {', '.join(sorted(CAPABILITIES))}; this "
                         f"agent lacks {', '.join(lacking)} (add them to its container's securityContext)")
    return mode


# -- the uid map --------------------------------------------------------------------------------------
class UidMap:
    """Tenant → uid, deterministic (sha256 of the tenant into the range, then the next free one) and kept in
    ``STATE_DIR/isolation.json`` (0600): a tenant's uid never changes and never serves another tenant. The
    simulated nodes of one ``agent.fleet`` share one map (in the fleet's directory): one machine, one map."""

    def __init__(self, state_dir: Path, first: int, last: int):
        self.path = Path(state_dir) / STATE_FILE
        self.first, self.last = first, last
        self.lock = threading.Lock()  # the fleet's nodes call it from their own threads
        self.uids: dict[str, int] = {}
        if self.path.exists():
            self.uids = {str(k): int(v) for k, v in json.loads(self.path.read_text())["uids"].items()}

    def uid_for(self, tenant: str) -> int:
        with self.lock:
            return self._uid_for(tenant)

    def _uid_for(self, tenant: str) -> int:
        if tenant in self.uids:
            return self.uids[tenant]
        size = self.last - self.first + 1
        taken = set(self.uids.values())
        if len(taken) >= size:
            raise IsolationError(f"no free uid left in {self.first}-{self.last} (workload_uids)", field="scope")
        start = int.from_bytes(hashlib.sha256(tenant.encode()).digest()[:8], "big") % size
        uid = next(self.first + (start + step) % size for step in range(size)
                   if self.first + (start + step) % size not in taken)
        self.uids[tenant] = uid
        self._save()
        return uid

    def _save(self) -> None:
        temporary = self.path.with_suffix(".tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump({"version": 1, "uids": self.uids}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)


# -- cgroups ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    """A run's limits: CPU in millicores (0: none), memory in bytes (0: none), processes."""

    cpu_milli: int = 0
    memory_bytes: int = 0
    pids: int = PIDS_MAX
    devices: tuple[str, ...] = ()  # v1 device rules allowed besides BASE_DEVICE_RULES ("c 195:0 rwm")


class Cgroups:
    """A small cgroup driver: ``version`` is ``"v2"`` when ``root`` is a cgroup2 hierarchy with the memory,
    cpu and pids controllers available, ``"v1"`` when ``root`` holds v1 controller hierarchies
    (``root/memory``, ``root/cpu``, ``root/pids``, ``root/devices``), else ``""`` (no cgroups: limits are not
    applied and ``describe`` says so). Every workload gets ``gpubroker/<name>`` with its limits; ``create``
    returns the ``cgroup.procs`` files the launcher writes its pid into before it drops privileges. On v2
    ``root`` is the agent's delegated subtree (``cgroup_root``); on v1 the groups nest under the agent's
    own group of each controller (so a node's limit on the agent's service covers its workloads too)."""

    V1_CONTROLLERS = ("memory", "cpu", "pids", "devices")
    V2_CONTROLLERS = ("cpu", "memory", "pids")

    def __init__(self, root: Path | str = "/sys/fs/cgroup", *, own: str = "/proc/self/cgroup"):
        self.root = Path(root)
        self.version = self._detect()
        self.parents = {}  # v1: controller -> the directory the workloads' groups are made in
        if self.version == "v1":
            inside = {}
            with contextlib.suppress(OSError):
                for line in Path(own).read_text().splitlines():
                    _, names, path = line.split(":", 2)
                    for name in names.split(","):
                        inside[name] = path.strip("/")
            for controller in self.V1_CONTROLLERS:
                mine = self.root / controller / inside.get(controller, "")
                self.parents[controller] = (mine if mine.is_dir() else self.root / controller) / CGROUP_PARENT

    def _detect(self) -> str:
        controllers = self.root / "cgroup.controllers"
        if controllers.exists():
            available = set(controllers.read_text().split())
            if set(self.V2_CONTROLLERS) <= available and os.access(self.root, os.W_OK):
                return "v2"
        if all((self.root / c / "cgroup.procs").exists() and os.access(self.root / c, os.W_OK)
               for c in self.V1_CONTROLLERS):
            return "v1"
        return ""  # none, or mounted read-only (a container's): no limits, devices masked in the namespace

    @property
    def restricts_devices(self) -> bool:
        return self.version == "v1"

    def create(self, name: str, limits: Limits) -> list[Path]:
        if self.version == "v2":
            return [self._create_v2(name, limits)]
        if self.version == "v1":
            return self._create_v1(name, limits)
        return []

    def _create_v2(self, name: str, limits: Limits) -> Path:
        parent = self.root / CGROUP_PARENT
        parent.mkdir(exist_ok=True)
        wanted = " ".join(f"+{c}" for c in self.V2_CONTROLLERS)
        for group in (self.root, parent):  # the controllers are delegated down to the workload's group
            enabled = set((group / "cgroup.subtree_control").read_text().split())
            if not set(self.V2_CONTROLLERS) <= enabled:
                (group / "cgroup.subtree_control").write_text(wanted)
        group = parent / name
        group.mkdir(exist_ok=True)
        (group / "memory.max").write_text(str(limits.memory_bytes) if limits.memory_bytes else "max")
        (group / "memory.swap.max").write_text("0") if (group / "memory.swap.max").exists() else None
        quota = limits.cpu_milli * CPU_PERIOD_US // 1000
        (group / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}" if quota else f"max {CPU_PERIOD_US}")
        (group / "pids.max").write_text(str(limits.pids))
        return group / "cgroup.procs"

    def _create_v1(self, name: str, limits: Limits) -> list[Path]:
        procs = []
        for controller in self.V1_CONTROLLERS:
            group = self.parents[controller] / name
            group.mkdir(parents=True, exist_ok=True)
            procs.append(group / "cgroup.procs")
        memory, cpu = self.parents["memory"] / name, self.parents["cpu"] / name
        (memory / "memory.limit_in_bytes").write_text(str(limits.memory_bytes) if limits.memory_bytes else "-1")
        (cpu / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
        quota = limits.cpu_milli * CPU_PERIOD_US // 1000
        (cpu / "cpu.cfs_quota_us").write_text(str(quota) if quota else "-1")
        (self.parents["pids"] / name / "pids.max").write_text(str(limits.pids))
        devices = self.parents["devices"] / name
        (devices / "devices.deny").write_text("a")  # default deny, then the allow list
        for rule in (*BASE_DEVICE_RULES, *limits.devices):
            (devices / "devices.allow").write_text(rule)
        return procs

    def device_rule(self, name: str, rule: str, *, allow: bool) -> bool:
        """One device rule (``"c 195:1 rwm"``) taken out of (``allow`` False: an open of it fails from now on,
        EPERM; a descriptor already open stays usable, ``WorkloadManager`` evicts its holder) or given back to
        (True: an elastic lease grew onto that GPU) the workload's v1 devices group at once. False where there is
        nothing to write it in (v2, no cgroups, or no group: no run is going)."""
        if self.version != "v1":
            return False
        try:
            (self.parents["devices"] / name / ("devices.allow" if allow else "devices.deny")).write_text(rule)
        except OSError:
            return False
        return True

    def resize(self, name: str, cpu_milli: int, memory_bytes: int) -> str:
        """A running workload's CPU and memory limits changed in place (an elastic lease's resize): v2
        ``cpu.max`` / ``memory.max``, v1 the CFS quota / ``memory.limit_in_bytes``. Returns "" when done, else
        what was refused (a memory limit under the group's current use: the kernel keeps the old one)."""
        quota = cpu_milli * CPU_PERIOD_US // 1000
        try:
            if self.version == "v2":
                group = self.root / CGROUP_PARENT / name
                (group / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}" if quota else f"max {CPU_PERIOD_US}")
            elif self.version == "v1":
                (self.parents["cpu"] / name / "cpu.cfs_quota_us").write_text(str(quota) if quota else "-1")
            else:
                return ""
        except OSError as error:
            return f"CPU limit not changed: {error.strerror}"
        try:
            if self.version == "v2":
                (self.root / CGROUP_PARENT / name / "memory.max").write_text(
                    str(memory_bytes) if memory_bytes else "max")
            else:
                (self.parents["memory"] / name / "memory.limit_in_bytes").write_text(
                    str(memory_bytes) if memory_bytes else "-1")
        except OSError as error:
            return f"memory limit not changed: {error.strerror}"
        return ""

    def groups(self, name: str) -> list[Path]:
        if self.version == "v2":
            return [self.root / CGROUP_PARENT / name]
        if self.version == "v1":
            return [self.parents[c] / name for c in self.V1_CONTROLLERS]
        return []

    def pids(self, name: str) -> set[int]:
        found: set[int] = set()
        for group in self.groups(name):
            with contextlib.suppress(OSError, ValueError):
                found |= {int(line) for line in (group / "cgroup.procs").read_text().split()}
        return found

    def remove(self, name: str) -> None:
        """The workload's groups, once empty (a group with a process left stays; the next run reuses it), and
        ``gpubroker`` too when it was the last (nothing is left in the agent's own group)."""
        for group in self.groups(name):
            with contextlib.suppress(OSError):
                group.rmdir()
                group.parent.rmdir()


# -- directories ----------------------------------------------------------------------------------
def owned_directory(base: Path, parts: list[str], uid: int, gid: int, *, chown_from: int = 0) -> Path:
    """``base/parts...`` exists, every component from ``parts[chown_from]`` on owned by ``uid`` (0700 when
    created). Walked with directory descriptors opened ``O_NOFOLLOW``: a symbolic link a workload put in its
    own directory makes this fail instead of leading the agent's root elsewhere."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(base, flags)
    try:
        for position, part in enumerate(parts):
            if part in ("", ".", "..") or "/" in part:
                raise IsolationError(f"bad path component {part!r} under {base}")
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
            try:
                child = os.open(part, flags, dir_fd=fd)
            except OSError as error:
                raise IsolationError(f"{base.joinpath(*parts[:position + 1])} is not a directory "
                                     f"({os.strerror(error.errno)})") from error
            os.close(fd)
            fd = child
            if position >= chown_from:
                info = os.fstat(fd)
                if (info.st_uid, info.st_gid) != (uid, gid):
                    os.fchown(fd, uid, gid)
    finally:
        os.close(fd)
    return base.joinpath(*parts)


# -- the node's own services, closed to workloads ---------------------------------------------------
TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
TCP_LISTEN = "0A"


def listening_ports(outside: tuple[int, int], tables: tuple[str, ...] = TCP_TABLES) -> list[int]:
    """TCP ports something listens on whose owner is not a workload uid (``outside`` is the workloads' uid
    range): the node's own services (a database, a broker, the agent itself, sshd)."""
    ports = set()
    for table in tables:
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 7 and fields[3] == TCP_LISTEN and not outside[0] <= int(fields[7]) <= outside[1]:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


class LocalServicesFirewall:
    """``workload_network = "closed-local"``: a workload may not open a TCP connection to a port the node's own
    services listen on, at any of the node's addresses (loopback included), unless the operator lists the port
    in ``workload_local_ports`` (say, the broker's, for profiling samples on a one-machine demo). Its own
    listeners and another machine's services stay reachable; a connection that came in (its ``PORT``) is
    answered. One iptables/ip6tables chain per uid range, jumped to from OUTPUT for those uids only
    (``-m owner``), refreshed before every run so a service started since is closed too. Unix sockets of the
    node's services (under ``/run``) are hidden by the run's private ``/run``."""

    def __init__(self, uids: tuple[int, int], allowed_ports=(), *, programs=("iptables", "ip6tables"),
                 tables: tuple[str, ...] = TCP_TABLES):
        self.uids = uids
        self.allowed = {int(p) for p in allowed_ports}
        self.programs = [p for p in programs if shutil.which(p)]
        if "iptables" not in self.programs:
            raise ValueError("workload_network closed-local needs iptables (apt-get install iptables)")
        self.tables = tables
        self.chain = f"GPUB-{uids[0]}-{uids[1]}"
        self.closed: list[int] = []

    def _run(self, program: str, *args: str, check: bool = True) -> bool:
        done = subprocess.run([program, "-w", "5", *args], capture_output=True, text=True, timeout=30,
                              check=False)
        if check and done.returncode:
            raise subprocess.SubprocessError(f"{program} {' '.join(args)}: {done.stderr.strip()}")
        return done.returncode == 0

    def refresh(self) -> list[int]:
        ports = [p for p in listening_ports(self.uids, self.tables) if p not in self.allowed]
        owner = ["-m", "owner", "--uid-owner", f"{self.uids[0]}-{self.uids[1]}", "-j", self.chain]
        for program in self.programs:
            if not self._run(program, "-N", self.chain, check=False):
                self._run(program, "-F", self.chain)
            self._run(program, "-A", self.chain, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED",
                      "-j", "RETURN")
            for port in ports:
                self._run(program, "-A", self.chain, "-p", "tcp", "-m", "addrtype", "--dst-type", "LOCAL",
                          "--dport", str(port), "-j", "REJECT", "--reject-with", "tcp-reset")
            if not self._run(program, "-C", "OUTPUT", *owner, check=False):
                self._run(program, "-I", "OUTPUT", "1", *owner)
        self.closed = ports
        return ports

    def remove(self) -> None:
        owner = ["-m", "owner", "--uid-owner", f"{self.uids[0]}-{self.uids[1]}", "-j", self.chain]
        for program in self.programs:
            while self._run(program, "-D", "OUTPUT", *owner, check=False):
                pass
            self._run(program, "-F", self.chain, check=False)
            self._run(program, "-X", self.chain, check=False)


# -- the isolation a manager applies --------------------------------------------------------------
@dataclass
class Isolation:
    """What the process runtime applies to each run (``mode`` ``"uid"``) or only reports (``"none"``)."""

    mode: str = "none"
    state_dir: Path = Path("var/agent")
    uids: tuple[int, int] = DEFAULT_UIDS
    device_dir: Path = Path("/dev")
    cgroups: Cgroups | None = None
    cpu_milli_per_gpu: int = 0
    memory_bytes_per_gpu: int = 0
    pids_max: int = PIDS_MAX
    # read-only in every run's view even where a directory above them is closed: the agent's Python (so a
    # workload may run the interpreter the node has) and what the operator adds (workload_shared_paths)
    shared_paths: list = field(default_factory=lambda: [Path(sys.prefix), Path(sys.base_prefix), AGENT_CODE])
    uid_map: UidMap | None = field(default=None, repr=False)
    # "closed-local": the node's own services are closed to workloads (LocalServicesFirewall, private /run)
    network: str = "node"
    local_ports: list = field(default_factory=list)  # ports of node services a workload may still reach
    firewall: LocalServicesFirewall | None = field(default=None, repr=False)

    def __post_init__(self):
        self.state_dir = Path(self.state_dir)
        self.device_dir = Path(self.device_dir)
        self.shared_paths = [Path(p) for p in self.shared_paths]
        if self.mode == "uid":
            self.state_dir.mkdir(parents=True, exist_ok=True)
            os.chmod(self.state_dir, 0o700)
            self.uid_map = self.uid_map or UidMap(self.state_dir, *self.uids)
            if self.cgroups is None:
                self.cgroups = Cgroups()
        if self.network not in NETWORKS:
            raise ValueError(f"workload_network must be one of {', '.join(NETWORKS)}, got {self.network!r}")
        if self.network == "closed-local":
            if self.mode != "uid":
                raise ValueError("workload_network closed-local needs isolation uid (workloads under their own "
                                 "uids are what the firewall tells apart)")
            self.firewall = self.firewall or LocalServicesFirewall(self.uids, self.local_ports)
            self.firewall.refresh()

    @property
    def enabled(self) -> bool:
        return self.mode == "uid"

    def describe(self) -> dict:
        """The node's isolation as its inventory reports it (``mode`` ``uid`` or ``none``)."""
        if not self.enabled:
            return {"mode": "none", "cgroup": "", "devices": "none"}
        version = self.cgroups.version if self.cgroups else ""
        return {"mode": "uid", "cgroup": version, "devices": "cgroup" if version == "v1" else "namespace",
                "uids": f"{self.uids[0]}-{self.uids[1]}", "network": self.network}

    @staticmethod
    def tenant_of(spec: dict) -> str:
        scope = spec.get("scope") or ""
        return scope.split("/")[0] if scope else "-"

    def uid_for(self, spec: dict) -> int:
        return self.uid_map.uid_for(self.tenant_of(spec))

    def host_limits(self, devices: list[dict], spec: dict | None = None) -> tuple[int, int]:
        """(milli-CPUs, memory bytes) of a run: what its lease asked for on this node (the spec's ``cpu_milli``
        and ``memory_mib``, each on its own), else the leased share of GPUs (a whole GPU 1; a share or a MIG
        instance the ``gpu_fraction`` the manager records, its milli or its memory of its GPU's, else its milli
        / its memory slots of 8) times the node's CPU and memory per GPU. 0: no limit (a node
        whose per-GPU figures are unknown). A limit is never under ``CPU_MILLI_MIN`` / ``MEMORY_BYTES_MIN``."""
        spec = spec or {}
        gpus = 0.0
        for device in devices:
            if device.get("gpu_fraction"):  # the manager's: a share's milli, a MIG instance's memory of its GPU's
                gpus += device["gpu_fraction"]
            elif device["kind"] == "share":
                gpus += device.get("milli", 1000) / 1000
            elif device["kind"] == "mig":
                gpus += device.get("slots", 1) / 8
            else:
                gpus += 1
        gpus = max(gpus, 1 / 8)
        cpu = int(spec.get("cpu_milli") or 0) or int(self.cpu_milli_per_gpu * gpus)
        memory = (int(spec.get("memory_mib") or 0) << 20) or int(self.memory_bytes_per_gpu * gpus)
        return (max(cpu, CPU_MILLI_MIN) if cpu else 0), (max(memory, MEMORY_BYTES_MIN) if memory else 0)

    def limits(self, devices: list[dict], spec: dict | None = None) -> Limits:
        """The run's limits from its lease (``host_limits``) and the leased GPUs' device nodes."""
        cpu_milli, memory_bytes = self.host_limits(devices, spec)
        rules = []
        for index in sorted({d["gpu_index"] for d in devices if d.get("gpu_index") is not None}):
            with contextlib.suppress(OSError):
                node = os.stat(self.device_dir / f"nvidia{index}")
                if stat.S_ISCHR(node.st_mode):
                    rules.append(f"c {os.major(node.st_rdev)}:{os.minor(node.st_rdev)} rwm")
        for name in ("nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools"):
            with contextlib.suppress(OSError):
                node = os.stat(self.device_dir / name)
                if stat.S_ISCHR(node.st_mode):
                    rules.append(f"c {os.major(node.st_rdev)}:{os.minor(node.st_rdev)} rwm")
        return Limits(cpu_milli=cpu_milli, memory_bytes=memory_bytes, pids=self.pids_max, devices=tuple(rules))

    def revoke_device(self, workload: dict, index: int, pids: set[int] = frozenset()) -> str:
        """A GPU the workload gave back (an elastic lease's shrink), taken from its running processes at once: on
        v1 its device node ``nvidia<index>`` is denied to the workload's devices cgroup; without a devices
        controller (v2, no cgroups) ``/dev/null`` is bound over the node in each mount namespace of ``pids`` (the
        run's processes) other than the agent's, as the launcher masks the GPUs not leased. Returns what was
        done (for the workload's event), or "" where nothing could be (isolation none, not a character device,
        no group, no namespace entered): there only the eviction of its holders applies. Either way a
        descriptor already open stays usable."""
        return self._device_access(workload, index, pids, allow=False)

    def grant_device(self, workload: dict, index: int, pids: set[int] = frozenset()) -> str:
        """A GPU the workload took (an elastic lease's growth), opened to its running processes at once: the
        inverse of ``revoke_device`` — on v1 its device node allowed in the workload's devices cgroup; without a
        devices controller the ``/dev/null`` bound over it (by the launcher, which masks every GPU not leased, or
        by a revoke) unmounted in each mount namespace of ``pids``. Returns what was done, "" where nothing was
        (then the workload reaches the GPU from its next run)."""
        return self._device_access(workload, index, pids, allow=True)

    def _device_access(self, workload: dict, index: int, pids, *, allow: bool) -> str:
        """``revoke_device`` (``allow`` False) and ``grant_device`` (True): one GPU's device node changed for the
        running workload, in its v1 devices cgroup or in the mount namespaces of ``pids``."""
        if not self.enabled:
            return ""
        path = self.device_dir / f"nvidia{index}"
        try:
            node = os.stat(path)
        except OSError:
            return ""
        if not stat.S_ISCHR(node.st_mode):
            return ""
        if self.cgroups is not None and self.cgroups.restricts_devices:
            rule = f"c {os.major(node.st_rdev)}:{os.minor(node.st_rdev)} rwm"
            done = self.cgroups.device_rule(self.cgroup_name(workload), rule, allow=allow)
            return (f"{'allowed in' if allow else 'denied to'} its cgroup ({rule})") if done else ""
        changed = mask_in_namespaces(pids, path, unmask=allow)
        where = "its mount namespace" if changed == 1 else f"its {changed} mount namespaces"
        return (f"unmasked in {where}" if allow else f"masked with /dev/null in {where}") if changed else ""

    def masked_devices(self, devices: list[dict]) -> list[str]:
        """The GPU device nodes a run must not reach (every ``nvidia<N>`` of ``device_dir`` not leased)."""
        leased = {f"nvidia{d['gpu_index']}" for d in devices if d.get("gpu_index") is not None}
        try:
            names = sorted(os.listdir(self.device_dir))
        except OSError:
            return []
        return [str(self.device_dir / n) for n in names if n.startswith("nvidia") and n[6:].isdigit()
                and n not in leased]

    def prepare(self, workload: dict, home: Path, roots: list[Path]) -> dict:
        """Before a run: the uid's directories and the run's cgroup. Returns what ``launcher_argv`` needs."""
        spec = workload["spec"]
        uid = self.uid_for(spec)
        owned_directory(home.parent, [home.name], uid, uid)
        scope = [p for p in (spec.get("scope") or "").split("/") if p]
        exposed = [os.path.realpath(home)]  # canonical: the launcher checks it opened exactly these
        for root in roots if scope else []:  # the tenant's project directory under each root is its own
            with contextlib.suppress(OSError):
                if root.is_dir():
                    exposed.append(os.path.realpath(owned_directory(root, scope, uid, uid)))
        for name in ("workdir", "checkpoint_dir"):
            path = Path(spec.get(name) or "")
            if not spec.get(name):
                continue
            root = next((r for r in roots if path.is_relative_to(r)), None)
            if root is None:
                raise IsolationError(f"{name} {str(path)!r} is outside the workload roots", field=name)
            try:  # a root itself (a node operator's unscoped call) is shown as it is, never handed to a user
                if path != root:
                    owned_directory(root, list(path.relative_to(root).parts), uid, uid)
            except (IsolationError, OSError) as error:
                raise IsolationError(f"{name} {str(path)!r}: {error}", field=name) from error
            exposed.append(os.path.realpath(path))
        exposed = list(dict.fromkeys(exposed))
        cgroup = self.cgroup_name(workload)
        try:
            procs = self.cgroups.create(cgroup, self.limits(workload["devices"], spec)) if self.cgroups else []
        except OSError as error:
            raise IsolationError(f"cannot make the workload's cgroup under {self.cgroups.root}: {error}") from error
        masks = [] if self.cgroups and self.cgroups.restricts_devices else self.masked_devices(workload["devices"])
        if self.firewall is not None:  # services started since the last run are closed too
            try:
                self.firewall.refresh()
            except (OSError, subprocess.SubprocessError) as error:
                raise IsolationError(f"cannot close the node's services to the workload: {error}") from error
        return {"uid": uid, "gid": uid, "procs": [str(p) for p in procs], "exposed": exposed, "masks": masks,
                "private_run": self.firewall is not None,
                "shared": [str(p) for p in dict.fromkeys([*self.shared_paths, self.device_dir]) if p.exists()],
                "cwd": spec.get("workdir") or str(home)}

    @staticmethod
    def cgroup_name(workload: dict) -> str:
        return workload["workload_id"].replace(":", "_")

    def release(self, workload: dict) -> None:
        if self.enabled and self.cgroups:
            self.cgroups.remove(self.cgroup_name(workload))

    @staticmethod
    def launcher_argv(plan: dict) -> list[str]:
        argv = [sys.executable, "-I", str(LAUNCHER), "--uid", str(plan["uid"]), "--gid", str(plan["gid"]),
                "--cwd", plan["cwd"], "--private-tmp", "--hide-proc"]
        for path in plan["procs"]:
            argv += ["--cgroup-procs", path]
        for path in plan["exposed"]:
            argv += ["--expose", path]
        for path in plan.get("shared", []):
            argv += ["--share", path]
        for path in plan["masks"]:
            argv += ["--mask-device", path]
        if plan.get("private_run"):
            argv.append("--private-run")
        return [*argv, "--"]


def mask_in_namespaces(pids, path: Path, *, unmask: bool = False) -> int:
    """``/dev/null`` bound over ``path`` in the mount namespace of each of ``pids`` that is not the agent's own
    (each namespace once), by this file run as ``--mask-in-namespace FD PATH`` (``setns`` needs a single-threaded
    process; the agent has threads); ``unmask``: the masks over ``path`` unmounted instead
    (``--unmask-in-namespace``). The namespace is held by a descriptor opened while the pid was checked to
    be the same process (start time before and after), so a pid reused meanwhile is never entered. Returns how
    many namespaces were changed."""
    try:
        own = os.stat("/proc/self/ns/mnt").st_ino
    except OSError:
        return 0
    handles: dict[int, int] = {}
    masked = 0
    try:
        for pid in sorted(pids):
            before = _start_time(pid)
            try:
                handle = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            inode = os.fstat(handle).st_ino
            if before is None or _start_time(pid) != before or inode == own or inode in handles:
                os.close(handle)
                continue
            handles[inode] = handle
        for handle in handles.values():
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                verb = "--unmask-in-namespace" if unmask else "--mask-in-namespace"
                done = subprocess.run([sys.executable, "-I", str(LAUNCHER), verb, str(handle), str(path)],
                                      pass_fds=(handle,), capture_output=True, timeout=10, check=False)
                masked += done.returncode == 0
    finally:
        for handle in handles.values():
            os.close(handle)
    return masked


def _start_time(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()[19]


# -- the launcher (runs as root in the shim's child, then becomes the workload) ---------------------
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
PR_SET_NO_NEW_PRIVS = 38


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def _mount(libc, source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(libc.mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None,
                      ctypes.c_ulong(flags), data.encode() if data else None), f"mount {target}")


def traversable(path: Path, uid: int, gid: int) -> bool:
    """Whether ``uid``/``gid`` (no supplementary groups) may search the directory ``path``."""
    info = os.stat(path)
    if info.st_uid == uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid == gid:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def blocking_ancestor(path: Path, uid: int, gid: int) -> Path | None:
    """The topmost directory above ``path`` that ``uid`` cannot search (None: the path is reachable)."""
    for ancestor in reversed(path.parents):  # "/" first
        if not traversable(ancestor, uid, gid):
            return ancestor
    return None


def plan_masks(exposed: list[Path], uid: int, gid: int, private_tmp: bool, private_run: bool = False) -> list[Path]:
    """The directories to replace with an empty one in the run's view: the private temporary directories (and
    ``/run`` with ``private_run``) and the topmost unsearchable directory above each exposed one, none inside
    another."""
    masks = [Path(p) for p in PRIVATE_TMP if private_tmp and os.path.isdir(p)]
    if private_run and os.path.isdir(PRIVATE_RUN) and not os.path.islink(PRIVATE_RUN):
        masks.append(Path(PRIVATE_RUN))
    for path in exposed:
        blocker = blocking_ancestor(path, uid, gid)
        if blocker is not None and not any(blocker == m or blocker.is_relative_to(m) for m in masks):
            masks = [m for m in masks if not m.is_relative_to(blocker)] + [blocker]
    return masks


def launch(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="isolation.py")
    parser.add_argument("--uid", type=int, required=True)
    parser.add_argument("--gid", type=int, required=True)
    parser.add_argument("--cgroup-procs", action="append", default=[])
    parser.add_argument("--expose", action="append", default=[])
    parser.add_argument("--share", action="append", default=[])
    parser.add_argument("--mask-device", action="append", default=[])
    parser.add_argument("--private-tmp", action="store_true")
    parser.add_argument("--private-run", action="store_true")
    parser.add_argument("--hide-proc", action="store_true")
    parser.add_argument("--cwd", default="/")
    parser.add_argument("command", nargs="+")
    args = parser.parse_args(argv)
    if args.uid == 0 or args.gid == 0:
        raise SystemExit("isolation.py: refusing to run a workload as root")
    for procs in args.cgroup_procs:
        Path(procs).write_text(str(os.getpid()))
    libc = _libc()
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(libc, "", "/", None, MS_REC | MS_PRIVATE)
    exposed = [Path(p) for p in args.expose]
    shared = [Path(p) for p in args.share]
    handles = {path: os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for path in exposed + shared}
    for path in exposed:  # the directory itself, not where a link its tenant swapped in since would lead
        if os.readlink(f"/proc/self/fd/{handles[path]}") != str(path):
            raise SystemExit(f"isolation.py: {path} leads elsewhere through a symbolic link; not started")
    masks = plan_masks(exposed + shared, args.uid, args.gid, args.private_tmp, args.private_run)
    for mask in masks:
        mode = "1777" if str(mask) in PRIVATE_TMP else "0755" if str(mask) == PRIVATE_RUN else "0711"
        _mount(libc, "tmpfs", str(mask), "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode},size=64m")
    for path, handle in handles.items():
        if any(path.is_relative_to(m) and path != m for m in masks):
            for parent in reversed(path.parents):  # the path down to it, searchable only
                if any(parent.is_relative_to(m) and parent != m for m in masks) and not parent.exists():
                    os.mkdir(parent, 0o711)
            path.mkdir(mode=0o700, exist_ok=True)
            _mount(libc, f"/proc/self/fd/{handle}", str(path), None, MS_BIND | MS_REC)
            if path in shared and path not in exposed:
                _mount(libc, "", str(path), None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
        os.close(handle)
    for device in args.mask_device:
        _mount(libc, "/dev/null", device, None, MS_BIND)
    if args.hide_proc:
        try:
            _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible")
        except OSError:
            _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    os.setgroups([])
    os.setresgid(args.gid, args.gid, args.gid)
    os.setresuid(args.uid, args.uid, args.uid)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    os.umask(0o077)
    os.chdir(args.cwd)
    try:
        os.execvp(args.command[0], args.command)  # noqa: S606 - the workload itself, as its user
    except OSError as error:
        sys.stderr.write(f"isolation.py: cannot run {args.command[0]!r}: {error.strerror}\n")
        raise SystemExit(127 if error.errno == errno.ENOENT else 126) from None


def mask_in_namespace(argv: list[str]) -> None:
    """``--mask-in-namespace FD PATH``: enter the mount namespace FD (inherited from the agent) and bind
    ``/dev/null`` over PATH there (``mask_in_namespaces``)."""
    handle, path = int(argv[0]), argv[1]
    libc = _libc()
    _check(libc.setns(handle, CLONE_NEWNS), "setns(CLONE_NEWNS)")
    _mount(libc, "/dev/null", path, None, MS_BIND)


MNT_DETACH = 2


def unmask_in_namespace(argv: list[str]) -> None:
    """``--unmask-in-namespace FD PATH``: enter the mount namespace FD and unmount every ``/dev/null`` bound over
    PATH there (the launcher's mask of a GPU not leased, a revoke's), so PATH is the device node again. Exit 1
    when PATH was not masked there."""
    handle, path = int(argv[0]), argv[1]
    libc = _libc()
    _check(libc.setns(handle, CLONE_NEWNS), "setns(CLONE_NEWNS)")
    null = os.stat("/dev/null").st_rdev
    undone = 0
    for _ in range(8):  # a mask per revoke, and the launcher's: never more than a few
        try:
            if os.stat(path).st_rdev != null:
                break
        except OSError:
            break
        _check(libc.umount2(path.encode(), MNT_DETACH), f"umount {path}")
        undone += 1
    raise SystemExit(0 if undone else 1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--mask-in-namespace"]:
        mask_in_namespace(sys.argv[2:])
    elif sys.argv[1:2] == ["--unmask-in-namespace"]:
        unmask_in_namespace(sys.argv[2:])
    else:
        launch(sys.argv[1:])
