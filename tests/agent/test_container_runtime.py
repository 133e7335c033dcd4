"""The container runtime: the ``docker`` / ``podman`` command line for whole, MIG and share leases, checked
against the NVIDIA container toolkit's documented CDI device selection (``--device nvidia.com/gpu=<name>``,
names as ``nvidia-ctk cdi generate`` lists them: a GPU by index or UUID, a MIG device by its MIG UUID); an
instance without a UUID is refused rather than sent as ``nvidia.com/gpu=``.

A real engine: Debian's podman runs a workload through the agent's ``/v1/workloads`` (a locally built busybox
image in a per-test storage root: no registry), which sees its environment, writes its log and its checkpoint,
gets the SIGTERM of a notice and has its exit reported. Where podman cannot run a container the test says why
(the engine's own error) and is skipped locally, FAILED under ``CI=true`` (tests/real_parts.py). No GPU and no
CDI specification here: that agent runs with ``--container-devices none`` (the UUIDs still reach the workload
in ``CUDA_VISIBLE_DEVICES``). A stand-in ``docker`` on PATH that records what it was asked checks the deadline's
``docker kill``."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from agent.backend import InstanceSpec
from agent.protocol import InvalidRequest, spec_from_json
from agent.sim import SimBackend
from agent.workloads import ContainerRuntime, WorkloadManager, device_env
from tests.real_parts import missing, require
from tests.support.agents import AgentProcess

CDI_NAME = re.compile(r"^nvidia\.com/gpu=(all|\d+|\d+:\d+|GPU-[0-9a-f-]{36}|MIG-[0-9a-f-]{36})$")


@pytest.fixture
def sim(tmp_path) -> SimBackend:
    return SimBackend(tmp_path / "sim", "node-c", [("H100-80GB", 2, "mig"), ("A100-80GB", 1, "whole"),
                                                   ("L4", 1, "shared")])


def instance(sim: SimBackend, allocation_id: str, **spec) -> dict:
    created, _ = sim.create(allocation_id, InstanceSpec(**spec))
    return created


def command_line(tmp_path: Path, instances: list[dict], engine: str = "docker", **spec) -> list[str]:
    body = {"instances": [i["allocation_id"] for i in instances], "image": "nvcr.io/nvidia/pytorch:24.05-py3",
            **spec}
    workload = {"workload_id": "lease-42.r0", "spec": spec_from_json(body, [tmp_path]),
                "devices": [{"allocation_id": i["allocation_id"], "kind": i["kind"], "device_uuid": i["device_uuid"],
                             "gpu": i["gpu"], "memory_mib": i["memory_mib"]} for i in instances]}
    directory = tmp_path / "wl"
    directory.mkdir(exist_ok=True)
    env = {"CUDA_VISIBLE_DEVICES": device_env(instances)["CUDA_VISIBLE_DEVICES"], "SECRET_TOKEN": "s3cr3t"}
    return ContainerRuntime(engine).argv(workload, env, directory)


def devices_of(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == "--device"]


def test_whole_gpus_by_their_uuid(tmp_path, sim):
    whole = instance(sim, "w", kind="whole", gpu=sim.state["gpus"][2]["uuid"])
    argv = command_line(tmp_path, [whole], args=["python", "train.py"])
    assert argv[:4] == ["docker", "run", "--rm", "--name"] and argv[-3:] == [
        "nvcr.io/nvidia/pytorch:24.05-py3", "python", "train.py"]
    assert devices_of(argv) == [f"nvidia.com/gpu={whole['gpu']}"]
    assert all(CDI_NAME.match(d) for d in devices_of(argv))
    assert "--ipc=host" not in argv and "s3cr3t" not in " ".join(argv)  # the environment is in a 0600 file
    env_file = Path(argv[argv.index("--env-file") + 1])
    assert oct(env_file.stat().st_mode & 0o777) == "0o600" and "SECRET_TOKEN=s3cr3t" in env_file.read_text()


def test_an_interactive_container_is_published_on_the_host_port_the_broker_gave(tmp_path, sim):
    whole = instance(sim, "w", kind="whole", gpu=sim.state["gpus"][2]["uuid"])
    argv = command_line(tmp_path, [whole], port=8888, host_port=20003)
    assert argv[argv.index("-p") + 1] == "127.0.0.1:20003:8888"  # the node's loopback only
    plain = command_line(tmp_path, [whole], port=8888)  # no host port given: the same port on the node
    assert plain[plain.index("-p") + 1] == "127.0.0.1:8888:8888"
    with pytest.raises(InvalidRequest) as refused:
        command_line(tmp_path, [whole], host_port=20003)
    assert refused.value.field == "host_port"


def test_mig_instances_by_their_mig_device_uuid_in_lease_order(tmp_path, sim):
    gpu = sim.state["gpus"][0]["uuid"]
    a = instance(sim, "m0", kind="mig", gpu=gpu, profile="3g.40gb", start=4)
    b = instance(sim, "m1", kind="mig", gpu=sim.state["gpus"][1]["uuid"], profile="1g.10gb", start=0)
    argv = command_line(tmp_path, [a, b], engine="podman", checkpoint_dir=str(tmp_path / "ckpt"),
                        workdir=str(tmp_path / "src"), command=["python", "-u"], args=["train.py"], port=8888)
    assert argv[0] == "podman"
    assert devices_of(argv) == [f"nvidia.com/gpu={a['device_uuid']}", f"nvidia.com/gpu={b['device_uuid']}"]
    assert all(d.startswith("nvidia.com/gpu=MIG-") and CDI_NAME.match(d) for d in devices_of(argv))
    assert f"{tmp_path / 'ckpt'}:{tmp_path / 'ckpt'}" in argv and argv[argv.index("-w") + 1] == str(tmp_path / "src")
    assert argv[argv.index("-p") + 1] == "127.0.0.1:8888:8888"
    assert argv[argv.index("--entrypoint") + 1] == "python"
    assert argv[-3:] == ["nvcr.io/nvidia/pytorch:24.05-py3", "-u", "train.py"]


def test_a_share_gets_its_gpu_and_the_mps_limits(tmp_path, sim):
    share = instance(sim, "s", kind="share", gpu=sim.state["gpus"][3]["uuid"], milli=250, memory_mib=6144)
    argv = command_line(tmp_path, [share])
    assert devices_of(argv) == [f"nvidia.com/gpu={share['gpu']}"]
    assert "--ipc=host" in argv and "/tmp/nvidia-mps:/tmp/nvidia-mps" in argv
    assert device_env([share]) == {"CUDA_VISIBLE_DEVICES": share["gpu"], "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                                   "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=6144M"}


def test_a_share_uses_its_gpus_mps_pipe_directory_when_the_agent_runs_that_daemon(tmp_path, sim):
    share = instance(sim, "s", kind="share", gpu=sim.state["gpus"][3]["uuid"], milli=500, memory_mib=4096)
    pipe = str(tmp_path / "mps" / share["gpu"] / "pipe")
    share["access"]["CUDA_MPS_PIPE_DIRECTORY"] = pipe  # as agent.mps.ShareEnforcingBackend reports it
    assert device_env([share])["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    workload = {"workload_id": "wl", "spec": spec_from_json({"instances": ["s"], "image": "img"}, [tmp_path]),
                "devices": [{"allocation_id": "s", "kind": "share", "device_uuid": share["device_uuid"],
                             "gpu": share["gpu"], "memory_mib": 4096}]}
    (tmp_path / "wl").mkdir()
    argv = ContainerRuntime("podman").argv(workload, device_env([share]), tmp_path / "wl")
    assert f"{pipe}:{pipe}" in argv and f"CUDA_MPS_PIPE_DIRECTORY={pipe}" in argv
    assert "/tmp/nvidia-mps:/tmp/nvidia-mps" not in argv


@pytest.mark.parametrize("uuid", ["", None, "0", "nvidia0"])
def test_an_instance_without_a_device_uuid_is_refused_not_sent_as_an_empty_cdi_name(tmp_path, sim, uuid):
    whole = instance(sim, "w", kind="whole", gpu=sim.state["gpus"][2]["uuid"])
    other = dict(whole, allocation_id="x", device_uuid=uuid)
    (tmp_path / "wl").mkdir()
    with pytest.raises(InvalidRequest) as refused:
        command_line(tmp_path, [whole, other])
    assert refused.value.field == "instances[1]" and "no device UUID" in str(refused.value)
    assert not (tmp_path / "wl" / "container.env").exists()  # refused before anything was written
    # the engine without a GPU (cdi_devices=False) leaves the flags out, and still refuses an unnamed device
    workload = {"workload_id": "wl", "spec": spec_from_json({"instances": ["w", "x"], "image": "img"}, [tmp_path]),
                "devices": [{"allocation_id": i["allocation_id"], "kind": "whole", "device_uuid": i["device_uuid"],
                             "gpu": i["gpu"], "memory_mib": 0} for i in (whole, other)]}
    with pytest.raises(InvalidRequest):
        ContainerRuntime("podman", cdi_devices=False).argv(workload, {}, tmp_path / "wl")
    workload["devices"].pop()
    assert "--device" not in ContainerRuntime("podman", cdi_devices=False).argv(workload, {}, tmp_path / "wl")


def test_an_agent_refuses_a_workload_on_an_instance_without_a_uuid_with_a_problem_naming_it(tmp_path, sim):
    whole = instance(sim, "w", kind="whole", gpu=sim.state["gpus"][2]["uuid"])
    manager = WorkloadManager(tmp_path / "state", ContainerRuntime("podman"), roots=[tmp_path])
    with pytest.raises(InvalidRequest) as refused:
        manager.start("wl", spec_from_json({"instances": ["w"], "image": "img"}, [tmp_path]),
                      [dict(whole, device_uuid="")])
    assert refused.value.field == "instances[0]" and manager.all() == []


@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_the_host_limits_become_cpus_and_memory(tmp_path, sim, engine):
    """The manager's ``limits`` (the lease's ask on the node, else its share per GPU) in the engines' syntax:
    ``--cpus`` a decimal of CPUs, ``--memory`` MiB (``m``) or bytes (``b``); none without limits."""
    whole = instance(sim, "w", kind="whole", gpu=sim.state["gpus"][2]["uuid"])
    workload = {"workload_id": "wl", "spec": spec_from_json({"instances": ["w"], "image": "img"}, [tmp_path]),
                "devices": [{"allocation_id": "w", "kind": "whole", "device_uuid": whole["device_uuid"],
                             "gpu": whole["gpu"], "memory_mib": 0}]}
    (tmp_path / "wl").mkdir()
    for limits, expected in (({"cpu_milli": 500, "memory_bytes": 256 << 20}, ["--cpus=0.5", "--memory=256m"]),
                             ({"cpu_milli": 2000, "memory_bytes": (1 << 30) + 1}, ["--cpus=2", "--memory=1073741825b"]),
                             ({"cpu_milli": 1250, "memory_bytes": 0}, ["--cpus=1.25"]),
                             ({"cpu_milli": 0, "memory_bytes": 0}, []), (None, [])):
        argv = ContainerRuntime(engine).argv({**workload, "limits": limits}, {}, tmp_path / "wl")
        assert [a for a in argv if a.startswith(("--cpus", "--memory"))] == expected, limits
        assert argv.index("img") > max([argv.index(a) for a in expected], default=0)  # engine options: before


def test_a_container_node_needs_an_image(tmp_path, sim):
    whole = instance(sim, "w", kind="whole", gpu=sim.state["gpus"][2]["uuid"])
    manager = WorkloadManager(tmp_path / "state", ContainerRuntime("docker"), roots=[tmp_path])
    with pytest.raises(InvalidRequest) as refused:
        manager.start("wl", spec_from_json({"instances": ["w"], "command": ["python"]}, [tmp_path]), [whole])
    assert refused.value.field == "image"


FAKE_DOCKER = """#!{python}
import json, os, signal, sys, time
log = os.environ["DOCKER_FAKE_LOG"]  # the engine's own DOCKER_* variables reach it
def record(what):
    with open(log, "a") as handle:
        handle.write(json.dumps(what) + "\\n")
