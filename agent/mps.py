"""GPU shares enforced by NVIDIA MPS: one ``nvidia-cuda-mps-control`` daemon per shared GPU (docs/agent-protocol.md,
"Shares and MPS").

A share's compute percentage and memory cap are only numbers in the workload's environment unless an MPS control
daemon serves the GPU: a CUDA client that finds no daemon runs without MPS, unlimited. So the agent runs one:

- **started with the GPU's first share**: ``nvidia-cuda-mps-control -d`` with ``CUDA_VISIBLE_DEVICES=<GPU UUID>``
  (the daemon sees that GPU only), ``CUDA_MPS_PIPE_DIRECTORY=<mps_directory>/<GPU UUID>/pipe`` and
  ``CUDA_MPS_LOG_DIRECTORY=<mps_directory>/<GPU UUID>/log`` (``mps_directory`` defaults to ``STATE_DIR/mps``);
- **limits through its control interface** (``echo COMMAND | nvidia-cuda-mps-control`` with the GPU's pipe
  directory): ``set_default_active_thread_percentage <p>`` and ``set_default_device_pinned_mem_limit 0 <n>M``,
  the tightest of the GPU's shares, so a client that drops its own variables still gets no more than the
  smallest share; each workload's own limits reach it in its environment (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``,
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, and ``CUDA_MPS_PIPE_DIRECTORY`` naming its GPU's daemon:
  ``agent.workloads.device_env``). NVIDIA documents that a default set while a server runs applies to the
  next server the daemon spawns;
- **stopped with the GPU's last share** (``quit``);
- **recovered after an agent restart**: the daemon outlives the agent; its pid file
  (``nvidia-cuda-mps-control.pid`` in the pipe directory, written by the daemon) says it runs, and the agent
  applies the limits again (a daemon with no share left is told to quit, a share without a daemon gets one).

Where MPS cannot run (no ``nvidia-cuda-mps-control``; the operator turned it off; a simulated fleet) every GPU
says ``share_enforcement: "none"`` with the reason, and the broker shows shares there as unenforced.

``ShareEnforcingBackend`` wraps a node's backend (the sim or NVML) and does this around ``create`` /
``create_many`` / ``destroy``; everything else passes through. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from agent.protocol import AgentError, Unavailable, problem_body

EXECUTABLE = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"  # written by the daemon in its pipe directory (NVIDIA's MPS docs)
COMMAND_TIMEOUT = 30.0
SOCKET_PATH_MAX = 107  # a unix socket's path (sun_path, 108 bytes with its NUL): MPS's sockets live in the pipe dir
SOCKET_NAME_MAX = len("control_privileged")
ENFORCED = "mps"
UNENFORCED = "none"


class MpsError(Exception):
    """The MPS control daemon could not be started, reached or told something."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie is not a daemon
        raw = Path(f"/proc/{pid}/stat").read_text()
        return raw[raw.rindex(")") + 2:].split()[0] != "Z"
    return True


