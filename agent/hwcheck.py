"""``python -m agent.hwcheck``: what an operator runs on a GPU node before enrolling it (docs/agent-protocol.md,
"Hardware check"; README, "Running on real GPUs").

It starts the node agent (``python -m agent``) as a child process on a free loopback port with a throw-away
state directory, and drives it through ``agent.protocol.AgentClient``, signed exactly as the broker signs, so
every check goes the real path: the HTTP server, the backend, the workload runtime. Each check prints one
``PASS`` / ``FAIL`` / ``SKIP`` line; ``--json PATH`` writes the report (the GPU's name, UUID and driver, the date,
and each check's name, status, seconds and detail). Exit status 0 when no check failed, 1 when one did, 2 for
bad arguments.

The truth it compares the agent with: ``nvidia-smi --query-gpu=...`` on the ``nvml`` backend, the declared
shape (``--sim-gpus``) and the GPU catalogue on ``sim`` (the report says which: ``"truth"``).

Default checks (read-only for the device: nothing is partitioned, no mode changes):

- the inventory against the truth; the inventory contracts (``memory_total_mib``, ``memory_reserved_mib``,
  ``memory_mib`` = total − reserved; ``share_enforcement`` per GPU) — a field the agent does not report is a
  FAIL saying so;
- telemetry from ``/metrics`` (dcgm-exporter names) idle, then under a short load through the runtime: a torch
  matmul on a real GPU (SKIP "no CUDA load available" without torch and CUDA), ``agent/perf_workload.py`` with
  the performance model's workload on the simulator (its throughput samples come back to a loopback receiver
  of this check);
- a whole-GPU instance (idempotent create, ``device_uuid``, the ``access`` it gives);
- a workload through the runtime that sees exactly its device and, when the agent runs as root, runs as
  another uid;
- ``kill -9`` of the agent, a restart on the same state directory: the instance and the running workload are
  adopted, nothing is started twice;
- a preemption notice: SIGTERM reaches the workload, which writes a checkpoint with the deadline and exits 0;
- cleanup: every instance deleted, the agent stopped, no process of the check left (on ``nvml``, no new
  compute process on any GPU, read through NVML).

Opt-in: ``--allow-mig-changes`` (the agent is started with it): on one MIG-capable GPU with no instance, each
MIG profile at each valid start, created and destroyed, a mode change refused while an instance is held, then
the mode found restored; a mode is only ever switched with no instance on the GPU. ``--mps``: two shares with
their limits (the ``access`` environment and the workloads' own), and, where the agent enforces shares with
MPS and torch can run, a process over its share's memory cap fails while one within it succeeds.

Bounded: each check has its own bound and the whole run ``--timeout`` (default 300 s): a watchdog ends the checks
at its last quarter (at most 40 s), which cleanup keeps, and the run exits 1. It never resets a GPU: no reset is
called here, and the agent never calls one. Standard library (and the agent); ``pynvml`` only on the ``nvml``
backend, read-only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from agent import __version__
from agent.protocol import AgentClient, AgentHTTPError, AgentUnreachable
from gpus.catalogue import UnknownModel, model_get
from gpus.mig import profiles_for

ROOT = Path(__file__).resolve().parent.parent
NODE_ID = "hwcheck"
PREFIX = "hwcheck-"
WHOLE_ID = "hwcheck-whole"
WORKLOAD_ID = "hwcheck-trap"
# agent/perf_workload.py reads its lease from the workload id, named as the broker names a lease's workload
LOAD_ID = "lease-0-a0"
SIM_GPUS = "h100-80gb:1:whole,h100-80gb:1:shared"
DEFAULT_TIMEOUT = 300
MIN_TIMEOUT = 5
MAX_TIMEOUT = 1800
PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
PERF = {"architecture": "bert-base", "task": "inference", "precision": "bf16", "batch_size": 32, "seq_len": 128}
SMI_FIELDS = ("index", "uuid", "name", "memory.total", "driver_version", "mig.mode.current")

# The workload of the notice check: it counts its starts, says what it sees, and at SIGTERM writes a checkpoint
# holding the deadline the agent wrote into its deadline file, then exits 0.
TRAP = r"""
import json, os, signal, sys, time
ckpt = os.environ["CHECKPOINT_DIR"]
os.makedirs(ckpt, exist_ok=True)
with open(os.path.join(ckpt, "starts"), "a") as f:
    f.write("%d\n" % os.getpid())
seen = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "GPUB_WORKLOAD_ID", "RESTART_COUNT")}
seen["uid"] = os.getuid()
with open(os.path.join(ckpt, "seen.json"), "w") as f:
    json.dump(seen, f)
step = 0
def term(*_):
    try:
        with open(os.environ["GPUB_DEADLINE_FILE"]) as f:
            deadline = f.read().strip()
    except OSError:
        deadline = ""
    with open(os.path.join(ckpt, "checkpoint.tmp"), "w") as f:
        json.dump({"step": step, "deadline": deadline}, f)
    os.replace(os.path.join(ckpt, "checkpoint.tmp"), os.path.join(ckpt, "checkpoint.json"))
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("ready", flush=True)
while True:
    step += 1
    time.sleep(0.05)