argv = sys.argv[1:]
if argv[0] == "kill":
    record({{"argv": argv}})
    sys.exit(0)
env_file = argv[argv.index("--env-file") + 1]
signal.signal(signal.SIGTERM, lambda *a: record({{"signal": "TERM"}}))  # before the test can see it started
record({{"argv": argv, "env": open(env_file).read().splitlines()}})
while True:
    time.sleep(0.05)
"""


def test_the_agent_runs_the_engine_sigterms_it_at_the_notice_and_kills_the_container_at_the_deadline(
        tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER.format(python=sys.executable))
    (bin_dir / "docker").chmod(0o755)
    log = tmp_path / "docker.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("DOCKER_FAKE_LOG", str(log))
    agent = AgentProcess(tmp_path / "a", extra=("--workload-runtime", "docker", "--workload-root", str(tmp_path)))
    agent.start()
    try:
        client = agent.client(retries=0)
        mig = next(g for g in client.inventory()["gpus"] if g["mode"] == "mig")["uuid"]
        created = client.create("c-m", {"kind": "mig", "gpu": mig, "profile": "2g.20gb", "start": 0})
        started = client.workload_start("wl-c", {"instances": ["c-m"], "image": "busybox:1.36",
                                                 "args": ["sh", "-c", "sleep 1000"], "restart_count": 1,
                                                 "cpu_milli": 1500, "memory_mib": 3072})
        assert devices_of(started["argv"]) == [f"nvidia.com/gpu={created['device_uuid']}"]
        assert "--cpus=1.5" in started["argv"] and "--memory=3072m" in started["argv"]  # the lease's host ask
        assert started["limits"] == {"cpu_milli": 1500, "memory_bytes": 3072 << 20}
        deadline_wait = time.monotonic() + 10
        # the fake opens the log before it writes the line: wait for a whole line, not for the file (a loaded
        # machine once showed the file empty)
        while not (log.exists() and log.read_text().endswith("\n")) and time.monotonic() < deadline_wait:
            time.sleep(0.05)
        run_call = json.loads(log.read_text().splitlines()[0])
        assert run_call["argv"] == started["argv"][1:]
        assert f"CUDA_VISIBLE_DEVICES={created['device_uuid']}" in run_call["env"]
        assert "RESTART_COUNT=1" in run_call["env"]
        client.notice("c-m", time.time() + 1.0, "reclaimed")
        deadline_wait = time.monotonic() + 10
        while client.workload("wl-c")["state"] == "running" and time.monotonic() < deadline_wait:
            time.sleep(0.05)
        calls = [json.loads(line) for line in log.read_text().splitlines()]
        assert {"signal": "TERM"} in calls  # docker run is attached: it proxies the SIGTERM to the container
        assert {"argv": ["kill", "--signal", "KILL", "gpub-wl-c"]} in calls
        done = client.workload("wl-c")
        assert done["state"] == "preempted" and done["runs"][0]["signal"] == 9
    finally:
        agent.stop()


# -- a real engine: podman -------------------------------------------------------------------------------
FAKE_MPS = Path(__file__).resolve().parents[1] / "fixtures" / "fake-nvidia-cuda-mps-control"
IMAGE = "localhost/gpub-busybox:test"
BUSYBOX = "/bin/busybox"  # Debian's busybox-static: runs in an image with nothing else in it
ENGINE_HINT = "Debian packages podman, runc, catatonit and busybox-static (infra/test.py SYSTEM_PACKAGES)"


def oci_runtime() -> str:
    """crun, Debian podman's default, unless the host has hybrid cgroups with a cgroup v2 controller enabled:
    crun refuses those ("cgroups in hybrid mode not supported, drop all controllers from cgroupv2", whatever its
    cgroup manager), runc runs there (cgroup v1 controllers, cgroupfs)."""
    controllers = Path("/sys/fs/cgroup/unified/cgroup.controllers")
    hybrid = controllers.exists() and controllers.read_text().strip()
    return "runc" if hybrid or not shutil.which("crun") else "crun"


@pytest.fixture(scope="module")
def podman(tmp_path_factory) -> dict[str, str]:
    """An engine of this test's own: podman with its storage, run and temporary directories under a fresh
    directory (containers.conf and storage.conf named by CONTAINERS_CONF / CONTAINERS_STORAGE_CONF, which the
    agent hands to the engine CLI), the busybox image built and imported here, one container run to prove
    the engine works. Its environment variables, or the test is skipped (locally) / failed (CI) with why."""
    for program in ("podman", oci_runtime(), "catatonit"):
        require(f"{program} (on PATH)", shutil.which(program) is not None, ENGINE_HINT)
    require(f"{BUSYBOX} (static)", os.access(BUSYBOX, os.X_OK), ENGINE_HINT)
    root = tmp_path_factory.mktemp("podman")
    # Modest limits for the container: podman's defaults (nofile 1048576) are more than a root without
    # CAP_SYS_RESOURCE (this VM) may set, and then no container starts at all ("error setting rlimit type 7");
    # on this machine even the shell's own nproc (96364) is refused by the OCI runtime, 4096 is not.
    limit = lambda kind: min(4096, resource.getrlimit(kind)[1] if resource.getrlimit(kind)[1] >= 0 else 4096)  # noqa: E731
    (root / "containers.conf").write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={limit(resource.RLIMIT_NOFILE)}:{limit(resource.RLIMIT_NOFILE)}", '
        f'"nproc={limit(resource.RLIMIT_NPROC)}:{limit(resource.RLIMIT_NPROC)}"]\n'
        'netns = "none"\n'
        'init_path = "/usr/bin/catatonit"\n'
        "[engine]\n"
        f'runtime = "{oci_runtime()}"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        f'tmp_dir = "{root}/libpod"\n'
        f'volume_path = "{root}/volumes"\n')
    (root / "storage.conf").write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{root}/storage"\nrunroot = "{root}/run"\n')
    env = {"CONTAINERS_CONF": str(root / "containers.conf"), "CONTAINERS_STORAGE_CONF": str(root / "storage.conf")}
    with tarfile.open(root / "rootfs.tar", "w") as tar:  # a rootfs of one static binary and its applets
        tar.add(BUSYBOX, arcname="bin/busybox")
        for applet in ("sh", "sleep", "echo", "env", "cat", "ls", "sort", "grep", "wc"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        for directory in ("tmp", "proc", "sys", "dev", "etc"):
            folder = tarfile.TarInfo(directory)
            folder.type, folder.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            tar.addfile(folder)
    engine_env = {**os.environ, **env}
    for argv in (["podman", "import", str(root / "rootfs.tar"), IMAGE],
                 ["podman", "run", "--rm", "--init", IMAGE, "/bin/sh", "-c", "echo engine-ok"]):
        done = subprocess.run(argv, env=engine_env, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0 or (argv[1] == "run" and "engine-ok" not in done.stdout):
            missing(f"a container engine that runs here: `{' '.join(argv)}` exited {done.returncode}: "
                    f"{done.stderr.strip()[-500:]}", ENGINE_HINT)
    yield env
    subprocess.run(["podman", "rm", "--all", "--force"], env=engine_env, capture_output=True, timeout=60, check=False)
    subprocess.run(["podman", "system", "reset", "--force"], env=engine_env, capture_output=True, timeout=60,
                   check=False)


SCRIPT = r"""
trap 'echo "got SIGTERM, deadline $(cat "$GPUB_DEADLINE_FILE")"; echo saved > "$CHECKPOINT_DIR/at-term"; exit 143' TERM
echo "visible=$CUDA_VISIBLE_DEVICES threads=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE mem=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
echo "restart=$RESTART_COUNT workload=$GPUB_WORKLOAD_ID greeting=$GREETING secret_set=${API_TOKEN:+yes}"
ls "$CUDA_MPS_PIPE_DIRECTORY"
echo started > "$CHECKPOINT_DIR/started"
while true; do sleep 0.1; done
"""


def test_podman_runs_a_share_workload_through_the_agent_sigterm_at_the_notice_and_its_exit_reported(
        tmp_path, monkeypatch, podman):
    mps_dir = Path(tempfile.mkdtemp(prefix="gpub-mps-"))  # short: the MPS daemon's unix sockets live there
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    agent = AgentProcess(tmp_path / "a", extra=(
        "--workload-runtime", "podman", "--container-devices", "none", "--workload-root", str(tmp_path),
        "--mps-control", str(FAKE_MPS), "--mps-directory", str(mps_dir)))
    for key, value in podman.items():
        monkeypatch.setenv(key, value)  # the agent hands CONTAINERS_* to the engine CLI, nothing else of its own
    agent.start()
    try:
        client = agent.client(retries=0)
        inventory = client.inventory()
        shared = next(g for g in inventory["gpus"] if g["mode"] == "shared")
        assert shared["share_enforcement"] == "mps"
        share = client.create("c-s", {"kind": "share", "gpu": shared["uuid"], "milli": 250, "memory_mib": 2048})
        pipe = share["access"]["CUDA_MPS_PIPE_DIRECTORY"]
        started = client.workload_start("wl-p", {
            "instances": ["c-s"], "image": IMAGE, "command": ["/bin/sh", "-c", SCRIPT], "restart_count": 2,
            "env": {"GREETING": "hello"}, "secret_env": {"API_TOKEN": "tok-123"},
            "checkpoint_dir": str(checkpoint)})
        assert started["argv"][:2] == ["podman", "run"] and "--device" not in started["argv"]
        assert "tok-123" not in json.dumps(started)
        deadline_wait = time.monotonic() + 60  # the first container of a fresh storage root takes a while
        while not (checkpoint / "started").exists() and time.monotonic() < deadline_wait:
            assert client.workload("wl-p")["state"] == "running", client.workload_logs("wl-p", stream="stderr")
            time.sleep(0.1)
        assert (checkpoint / "started").read_text() == "started\n"
        client.notice("c-s", time.time() + 30, "reclaimed")
        deadline_wait = time.monotonic() + 30
        while client.workload("wl-p")["state"] == "running" and time.monotonic() < deadline_wait:
            time.sleep(0.1)
        done = client.workload("wl-p")
        log = client.workload_logs("wl-p")["data"]
        assert f"visible={share['device_uuid']} threads=25 mem=0=2048M" in log
        assert "restart=2 workload=wl-p greeting=hello secret_set=yes" in log
        assert "nvidia-cuda-mps-control.pid" in log  # the GPU's MPS pipe directory, mounted into the container
        assert "got SIGTERM, deadline " in log and (checkpoint / "at-term").read_text() == "saved\n"
        assert "tok-123" not in log
        assert done["state"] == "preempted" and done["runs"][0]["exit_code"] == 143, done
        assert done["runs"][0]["signal"] is None  # it ended on the SIGTERM, before the deadline's SIGKILL
        client.destroy("c-s")
        assert not Path(pipe, "nvidia-cuda-mps-control.pid").exists()  # the last share gone: the daemon quit
    finally:
        agent.stop()
        for pid_file in mps_dir.rglob("nvidia-cuda-mps-control.pid"):  # a daemon a failed test left behind
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        shutil.rmtree(mps_dir, ignore_errors=True)


# what the container's cgroup says of its CPU and memory limits, v2 or v1 (busybox's sh and cat)
LIMITS = ("echo cpu.max=$(cat /sys/fs/cgroup/cpu.max 2>/dev/null); echo memory.max=$(cat /sys/fs/cgroup/memory.max "
          "2>/dev/null); echo quota=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null); "
          "echo period=$(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us 2>/dev/null); "
          "echo memory=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null)")


def test_podman_container_that_ignores_sigterm_is_killed_at_the_deadline_and_removed(tmp_path, monkeypatch, podman):
    for key, value in podman.items():
        monkeypatch.setenv(key, value)
    agent = AgentProcess(tmp_path / "a", extra=(
        "--workload-runtime", "podman", "--container-devices", "none", "--workload-root", str(tmp_path),
        "--mps-control", ""))
    agent.start()
    try:
        client = agent.client(retries=0)
        whole = next(g for g in client.inventory()["gpus"] if g["mode"] == "whole")
        client.create("c-w", {"kind": "whole", "gpu": whole["uuid"]})
        started = client.workload_start("wl-k", {"instances": ["c-w"], "image": IMAGE, "command": [
            "/bin/sh", "-c", f"{LIMITS}; trap 'echo ignoring SIGTERM' TERM; echo up; while true; do sleep 0.1; done"],
            "cpu_milli": 500, "memory_mib": 256})
        assert "--cpus=0.5" in started["argv"] and "--memory=256m" in started["argv"]
        deadline_wait = time.monotonic() + 60
        while "up" not in client.workload_logs("wl-k")["data"] and time.monotonic() < deadline_wait:
            assert client.workload("wl-k")["state"] == "running", client.workload_logs("wl-k", stream="stderr")
            time.sleep(0.1)
        # the engine applied the lease's host ask: half a CPU, 256 MiB, in the container's own cgroup
        seen = dict(line.split("=", 1) for line in client.workload_logs("wl-k")["data"].splitlines() if "=" in line)
        if seen.get("cpu.max"):  # cgroup v2 in the container
            assert seen["cpu.max"] == "50000 100000" and seen["memory.max"] == str(256 << 20), seen
        else:  # v1 (this machine's hybrid hierarchy, runc)
            assert (seen["quota"], seen["period"]) == ("50000", "100000"), seen
            assert seen["memory"] == str(256 << 20), seen
        client.notice("c-w", time.time() + 2.0, "reclaimed")
        deadline_wait = time.monotonic() + 40
        while client.workload("wl-k")["state"] == "running" and time.monotonic() < deadline_wait:
            time.sleep(0.1)
        done = client.workload("wl-k")
        assert done["state"] == "preempted" and done["runs"][0]["signal"] == 9, done
        assert "ignoring SIGTERM" in client.workload_logs("wl-k")["data"]
        engine_env = {**os.environ, **podman}
        deadline_wait = time.monotonic() + 90  # `podman kill` at the deadline; --rm removes the container after
        while time.monotonic() < deadline_wait:
            listed = subprocess.run(["podman", "ps", "--all", "--format", "{{.Names}}"], env=engine_env,
                                    capture_output=True, text=True, timeout=60, check=True).stdout.split()
            if "gpub-wl-k" not in listed:
                break
            time.sleep(0.5)
        assert "gpub-wl-k" not in listed
    finally:
        agent.stop()


# an elastic container: a child holds the stand-in node of GPU 1, the main shell only GPU 0's; both ignore SIGUSR1;
# on a probe file the main shell reads GPU 1's node anew (its size: 4096, or 0 once /dev/null is bound over it)
ELASTIC = r"""
trap '' USR1
( exec 3<"$DEV/nvidia1"; echo $$ > "$CK/holder"; while true; do sleep 0.1; done ) &
exec 4<"$DEV/nvidia0"
echo "up visible=$CUDA_VISIBLE_DEVICES"
while true; do
  sleep 0.1
  if [ -e "$CK/probe" ] && [ ! -e "$CK/seen" ]; then cat "$DEV/nvidia1" | wc -c > "$CK/seen.tmp"; echo > "$CK/seen"; fi
