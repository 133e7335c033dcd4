"""Workloads on leases: the node runs the tenant's job on exactly the leased devices (docs/agent-protocol.md,
"Workloads").

A workload names the instances it runs on (allocation ids of this node) and what to run: a command (the
process runtime) or an image (a container runtime), arguments, environment, secret environment
(``secret_env``: in the workload's environment like ``env``, but kept in a 0600 file beside its logs, never in
the state file, an answer or a log line, which show its names only), working directory, checkpoint
directory (under ``<root>/<scope>`` when the broker gives the workload's ``scope``, ``<tenant>/<project>``, and
with symbolic links resolved), restart policy and, for interactive leases, a port. The agent

- starts it through a **runtime** (``ProcessRuntime``: a plain process, used by the simulated fleet so
  that everything runs here for real, as its tenant's own user in its own cgroup and mount namespace when
  the manager's ``isolation`` is ``uid``, ``agent.isolation``; ``ContainerRuntime``: ``docker run`` /
  ``podman run`` with the NVIDIA container toolkit's CDI device names) in its own session and process group
  (``start_new_session``), every run wrapped by ``agent/shim.py``, which writes the run's exit status to a
  file and captures stdout and stderr into bounded logs under ``STATE_DIR/workloads/<id>/`` (at most
  ``log_max_bytes`` per stream, the newest bytes kept: ``agent.shim.BoundedLog``);
- gives it exactly the leased devices: ``CUDA_VISIBLE_DEVICES`` with the instances' device UUIDs (MIG
  device UUIDs for MIG instances), and for shares ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``; ``CHECKPOINT_DIR``, ``RESTART_COUNT``, ``GPUB_WORKLOAD_ID``,
  ``GPUB_DEADLINE_FILE`` (and ``GPUB_PREEMPT_DEADLINE`` when a notice is already there), ``PORT``;
- at a preemption notice writes the deadline (unix seconds) into ``GPUB_DEADLINE_FILE`` and sends
  SIGTERM to the process group; at the deadline SIGKILL (and to whatever is left in an isolated run's
  cgroup). A stop does the same with its grace period, its kill time in the deadline file;
- at an elastic lease's shrink (``shrink``) tells the workload its new size (units file, SIGUSR1), takes the
  device given back from it at once (isolated: v1 ``devices.deny``, else ``/dev/null`` bound over it in its mount
  namespace) and SIGKILLs, after ``shrink_grace_seconds``, each of its processes still holding that device
  (``_revoke``, ``_evict_due``);
- restarts a failed run (policy ``on-failure``) with exponential back-off, up to ``max_restarts``;
- keeps every workload in ``STATE_DIR/workloads.json`` (temp file, fsync, rename) before answering, so
  after ``kill -9`` and a restart it finds each one: still running (its pid and the process start time
  from ``/proc``, or, for a run whose pid was not yet saved, the run token in the process environment),
  or exited with the status the shim wrote. A run is never started twice.

Every change appends an event (``seq`` numbered) to the workload; the agent reports workloads with
events the broker has not acknowledged (``agent.daemon.BrokerLink``).

Not Django; standard library only. The manager is not thread-safe: the server calls it under the node's
lock, as it does the backend.
"""

from __future__ import annotations

import abc
import contextlib
import json
import logging
import os
import re
import secrets
import shlex
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from agent.isolation import Isolation, IsolationError, mask_in_namespaces
from agent.protocol import WORKLOAD_ID, Conflict, InvalidRequest, NotFound
from agent.shim import log_read

logger = logging.getLogger("agent.workloads")