"""

# A short CUDA load: matmuls for SECONDS, then exit 0 (SIGTERM ends it early, also 0).
MATMUL = r"""
import signal, sys, time
import torch
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
seconds = float(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
end, n = time.monotonic() + seconds, 0
while time.monotonic() < end:
    c = a @ b
    n += 1
    if n % 20 == 0:
        torch.cuda.synchronize()
torch.cuda.synchronize()
print("matmuls", n, flush=True)
"""

# Allocate MIB MiB on the device and hold it a moment: exit 0 when it could, 3 when CUDA refused (out of memory).
ALLOCATE = r"""
import sys, time
import torch
mib = int(sys.argv[1])
try:
    block = torch.empty(mib * 1024 * 1024, dtype=torch.uint8, device="cuda")
    block.fill_(1)
    torch.cuda.synchronize()
except RuntimeError as error:
    print("refused:", str(error).splitlines()[0], flush=True)
    sys.exit(3)
print("allocated", mib, "MiB", flush=True)
time.sleep(0.5)
"""

PROBE_TORCH = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)"
SHOW_ENV = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in ('CUDA_VISIBLE_DEVICES', "
            "'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE', 'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT')}))")


class CheckFailed(Exception):
    """The check failed; the message is its detail."""


class CheckTimedOut(CheckFailed):
    """A wait of the check ran to its deadline."""


class CheckSkipped(Exception):
    """The check cannot run here; the message is the reason."""


class HardStop(BaseException):
    """The whole run passed its bound (the watchdog's SIGALRM)."""


@dataclass
class CheckResult:
    name: str
    status: str
    seconds: float
    detail: str
    data: dict = field(default_factory=dict)


def wait_for(predicate: Callable[[], object], deadline: float, what: str, step: float = 0.1):
    """The first truthy value of ``predicate()`` before ``deadline`` (monotonic), else ``CheckFailed``."""
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise CheckTimedOut(f"{what}: not within the check's bound")
        time.sleep(step)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def process_group_alive(pgid: int) -> list[int]:
    """The pids of live (not zombie) processes in process group ``pgid``."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            alive.append(int(entry.name))
    return alive


# -- /metrics ---------------------------------------------------------------------------------------------
_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"] or ""))
        try:
            samples.append((match["name"], labels, float(match["value"])))
        except ValueError:
            continue
    return samples


def gpu_series(samples, name: str, uuid: str) -> list[tuple[dict, float]]:
    return [(labels, value) for metric, labels, value in samples if metric == name and labels.get("UUID") == uuid]


# -- the truth -------------------------------------------------------------------------------------------
def nvidia_smi_gpus(fields=SMI_FIELDS) -> list[dict]:
    """``nvidia-smi --query-gpu`` as dicts (``CheckFailed`` when it is missing or fails)."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        raise CheckFailed("nvidia-smi is not on PATH (it comes with the NVIDIA driver)")
    try:
        done = subprocess.run([binary, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise CheckFailed(f"nvidia-smi did not answer: {error}") from None
    if done.returncode != 0:
        raise CheckFailed(f"nvidia-smi exited {done.returncode}: {(done.stderr or done.stdout).strip()[:300]}")
    rows = []
    for line in done.stdout.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) == len(fields):
            rows.append(dict(zip(fields, values, strict=True)))
    return rows


def host_readings() -> dict:
    """What this machine says of its CPU and memory without the agent's code: ``nproc`` and ``MemTotal``, each
    capped by the cgroup v2 limit (``/sys/fs/cgroup/cpu.max``, ``memory.max``) when one is set; the sources named."""
    try:
        nproc = int(subprocess.run(["nproc"], capture_output=True, text=True, timeout=10, check=True).stdout)
    except (OSError, ValueError, subprocess.SubprocessError):
        nproc = os.cpu_count() or 0
    cpu_milli, cpu_source = nproc * 1000, f"nproc {nproc}"
    memory_mib, memory_source = 0, "MemTotal unreadable"
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_mib = int(line.split()[1]) // 1024
                memory_source = f"MemTotal {memory_mib} MiB"
    with contextlib.suppress(OSError, ValueError, ZeroDivisionError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        cpu_source += f", cgroup cpu.max {quota} {period}"
        if quota != "max":
            cpu_milli = min(cpu_milli, int(quota) * 1000 // int(period))
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        memory_source += f", cgroup memory.max {limit}"
        if limit != "max":
            memory_mib = min(memory_mib, int(limit) >> 20) if memory_mib else int(limit) >> 20
    return {"cpu_milli": cpu_milli, "memory_mib": memory_mib, "cpu_source": cpu_source,
            "memory_source": memory_source}


def nvidia_smi_active_links() -> dict[int, int] | None:
    """``nvidia-smi nvlink --status``: the number of active links per GPU index (a link line with a speed, e.g.
    ``Link 0: 26.562 GB/s``; ``<inactive>`` is not active); None when nvidia-smi cannot say."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    try:
        done = subprocess.run([binary, "nvlink", "--status"], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    links: dict[int, int] = {}
    current = None
    for line in done.stdout.splitlines():
        text = line.strip()
        if text.startswith("GPU ") and ":" in text:
            with contextlib.suppress(ValueError):
                current = int(text[4:text.index(":")])
                links.setdefault(current, 0)
        elif current is not None and text.startswith("Link ") and "/s" in text and "inactive" not in text.lower():
            links[current] += 1
    return links


def smi_int(value: str) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


class NvmlProcesses:
    """Compute processes per GPU through NVML (read-only; ``pynvml`` loaded only on the nvml backend)."""

    def __init__(self):
        import pynvml

        self.nv = pynvml
        self.nv.nvmlInit()

    def pids(self) -> dict[str, set[int]]:
        found: dict[str, set[int]] = {}
        for index in range(self.nv.nvmlDeviceGetCount()):
            handle = self.nv.nvmlDeviceGetHandleByIndex(index)
            uuid = self.nv.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            found[uuid] = {p.pid for p in self.nv.nvmlDeviceGetComputeRunningProcesses(handle)}
        return found

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nv.nvmlShutdown()


# -- the loopback receiver of perf_workload.py's samples ----------------------------------------------------
class SampleReceiver:
    """``POST /api/v1/leases/{lease}/samples`` on loopback, as the broker answers agent/perf_workload.py:
    counts the samples that carry the bearer token and a positive throughput."""

    def __init__(self):
        self.token = secrets.token_urlsafe(24)
        self.samples: list[float] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(min(length, 65536))
                if self.headers.get("Authorization") != f"Bearer {receiver.token}":
                    self.send_response(401)
                    self.end_headers()
                    return
                try:
                    value = float(json.loads(body)["throughput"])
                except (ValueError, KeyError, TypeError):
                    self.send_response(422)
                    self.end_headers()
                    return
                receiver.samples.append(value)
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/api/v1/leases/{{lease}}/samples"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- the agent under test ----------------------------------------------------------------------------------
class AgentChild:
    """``python -m agent`` as a child (its own session), standalone: it makes its secret in the state dir."""

    def __init__(self, backend: str, state_dir: Path, work_root: Path, sim_gpus: str, allow_mig_changes: bool):
        self.backend = backend
        self.state_dir = state_dir
        self.work_root = work_root
        self.sim_gpus = sim_gpus
        self.allow_mig_changes = allow_mig_changes
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.log_path = state_dir.parent / f"{state_dir.name}-agent.log"
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, deadline: float) -> None:
        command = [sys.executable, "-m", "agent", "--node-id", NODE_ID, "--listen", f"127.0.0.1:{self.port}",
                   "--backend", self.backend, "--state-dir", str(self.state_dir),
                   "--workload-root", str(self.work_root), "--log-level", "INFO"]
        if self.backend == "sim":
            command += ["--gpus", self.sim_gpus]
        if self.allow_mig_changes:
            command.append("--allow-mig-changes")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                            start_new_session=True)
        self.starts += 1
        probe = AgentClient(self.url, NODE_ID, "-", timeout=2, retries=0)

        def answering():
            if self.process.poll() is not None:
                raise CheckFailed(f"the agent exited {self.process.returncode}: {self.log_tail()}")
            try:
                return probe.healthz().get("status") == "ok"
            except (AgentUnreachable, AgentHTTPError):
                return False

        wait_for(answering, deadline, "the agent's /healthz")

    def client(self) -> AgentClient:
        secret = (self.state_dir / "secret").read_text().strip()
        return AgentClient(self.url, NODE_ID, secret, timeout=10, retries=1, backoff=0.2)

    def kill9(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self, timeout: float = 15) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
            return None

    def log_tail(self, size: int = 1500) -> str:
        try:
            data = self.log_path.read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return ""
        return " ".join(data.split())


# -- the run -----------------------------------------------------------------------------------------------
class HwCheck:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.backend = args.backend
        self.started = time.monotonic()
        # the whole run within --timeout: the checks until its last quarter (at most 40 s), kept for cleanup
        self.cleanup_seconds = min(40.0, max(2.0, args.timeout / 4))
        self.end = self.started + args.timeout
        self.deadline = self.end - self.cleanup_seconds
        self.results: list[CheckResult] = []
        self.keep_state = bool(args.state_dir)
        base = Path(args.state_dir) if args.state_dir else Path(tempfile.mkdtemp(prefix="hwcheck-"))
        base.mkdir(parents=True, exist_ok=True)
        self.base = base
        self.state_dir = base / "state"
        self.work_root = base / "work"
        self.state_dir.mkdir(mode=0o700, exist_ok=True)
        self.work_root.mkdir(exist_ok=True)
        # a workload of another uid (an agent that isolates them) must reach its directories: read and traverse only
        os.chmod(base, 0o755)  # noqa: S103
        os.chmod(self.work_root, 0o755)  # noqa: S103
        self.agent = AgentChild(self.backend, self.state_dir, self.work_root, args.sim_gpus, args.allow_mig_changes)
        self.client: AgentClient | None = None
        self.inventory: dict = {}
        self.truth: list[dict] = []
        self.target: dict | None = None  # the GPU of the whole-instance and workload checks
        self.target_reason = "no GPU chosen"
        self.idle: dict = {}
        self.pgids: set[int] = set()  # the process groups of every workload run (the shim leads each)
        self.compute_before: dict[str, set[int]] = {}
        self.torch_ok: bool | None = None
        self.torch_reason = ""
        self.driver = "sim" if self.backend == "sim" else ""

    # -- plumbing -------------------------------------------------------------------------------------------
    def run(self, name: str, bound: float, check: Callable[[float], str | tuple[str, dict]]) -> CheckResult:
        started = time.monotonic()
        deadline = min(started + bound, self.deadline)
        data: dict = {}
        try:
            outcome = check(deadline)
            detail, data = outcome if isinstance(outcome, tuple) else (outcome, {})
            status = PASS
        except CheckSkipped as skipped:
            status, detail = SKIP, str(skipped)
        except CheckTimedOut as late:
            status, detail = FAIL, str(late)
            if deadline == self.deadline and name != "cleanup":
                # the run's bound, shorter than the check's, cut it: the last check before cleanup
                self.record(CheckResult(name, FAIL, round(time.monotonic() - started, 2),
                                        f"the whole run passed its bound of {self.args.timeout} s ({detail})"))
                raise HardStop from None
        except CheckFailed as failed:
            status, detail = FAIL, str(failed)
        except Exception as error:  # noqa: BLE001 - a check's own crash (NVML, the agent, a file) is its FAIL
            status, detail = FAIL, f"{type(error).__name__}: {error}"
        except HardStop:
            status, detail = FAIL, f"the whole run passed its bound of {self.args.timeout} s (SIGALRM)"
            self.record(CheckResult(name, status, round(time.monotonic() - started, 2), detail))
            raise
        seconds = time.monotonic() - started
        if status == PASS and seconds > bound:
            status, detail = FAIL, f"took {seconds:.1f} s, over its bound of {bound:g} s ({detail})"
        return self.record(CheckResult(name, status, round(seconds, 2), detail, data))

    def record(self, result: CheckResult) -> CheckResult:
        self.results.append(result)
        print(f"{result.status}  {result.name:<28} {result.seconds:6.1f} s  {result.detail}", flush=True)
        return result

    def passed(self, name: str) -> bool:
        return any(r.name == name and r.status == PASS for r in self.results)

    def gpus(self) -> list[dict]:
        self.inventory = self.client.inventory()
        return self.inventory.get("gpus", [])

    def metrics(self) -> list:
        return parse_metrics(self.client.metrics())

    def workload_state(self, workload_id: str) -> dict:
        workload = self.client.workload(workload_id)
        for run in workload.get("runs", []):
            if run.get("pid"):
                self.pgids.add(run["pid"])
        return workload

    def wait_final(self, workload_id: str, deadline: float) -> dict:
        return wait_for(lambda: (w := self.workload_state(workload_id))["state"] not in ("running", "backoff") and w,
                        deadline, f"workload {workload_id} to end")

    def stderr_tail(self, workload_id: str) -> str:
        with contextlib.suppress(AgentHTTPError, AgentUnreachable):
            data = self.client.workload_logs(workload_id, stream="stderr", tail=600)["data"]
            return " ".join(data.split())[-600:]
        return ""

    def has_torch(self, device: str, deadline: float) -> bool:
        """Whether this interpreter (the workloads' too) can run CUDA through torch on ``device``: asked once,
        in a child, within the check's bound."""
        if self.torch_ok is None:
            try:
                done = subprocess.run([sys.executable, "-c", PROBE_TORCH], capture_output=True, text=True,
                                      timeout=max(1.0, min(90.0, deadline - time.monotonic() - 5)),
                                      env={**os.environ, "CUDA_VISIBLE_DEVICES": device}, check=False)
                self.torch_ok = done.returncode == 0
                last = (done.stderr.strip().splitlines() or [""])[-1][-200:]
                self.torch_reason = ("torch sees no CUDA device" if done.returncode == 3
                                     else f"torch cannot run with {sys.executable}: {last}")
            except (OSError, subprocess.TimeoutExpired) as error:
                self.torch_ok, self.torch_reason = False, f"torch did not answer: {error}"
        return self.torch_ok

    # -- checks ---------------------------------------------------------------------------------------------
    def check_agent_start(self, deadline: float) -> str:
        if self.backend == "nvml":
            with contextlib.suppress(Exception):
                probe = NvmlProcesses()
                try:
                    self.compute_before = probe.pids()
                finally:
                    probe.close()
        self.agent.start(deadline)
        self.client = self.agent.client()
        health = self.client.healthz()
        if health.get("backend") != self.backend:
            raise CheckFailed(f"the agent runs the {health.get('backend')!r} backend, not {self.backend!r}")
        return f"agent {health.get('version')} ({self.backend}, protocol {health.get('protocol')}) on {self.agent.url}"

    def check_inventory(self, deadline: float) -> tuple[str, dict]:
        gpus = self.gpus()
        if self.backend == "sim":
            from agent.sim import parse_gpu_specs

            truth = []
            for code, count, mode in parse_gpu_specs(self.args.sim_gpus):
                model = model_get(code)
                truth += [{"index": len(truth) + n, "name": model.vendor_name, "model": code, "mode": mode,
                           "memory_total_mib": model.memory_mib, "uuid": None} for n in range(count)]
        else:
            truth = []
            for row in nvidia_smi_gpus():
                mig = row["mig.mode.current"].lower() == "enabled"
                truth.append({"index": smi_int(row["index"]), "name": row["name"], "uuid": row["uuid"],
                              "memory_total_mib": smi_int(row["memory.total"]), "mode": "mig" if mig else None,
                              "driver": row["driver_version"]})
                self.driver = row["driver_version"]
        self.truth = truth
        problems = []
        if len(gpus) != len(truth):
            problems.append(f"the agent reports {len(gpus)} GPU(s), the {self.truth_name()} {len(truth)}")
        by_index = {g.get("index"): g for g in gpus}
        for want in truth:
            got = by_index.get(want["index"])
            if got is None:
                problems.append(f"GPU {want['index']} is missing from the inventory")
                continue
            if want["uuid"] and got.get("uuid") != want["uuid"]:
                problems.append(f"GPU {want['index']}: uuid {got.get('uuid')} vs {want['uuid']}")
            if got.get("name") != want["name"]:
                problems.append(f"GPU {want['index']}: name {got.get('name')!r} vs {want['name']!r}")
            total = got.get("memory_total_mib", got.get("memory_mib"))
            if total != want["memory_total_mib"]:
                problems.append(f"GPU {want['index']}: memory {total} MiB vs {want['memory_total_mib']} MiB")
            if want["mode"] == "mig" and got.get("mode") != "mig":
                problems.append(f"GPU {want['index']}: MIG is enabled but the agent says {got.get('mode')!r}")
            if want["mode"] and want["mode"] != "mig" and got.get("mode") != want["mode"]:
                problems.append(f"GPU {want['index']}: mode {got.get('mode')!r} vs {want['mode']!r}")
            if self.backend == "nvml" and want["mode"] is None and got.get("mode") == "mig":
                problems.append(f"GPU {want['index']}: the agent says mig, nvidia-smi says MIG is not enabled")
        if problems:
            raise CheckFailed("; ".join(problems))
        first = gpus[0] if gpus else {}
        return (f"{len(gpus)} GPU(s) as the {self.truth_name()} has them: "
                + ", ".join(f"{g.get('index')}={g.get('name')} {g.get('mode')}" for g in gpus),
                {"gpus": [{k: g.get(k) for k in ("index", "uuid", "name", "mode")} for g in gpus],
                 "first": first.get("uuid")})

    def truth_name(self) -> str:
        return "sim's declared shape" if self.backend == "sim" else "nvidia-smi"

    def check_memory_fields(self, deadline: float) -> str:
        gpus = self.inventory.get("gpus") or self.gpus()
        smi_reserved: dict[str, int | None] = {}
        if self.backend == "nvml":
            with contextlib.suppress(CheckFailed):
                smi_reserved = {r["uuid"]: smi_int(r["memory.reserved"])
                                for r in nvidia_smi_gpus(("uuid", "memory.reserved"))}
        truth = {t["index"]: t for t in self.truth}
        shown = []
        for gpu in gpus:
            for name in ("memory_total_mib", "memory_reserved_mib", "memory_mib"):
                value = gpu.get(name)
                if value is None:
                    raise CheckFailed(f"agent does not report {name} (GPU {gpu.get('index')})")
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise CheckFailed(f"GPU {gpu.get('index')}: {name} must be a whole number of MiB, got {value!r}")
            total, reserved, usable = gpu["memory_total_mib"], gpu["memory_reserved_mib"], gpu["memory_mib"]
            if usable != total - reserved or not 0 < usable <= total:
                raise CheckFailed(f"GPU {gpu.get('index')}: memory_mib {usable} is not memory_total_mib {total} "
                                  f"- memory_reserved_mib {reserved}")
            want = truth.get(gpu.get("index"), {}).get("memory_total_mib")
            if want is not None and total != want:
                raise CheckFailed(f"GPU {gpu.get('index')}: memory_total_mib {total} vs {want} ({self.truth_name()})")
            if smi_reserved.get(gpu.get("uuid")) is not None and reserved != smi_reserved[gpu["uuid"]]:
                raise CheckFailed(f"GPU {gpu.get('index')}: memory_reserved_mib {reserved} vs nvidia-smi's "
                                  f"memory.reserved {smi_reserved[gpu['uuid']]}")
            shown.append(f"{gpu.get('index')}: {total} - {reserved} = {usable} MiB")
        return "; ".join(shown)

    def check_host_topology(self, deadline: float) -> tuple[str, dict]:
        """The host's CPU and memory and each GPU's NVLink domain, against what the machine says otherwise:
        ``nproc`` (the CPUs this process may use) and ``MemTotal``, each capped by the cgroup's ``cpu.max`` /
        ``memory.max`` where one is set, and ``nvidia-smi nvlink --status`` (a GPU with an active link has a
        domain, one without has none); on ``sim`` the declared shape (14 cores and 256 GiB per GPU)."""
        data = self.inventory if self.inventory.get("gpus") else (self.gpus() and self.inventory)
        cpu, memory = data.get("host_cpu_milli"), data.get("host_memory_mib")
        for name, value in (("host_cpu_milli", cpu), ("host_memory_mib", memory)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise CheckFailed(f"agent reports {name}={value!r}: a positive whole number is needed")
        gpus = data.get("gpus", [])
        readings: dict = {}
        if self.backend == "sim":
            from agent.sim import SIM_CPU_MILLI_PER_GPU, SIM_MEMORY_MIB_PER_GPU

            want_cpu, want_memory = SIM_CPU_MILLI_PER_GPU * len(gpus), SIM_MEMORY_MIB_PER_GPU * len(gpus)
            linked = None
        else:
            readings = host_readings()
            want_cpu, want_memory = readings["cpu_milli"], readings["memory_mib"]
            linked = nvidia_smi_active_links()
        problems = []
        if want_cpu and cpu != want_cpu:
            problems.append(f"host_cpu_milli {cpu} vs {want_cpu} ({readings.get('cpu_source', 'the shape')})")
        if want_memory and abs(memory - want_memory) > 1:
            problems.append(f"host_memory_mib {memory} vs {want_memory} ({readings.get('memory_source', 'the shape')})")
        domains = {}
        for gpu in gpus:
            if "nvlink_domain" not in gpu:
                problems.append(f"GPU {gpu.get('index')}: no nvlink_domain in the inventory")
                continue
            domain = gpu["nvlink_domain"]
            domains[gpu.get("index")] = domain
            if linked is not None and gpu.get("index") in linked:
                if linked[gpu["index"]] and not domain:
                    problems.append(f"GPU {gpu['index']}: nvidia-smi shows {linked[gpu['index']]} active NVLink "
                                    "link(s), the agent no domain")
                if not linked[gpu["index"]] and domain:
                    problems.append(f"GPU {gpu['index']}: no active NVLink link, the agent says domain {domain!r}")
        if problems:
            raise CheckFailed("; ".join(problems))
        shown = ", ".join(f"{index}={domain or '(none)'}" for index, domain in domains.items())
        links = "" if linked is None else " (active links per GPU: " + ", ".join(
            f"{index}={count}" for index, count in sorted(linked.items())) + ")"
        return (f"host {cpu:,} milli-CPU, {memory:,} MiB"
                + (f" = {readings['cpu_source']}; {readings['memory_source']}" if readings else " = the sim's shape")
                + f"; NVLink domains {shown}{links}",
                {"host_cpu_milli": cpu, "host_memory_mib": memory, "nvlink_domains": domains,
                 "readings": readings, "active_links": linked})

    def check_share_enforcement(self, deadline: float) -> str:
        shown = []
        for gpu in self.inventory.get("gpus") or self.gpus():
            value = gpu.get("share_enforcement")
            if value is None:
                raise CheckFailed(f"agent does not report share_enforcement (GPU {gpu.get('index')})")
            mode = enforcement_mode(value)
            if mode not in ("mps", "none"):
                raise CheckFailed(f"GPU {gpu.get('index')}: share_enforcement must be 'mps' or 'none', got {value!r}")
            shown.append(f"{gpu.get('index')}: {mode}")
        return "; ".join(shown)

    def pick_target(self) -> dict:
        gpus = self.gpus()
        if self.args.gpu is not None:
            chosen = [g for g in gpus if self.args.gpu in (g.get("uuid"), str(g.get("index")))]
            if not chosen:
                raise CheckSkipped(f"--gpu {self.args.gpu}: no such GPU in the inventory")
        else:
            chosen = [g for g in gpus if g.get("mode") == "whole"]
        held = {i.get("gpu") for i in self.inventory.get("instances", [])}
        free = [g for g in chosen if g.get("mode") == "whole" and g.get("uuid") not in held]
        if not free:
            raise CheckSkipped("no GPU in whole mode without instances (MIG enabled or shared everywhere)")
        return free[0]

    def check_telemetry_idle(self, deadline: float) -> tuple[str, dict]:
        try:
            self.target = self.pick_target()
        except CheckSkipped as why:
            self.target, self.target_reason = None, str(why)
        gpus = self.gpus()
        first, first_at = self.metrics(), time.monotonic()
        time.sleep(max(0.0, min(1.0, deadline - time.monotonic() - 1)))
        second, second_at = self.metrics(), time.monotonic()
        smi_power = {}
        if self.backend == "nvml":
            with contextlib.suppress(CheckFailed):
                smi_power = {r["uuid"]: float(r["power.draw"]) for r in nvidia_smi_gpus(("uuid", "power.draw"))
                             if smi_int(r["power.draw"]) is not None}
        shown, idle, problems = [], {}, []
        for gpu in gpus:
            uuid, index = gpu["uuid"], gpu.get("index")
            power = gpu_series(second, "DCGM_FI_DEV_POWER_USAGE", uuid)
            energy0 = gpu_series(first, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", uuid)
            energy1 = gpu_series(second, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", uuid)
            if len(power) != 1 or len(energy1) != 1 or len(energy0) != 1:
                problems.append(f"GPU {index}: expected one power and one energy series, got {len(power)} and "
                                f"{len(energy1)}")
                continue
            watts, joules = power[0][1], (energy1[0][1] - energy0[0][1]) / 1000
            if energy1[0][1] < energy0[0][1]:
                problems.append(f"GPU {index}: the energy counter went down ({energy0[0][1]} -> {energy1[0][1]})")
            if not 0 < watts < 2000:
                problems.append(f"GPU {index}: power {watts} W is not a plausible reading")
            if self.backend == "sim" and gpu.get("mode") != "mig":
                model = model_get(gpu["model"])
                expected = model.idle_power_w * (second_at - first_at)
                if abs(watts - model.idle_power_w) > 0.5:
                    problems.append(f"GPU {index}: idle power {watts} W, the model's idle is {model.idle_power_w} W")
                elif not 0.5 * expected <= joules <= 2 * expected + 1:
                    problems.append(f"GPU {index}: energy grew {joules:.1f} J in {second_at - first_at:.2f} s at "
                                    f"{watts} W")
            elif uuid in smi_power and abs(watts - smi_power[uuid]) > max(30.0, 0.2 * smi_power[uuid]):
                problems.append(f"GPU {index}: power {watts} W, nvidia-smi says {smi_power[uuid]} W")
            util = gpu_series(second, "DCGM_FI_DEV_GPU_UTIL", uuid)
            if gpu.get("mode") == "whole":
                if len(util) != 1 or not 0 <= util[0][1] <= 100:
                    problems.append(f"GPU {index}: a whole GPU has one DCGM_FI_DEV_GPU_UTIL series of 0..100 %, got "
                                    f"{[value for _, value in util]}")
                    continue
                fb = gpu_series(second, "DCGM_FI_DEV_FB_USED", uuid)
                idle[uuid] = {"watts": watts, "util": util[0][1], "fb_used_mib": fb[0][1] if fb else None}
                if util[0][1] > 10 and self.target is not None and uuid == self.target["uuid"]:
                    problems.append(f"GPU {index} is not idle: {util[0][1]} % busy before the check put any load")
            elif gpu.get("mode") == "mig" and util:
                problems.append(f"GPU {index}: a MIG-mode GPU has no GPU-level utilisation, yet it has {len(util)}")
            shown.append(f"{index}: {watts:g} W, +{joules:.1f} J in {second_at - first_at:.1f} s"
                         + (f", {util[0][1]:g} %" if util else ""))
        if problems:
            raise CheckFailed("; ".join(problems))
        self.idle = idle
        return "; ".join(shown), {"idle": idle}

    def check_whole_instance(self, deadline: float) -> tuple[str, dict]:
        if self.target is None:
            raise CheckSkipped(self.target_reason)
        gpu = self.target
        spec = {"kind": "whole", "gpu": gpu["uuid"]}
        created = self.client.create(WHOLE_ID, spec)
        again = self.client.create(WHOLE_ID, spec)
        if again != created:
            raise CheckFailed("the same create again answered another instance")
        instance = self.client.instance(WHOLE_ID)
        if instance.get("kind") != "whole" or instance.get("gpu") != gpu["uuid"]:
            raise CheckFailed(f"the instance is {instance.get('kind')} on {instance.get('gpu')}, not whole on "
                              f"{gpu['uuid']}")
        access = instance.get("access") or {}
        if access.get("CUDA_VISIBLE_DEVICES") != gpu["uuid"]:
            raise CheckFailed(f"access CUDA_VISIBLE_DEVICES is {access.get('CUDA_VISIBLE_DEVICES')!r}, not the GPU's "
                              f"UUID {gpu['uuid']}")
        try:
            self.client.set_gpu_mode(gpu["uuid"], "shared")
        except AgentHTTPError as refused:
            if refused.status not in (403, 409):
                raise CheckFailed(f"a mode change of a held GPU answered {refused.status}, not 409/403") from None
        else:
            raise CheckFailed("the agent changed the mode of a GPU that holds an instance")
        series = [labels for labels, _ in gpu_series(self.metrics(), "DCGM_FI_DEV_GPU_UTIL", gpu["uuid"])]
        if not any(labels.get("allocation_id") == WHOLE_ID for labels in series):
            raise CheckFailed("/metrics does not label the held GPU with the instance's allocation_id")
        return (f"{WHOLE_ID} on GPU {gpu.get('index')} ({gpu.get('name')}); idempotent; a mode change refused while "
                "held; /metrics labels it", {"gpu": gpu["uuid"]})

    def check_device_uuid(self, deadline: float) -> str:
        if not self.passed("whole_instance"):
            raise CheckSkipped("no whole-GPU instance to read (see whole_instance)")
        instance = self.client.instance(WHOLE_ID)
        if not instance.get("device_uuid"):
            raise CheckFailed("agent does not report device_uuid (empty) for a whole-GPU instance")
        if instance["device_uuid"] != self.target["uuid"]:
            raise CheckFailed(f"device_uuid {instance['device_uuid']} is not the GPU's UUID {self.target['uuid']}")
        return f"device_uuid = {instance['device_uuid']}"

    def check_telemetry_load(self, deadline: float) -> tuple[str, dict]:
        if not self.passed("whole_instance"):
            raise CheckSkipped("no whole-GPU instance to load (see whole_instance)")
        uuid = self.target["uuid"]
        idle = self.idle.get(uuid) or {}
        receiver = expected = None
        if self.backend == "sim":
            expected = sim_load_expected(self.target["model"])
            # a copy in its own working directory: an isolating agent shows a workload its directories, not ours
            load_dir = self.work_root / "load"
            load_dir.mkdir(exist_ok=True)
            shutil.copyfile(ROOT / "agent" / "perf_workload.py", load_dir / "perf_workload.py")
            receiver = SampleReceiver()
            spec = {"instances": [WHOLE_ID], "command": [sys.executable, str(load_dir / "perf_workload.py")],
                    "workdir": str(load_dir), "env": {"PERF_SAMPLES_URL": receiver.url, "PERF_INTERVAL_SECONDS": "0.2"},
                    "secret_env": {"PERF_TOKEN": receiver.token}, "perf": PERF}
        else:
            if not self.has_torch(uuid, deadline):
                raise CheckSkipped(f"no CUDA load available ({self.torch_reason})")
            spec = {"instances": [WHOLE_ID], "command": [sys.executable, "-c", MATMUL], "args": ["20"]}
        try:
            self.client.workload_start(LOAD_ID, spec)
            self.workload_state(LOAD_ID)

            def loaded():
                if self.workload_state(LOAD_ID)["state"] != "running":
                    raise CheckFailed(f"the load ended early: {self.stderr_tail(LOAD_ID)}")
                samples = self.metrics()
                util = gpu_series(samples, "DCGM_FI_DEV_GPU_UTIL", uuid)
                power = gpu_series(samples, "DCGM_FI_DEV_POWER_USAGE", uuid)
                fb = gpu_series(samples, "DCGM_FI_DEV_FB_USED", uuid)
                if not (util and power and fb):
                    return None
                if expected is not None:  # the simulator: the series follow the performance model exactly
                    util_want, power_want, fb_want = expected
                    reserved = self.target.get("memory_reserved_mib") or 0  # (where the sim models the driver's)
                    if (abs(util[0][1] - util_want) <= 0.2 and abs(power[0][1] - power_want) <= 1
                            and fb_want - 1 <= fb[0][1] <= fb_want + reserved + 1 and receiver.samples):
                        return util[0][1], power[0][1], fb[0][1]
                    return None
                busy = util[0][1] >= 50
                hotter = power[0][1] > idle.get("watts", 0) + 20
                fuller = fb[0][1] > (idle.get("fb_used_mib") or 0) + 100
                return (util[0][1], power[0][1], fb[0][1]) if busy and hotter and fuller else None

            util, watts, fb = wait_for(loaded, deadline - 15, "utilisation, power and memory to rise under load",
                                       step=0.5)
            self.client.workload_stop(LOAD_ID, grace_seconds=10, reason="hwcheck: load done")
            ended = self.wait_final(LOAD_ID, deadline)
        finally:
            if receiver is not None:
                receiver.close()
            with contextlib.suppress(AgentHTTPError, AgentUnreachable):  # a failed check leaves no load running
                if self.client.workload(LOAD_ID)["state"] in ("running", "backoff"):
                    self.client.workload_stop(LOAD_ID, grace_seconds=0, reason="hwcheck: load check failed")
                    with contextlib.suppress(CheckFailed):
                        self.wait_final(LOAD_ID, time.monotonic() + 5)
        last = ended["runs"][-1]
        if last.get("exit_code") != 0:
            raise CheckFailed(f"the load exited {last.get('exit_code')} (signal {last.get('signal')}): "
                              f"{self.stderr_tail(LOAD_ID)}")
        what = (f"agent/perf_workload.py ({PERF['architecture']}), {len(receiver.samples)} throughput sample(s) "
                f"received, {receiver.samples[-1]:.0f}/s" if receiver is not None else "torch matmul")
        return (f"{what}: {idle.get('util', 0):g} -> {util:g} %, {idle.get('watts', 0):g} -> {watts:g} W, "
                f"fb {idle.get('fb_used_mib')} -> {fb:g} MiB; exited 0 at the stop",
                {"util_pct": util, "power_w": watts, "fb_used_mib": fb})

    def check_workload(self, deadline: float) -> tuple[str, dict]:
        if not self.passed("whole_instance"):
            raise CheckSkipped("no whole-GPU instance to run on (see whole_instance)")
        checkpoint = self.work_root / "trap"
        checkpoint.mkdir(exist_ok=True)
        os.chmod(checkpoint, 0o755)  # noqa: S103 (the agent gives it to the workload's uid)
        started = self.client.workload_start(WORKLOAD_ID, {
            "instances": [WHOLE_ID], "command": [sys.executable, "-c", TRAP], "checkpoint_dir": str(checkpoint),
            "restart_policy": "never"})
        if started.get("state") != "running":
            raise CheckFailed(f"the workload is {started.get('state')}, not running: {self.stderr_tail(WORKLOAD_ID)}")
        self.workload_state(WORKLOAD_ID)

        def seen():
            if self.workload_state(WORKLOAD_ID)["state"] != "running":
                raise CheckFailed(f"the workload ended: {self.stderr_tail(WORKLOAD_ID)}")
            path = checkpoint / "seen.json"
            return json.loads(path.read_text()) if path.exists() and path.stat().st_size else None

        found = wait_for(seen, deadline, "the workload to start and write what it sees")
        device = self.client.instance(WHOLE_ID).get("device_uuid") or self.target["uuid"]
        if found.get("CUDA_VISIBLE_DEVICES") != device:
            raise CheckFailed(f"the workload sees CUDA_VISIBLE_DEVICES={found.get('CUDA_VISIBLE_DEVICES')!r}, "
                              f"not {device}")
        if found.get("GPUB_WORKLOAD_ID") != WORKLOAD_ID:
            raise CheckFailed(f"GPUB_WORKLOAD_ID is {found.get('GPUB_WORKLOAD_ID')!r}")
        self.workload_uid = found.get("uid")
        return (f"{WORKLOAD_ID} running through the {started.get('runtime')} runtime, CUDA_VISIBLE_DEVICES={device}",
                {"uid": found.get("uid")})

    def check_workload_uid(self, deadline: float) -> str:
        uid = getattr(self, "workload_uid", None)
        if uid is None:
            raise CheckSkipped("no workload ran (see workload)")
        isolation = self.inventory.get("isolation")
        said = f" (inventory isolation: {isolation!r})" if isolation is not None else ""
        if os.geteuid() == 0:
            if uid == 0:
                raise CheckFailed(f"the agent runs as root and so did the workload (uid 0): workloads are not "
                                  f"isolated{said}")
            return f"the agent runs as root; the workload ran as uid {uid}{said}"
        if uid != os.geteuid():
            raise CheckFailed(f"the workload ran as uid {uid}, the agent (not root) as {os.geteuid()}")
        return f"the agent is not root: the workload ran as its uid {uid}, not isolated{said}"

    def check_adoption(self, deadline: float) -> str:
        if not self.passed("workload"):
            raise CheckSkipped("no running workload to adopt (see workload)")
        before = self.workload_state(WORKLOAD_ID)
        run = before["runs"][-1]
        old_pid = self.agent.process.pid
        self.agent.kill9()
        if process_group_alive(run["pid"]) == []:
            raise CheckFailed("the workload died with the agent")
        self.agent.start(deadline)
        self.client = self.agent.client()
        instance = self.client.instance(WHOLE_ID)
        if instance.get("gpu") != self.target["uuid"] or instance.get("state", "active") != "active":
            raise CheckFailed(f"the restarted agent holds {WHOLE_ID} as {instance}")
        after = self.workload_state(WORKLOAD_ID)
        if after["state"] != "running":
            raise CheckFailed(f"after the restart the workload is {after['state']}, not running")
        if len(after["runs"]) != 1 or after["runs"][0]["pid"] != run["pid"]:
            raise CheckFailed(f"the restarted agent started the workload again (runs: {len(after['runs'])})")
        starts = (self.work_root / "trap" / "starts").read_text().split()
        if len(starts) != 1:
            raise CheckFailed(f"the workload's process started {len(starts)} times")
        return (f"agent pid {old_pid} killed with SIGKILL, restarted as {self.agent.process.pid}: {WHOLE_ID} and "
                f"{WORKLOAD_ID} (pid {run['pid']}) adopted, started once")

    def check_notice(self, deadline: float) -> tuple[str, dict]:
        if not self.passed("workload"):
            raise CheckSkipped("no running workload to notice (see workload)")
        deadline_at = round(time.time() + 30, 3)
        noticed = self.client.notice(WHOLE_ID, deadline_at, "hwcheck: preemption notice")
        if not (noticed.get("notice") or {}).get("deadline"):
            raise CheckFailed("the instance does not show the notice")
        ended = self.wait_final(WORKLOAD_ID, deadline)
        run = ended["runs"][-1]
        if ended["state"] != "preempted":
            raise CheckFailed(f"the workload ended {ended['state']}, not preempted")
        if run.get("exit_code") != 0:
            raise CheckFailed(f"the workload exited {run.get('exit_code')} (signal {run.get('signal')}), not 0 after "
                              f"its checkpoint: {self.stderr_tail(WORKLOAD_ID)}")
        path = self.work_root / "trap" / "checkpoint.json"
        if not path.exists():
            raise CheckFailed("no checkpoint was written at SIGTERM")
        checkpoint = json.loads(path.read_text())
        if not checkpoint.get("deadline") or abs(float(checkpoint["deadline"]) - deadline_at) > 0.01:
            raise CheckFailed(f"the checkpoint holds deadline {checkpoint.get('deadline')!r}, the notice {deadline_at}")
        took = run["ended_at"] - (ended.get("notice") or {}).get("at", run["ended_at"])
        return (f"SIGTERM at the notice; checkpoint at step {checkpoint['step']} with the deadline; exit 0 "
                f"{took:.2f} s after the notice", {"seconds_to_exit": round(took, 3)})

    def check_release(self, deadline: float) -> str:
        answers = [self.client.destroy(i["allocation_id"]) for i in self.client.inventory()["instances"]
                   if i["allocation_id"].startswith(PREFIX)]
        left = [i["allocation_id"] for i in self.client.inventory()["instances"]]
        if left:
            raise CheckFailed(f"instances left after delete: {left}")

        def live() -> list[str]:
            return [w["workload_id"] for w in self.client.workloads() if w["state"] in ("running", "backoff")]

        with contextlib.suppress(CheckFailed):
            wait_for(lambda: not live(), min(deadline, time.monotonic() + 5), "the workloads to end")
        if still := live():
            raise CheckFailed(f"workloads still live 5 s after their instance went: {still}")
        return f"{len(answers)} instance(s) deleted; no live workload"

    def check_mig(self, deadline: float) -> tuple[str, dict]:
        gpus = self.gpus()
        held = {i.get("gpu") for i in self.inventory.get("instances", [])}
        capable = []
        for gpu in gpus:
            with contextlib.suppress(UnknownModel):
                if model_get(gpu.get("model", "")).mig_capable:
                    capable.append(gpu)
        if self.args.gpu is not None:
            capable = [g for g in capable if self.args.gpu in (g.get("uuid"), str(g.get("index")))]
        if not capable:
            raise CheckSkipped("no MIG-capable GPU on this node")
        free = [g for g in capable if g["uuid"] not in held and not g.get("mig_layout")]
        if not free:
            raise CheckFailed("every MIG-capable GPU holds an instance or a GPU instance: hwcheck switches a mode only "
                              "with no instance present")
        gpu = free[0]
        found = gpu["mode"]
        placements, refused = 0, ""
        try:
            if found != "mig":
                try:
                    self.client.set_gpu_mode(gpu["uuid"], "mig")
                except AgentHTTPError as refused:
                    if refused.status != 409:
                        raise
                    raise CheckFailed(
                        f"enabling MIG on GPU {gpu.get('index')} was refused: {refused.problem.get('detail')}; "
                        f"hwcheck resets no GPU. If the change is left pending on the device, `nvidia-smi -i "
                        f"{gpu.get('index')} -mig 0` cancels it") from None
            for profile in profiles_for(gpu["model"]):
                for start in profile.starts:
                    if time.monotonic() > deadline - 10:
                        raise CheckFailed(f"out of time after {placements} placement(s)")
                    allocation_id = f"{PREFIX}mig-{profile.name.replace('+', '-')}-{start}"
                    instance = self.client.create(allocation_id, {"kind": "mig", "gpu": gpu["uuid"],
                                                                  "profile": profile.name, "start": start})
                    if instance.get("profile") != profile.name or instance.get("start") != start:
                        raise CheckFailed(f"{profile.name}@{start}: the agent made {instance.get('profile')}@"
                                          f"{instance.get('start')}")
                    if not str(instance.get("device_uuid", "")).startswith("MIG-"):
                        raise CheckFailed(f"{profile.name}@{start}: device_uuid {instance.get('device_uuid')!r} is not "
                                          "a MIG device UUID")
                    layout = next(g for g in self.gpus() if g["uuid"] == gpu["uuid"]).get("mig_layout", [])
                    if [(e.get("profile"), e.get("start")) for e in layout] != [(profile.name, start)]:
                        raise CheckFailed(f"{profile.name}@{start}: the GPU's layout is {layout}")
                    if not refused:
                        try:
                            self.client.set_gpu_mode(gpu["uuid"], "whole")
                            raise CheckFailed("the agent switched MIG off on a GPU holding a MIG instance")
                        except AgentHTTPError as error:
                            if error.status != 409:
                                raise CheckFailed(f"a mode change with an instance answered {error.status}, not 409"
                                                  ) from None
                            refused = "a mode change refused (409) while it held an instance"
                    if not self.client.destroy(allocation_id).get("existed"):
                        raise CheckFailed(f"{profile.name}@{start}: the delete found no instance")
                    placements += 1
            after = next(g for g in self.gpus() if g["uuid"] == gpu["uuid"])
            if after.get("mig_layout"):
                raise CheckFailed(f"GPU instances left: {after['mig_layout']}")
        finally:
            for instance in self.client.inventory()["instances"]:
                if instance["allocation_id"].startswith(f"{PREFIX}mig-"):
                    self.client.destroy(instance["allocation_id"])
            now = next(g for g in self.gpus() if g["uuid"] == gpu["uuid"])["mode"]
            if now != found:
                self.client.set_gpu_mode(gpu["uuid"], found)
        restored = next(g for g in self.gpus() if g["uuid"] == gpu["uuid"])["mode"]
        if restored != found:
            raise CheckFailed(f"the mode found ({found}) was not restored: {restored}")
        return (f"GPU {gpu.get('index')} ({gpu['model']}): {placements} placement(s), every profile at every valid "
                f"start, created and destroyed; {refused}; mode {found} restored",
                {"gpu": gpu["uuid"], "mode_found": found, "mode_after": restored, "placements": placements})

    def share_gpu(self) -> tuple[dict, str]:
        """A GPU for two shares (shared mode, or a whole one switched to it) and the mode to restore."""
        gpus = self.gpus()
        held = {i.get("gpu") for i in self.inventory.get("instances", [])}
        candidates = [g for g in gpus if g["uuid"] not in held and g.get("mode") in ("shared", "whole")]
        if self.args.gpu is not None:
            candidates = [g for g in candidates if self.args.gpu in (g.get("uuid"), str(g.get("index")))]
        candidates.sort(key=lambda g: g.get("mode") != "shared")
        if not candidates:
            raise CheckSkipped("no GPU in shared or whole mode without instances")
        gpu = candidates[0]
        if gpu["mode"] == "whole":
            with contextlib.suppress(AgentHTTPError):  # an agent that keeps no modes takes shares on a plain GPU
                self.client.set_gpu_mode(gpu["uuid"], "shared")
        return gpu, gpu["mode"]

    def check_mps_shares(self, deadline: float) -> tuple[str, dict]:
        gpu, found = self.share_gpu()
        self.share_target = (gpu, found)
        usable = gpu.get("memory_mib", 0)
        asks = {f"{PREFIX}share-a": (300, min(2048, usable // 4)), f"{PREFIX}share-b": (200, min(2048, usable // 4))}
        for allocation_id, (milli, memory) in asks.items():
            instance = self.client.create(allocation_id, {"kind": "share", "gpu": gpu["uuid"], "milli": milli,
                                                          "memory_mib": memory})
            access = instance.get("access") or {}
            want = {"CUDA_VISIBLE_DEVICES": gpu["uuid"],
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(math.ceil(milli / 10)),
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={memory}M"}
            for key, value in want.items():
                if access.get(key) != value:
                    raise CheckFailed(f"{allocation_id}: access {key}={access.get(key)!r}, expected {value!r}")
        entry = next(g for g in self.gpus() if g["uuid"] == gpu["uuid"])
        shares = entry.get("shares") or {}
        memory_total = sum(m for _, m in asks.values())
        if (shares.get("milli_used"), shares.get("memory_used_mib")) != (500, memory_total):
            raise CheckFailed(f"the GPU's shares say {shares}, not 500 milli and {memory_total} MiB")
        for allocation_id in asks:
            workload_id = f"{allocation_id}-env"
            self.client.workload_start(workload_id, {"instances": [allocation_id],
                                                     "command": [sys.executable, "-c", SHOW_ENV]})
            ended = self.wait_final(workload_id, deadline)
            seen = json.loads(self.client.workload_logs(workload_id, tail=2000)["data"].strip().splitlines()[-1])
            access = self.client.instance(allocation_id)["access"]
            for key in ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"):
                if seen.get(key) != access.get(key):
                    raise CheckFailed(f"{workload_id} sees {key}={seen.get(key)!r}, its access says "
                                      f"{access.get(key)!r}")
            if ended["runs"][-1].get("exit_code") != 0:
                raise CheckFailed(f"{workload_id} exited {ended['runs'][-1].get('exit_code')}")
        return (f"two shares on GPU {gpu.get('index')} (300 and 200 milli, {asks[PREFIX + 'share-a'][1]} MiB each): "
                "limits in their access and in their workloads' environment", {"gpu": gpu["uuid"]})

    def check_mps_cap(self, deadline: float) -> str:
        if not self.passed("mps_shares"):
            raise CheckSkipped("no shares (see mps_shares)")
        gpu, _found = self.share_target
        entry = next(g for g in self.gpus() if g["uuid"] == gpu["uuid"])
        if entry.get("share_enforcement") is None:
            raise CheckFailed("agent does not report share_enforcement")
        if enforcement_mode(entry["share_enforcement"]) != "mps":
            raise CheckSkipped(f"share_enforcement is {entry['share_enforcement']!r} on this GPU: nothing enforces a "
                               "share's memory cap here")
        if self.backend == "sim" or not self.has_torch(gpu["uuid"], deadline):
            raise CheckSkipped(f"no CUDA load available ({self.torch_reason or 'simulated GPUs'})")
        cap = self.client.instance(f"{PREFIX}share-a")["memory_mib"]
        outcomes = {}
        for label, mib in (("within", cap // 2), ("over", cap + 1024)):
            workload_id = f"{PREFIX}share-a-{label}"
            self.client.workload_start(workload_id, {"instances": [f"{PREFIX}share-a"],
                                                     "command": [sys.executable, "-c", ALLOCATE], "args": [str(mib)]})
            outcomes[label] = self.wait_final(workload_id, deadline)["runs"][-1].get("exit_code")
        if outcomes["within"] != 0:
            raise CheckFailed(f"allocating {cap // 2} MiB within the {cap} MiB cap exited {outcomes['within']}: "
                              f"{self.stderr_tail(PREFIX + 'share-a-within')}")
        if outcomes["over"] == 0:
            raise CheckFailed(f"a process allocated {cap + 1024} MiB on a share capped at {cap} MiB")
        return f"{cap // 2} MiB within the {cap} MiB cap: exit 0; {cap + 1024} MiB over it: exit {outcomes['over']}"

    def release_shares(self) -> None:
        target = getattr(self, "share_target", None)
        for instance in self.client.inventory()["instances"]:
            if instance["allocation_id"].startswith(f"{PREFIX}share-"):
                self.client.destroy(instance["allocation_id"])
        if target is not None:
            gpu, found = target
            if next(g for g in self.gpus() if g["uuid"] == gpu["uuid"])["mode"] != found:
                with contextlib.suppress(AgentHTTPError):
                    self.client.set_gpu_mode(gpu["uuid"], found)

    def check_cleanup(self, deadline: float) -> str:
        if self.agent.process is None:
            return "nothing was started"
        left = []
        running = self.agent.process.poll() is None
        if running and self.client is not None:
            with contextlib.suppress(AgentUnreachable, AgentHTTPError):
                for workload in self.client.workloads():
                    for run in workload.get("runs", []):
                        if run.get("pid"):
                            self.pgids.add(run["pid"])
                for instance in self.client.inventory()["instances"]:
                    self.client.destroy(instance["allocation_id"])
                left = [i["allocation_id"] for i in self.client.inventory()["instances"]]
        code = self.agent.stop(timeout=max(1.0, min(15.0, deadline - time.monotonic() - 1)))
        if left:
            raise CheckFailed(f"instances left: {left}")
        if running and self.client is not None and code != 0:  # (one stopped before it answered may not say 0)
            raise CheckFailed(f"the agent exited {code} at SIGTERM, not 0: {self.agent.log_tail()}")

        def alive() -> list[int]:
            return [pid for pgid in sorted(self.pgids) for pid in process_group_alive(pgid)]

        with contextlib.suppress(CheckFailed):
            wait_for(lambda: not alive(), min(deadline, time.monotonic() + 10), "the workloads' processes to end")
        if left_alive := alive():
            for pgid in self.pgids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
            raise CheckFailed(f"process(es) of the check still alive after the agent stopped: {left_alive} "
                              "(killed now)")
        detail = (f"the agent stopped (exit {code}); none of the {len(self.pgids)} workload process group(s) is left"
                  if running else f"the agent had exited ({self.agent.process.returncode}); no workload process left")
        if self.backend == "nvml" and self.agent.starts and running:
            probe = NvmlProcesses()

            def new_processes() -> dict[str, list[int]]:
                now = probe.pids()
                found = {uuid: sorted(pids - self.compute_before.get(uuid, set())) for uuid, pids in now.items()}
                return {uuid: pids for uuid, pids in found.items() if pids}

            try:
                with contextlib.suppress(CheckFailed):  # a process that just exited may linger a moment in NVML
                    wait_for(lambda: not new_processes(), min(deadline, time.monotonic() + 10),
                             "the GPUs' compute processes to go", step=0.5)
                new = new_processes()
            finally:
                probe.close()
            if new:
                raise CheckFailed(f"compute process(es) on the GPU after cleanup (NVML): {new}")
            detail += "; NVML shows no new compute process on any GPU"
        return detail

    # -- the whole run ---------------------------------------------------------------------------------------
    def main(self) -> int:
        plan = [("inventory", 30, self.check_inventory),
                ("inventory_memory_fields", 30, self.check_memory_fields),
                ("inventory_share_enforcement", 10, self.check_share_enforcement),
                ("inventory_host_topology", 30, self.check_host_topology),
                ("telemetry_idle", 20, self.check_telemetry_idle),
                ("whole_instance", 30, self.check_whole_instance),
                ("instance_device_uuid", 10, self.check_device_uuid),
                ("telemetry_load", 90, self.check_telemetry_load),
                ("workload", 30, self.check_workload),
                ("workload_uid", 5, self.check_workload_uid),
                ("agent_kill9_adoption", 45, self.check_adoption),
                ("notice_sigterm_checkpoint", 45, self.check_notice),
                ("instances_release", 30, self.check_release)]
        if self.args.mps:
            plan += [("mps_shares", 45, self.check_mps_shares), ("mps_memory_cap", 60, self.check_mps_cap)]
        if self.args.allow_mig_changes:
            plan.append(("mig_profiles", 150, self.check_mig))
        stepped = -1  # the plan's step in progress (-1: agent_start)
        previous = signal.signal(signal.SIGALRM, _hard_stop)
        signal.setitimer(signal.ITIMER_REAL, max(0.5, self.deadline - time.monotonic()))
        try:
            try:
                self.run("agent_start", 60, self.check_agent_start)
                for step, (name, bound, check) in enumerate(plan):
                    stepped = step
                    if self.client is None:
                        self.record(CheckResult(name, SKIP, 0.0, "not run: the agent did not start"))
                        continue
                    self.run(name, bound, check)
                    if name == "mps_memory_cap":
                        with contextlib.suppress(AgentHTTPError, AgentUnreachable):
                            self.release_shares()
            except HardStop:
                for name, _bound, _check in plan[stepped + 1:]:
                    self.record(CheckResult(name, SKIP, 0.0, "not run: the whole run passed its bound"))
            signal.setitimer(signal.ITIMER_REAL, 0)
            self.deadline = max(self.end, time.monotonic() + 2)  # cleanup: the rest of the run's bound
            self.run("cleanup", max(2.0, self.deadline - time.monotonic()), self.check_cleanup)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            self.agent.stop(timeout=5)
        report = self.report()
        if self.args.json:
            path = Path(self.args.json)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report, indent=2) + "\n")
        failed = [r.name for r in self.results if r.status == FAIL]
        counts = {s: sum(r.status == s for r in self.results) for s in (PASS, FAIL, SKIP)}
        print(f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped in "
              f"{time.monotonic() - self.started:.1f} s" + (f"; report: {self.args.json}" if self.args.json else ""))
        if not self.keep_state:
            shutil.rmtree(self.base, ignore_errors=True)
        return 1 if failed else 0

    def report(self) -> dict:
        gpu = self.target or next(iter(self.inventory.get("gpus", [])), {}) or {}
        return {
            "tool": "agent.hwcheck", "agent_version": __version__, "backend": self.backend,
            "truth": "sim" if self.backend == "sim" else "nvidia-smi",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "hostname": socket.gethostname(),
            "gpu": {"name": gpu.get("name"), "uuid": gpu.get("uuid"), "model": gpu.get("model"),
                    "driver": self.driver or None},
            "gpus": [{k: g.get(k) for k in ("index", "uuid", "name", "mode")} for g in self.inventory.get("gpus", [])],
            "options": {"allow_mig_changes": self.args.allow_mig_changes, "mps": self.args.mps,
                        "timeout_seconds": self.args.timeout, "sim_gpus": self.args.sim_gpus
                        if self.backend == "sim" else None},
            "seconds": round(time.monotonic() - self.started, 2),
            "passed": not any(r.status == FAIL for r in self.results),
            "checks": [asdict(r) for r in self.results],
        }


def sim_load_expected(model_code: str) -> tuple[float, float, int]:
    """(utilisation %, power W, framebuffer used MiB) that a simulated whole GPU shows under ``PERF``: the
    performance model's estimate, as ``agent.sim`` turns it into DCGM series."""
    from agent.protocol import perf_from_json
    from gpus.performance import Workload, estimate, whole

    model = model_get(model_code)
    truth = estimate(Workload(**perf_from_json(PERF)), whole(model.code))
    load = round(truth.engine_active, 4)
    return (round(load * 100, 1), round(model.idle_power_w + (model.max_power_w - model.idle_power_w) * load, 1),
            int(min(truth.memory_mib, model.memory_mib)))


def enforcement_mode(value: object) -> str | None:
    """``share_enforcement`` as a string, or an object with its mode and a reason."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        for key in ("mode", "enforcement", "value", "state"):
            if isinstance(value.get(key), str):
                return value[key]
    return None


def _hard_stop(signum, frame):
    raise HardStop


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m agent.hwcheck", description=(
        "Check this GPU node end to end through a node agent started for the check; read-only for the device "
        "unless --allow-mig-changes. Never resets a GPU."))
    parser.add_argument("--backend", choices=("nvml", "sim"), default="nvml",
                        help="nvml (the default, a GPU node) or sim (simulated GPUs: the test)")
    parser.add_argument("--sim-gpus", default=SIM_GPUS, metavar="SPEC",
                        help=f"sim: the GPUs, MODEL:COUNT[:whole|mig|shared],... (default {SIM_GPUS})")
    parser.add_argument("--gpu", metavar="UUID|INDEX", help="the GPU to check (default: the first that fits)")
    parser.add_argument("--json", metavar="PATH", help="write the report there")
    parser.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"bound of the whole run (default {DEFAULT_TIMEOUT}, {MIN_TIMEOUT}..{MAX_TIMEOUT}); "
                             "its last quarter (at most 40 s) is kept for cleanup")
    parser.add_argument("--allow-mig-changes", action="store_true",
                        help="also cycle every MIG profile at every start on one GPU with no instance, then restore "
                             "its mode")
    parser.add_argument("--mps", action="store_true", help="also check two shares and their limits")
    parser.add_argument("--state-dir", metavar="PATH",
                        help="keep the agent's state and the workloads' files there (default: a temporary directory, "
                             "removed at the end)")
    args = parser.parse_args(argv)
    if not MIN_TIMEOUT <= args.timeout <= MAX_TIMEOUT:
        parser.error(f"--timeout must be {MIN_TIMEOUT}..{MAX_TIMEOUT} seconds, got {args.timeout}")
    if args.state_dir and (state := Path(args.state_dir) / "state").is_dir() and any(state.iterdir()):
        parser.error(f"--state-dir: {state} holds an earlier run's agent state; give an empty or new directory")
    if args.backend == "sim":
        from agent.sim import parse_gpu_specs

        try:
            parse_gpu_specs(args.sim_gpus)
        except ValueError as error:
            parser.error(f"--sim-gpus: {error}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"agent.hwcheck {__version__}: {args.backend} backend, bound {args.timeout} s", flush=True)
    return HwCheck(args).main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