done
"""


def test_podman_a_shrink_masks_the_device_given_back_in_the_container_kills_its_holder_and_resizes_it(
        tmp_path, monkeypatch, podman):
    """Issue 32: a container's processes are its engine's, outside the run's session, so a shrink used to leave the
    GPU given back (now another tenant's) in the container. The agent now finds them (``ENGINE inspect`` and the
    descendants of the container's first process), binds ``/dev/null`` over the node in the container's mount
    namespace at once, SIGKILLs after the grace the one still holding it, leaves the rest running on the GPU kept,
    and ``podman update``s the container's CPU and memory to the units left."""
    for key, value in podman.items():
        monkeypatch.setenv(key, value)
    checkpoint = tmp_path / "ck"
    devices = checkpoint / "dev"  # under the checkpoint directory: mounted into the container at the same path
    devices.mkdir(parents=True)
    for index in (0, 1):
        (devices / f"nvidia{index}").write_bytes(b"\0" * 4096)
    agent = AgentProcess(tmp_path / "a", gpus="a100-80gb:2:whole", extra=(
        "--workload-runtime", "podman", "--container-devices", "none", "--workload-root", str(tmp_path),
        "--device-dir", str(devices), "--shrink-grace-seconds", "1", "--mps-control", ""))
    agent.start()
    try:
        client = agent.client(retries=0)
        gpus = {g["index"]: g["uuid"] for g in client.inventory()["gpus"]}
        for n in (0, 1):
            client.create(f"el-{n}", {"kind": "whole", "gpu": gpus[n]})
        started = client.workload_start("wl-el", {
            "instances": ["el-0", "el-1"], "image": IMAGE, "command": ["/bin/sh", "-c", ELASTIC],
            "env": {"DEV": str(devices), "CK": str(checkpoint)}, "checkpoint_dir": str(checkpoint),
            "cpu_milli": 1000, "memory_mib": 512})
        assert "--cpus=1" in started["argv"] and "--memory=512m" in started["argv"]
        deadline_wait = time.monotonic() + 60
        while not (checkpoint / "holder").exists() and time.monotonic() < deadline_wait:
            assert client.workload("wl-el")["state"] == "running", client.workload_logs("wl-el", stream="stderr")
            time.sleep(0.1)
        assert "up" in client.workload_logs("wl-el")["data"]
        client.destroy("el-1", resize=True)
        events = lambda kind: [e for e in client.workload("wl-el")["events"] if e["kind"] == kind]  # noqa: E731
        [revoked] = events("revoked")
        assert "masked with /dev/null in its mount namespace" in revoked["detail"], revoked
        (checkpoint / "probe").write_text("")  # the container opens GPU 1's node anew: /dev/null now
        deadline_wait = time.monotonic() + 20
        while not (checkpoint / "seen").exists() and time.monotonic() < deadline_wait:
            time.sleep(0.1)
        assert (checkpoint / "seen.tmp").read_text().strip() == "0"
        assert (devices / "nvidia1").stat().st_size == 4096  # the node's own view is unchanged
        deadline_wait = time.monotonic() + 20
        while not events("evicted") and time.monotonic() < deadline_wait:
            time.sleep(0.1)
        evicted = events("evicted")
        assert evicted and all(e["device"] == str(devices / "nvidia1") for e in evicted), evicted
        time.sleep(1.5)
        workload = client.workload("wl-el")
        assert workload["state"] == "running" and len(workload["runs"]) == 1, workload  # the main shell goes on
        [limits] = events("limits")
        assert limits["detail"] == "container resized for 1 unit(s): 500 milli-CPU, 256 MiB (podman update)", limits
        # the lease grows back onto GPU 1: an engine adds no device to a running container, so after the grace the
        # container ends and the next run starts at once with both devices (whatever the restart policy)
        grown = client.create("el-2", {"kind": "whole", "gpu": gpus[1]})
        client.workload_grow("wl-el", ["el-2"])
        [regrow] = events("regrow")
        assert "restarts with its 2 device(s) in 1 s" in regrow["detail"], regrow
        deadline_wait = time.monotonic() + 60
        while client.workload("wl-el")["runs"][-1]["run"] < 2 or client.workload_logs("wl-el")["data"].count(
                "up visible") < 2:
            assert time.monotonic() < deadline_wait, client.workload("wl-el")
            time.sleep(0.1)
        workload = client.workload("wl-el")
        assert workload["state"] == "running" and workload["runs"][0]["outcome"] == "regrown", workload
        assert [e for e in workload["events"] if e["kind"] == "restarted"][-1].get("regrown") is True
        last = client.workload_logs("wl-el")["data"].splitlines()
        assert any(f"up visible={gpus[0]},{grown['device_uuid']}" in line for line in last), last
        client.workload_stop("wl-el", grace_seconds=0)
        deadline_wait = time.monotonic() + 40
        while client.workload("wl-el")["state"] == "running" and time.monotonic() < deadline_wait:
            time.sleep(0.1)
    finally:
        agent.stop()