MAX_EVENTS = 200
MAX_LOG_READ = 256 * 1024
LOG_MAX_BYTES = 16 * 1024 * 1024  # per stream of a workload (all its runs): the default of workload_log_max_bytes
STATE_FILE = "workloads.json"
ACTIVE = ("running", "backoff")
FINAL = ("succeeded", "failed", "stopped", "preempted")
SECRET_FILE = "secret_env.json"  # the workload's secret values, beside its logs (0600), never in workloads.json
SHIM = Path(__file__).with_name("shim.py")
BASE_ENV = ("PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "TZ")
PROCESS_ENV = ("LD_LIBRARY_PATH",)  # a plain process also keeps the node's library path (CUDA's libraries)
HOME_DIR = "home"  # an isolated workload's own directory, owned by its uid: its HOME and its deadline file
ENGINE_ENV_PREFIXES = ("DOCKER_", "CONTAINER_", "CONTAINERS_", "PODMAN_")
SHRINK_GRACE = 10.0  # a device given back (shrink): a process of the workload still holding it is killed after this


def device_env(instances: list[dict]) -> dict[str, str]:
    """The environment that makes exactly these instances visible (device UUIDs in order) and, for shares,
    applies their MPS limits (docs/agent-protocol.md)."""
    devices = [i["access"]["CUDA_VISIBLE_DEVICES"] for i in instances]
    env = {"CUDA_VISIBLE_DEVICES": ",".join(devices)}
    shares = [(n, i) for n, i in enumerate(instances) if i.get("kind") == "share"]
    if shares:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(min(
            int(i["access"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) for _, i in shares))
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{n}={i['memory_mib']}M" for n, i in shares)
        pipes = [i["access"]["CUDA_MPS_PIPE_DIRECTORY"] for _, i in shares if "CUDA_MPS_PIPE_DIRECTORY" in i["access"]]
        if pipes:  # the share's GPU's MPS control daemon (agent.mps), which enforces the limits
            env["CUDA_MPS_PIPE_DIRECTORY"] = pipes[0]
    return env


def cpus_flag(milli: int) -> str:
    """Milli-CPUs as the engines' ``--cpus`` decimal, exactly: 500 → ``0.5``, 2000 → ``2``, 1250 → ``1.25``."""
    whole, part = divmod(int(milli), 1000)
    return f"{whole}.{part:03d}".rstrip("0").rstrip(".")


def memory_flag(memory_bytes: int) -> str:
    """Bytes as the engines' ``--memory`` (Docker's and Podman's units: ``m`` MiB, ``b`` bytes)."""
    return f"{memory_bytes >> 20}m" if memory_bytes % (1 << 20) == 0 else f"{memory_bytes}b"


# -- runtimes -------------------------------------------------------------------------------------
class Runtime(abc.ABC):
    """How a workload run is started and ended. ``argv`` is the command line it runs (tests check it);
    ``spawn`` starts it through the shim in a new session; ``kill`` ends what the process group's SIGKILL
    does not reach (a container)."""

    name = ""

    @abc.abstractmethod
    def argv(self, workload: dict, env: dict[str, str], directory: Path) -> list[str]:
        """The command line of one run (without the shim)."""

    def process_env(self, env: dict[str, str]) -> dict[str, str]:
        """The environment of the process the agent starts (the workload's own for a plain process)."""
        return env

    def spawn(self, workload: dict, env: dict[str, str], directory: Path, exit_file: Path, *,
              log_max_bytes: int = LOG_MAX_BYTES, banner: str = "", launcher: list[str] | None = None
              ) -> subprocess.Popen:
        # ``launcher``: what runs the command as the workload's own user (agent.isolation), process runtime only
        argv = [*(launcher or []), *self.argv(workload, env, directory)]
        spec = workload["spec"]
        with open(directory / "shim.err", "ab") as err:  # the shim's own trouble; the run's output is in the logs
            return subprocess.Popen(
                [sys.executable, "-I", str(SHIM), str(exit_file), "--log-dir", str(directory),
                 "--log-max-bytes", str(log_max_bytes), "--banner", banner, "--", *argv],
                cwd=spec["workdir"] or directory, env=self.process_env(env), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True, close_fds=True)

    def kill(self, workload: dict) -> None:  # noqa: B027 - optional hook
        """Besides SIGKILL to the process group: end what it does not reach."""

    def pids(self, workload: dict) -> set[int]:
        """The run's processes the process group and session do not hold (a container's, which its engine
        started): none for a plain process."""
        return set()

    def update_limits(self, workload: dict, cpu_milli: int, memory_bytes: int) -> str:
        """The running run's CPU and memory limits changed where its own cgroup is not the agent's to write (a
        container's, through its engine); "" when there is nothing to do, else what was done or refused."""
        return ""


class ProcessRuntime(Runtime):
    """The workload's command as a plain process: as its tenant's own unprivileged user, in its own cgroup and
    file-system view, when the manager's isolation is ``uid`` (``agent.isolation``); as the agent's user
    only with ``isolation = "none"`` (a trusted node; an agent that is not root)."""

    name = "process"

    def argv(self, workload: dict, env: dict[str, str], directory: Path) -> list[str]:
        spec = workload["spec"]
        if spec["image"]:
            raise InvalidRequest("this node runs plain processes (runtime 'process'): give a command, not an image",
                                 field="image")
        return [*spec["command"], *spec["args"]]


class ContainerRuntime(Runtime):
    """``docker run`` / ``podman run`` with the NVIDIA container toolkit's CDI device names: one ``--device
    nvidia.com/gpu=<UUID>`` per leased device — the GPU UUID for a whole GPU or a share, the MIG device UUID
    for a MIG instance (names from ``nvidia-ctk cdi generate``, which lists each device by index and by
    UUID; docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/cdi-support.html). An instance
    without a device UUID is refused (``InvalidRequest`` on ``instances[i]``): ``nvidia.com/gpu=`` names no
    device, and an index would name whichever GPU holds it after a reboot. The environment goes through an
    env file (0600, never argv: ``ps`` shows argv to every user). A share adds ``--ipc=host`` and its GPU's
    MPS pipe directory (``CUDA_MPS_PIPE_DIRECTORY`` of the workload's environment when the agent runs that
    GPU's MPS control daemon, ``agent.mps``; else ``mps_pipe_directory``), as MPS clients need. The
    checkpoint and working directories are mounted at the same paths. The workload's host limits (the
    manager's ``workload["limits"]``: the lease's CPU and memory ask on this node, else the node's share per
    leased GPU, ``Isolation.host_limits``) become ``--cpus`` and ``--memory``. The engine CLI stays attached
    (``--sig-proxy`` is its default), so the SIGTERM at a notice reaches the container's process; the
    SIGKILL at the deadline also runs ``ENGINE kill`` on the container, which the CLI's death alone does not
    stop.

    ``cdi_devices=False`` leaves the ``--device`` flags out: only for an engine with no GPU and no CDI
    specification (the container engine test on a machine without a GPU, ``--container-devices none``); the
    UUIDs are still required and still reach the workload in ``CUDA_VISIBLE_DEVICES``."""

    def __init__(self, engine: str = "docker", *, mps_pipe_directory: str = "/tmp/nvidia-mps",  # noqa: S108
                 cdi_devices: bool = True):
        if engine not in ("docker", "podman"):
            raise ValueError(f"container engine must be docker or podman, got {engine!r}")
        self.engine = engine
        self.name = engine
        self.mps_pipe_directory = mps_pipe_directory
        self.cdi_devices = cdi_devices

    @staticmethod
    def container_name(workload: dict) -> str:
        return "gpub-" + re.sub(r"[^A-Za-z0-9_.-]", "-", workload["workload_id"])

    @staticmethod
    def cdi_device(position: int, device: dict) -> str:
        """The CDI name of one leased device: ``nvidia.com/gpu=<GPU or MIG UUID>``; refused without a UUID."""
        uuid = device.get("device_uuid") or ""
        if not re.fullmatch(r"(GPU|MIG)-[0-9A-Za-z/-]+", uuid):  # MIG-GPU-<uuid>/<gi>/<ci> on old drivers
            raise InvalidRequest(
                f"instance {device.get('allocation_id')!r} has no device UUID (got {uuid!r}): the container "
                "runtime names each device by its UUID (nvidia.com/gpu=<UUID>) and will not start a container "
                "on an unnamed device", field=f"instances[{position}]")
        return f"nvidia.com/gpu={uuid}"

    def argv(self, workload: dict, env: dict[str, str], directory: Path) -> list[str]:
        spec = workload["spec"]
        if not spec["image"]:
            raise InvalidRequest(f"this node runs containers (runtime {self.engine!r}): give an image", field="image")
        devices = [self.cdi_device(n, d) for n, d in enumerate(workload["devices"])]  # refusals before any file
        env_file = directory / "container.env"
        descriptor = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.writelines(f"{key}={value}\n" for key, value in sorted(env.items()) if "\n" not in value)
        argv = [self.engine, "run", "--rm", "--name", self.container_name(workload), "--init",
                "--label", f"dev.gpubroker.workload={workload['workload_id']}", "--env-file", str(env_file)]
        if self.cdi_devices:
            for device in devices:
                argv += ["--device", device]
        limits = workload.get("limits") or {}
        if limits.get("cpu_milli"):
            argv.append(f"--cpus={cpus_flag(limits['cpu_milli'])}")
        if limits.get("memory_bytes"):
            argv.append(f"--memory={memory_flag(limits['memory_bytes'])}")
        if any(d["kind"] == "share" for d in workload["devices"]):
            pipe = env.get("CUDA_MPS_PIPE_DIRECTORY") or self.mps_pipe_directory
            argv += ["--ipc=host", "-v", f"{pipe}:{pipe}", "-e", f"CUDA_MPS_PIPE_DIRECTORY={pipe}"]
        mounts = [str(directory)] + [p for p in (spec["checkpoint_dir"], spec["workdir"]) if p]
        for path in dict.fromkeys(mounts):
            argv += ["-v", f"{path}:{path}"]
        if spec["workdir"]:
            argv += ["-w", spec["workdir"]]
        if spec["port"]:  # the node's port (allocated by the broker) to the container's, on the node's loopback only:
            # the broker reaches it through the agent's signed relay (/v1/workloads/{id}/port/...), nobody else
            argv += ["-p", f"127.0.0.1:{spec.get('host_port') or spec['port']}:{spec['port']}"]
        if spec["command"]:  # the image's entrypoint replaced: the command's program, its arguments after the image
            argv += ["--entrypoint", spec["command"][0]]
        return [*argv, spec["image"], *spec["command"][1:], *spec["args"]]

    def process_env(self, env: dict[str, str]) -> dict[str, str]:
        # the engine CLI's own environment (where its daemon or socket is), never the agent's secrets; the
        # job's environment is in the env file
        return {key: value for key, value in os.environ.items()
                if key in BASE_ENV or key == "XDG_RUNTIME_DIR" or key.startswith(ENGINE_ENV_PREFIXES)}

    def kill(self, workload: dict) -> None:
        # SIGKILL to the run's process group also ends the engine's client (`run --rm`), which would have removed
        # the container: remove it here too (force: whatever state it is in; a missing one is no error)
        for argv in ([self.engine, "kill", "--signal", "KILL", self.container_name(workload)],
                     [self.engine, "rm", "--force", self.container_name(workload)]):
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=30, check=False)


    def _engine(self, *args: str) -> subprocess.CompletedProcess | None:
        try:
            return subprocess.run([self.engine, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=30, check=False, env=self.process_env({}))
        except (OSError, subprocess.TimeoutExpired):
            return None

    def pids(self, workload: dict) -> set[int]:
        """The container's processes, as the host sees them: its first process (``ENGINE inspect``
        ``{{.State.Pid}}``, the ``--init`` process) and every descendant of it. Empty when the engine knows no
        such running container."""
        done = self._engine("inspect", "--format", "{{.State.Pid}}", self.container_name(workload))
        try:
            first = int(done.stdout.strip()) if done is not None and done.returncode == 0 else 0
        except ValueError:
            first = 0
        return descendants(first) if first > 0 else set()

    def update_limits(self, workload: dict, cpu_milli: int, memory_bytes: int) -> str:
        """``ENGINE update --cpus --memory`` on the running container (a shrink or a growth of its lease)."""
        argv = ["update", f"--cpus={cpus_flag(cpu_milli)}"] if cpu_milli else ["update"]
        if memory_bytes:
            argv.append(f"--memory={memory_flag(memory_bytes)}")
        if len(argv) == 1:
            return ""
        done = self._engine(*argv, self.container_name(workload))
        if done is None:
            return f"`{self.engine} update` could not run"
        if done.returncode != 0:
            return f"`{self.engine} update` refused: {(done.stderr or done.stdout).strip()[-300:]}"
        return f"{self.engine} update"


def build_runtime(name: str) -> Runtime:
    if name == "process":
        return ProcessRuntime()
    if name in ("docker", "podman"):
        return ContainerRuntime(name)
    raise ValueError(f"workload runtime must be process, docker or podman, got {name!r}")


# -- processes ------------------------------------------------------------------------------------
def process_start_ticks(pid: int) -> tuple[int, str] | None:
    """(start time in clock ticks since boot, state letter) of a process, or None when there is none."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return int(fields[19]), fields[0]


def find_by_token(token: str) -> int | None:
    """The pid of a live process whose environment holds ``GPUB_RUN_TOKEN=token`` (a run started just before
    the agent died, its pid not yet saved)."""
    needle = f"GPUB_RUN_TOKEN={token}\0".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ and (ticks := process_start_ticks(int(entry.name))) and ticks[1] != "Z":
            return int(entry.name)
    return None


def _signal_group(pid: int, signum: int) -> bool:
    try:
        os.killpg(pid, signum)  # the run's session leader is the shim: its pid is the group id
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _live_processes():
    """(pid, ppid, process group, session) of every process that is not a zombie, from ``/proc/<pid>/stat``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()  # state, ppid, pgrp, session, ...
        if fields[0] != "Z":
            yield int(entry.name), int(fields[1]), int(fields[2]), int(fields[3])


def session_members(leader: int) -> set[int]:
    """Every live process in the process group or the session ``leader`` leads (a run's shim leads both)."""
    return {pid for pid, _ppid, group, session in _live_processes() if leader in (group, session)}


def descendants(root: int) -> set[int]:
    """``root`` and every live process below it (by parent pid)."""
    children: dict[int, list[int]] = {}
    for pid, ppid, _group, _session in _live_processes():
        children.setdefault(ppid, []).append(pid)
    if not Path(f"/proc/{root}").exists():
        return set()
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def device_identity(path: Path) -> tuple | None:
    """What an open descriptor of ``path`` looks like to ``stat``: a character device by its number (whatever
    path a process's own view gives it), anything else (a test's stand-in file) by its inode. None: no such node."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    if stat.S_ISCHR(info.st_mode):
        return ("c", info.st_rdev)
    return ("f", info.st_dev, info.st_ino)


def holds_device(pid: int, identity: tuple, path: Path) -> str:
    """How process ``pid`` holds the device: ``"open"`` (a descriptor in ``/proc/<pid>/fd``), ``"mapped"`` (a
    mapping of it in ``/proc/<pid>/maps``, which outlives the descriptor), or "" (not at all, or gone)."""
    directory = f"/proc/{pid}/fd"
    try:
        descriptors = os.listdir(directory)
    except OSError:
        return ""
    for descriptor in descriptors:
        try:
            info = os.stat(f"{directory}/{descriptor}")  # follows the magic link to the file the descriptor is
        except OSError:
            continue
        if identity[0] == "c" and stat.S_ISCHR(info.st_mode) and info.st_rdev == identity[1]:
            return "open"
        if identity[0] == "f" and (info.st_dev, info.st_ino) == identity[1:]:
            return "open"
    try:
        with open(f"/proc/{pid}/maps") as maps:
            if any(line.rstrip("\n").endswith(f" {path}") for line in maps):
                return "mapped"
    except OSError:
        pass
    return ""


def _kill_holder(pid: int, identity: tuple | None, path: Path, nvml: set[int]) -> str:
    """SIGKILL to ``pid`` if it still holds the device (looked at again through a pidfd, so a pid reused since
    the scan is never signalled). Returns how it held it, or "" when it did not (any more)."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return ""
    except OSError:  # no pidfd (an old kernel): the scan's answer and the pid as they are
        handle = None
    try:
        how = (holds_device(pid, identity, path) if identity else "") or ("NVML" if pid in nvml else "")
        if how:
            if handle is not None:
                signal.pidfd_send_signal(handle, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        return how
    except (ProcessLookupError, PermissionError):
        return ""
    finally:
        if handle is not None:
            os.close(handle)


# -- the manager ----------------------------------------------------------------------------------
class WorkloadManager:
    def __init__(self, state_dir: Path, runtime: Runtime | None = None, *, roots: list[Path] | None = None,
                 backoff_seconds: float = 1.0, backoff_cap: float = 60.0, log_max_bytes: int = LOG_MAX_BYTES,
                 clock=time.time, isolation: Isolation | None = None, shrink_grace_seconds: float = SHRINK_GRACE):
        self.state_dir = Path(state_dir)
        # a plain process runs as its tenant's user with isolation "uid" (agent.isolation); "none" is reported
        self.isolation = isolation or Isolation(mode="none", state_dir=self.state_dir)
        # GPU uuid -> its inventory entry (index, memory_mib): set by the daemon, for device nodes and limits
        self.gpu_lookup = None
        # GPU uuid -> pids of its compute processes (NVML; the nvml backend's ``compute_pids``): set by the daemon
        self.gpu_processes = None
        self.shrink_grace_seconds = shrink_grace_seconds  # a device given back: its holders are killed after this
        self.directory = self.state_dir / "workloads"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.runtime = runtime or ProcessRuntime()
        self.roots = [Path(r) for r in roots] if roots else [self.state_dir / "work"]
        self.backoff_seconds = backoff_seconds
        self.backoff_cap = backoff_cap
        self.log_max_bytes = log_max_bytes
        self.clock = clock
        self._children: dict[int, subprocess.Popen] = {}
        path = self.state_dir / STATE_FILE
        self.workloads: dict[str, dict] = json.loads(path.read_text())["workloads"] if path.exists() else {}
        self._adopt()

    # -- persistence --------------------------------------------------------------------------------
    def _save(self) -> None:
        path = self.state_dir / STATE_FILE
        temporary = path.with_suffix(".tmp")
        with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
            json.dump({"version": 1, "workloads": self.workloads}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)

    def _adopt(self) -> None:
        """After a restart: every run the file says is going is found again (by pid and start time, or by its
        token) or has ended; a run whose process never came up is started now (once)."""
        changed = False
        for workload in self.workloads.values():
            if workload["state"] != "running":
                continue
            run = workload["runs"][-1]
            if run.get("pid") is None:
                pid = find_by_token(run["token"])
                if pid is not None:
                    run["pid"], run["start_ticks"] = pid, process_start_ticks(pid)[0]
                    logger.info("adopted workload %s: run %s found by its token, pid %s", workload["workload_id"],
                                run["run"], pid)
                    changed = True
                elif not self._exit_file(workload, run).exists():
                    workload["runs"].pop()  # it never started: start it now, as the same run
                    logger.info("adopted workload %s: run %s never started; starting it now",
                                workload["workload_id"], run["run"])
                    self._spawn(workload, self.clock())
                    changed = True
                else:
                    logger.info("adopted workload %s: run %s ended while the agent was away",
                                workload["workload_id"], run["run"])
            elif (ticks := process_start_ticks(run["pid"])) and ticks[0] == run["start_ticks"] and ticks[1] != "Z":
                logger.info("adopted workload %s: run %s still running, pid %s", workload["workload_id"],
                            run["run"], run["pid"])
            else:
                logger.info("adopted workload %s: run %s (pid %s) ended while the agent was away",
                            workload["workload_id"], run["run"], run["pid"])
        if changed:
            self._save()

    # -- reading ------------------------------------------------------------------------------------
    def get(self, workload_id: str) -> dict:
        workload = self.workloads.get(workload_id)
        if workload is None:
            raise NotFound(f"no workload {workload_id!r} on this node", field="workload_id")
        return workload

    def status(self, workload_id: str) -> dict:
        return self._public(self.get(workload_id))

    def all(self) -> list[dict]:
        return [self._public(w) for w in self.workloads.values()]

    def _public(self, workload: dict) -> dict:
        sizes = {stream: log_read(self._dir(workload), stream, tail=0)["size"] for stream in ("stdout", "stderr")}
        return {key: workload[key] for key in ("workload_id", "state", "spec", "devices", "runtime", "argv",
                                                "notice", "stop", "next_start_at", "local_restarts", "runs",
                                                "events", "created_at")} | {
            "limits": workload.get("limits") or {"cpu_milli": 0, "memory_bytes": 0},
            "restart_count": workload["spec"]["restart_count"] + workload["local_restarts"],
            "log_bytes": sizes, "acked_seq": workload["acked_seq"]}

    def report(self) -> dict:
        """What the node's inventory and heartbeats say of its workloads: the runtime and its isolation
        (``agent.isolation``; mode ``none`` where a plain process runs as the agent's own user)."""
        isolation = self.isolation.describe() if self.runtime.name == "process" else {"mode": "container"}
        return {"workload_runtime": self.runtime.name, "isolation": isolation}

    def active(self) -> bool:
        return any(w["state"] in ACTIVE for w in self.workloads.values())

    def logs(self, workload_id: str, stream: str = "stdout", *, offset: int | None = None, tail: int | None = None,
             limit: int = 64 * 1024) -> dict:
        """A range of a log: from ``offset``, or the last ``tail`` bytes, at most ``limit`` bytes (256 KiB).
        Offsets count the stream's bytes since the first run; the log keeps its newest ``log_max_bytes`` at
        most, so an offset before ``first_offset`` (dropped bytes) reads from ``first_offset``."""
        workload = self.get(workload_id)
        if stream not in ("stdout", "stderr"):
            raise InvalidRequest("stream must be stdout or stderr", field="stream")
        if not 1 <= limit <= MAX_LOG_READ:
            raise InvalidRequest(f"limit must be 1..{MAX_LOG_READ}", field="limit")
        found = log_read(self._dir(workload), stream, offset=offset, tail=tail, limit=limit)
        return {"workload_id": workload_id, "stream": stream, **found,
                "data": found["data"].decode("utf-8", errors="replace"), "state": workload["state"]}

    # -- changes ------------------------------------------------------------------------------------
    def start(self, workload_id: str, spec: dict, instances: list[dict]) -> tuple[dict, bool]:
        """Start a workload on these instances (their inventory entries, in ``spec["instances"]`` order).
        The same id and spec again returns it as it is; the same id with another spec is ``Conflict``."""
        if not WORKLOAD_ID.match(workload_id):
            raise InvalidRequest("workload_id must be 1-128 of A-Z a-z 0-9 . _ : - (starting alphanumeric)",
                                 field="workload_id")
        secret_env = dict(spec.get("secret_env") or {})
        spec = {**spec, "secret_env": sorted(secret_env)}  # kept: the names; the values only in SECRET_FILE
        existing = self.workloads.get(workload_id)
        if existing is not None:
            # (a workload kept by an agent from before secret_env and scope existed has neither key)
            # (nor cpu_milli and memory_mib: the node's share per GPU, as then)
            before = {"secret_env": [], "scope": "", "cpu_milli": 0, "memory_mib": 0, **existing["spec"]}
            if before == spec and self._secret_env(existing) == secret_env:
                return self._public(existing), False
            raise Conflict(f"workload {workload_id!r} exists with another definition", field="workload_id")
        for other in self.workloads.values():
            if (spec.get("host_port") and other["state"] in ACTIVE
                    and (other["spec"].get("host_port") or 0) == spec["host_port"]):
                raise Conflict(f"host port {spec['host_port']} is taken by workload {other['workload_id']!r}",
                               field="host_port")
        for position, allocation_id in enumerate(spec["instances"]):
            for other in self.workloads.values():
                if other["state"] in ACTIVE and allocation_id in other["spec"]["instances"]:
                    raise Conflict(f"instance {allocation_id!r} already runs workload {other['workload_id']!r}",
                                   field=f"instances[{position}]")
        now = self.clock()
        devices = [{"allocation_id": i["allocation_id"], "kind": i["kind"], "device_uuid": i["device_uuid"],
                    "gpu": i["gpu"], "memory_mib": i.get("memory_mib", 0), **self._gpu_facts(i)} for i in instances]
        notice = next((i["notice"] for i in instances if i.get("notice")), None)
        workload = {"workload_id": workload_id, "spec": spec, "devices": devices, "access": device_env(instances),
                    "runtime": self.runtime.name, "argv": [], "state": "running", "created_at": now,
                    "notice": notice, "stop": None, "next_start_at": None, "local_restarts": 0, "runs": [],
                    "events": [], "seq": 0, "acked_seq": 0}
        workload["limits"] = self._host_limits(workload)
        directory = self._dir(workload)
        directory.mkdir(parents=True, exist_ok=True)
        self._secret_env_write(workload, secret_env)
        workload["argv"] = self.runtime.argv(workload, self._env(workload, token="-"), directory)  # refusals first
        if self._isolating():
            try:  # its user's directories and its cgroup can be made: else refused, nothing recorded
                self.isolation.prepare(workload, self._home(workload), self.roots)
            except IsolationError as error:
                self.isolation.release(workload)
                raise InvalidRequest(str(error), field=error.field or "workload_id") from error
        self.workloads[workload_id] = workload
        if notice:  # placed with a notice already running out: there is nothing to run
            workload["state"] = "preempted"
            self._event(workload, "preempted", now, detail="the instance was under notice when the workload came")
        else:
            self._spawn(workload, now)
        self._save()
        return self._public(workload), True

    def stop(self, workload_id: str, *, grace_seconds: float = 10.0, reason: str = "") -> dict:
        """SIGTERM now, SIGKILL after the grace (0: at once); a workload waiting to restart stops at once."""
        workload = self.get(workload_id)
        now = self.clock()
        if workload["state"] in ACTIVE and workload["stop"] is None:
            workload["stop"] = {"requested_at": now, "kill_at": now + grace_seconds, "reason": reason}
            self._write_deadline(workload, now + grace_seconds)  # as a notice does: the run sees its deadline
            self._event(workload, "stop_requested", now, grace_seconds=grace_seconds, detail=reason)
            if workload["state"] == "backoff":
                self._finish(workload, "stopped", now, detail=reason)
            else:
                self._term(workload, now, signal.SIGKILL if grace_seconds <= 0 else signal.SIGTERM)
            self._save()
        return self._public(workload)

    def notice(self, allocation_id: str, deadline: float, reason: str) -> list[str]:
        """A preemption notice on an instance: every workload on it gets the deadline in its deadline file
        and SIGTERM now; ``tick`` sends SIGKILL at the deadline. Returns the workloads noticed."""
        now = self.clock()
        noticed = []
        for workload in self.workloads.values():
            if workload["state"] not in ACTIVE or allocation_id not in workload["spec"]["instances"]:
                continue
            if workload["notice"] and workload["notice"]["deadline"] <= deadline:
                continue  # an earlier (or the same) deadline stands
            workload["notice"] = {"deadline": deadline, "reason": reason, "at": now}
            self._write_deadline(workload, deadline)
            self._event(workload, "notice", now, deadline=deadline, detail=reason)
            if workload["state"] == "backoff":
                self._finish(workload, "preempted", now, detail=reason)
            else:
                self._term(workload, now, signal.SIGTERM)
            noticed.append(workload["workload_id"])
        if noticed:
            self._save()
        return noticed

    def release(self, allocation_id: str) -> list[str]:
        """The instance is being destroyed: whatever still runs on it is killed now."""
        ids = [w["workload_id"] for w in self.workloads.values()
               if w["state"] in ACTIVE and allocation_id in w["spec"]["instances"]]
        for workload_id in ids:
            self.stop(workload_id, grace_seconds=0, reason=f"instance {allocation_id} destroyed")
        return ids

    def shrink(self, allocation_id: str) -> list[str]:
        """An elastic lease gives this instance back and keeps its others (``DELETE /v1/instances/{id}?resize=1``):
        each active workload on it that holds other instances drops it from its devices, finds its new size and
        devices in its units file (``GPUBROKER_UNITS_FILE``: ``{"units": n, "devices": [uuid, ...], "at": t}``) and
        gets SIGUSR1; its next run starts with them (``GPUBROKER_UNITS``, ``CUDA_VISIBLE_DEVICES``). A workload
        with nothing else left is stopped, as ``release`` does. The device given back is taken from it
        (``_revoke``: denied to it now, its holders SIGKILLed after ``shrink_grace_seconds``). Returns the
        workloads resized."""
        now = self.clock()
        resized = []
        for workload in list(self.workloads.values()):
            instances = workload["spec"]["instances"]
            if workload["state"] not in ACTIVE or allocation_id not in instances:
                continue
            if len(instances) <= 1:
                self.stop(workload["workload_id"], grace_seconds=0, reason=f"instance {allocation_id} destroyed")
                continue
            self._revoke(workload, allocation_id, now)  # its device node denied now, its holders evicted later
            workload["spec"] = {**workload["spec"], "instances": [i for i in instances if i != allocation_id]}
            workload["devices"] = [d for d in workload["devices"] if d["allocation_id"] != allocation_id]
            uuids = [d["device_uuid"] for d in workload["devices"]]
            workload["access"] = {**workload["access"], "CUDA_VISIBLE_DEVICES": ",".join(uuids)}
            self._resize_limits(workload, len(instances), now)
            self._write_units(workload, now)
            self._event(workload, "resized", now, detail=f"instance {allocation_id} given back; "
                                                         f"{len(uuids)} unit(s) left")
            run = workload["runs"][-1] if workload["runs"] else None
            if workload["state"] == "running" and run and run["pid"] is not None and run["ended_at"] is None:
                _signal_group(run["pid"], signal.SIGUSR1)
            resized.append(workload["workload_id"])
        if resized:
            self._save()
        return resized

    def grow(self, workload_id: str, instances: list[dict]) -> dict:
        """An elastic lease took units back (``POST /v1/workloads/{id}/grow``): ``instances`` (inventory entries of
        this node, each new to the workload) join its devices; as a shrink does, its units file gets the new size
        and devices and its process group SIGUSR1; its next run starts with them (``GPUBROKER_UNITS``,
        ``CUDA_VISIBLE_DEVICES``). A workload that is not active, or an instance it already has or another active
        workload runs on: ``Conflict``, nothing changed. Returns the workload."""
        workload = self.get(workload_id)
        if workload["state"] not in ACTIVE:
            raise Conflict(f"workload {workload_id!r} is {workload['state']}: nothing to grow", field="workload_id")
        for position, instance in enumerate(instances):
            allocation_id = instance["allocation_id"]
            for other in self.workloads.values():
                if other["state"] in ACTIVE and allocation_id in other["spec"]["instances"]:
                    raise Conflict(f"instance {allocation_id!r} already runs workload {other['workload_id']!r}",
                                   field=f"instances[{position}]")
        if not instances:
            return self._public(workload)
        now = self.clock()
        added = [i["allocation_id"] for i in instances]
        workload["spec"] = {**workload["spec"], "instances": [*workload["spec"]["instances"], *added]}
        workload["devices"] = [*workload["devices"], *(
            {"allocation_id": i["allocation_id"], "kind": i["kind"], "device_uuid": i["device_uuid"], "gpu": i["gpu"],
             "memory_mib": i.get("memory_mib", 0), **self._gpu_facts(i)} for i in instances)]
        uuids = [d["device_uuid"] for d in workload["devices"]]
        workload["access"] = {**workload["access"], "CUDA_VISIBLE_DEVICES": ",".join(uuids)}
        self._grant(workload, workload["devices"][-len(instances):], now)
        self._resize_limits(workload, len(workload["devices"]) - len(instances), now)
        self._write_units(workload, now)
        self._event(workload, "resized", now, detail=f"instance(s) {', '.join(added)} taken back; "
                                                     f"{len(uuids)} unit(s) now")
        run = workload["runs"][-1] if workload["runs"] else None
        if workload["state"] == "running" and run and run["pid"] is not None and run["ended_at"] is None:
            _signal_group(run["pid"], signal.SIGUSR1)
            if self.runtime.name != "process":  # an engine adds no device to a running container: a new run does
                grace = self.shrink_grace_seconds
                workload["regrow"] = {"run": run["run"], "due": now + grace}
                self._event(workload, "regrow", now, run=run["run"], detail=(
                    f"the container restarts with its {len(uuids)} device(s) in {grace:g} s: an engine cannot add a "
                    "device to a running container"))
        self._save()
        return self._public(workload)

    def _regrow_due(self, workload: dict, run: dict, now: float) -> bool:
        """A container's run ended ``shrink_grace_seconds`` after a growth (``grow``), so that its next run starts
        with every device it holds now: SIGKILL to its process group and ``ENGINE kill``; ``_run_ended`` starts the
        next run at once, whatever the restart policy. True when it was done or dropped."""
        regrow = workload.get("regrow")
        if not regrow:
            return False
        if regrow["run"] != run["run"] or run["ended_at"] is not None:
            del workload["regrow"]
            return True
        if now < regrow["due"] or run.get("kill_at"):
            return False
        del workload["regrow"]
        run["regrow"] = True
        _signal_group(run["pid"], signal.SIGKILL)
        self.runtime.kill(workload)
        self._event(workload, "regrown", now, run=run["run"], detail="ended for a new run with the devices grown onto")
        return True

    def tick(self) -> bool:
        """Reap exits, send SIGKILL at deadlines, restart after back-off. True when something changed."""
        now = self.clock()
        changed = False
        for workload in list(self.workloads.values()):
            if workload["state"] == "backoff":
                if now >= workload["next_start_at"]:
                    workload["local_restarts"] += 1
                    self._spawn(workload, now)
                    changed = True
                continue
            if workload["state"] != "running":
                continue
            run = workload["runs"][-1]
            changed |= self._evict_due(workload, run, now)  # a device given back and still held: SIGKILL
            changed |= self._regrow_due(workload, run, now)  # a container grown onto more devices: a new run
            ended = self._ended(workload, run)
            if ended is None:
                kill_at = min(t for t in (workload["notice"] and workload["notice"]["deadline"],
                                          workload["stop"] and workload["stop"]["kill_at"], float("inf")) if t)
                if now >= kill_at and not run.get("kill_at"):
                    run["kill_at"] = now
                    _signal_group(run["pid"], signal.SIGKILL)
                    self._kill_cgroup(workload)
                    self.runtime.kill(workload)
                    self._event(workload, "killed", now, run=run["run"], detail="SIGKILL at the deadline")
                    changed = True
                continue
            self._run_ended(workload, run, ended, now)
            changed = True
        if changed:
            self._save()
        return changed

    def pending(self, limit: int = 50) -> list[dict]:
        """Reports of (at most ``limit``) workloads with events the broker has not acknowledged: their state,
        runs and the unacknowledged events (not the spec, which the broker has)."""
        reports = []
        for workload in self.workloads.values():
            if workload["seq"] > workload["acked_seq"] and len(reports) < limit:
                public = self._public(workload)
                del public["spec"], public["argv"]
                public["events"] = [e for e in workload["events"] if e["seq"] > workload["acked_seq"]]
                reports.append(public)
        return reports

    def ack(self, acked: dict) -> None:
        changed = False
        for workload_id, seq in acked.items():
            workload = self.workloads.get(workload_id)
            if workload is not None and isinstance(seq, int) and workload["acked_seq"] < seq <= workload["seq"]:
                workload["acked_seq"] = seq
                changed = True
        if changed:
            self._save()

    # -- internals ----------------------------------------------------------------------------------
    def _dir(self, workload: dict) -> Path:
        return self.directory / workload["workload_id"]

    def _exit_file(self, workload: dict, run: dict) -> Path:
        return self._dir(workload) / f"exit-{run['run']}.json"

    def _isolating(self) -> bool:
        return self.isolation.enabled and self.runtime.name == "process"

    def _home(self, workload: dict) -> Path:
        return self._dir(workload) / HOME_DIR

    def _deadline_file(self, workload: dict) -> Path:
        return (self._home(workload) if self._isolating() else self._dir(workload)) / "deadline"

    def _gpu_facts(self, instance: dict) -> dict:
        """The GPU's index (its device node ``nvidia<index>``) and the share of it the instance is."""
        gpu = self.gpu_lookup(instance["gpu"]) if self.gpu_lookup else None
        if gpu is None:
            return {}
        if instance["kind"] == "share":
            fraction = instance.get("milli", 1000) / 1000
        elif instance["kind"] == "mig" and gpu.get("memory_mib"):
            fraction = instance.get("memory_mib", 0) / gpu["memory_mib"]
        else:
            fraction = 1.0
        return {"gpu_index": gpu["index"], "gpu_fraction": round(fraction, 4)}

    def _host_limits(self, workload: dict) -> dict:
        """The run's host CPU (milli-CPUs) and memory (bytes): the lease's ask on this node (the spec's
        ``cpu_milli`` / ``memory_mib``), else the node's share per leased GPU (``Isolation.host_limits``); the
        cgroup's limits (isolation ``uid``) and a container's ``--cpus`` / ``--memory``."""
        cpu_milli, memory_bytes = self.isolation.host_limits(workload["devices"], workload["spec"])
        return {"cpu_milli": cpu_milli, "memory_bytes": memory_bytes}

    def _units_file(self, workload: dict) -> Path:
        return (self._home(workload) if self._isolating() else self._dir(workload)) / "units"

    def _write_units(self, workload: dict, now: float) -> None:
        """The workload's current size and devices into its units file, replaced atomically (as the deadline)."""
        path = self._units_file(workload)
        path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"units": len(workload["devices"]),
                           "devices": [d["device_uuid"] for d in workload["devices"]], "at": round(now, 3)})
        directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink("units.tmp", dir_fd=directory)
            descriptor = os.open("units.tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644,
                                 dir_fd=directory)
            with os.fdopen(descriptor, "w") as handle:
                handle.write(body + "\n")
            os.replace("units.tmp", "units", src_dir_fd=directory, dst_dir_fd=directory)
        finally:
            os.close(directory)

    def _write_deadline(self, workload: dict, deadline: float) -> None:
        """The deadline (unix seconds) into the workload's deadline file, replaced atomically. In an isolated
        workload's home (its own directory) through a descriptor: a link it planted is replaced, never followed."""
        path = self._deadline_file(workload)
        path.parent.mkdir(parents=True, exist_ok=True)
        directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink("deadline.tmp", dir_fd=directory)
            descriptor = os.open("deadline.tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644,
                                 dir_fd=directory)
            with os.fdopen(descriptor, "w") as handle:
                handle.write(f"{deadline:.3f}\n")
            os.replace("deadline.tmp", "deadline", src_dir_fd=directory, dst_dir_fd=directory)
        finally:
            os.close(directory)

    def _kill_cgroup(self, workload: dict) -> None:
        """SIGKILL to every process left in the workload's cgroup (one that left its process group too)."""
        if not self._isolating() or self.isolation.cgroups is None:
            return
        for pid in self.isolation.cgroups.pids(self.isolation.cgroup_name(workload)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def _revoke(self, workload: dict, allocation_id: str, now: float) -> None:
        """An instance given back by a shrink (``shrink``): when none of the workload's other instances is on its
        GPU, that GPU's device node is taken from the isolated run at once (``Isolation.revoke_device``: its v1
        devices cgroup, or its mount namespace) and an eviction is due after ``shrink_grace_seconds``:
        ``_evict_due`` kills each process of the run that still holds the device then. Kept in the workload
        (``evictions``, saved with it), so an agent restarted meanwhile still evicts."""
        given = next((d for d in workload["devices"] if d["allocation_id"] == allocation_id), None)
        if given is None or given.get("gpu_index") is None:
            return
        index = given["gpu_index"]
        if any(d.get("gpu_index") == index for d in workload["devices"] if d["allocation_id"] != allocation_id):
            return  # another of its instances is on that GPU (MIG, a share): its device node stays its own
        run = workload["runs"][-1] if workload["runs"] else None
        if workload["state"] != "running" or run is None or run["pid"] is None or run["ended_at"] is not None:
            return  # no run going: the next one's cgroup allows only the devices left
        node = self.isolation.device_dir / f"nvidia{index}"
        if device_identity(node) is None and self.gpu_processes is None:
            self._event(workload, "revoked", now, detail=f"instance {allocation_id} given back: no device node "
                                                         f"{node} and no NVML here, nothing to deny or evict")
            return
        denied = ""
        if self._isolating():  # v1: its devices cgroup; else its mount namespace: no new open from now on
            denied = self.isolation.revoke_device(workload, index, self._members(workload, run))
        elif self.runtime.name != "process":  # a container: its mount namespace, entered through its processes
            denied = _masked_words(mask_in_namespaces(self.runtime.pids(workload), node), unmask=False)
        grace = self.shrink_grace_seconds
        workload.setdefault("evictions", []).append({
            "allocation_id": allocation_id, "gpu": given["gpu"], "gpu_index": index, "device": str(node),
            "run": run["run"], "at": now, "due": now + grace, "grace_seconds": grace})
        self._event(workload, "revoked", now, detail=(
            f"instance {allocation_id} given back: {node} "
            f"{denied or 'not taken from its processes (no devices cgroup, no mount namespace of its own)'}; "
            f"a process still holding it after {grace:g} s is killed"))

    def _resize_limits(self, workload: dict, before: int, now: float) -> None:
        """After a shrink or a growth from ``before`` units: the lease's host ask (``cpu_milli`` / ``memory_mib`` in
        the spec, the per-unit ask times the units at the start) scaled to the units it holds now, as the scheduler
        reserves it, and the run's limits with it (``workload["limits"]``); a running isolated run's cgroup is
        given them at once (``Cgroups.resize``: CPU and memory only; a memory limit under what the run already uses
        is refused by the kernel and kept, with an event saying so). A running container is given them by its engine
        (``ENGINE update``). Without an ask the node's share per GPU follows the devices as before."""
        after = len(workload["devices"])
        if before <= 0 or after == before:
            return
        spec = workload["spec"]
        scaled = {name: spec[name] * after // before for name in ("cpu_milli", "memory_mib") if spec.get(name)}
        if scaled:
            workload["spec"] = {**spec, **scaled}
        workload["limits"] = self._host_limits(workload)
        run = workload["runs"][-1] if workload["runs"] else None
        if workload["state"] != "running" or run is None or run["ended_at"] is not None:
            return
        if self.runtime.name != "process":  # a container's cgroup is its engine's: ``ENGINE update``
            done = self.runtime.update_limits(workload, workload["limits"]["cpu_milli"],
                                              workload["limits"]["memory_bytes"])
            if done:
                self._event(workload, "limits", now, detail=(
                    f"container resized for {after} unit(s): {workload['limits']['cpu_milli']} milli-CPU, "
                    f"{workload['limits']['memory_bytes'] >> 20} MiB ({done})"))
            return
        if not self._isolating() or self.isolation.cgroups is None:
            return
        refused = self.isolation.cgroups.resize(self.isolation.cgroup_name(workload), workload["limits"]["cpu_milli"],
                                                workload["limits"]["memory_bytes"])
        self._event(workload, "limits", now, detail=(
            f"cgroup resized for {after} unit(s): {workload['limits']['cpu_milli']} milli-CPU, "
            f"{workload['limits']['memory_bytes'] >> 20} MiB" + (f" ({refused})" if refused else "")))

    def _grant(self, workload: dict, devices: list[dict], now: float) -> None:
        """Devices an elastic lease took (``grow``): an eviction still pending for one of their GPUs (given back by
        a shrink and taken again within the grace) is dropped, and the running isolated run may open them from
        now on (``Isolation.grant_device``: its v1 devices cgroup, or the masks in its mount namespace). Without a
        run going, the next run's launch opens them anyway."""
        indexes = sorted({d["gpu_index"] for d in devices if d.get("gpu_index") is not None})
        if not indexes:
            return
        pending = workload.get("evictions") or []
        kept = [e for e in pending if e.get("gpu_index") not in indexes]
        for eviction in pending:
            if eviction not in kept:
                self._event(workload, "revoked", now, detail=f"eviction from {eviction['device']} dropped: the "
                                                             "lease took that GPU back")
        if pending:
            workload["evictions"] = kept
        run = workload["runs"][-1] if workload["runs"] else None
        container = self.runtime.name != "process"
        if (workload["state"] != "running" or run is None or run["pid"] is None or run["ended_at"] is not None
                or not (self._isolating() or container)):
            return
        members = self._members(workload, run)
        for index in indexes:
            if container:  # a mask a shrink left in its namespace comes off; a GPU never in it waits for a new run
                opened = _masked_words(mask_in_namespaces(members, self.isolation.device_dir / f"nvidia{index}",
                                                          unmask=True), unmask=True)
            else:
                opened = self.isolation.grant_device(workload, index, members)
            if opened:
                self._event(workload, "granted", now, detail=f"{self.isolation.device_dir / f'nvidia{index}'} "
                                                             f"{opened}")

    def _evict_due(self, workload: dict, run: dict, now: float) -> bool:
        """Each due eviction of a device given back (``_revoke``): SIGKILL to every process of the run (its process
        group and session, and its cgroup when isolated) that still has the device open or mapped, or that NVML
        lists as a compute process on the GPU. Only those: the rest of the workload keeps running on the units
        it kept. The run's main process is no exception: killed, its run ends and the restart policy applies.
        True when an eviction was done or dropped (the run it was for has ended)."""
        pending = workload.get("evictions")
        if not pending:
            return False
        due = [e for e in pending if e["run"] != run["run"] or run["ended_at"] is not None or now >= e["due"]]
        if not due:
            return False
        workload["evictions"] = [e for e in pending if e not in due]
        for eviction in due:
            if eviction["run"] == run["run"] and run["ended_at"] is None:
                self._evict(workload, run, eviction, now)
        return True

    def _evict(self, workload: dict, run: dict, eviction: dict, now: float) -> None:
        path = Path(eviction["device"])
        identity = device_identity(path)
        nvml: set[int] = set()
        if self.gpu_processes is not None:
            try:
                nvml = set(self.gpu_processes(eviction["gpu"]))
            except Exception:  # NVML's own errors: the descriptors are still looked at
                logger.warning("workload %s: NVML's compute processes of GPU %s unknown", workload["workload_id"],
                               eviction["gpu"], exc_info=True)
        if identity is None and not nvml:
            return
        members = self._members(workload, run)
        try:
            main = {int(p) for p in Path(f"/proc/{run['pid']}/task/{run['pid']}/children").read_text().split()}
        except (OSError, ValueError):
            main = set()
        for pid in sorted(members):
            how = _kill_holder(pid, identity, path, nvml)
            if not how:
                continue
            held = {"open": "still open", "mapped": "still mapped",
                    "NVML": "still a compute process on the GPU (NVML)"}[how]
            ending = "; the workload's main process: its run ends" if pid in main else ""
            logger.warning("workload %s: killed pid %s, which held %s %s s after it was given back",
                           workload["workload_id"], pid, path, f"{eviction['grace_seconds']:g}")
            self._event(workload, "evicted", now, run=run["run"], pid=pid, device=str(path),
                        detail=f"evicted pid {pid} from the device given back ({path}, instance "
                               f"{eviction['allocation_id']}): {held} after {eviction['grace_seconds']:g} s{ending}")

    def _members(self, workload: dict, run: dict) -> set[int]:
        """The run's processes: its process group and session (the shim leads both) and, isolated, its cgroup's."""
        members = session_members(run["pid"])
        if self._isolating() and self.isolation.cgroups is not None:
            members |= self.isolation.cgroups.pids(self.isolation.cgroup_name(workload))
        members |= self.runtime.pids(workload)  # a container's: its engine started them, not the run's shim
        members.discard(os.getpid())
        return members

    def _secret_env_write(self, workload: dict, values: dict[str, str]) -> None:
        """The workload's secret values in its directory, readable by the agent's user only (written before
        the state file names the workload, so a restarted agent always finds them)."""
        path = self._dir(workload) / SECRET_FILE
        temporary = path.with_suffix(".tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump(values, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)

    def _secret_env(self, workload: dict) -> dict[str, str]:
        try:
            return json.loads((self._dir(workload) / SECRET_FILE).read_text())
        except (OSError, ValueError):
            return {}

    def _env(self, workload: dict, token: str) -> dict[str, str]:
        spec = workload["spec"]
        names = BASE_ENV + PROCESS_ENV if self.runtime.name == "process" else BASE_ENV
        env = {key: os.environ[key] for key in names if key in os.environ}
        if self._isolating():  # its own home; its /tmp is private (agent.isolation)
            env.update({"HOME": str(self._home(workload)), "TMPDIR": "/tmp"})  # noqa: S108
        env.update(spec["env"])
        env.update(self._secret_env(workload))
        env.update(workload["access"])
        env.update({"RESTART_COUNT": str(spec["restart_count"] + workload["local_restarts"]),
                    "GPUB_WORKLOAD_ID": workload["workload_id"], "GPUB_RUN_TOKEN": token,
                    "GPUB_DEADLINE_FILE": str(self._deadline_file(workload)),
                    # an elastic lease's current size (its devices), and where a shrink writes the new one
                    "GPUBROKER_UNITS": str(len(workload["devices"])),
                    "GPUBROKER_UNITS_FILE": str(self._units_file(workload))})
        if spec["checkpoint_dir"]:
            env["CHECKPOINT_DIR"] = spec["checkpoint_dir"]
        if spec["port"]:  # a plain process listens on the node itself: on the host port it was given, on loopback
            env["PORT"] = str(spec["port"] if self.runtime.name != "process" else
                              spec.get("host_port") or spec["port"])
            # where to listen: the node's loopback for a plain process (the agent's relay reaches it there), any
            # address inside a container (whose published port is on the node's loopback only)
            env.setdefault("GPUB_LISTEN_HOST", "127.0.0.1" if self.runtime.name == "process" else "0.0.0.0")  # noqa: S104
        if workload["notice"]:
            env["GPUB_PREEMPT_DEADLINE"] = f"{workload['notice']['deadline']:.3f}"
        return env

    def _spawn(self, workload: dict, now: float) -> None:
        """Start the next run: saved with its token before the process exists, its pid right after."""
        number = len(workload["runs"]) + 1
        restart_count = workload["spec"]["restart_count"] + workload["local_restarts"]
        run = {"run": number, "token": secrets.token_hex(16), "pid": None, "start_ticks": None, "started_at": now,
               "restart_count": restart_count, "ended_at": None, "exit_code": None, "signal": None,
               "term_at": None, "kill_at": None, "outcome": None}
        workload["runs"].append(run)
        workload["state"], workload["next_start_at"] = "running", None
        directory = self._dir(workload)
        directory.mkdir(parents=True, exist_ok=True)
        self._save()  # the token is on disk before the process can exist
        banner = (f"--- gpubroker: run {number} (RESTART_COUNT={restart_count}) at "
                  f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(now))}")
        env = self._env(workload, run["token"])
        workload["limits"] = self._host_limits(workload)  # the container's --cpus / --memory (the cgroup's: prepare)
        try:
            launcher = None
            if self._isolating():
                launcher = self.isolation.launcher_argv(
                    self.isolation.prepare(workload, self._home(workload), self.roots))
            process = self.runtime.spawn(workload, env, directory, self._exit_file(workload, run),
                                         log_max_bytes=self.log_max_bytes, banner=banner, launcher=launcher)
        except (OSError, IsolationError) as error:
            run.update(ended_at=now, exit_code=127, outcome="failed")
            self._event(workload, "start_failed", now, run=number, detail=str(error))
            self._finish(workload, "failed", now, detail=f"cannot start: {error}")
            return
        self._children[process.pid] = process
        ticks = process_start_ticks(process.pid)
        run["pid"], run["start_ticks"] = process.pid, ticks[0] if ticks else None
        regrown = number > 1 and workload["runs"][-2].get("outcome") == "regrown"
        self._event(workload, "started" if number == 1 else "restarted", now, run=number, pid=process.pid,
                    restart_count=restart_count, **({"regrown": True} if regrown else {}))

    def _ended(self, workload: dict, run: dict) -> dict | None:
        """How the run ended, or None while it runs."""
        exit_file = self._exit_file(workload, run)
        child = self._children.get(run["pid"])
        if child is not None:
            if child.poll() is None:
                return None
            del self._children[run["pid"]]
        elif (ticks := process_start_ticks(run["pid"])) and ticks[0] == run["start_ticks"] and ticks[1] != "Z":
            return None
        if exit_file.exists():
            try:
                return json.loads(exit_file.read_text())
            except ValueError:
                pass
        if child is not None and child.returncode is not None and child.returncode < 0:
            return {"exit_code": None, "signal": -child.returncode, "ended_at": self.clock()}
        if run.get("kill_at"):
            return {"exit_code": None, "signal": int(signal.SIGKILL), "ended_at": run["kill_at"]}
        return {"exit_code": None, "signal": None, "ended_at": self.clock(),
                "error": "the process is gone and left no exit status"}

    def _run_ended(self, workload: dict, run: dict, ended: dict, now: float) -> None:
        self._kill_cgroup(workload)  # what the run left behind ends with it
        self.isolation.release(workload)
        run["ended_at"] = min(float(ended.get("ended_at") or now), now)
        run["exit_code"], run["signal"] = ended.get("exit_code"), ended.get("signal")
        data = {"run": run["run"], "exit_code": run["exit_code"], "signal": run["signal"],
                "restart_count": run["restart_count"]}
        if ended.get("error"):
            data["detail"] = ended["error"]
        spec = workload["spec"]
        if workload["stop"]:
            run["outcome"] = "stopped"
            self._event(workload, "exited", run["ended_at"], **data)
            self._finish(workload, "stopped", run["ended_at"], detail=workload["stop"]["reason"])
        elif workload["notice"]:
            run["outcome"] = "preempted"
            self._event(workload, "exited", run["ended_at"], **data)
            self._finish(workload, "preempted", run["ended_at"], detail=workload["notice"]["reason"])
        elif run.get("regrow"):  # ended by the agent after a growth (``_regrow_due``): the next run at once
            run["outcome"] = "regrown"
            workload["state"], workload["next_start_at"] = "backoff", now
            self._event(workload, "exited", run["ended_at"], **data)
        elif run["exit_code"] == 0:
            run["outcome"] = "succeeded"
            self._event(workload, "exited", run["ended_at"], **data)
            self._finish(workload, "succeeded", run["ended_at"])
        elif spec["restart_policy"] == "on-failure" and workload["local_restarts"] < spec["max_restarts"]:
            run["outcome"] = "failed"
            delay = min(self.backoff_cap, self.backoff_seconds * 2 ** workload["local_restarts"])
            workload["state"], workload["next_start_at"] = "backoff", now + delay
            self._event(workload, "exited", run["ended_at"], **data)
            self._event(workload, "backoff", now, seconds=delay, restart=workload["local_restarts"] + 1)
        else:
            run["outcome"] = "failed"
            self._event(workload, "exited", run["ended_at"], **data)
            limit = (f" after {workload['local_restarts']} restart(s)" if spec["restart_policy"] == "on-failure"
                     else "")
            self._finish(workload, "failed", run["ended_at"], detail=f"run {run['run']} failed{limit}")

    def _finish(self, workload: dict, state: str, at: float, *, detail: str = "") -> None:
        workload["state"], workload["next_start_at"] = state, None
        run = workload["runs"][-1] if workload["runs"] else None
        logger.info("workload %s ended: %s%s (runs %d, last exit code %s, signal %s)", workload["workload_id"], state,
                    f" -- {detail}" if detail else "", len(workload["runs"]), run and run["exit_code"],
                    run and run["signal"])
        self._event(workload, state, at, detail=detail)

    def _term(self, workload: dict, now: float, signum: int) -> None:
        run = workload["runs"][-1] if workload["runs"] else None
        if run is None or run["pid"] is None or run["ended_at"] is not None:
            return
        if signum == signal.SIGKILL:
            run["kill_at"] = now
            self._kill_cgroup(workload)
            self.runtime.kill(workload)
        elif run["term_at"] is None:
            run["term_at"] = now
        _signal_group(run["pid"], signum)
        self._event(workload, "signalled", now, run=run["run"], signal=signal.Signals(signum).name)

    def _event(self, workload: dict, kind: str, at: float, **data) -> None:
        workload["seq"] += 1
        workload["events"].append({"seq": workload["seq"], "kind": kind, "at": at,
                                   **{k: v for k, v in data.items() if v not in (None, "")}})
        del workload["events"][:-MAX_EVENTS]

    def shell_plan(self, workload_id: str, command: str, pty: bool) -> dict:
        """How to run a tenant's shell or command beside a running workload (``agent.server.workload_shell``, the
        broker's SSH gateway): as the workload's own user in its own cgroup and file-system view (the launcher,
        with ``isolation = "uid"``), in its working directory, with its environment (its devices, its secrets)
        but no run token; inside its container with ``<engine> exec`` for a container runtime. ``command``: what
        ``sh -c`` runs; empty: an interactive login shell. Only a running workload takes one."""
        workload = self.get(workload_id)
        if workload["state"] != "running":
            raise Conflict(f"the workload is {workload['state']}, not running: there is nothing to open a shell "
                           "beside", field="workload_id")
        spec = workload["spec"]
        program = ["/bin/sh", "-c", command] if command else ["/bin/sh", "-l"]
        env = self._env(workload, "")
        env.pop("GPUB_RUN_TOKEN", None)
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        cwd = spec["workdir"] or str(self._home(workload) if self._isolating() else self._dir(workload))
        if self.runtime.name in ("docker", "podman"):
            argv = [self.runtime.name, "exec", "-i", *(["-t"] if pty else []),
                    ContainerRuntime.container_name(workload), *program]
            return {"argv": argv, "env": self.runtime.process_env(env), "cwd": str(self._dir(workload))}
        launcher = []
        if self._isolating():
            plan = self.isolation.prepare(workload, self._home(workload), self.roots)
            launcher = self.isolation.launcher_argv(plan)
            cwd = plan["cwd"]
        return {"argv": [*launcher, *program], "env": env, "cwd": cwd}

    def command_line(self, workload_id: str) -> str:
        return shlex.join(self.get(workload_id)["argv"])


def _masked_words(changed: int, *, unmask: bool) -> str:
    """What ``mask_in_namespaces`` did, for a workload's event ("" when nothing)."""
    if not changed:
        return ""
    where = "its mount namespace" if changed == 1 else f"its {changed} mount namespaces"
    return f"unmasked in {where}" if unmask else f"masked with /dev/null in {where}"