class MpsControl:
    """The MPS control daemons of one node, one per GPU, under ``directory/<GPU UUID>/`` (``STATE_DIR/mps``
    unless given: the pipe directory holds unix sockets, whose paths may not pass 107 bytes)."""

    def __init__(self, state_dir: Path, executable: str = EXECUTABLE, *, directory: Path | None = None):
        self.root = Path(directory) if directory else Path(state_dir) / "mps"
        self.executable = executable

    def resolved(self) -> str | None:
        """The control program's path, or None when this node has none."""
        if os.sep in self.executable:
            return self.executable if os.access(self.executable, os.X_OK) else None
        return shutil.which(self.executable)

    def pipe_directory(self, gpu_uuid: str) -> Path:
        return self.root / gpu_uuid / "pipe"

    def log_directory(self, gpu_uuid: str) -> Path:
        return self.root / gpu_uuid / "log"

    def _env(self, gpu_uuid: str) -> dict[str, str]:
        env = {key: os.environ[key] for key in ("PATH", "LANG", "LC_ALL", "TZ") if key in os.environ}
        return env | {"CUDA_VISIBLE_DEVICES": gpu_uuid, "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_directory(gpu_uuid)),
                      "CUDA_MPS_LOG_DIRECTORY": str(self.log_directory(gpu_uuid))}

    def daemon_pid(self, gpu_uuid: str) -> int | None:
        """The GPU's running control daemon (from the pid file it writes), or None."""
        try:
            pid = int((self.pipe_directory(gpu_uuid) / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def running(self) -> list[str]:
        """The GPUs (UUIDs) whose daemon runs now."""
        if not self.root.is_dir():
            return []
        return sorted(entry.name for entry in self.root.iterdir() if self.daemon_pid(entry.name) is not None)

    def start(self, gpu_uuid: str) -> int:
        """Start the GPU's daemon (``-d``: it forks into the background); its pid. One that runs is kept."""
        pid = self.daemon_pid(gpu_uuid)
        if pid is not None:
            return pid
        program = self.resolved()
        if program is None:
            raise MpsError(f"{self.executable} is not installed on this node")
        pipe = str(self.pipe_directory(gpu_uuid))
        if len(pipe) + 1 + SOCKET_NAME_MAX > SOCKET_PATH_MAX:
            raise MpsError(f"the MPS pipe directory {pipe} is too long for the daemon's unix sockets (at most "
                           f"{SOCKET_PATH_MAX - 1 - SOCKET_NAME_MAX} characters): set mps_directory shorter")
        for directory in (self.pipe_directory(gpu_uuid), self.log_directory(gpu_uuid)):
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            done = subprocess.run([program, "-d"], env=self._env(gpu_uuid), stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise MpsError(f"{program} -d for GPU {gpu_uuid}: {error}") from None
        if done.returncode != 0:
            raise MpsError(f"{program} -d for GPU {gpu_uuid} exited {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()[:300]}")
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while (pid := self.daemon_pid(gpu_uuid)) is None:
            if time.monotonic() > deadline:
                raise MpsError(f"the MPS control daemon of GPU {gpu_uuid} wrote no pid file in "
                               f"{self.pipe_directory(gpu_uuid)}")
            time.sleep(0.02)
        return pid

    def command(self, gpu_uuid: str, line: str) -> str:
        """One control command (``echo LINE | nvidia-cuda-mps-control``) to the GPU's daemon; its answer."""
        program = self.resolved()
        if program is None:
            raise MpsError(f"{self.executable} is not installed on this node")
        try:
            done = subprocess.run([program], input=line + "\n", env=self._env(gpu_uuid), capture_output=True,
                                  text=True, timeout=COMMAND_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise MpsError(f"{line!r} to the MPS control daemon of GPU {gpu_uuid}: {error}") from None
        if done.returncode != 0:
            raise MpsError(f"{line!r} to the MPS control daemon of GPU {gpu_uuid} exited {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()[:300]}")
        return done.stdout.strip()

    def apply(self, gpu_uuid: str, *, active_thread_percentage: int, pinned_mem_limit_mib: int) -> None:
        """The daemon's defaults for the servers it spawns (documented: a running server keeps its own)."""
        self.command(gpu_uuid, f"set_default_active_thread_percentage {active_thread_percentage}")
        self.command(gpu_uuid, f"set_default_device_pinned_mem_limit 0 {pinned_mem_limit_mib}M")

    def server_list(self, gpu_uuid: str) -> list[int]:
        """The MPS servers' pids (``get_server_list``)."""
        return [int(word) for word in self.command(gpu_uuid, "get_server_list").split() if word.isdigit()]

    def stop(self, gpu_uuid: str) -> None:
        """``quit``, then wait until the daemon has gone (it ends its servers first)."""
        pid = self.daemon_pid(gpu_uuid)
        if pid is None:
            return
        self.command(gpu_uuid, "quit")
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while _alive(pid):
            if time.monotonic() > deadline:
                raise MpsError(f"the MPS control daemon of GPU {gpu_uuid} (pid {pid}) did not quit")
            time.sleep(0.02)


def share_limits(shares: list[dict]) -> tuple[int, int]:
    """(active thread percentage, pinned memory MiB): the tightest of a GPU's shares."""
    percentage = min(int(i.get("access", {}).get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") or max(1, -(-i["milli"] // 10)))
                     for i in shares)
    return percentage, min(int(i["memory_mib"]) for i in shares)


class ShareEnforcingBackend:
    """A node's backend with its shares enforced by MPS (``control``), or reported unenforced with ``reason``
    when ``control`` is None or its program is missing. Every other call goes to the backend as it is."""

    def __init__(self, backend, control: MpsControl | None, *, reason: str = ""):
        self.backend = backend
        self.control = control
        self.problem = ""  # the last failure to run a daemon (shown as the reason while it lasts)
        if control is not None and control.resolved() is None:
            reason = reason or f"{control.executable} is not installed on this node"
            self.control = None
        self.reason = reason or "MPS is turned off on this node (mps_control = \"\")"
        if self.control is not None:
            self.recover()

    def __getattr__(self, name: str):
        return getattr(self.backend, name)

    # -- what the node says ---------------------------------------------------------------------------
    def enforcement(self) -> tuple[str, str]:
        if self.control is None:
            return UNENFORCED, self.reason
        if self.problem:
            return UNENFORCED, self.problem
        return ENFORCED, ""

    def _decorate_instance(self, instance: dict) -> dict:
        if self.control is not None and instance.get("kind") == "share":
            instance = {**instance, "access": {
                **instance["access"], "CUDA_MPS_PIPE_DIRECTORY": str(self.control.pipe_directory(instance["gpu"]))}}
        return instance

    def inventory(self) -> dict:
        data = self.backend.inventory()
        mode, reason = self.enforcement()
        gpus = [{**gpu, "share_enforcement": mode, "share_enforcement_reason": reason} for gpu in data["gpus"]]
        return {**data, "gpus": gpus, "instances": [self._decorate_instance(i) for i in data["instances"]]}

    def instance(self, allocation_id: str) -> dict:
        return self._decorate_instance(self.backend.instance(allocation_id))

    def gpu(self, gpu_uuid: str) -> dict:
        for item in self.inventory()["gpus"]:
            if item["uuid"] == gpu_uuid:
                return item
        return self.backend.gpu(gpu_uuid)  # its NotFound

    def set_mode(self, gpu_uuid: str, mode: str) -> dict:
        entry = self.backend.set_mode(gpu_uuid, mode)
        enforcement, reason = self.enforcement()
        return {**entry, "share_enforcement": enforcement, "share_enforcement_reason": reason}

    # -- changes --------------------------------------------------------------------------------------
    def create(self, allocation_id: str, spec):
        instance, created = self.backend.create(allocation_id, spec)
        if instance.get("kind") == "share" and self.control is not None:
            try:
                self.sync(instance["gpu"])
            except MpsError as error:
                if created:  # not left behind as a share nothing enforces
                    self.backend.destroy(allocation_id)
                raise Unavailable(f"the share cannot be enforced: {error}", field="kind") from None
        return self._decorate_instance(instance), created

    def create_many(self, specs: dict) -> dict:
        answers = self.backend.create_many(specs)
        if self.control is None:
            return answers
        gpus = sorted({a["instance"]["gpu"] for a in answers.values()
                       if "instance" in a and a["instance"].get("kind") == "share"})
        for gpu_uuid in gpus:
            try:
                self.sync(gpu_uuid)
            except MpsError as error:
                for allocation_id, answer in answers.items():
                    instance = answer.get("instance")
                    if instance and instance.get("kind") == "share" and instance["gpu"] == gpu_uuid:
                        if answer["status"] == 201:
                            self.backend.destroy(allocation_id)
                        refusal = Unavailable(f"the share cannot be enforced: {error}", field="kind")
                        answers[allocation_id] = {"status": refusal.status, "problem": problem_body(refusal)}
        return {aid: ({**a, "instance": self._decorate_instance(a["instance"])} if "instance" in a else a)
                for aid, a in answers.items()}

    def destroy(self, allocation_id: str) -> bool:
        gpu_uuid = None
        with contextlib.suppress(AgentError):
            held = self.backend.instance(allocation_id)
            gpu_uuid = held["gpu"] if held.get("kind") == "share" else None
        existed = self.backend.destroy(allocation_id)
        if gpu_uuid and self.control is not None:
            with contextlib.suppress(MpsError):  # the instance is gone either way; recover() retries the quit
                self.sync(gpu_uuid)
        return existed

    # -- the daemons ----------------------------------------------------------------------------------
    def _shares(self) -> dict[str, list[dict]]:
        shares: dict[str, list[dict]] = {}
        for item in self.backend.inventory()["instances"]:
            if item.get("kind") == "share":
                shares.setdefault(item["gpu"], []).append(item)
        return shares

    def sync(self, gpu_uuid: str) -> None:
        """The GPU's daemon as its shares need it: running with their limits, or stopped when none is left."""
        shares = self._shares().get(gpu_uuid, [])
        try:
            if shares:
                self.control.start(gpu_uuid)
                percentage, memory_mib = share_limits(shares)
                self.control.apply(gpu_uuid, active_thread_percentage=percentage, pinned_mem_limit_mib=memory_mib)
            else:
                self.control.stop(gpu_uuid)
        except MpsError as error:
            self.problem = str(error)
            raise
        self.problem = ""

    def recover(self) -> None:
        """After a start: every GPU with shares has its daemon and limits, no daemon runs for a GPU without."""
        shares = self._shares()
        for gpu_uuid in sorted(set(shares) | set(self.control.running())):
            with contextlib.suppress(MpsError):  # recorded in self.problem: the inventory says so
                self.sync(gpu_uuid)


ISOLATED_UIDS_REASON = ("workloads run as their tenants' own uids (isolation uid), and an MPS control daemon "
                        "serves one uid at a time: another tenant's share on the GPU would wait for the first "
                        "one's to end, and a workload that cannot reach the daemon runs without its limits")


def enforce_shares(backend, state_dir: Path, executable: str, directory: str = "", *, isolated_uids: bool = False):
    """The node's backend with MPS (``executable`` the control program, "" turns MPS off; ``directory`` where the
    daemons' pipe and log directories go, "" for ``STATE_DIR/mps``). With ``isolated_uids`` (the process runtime
    runs each tenant as its own uid) shares are reported unenforced: NVIDIA's control daemon starts one MPS
    server per uid and makes a client of another uid wait until that server's clients are done, so shares of two
    tenants on one GPU cannot both run under it."""
    if not executable:
        return ShareEnforcingBackend(backend, None)
    if isolated_uids:
        return ShareEnforcingBackend(backend, None, reason=ISOLATED_UIDS_REASON)
    return ShareEnforcingBackend(backend, MpsControl(state_dir, executable, directory=Path(directory) if directory
                                                     else None))


__all__ = ["ENFORCED", "UNENFORCED", "MpsControl", "MpsError", "ShareEnforcingBackend", "enforce_shares",
           "share_limits"]
