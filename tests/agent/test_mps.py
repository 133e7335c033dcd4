"""Shares enforced by MPS (agent/mps.py): one ``nvidia-cuda-mps-control`` daemon per shared GPU, started with the
first share, told the limits through its control interface, stopped with the last share, found again after the
agent restarts; where MPS cannot run, every GPU says ``share_enforcement: "none"`` and why.

No GPU here: the control program is ``tests/fixtures/fake-nvidia-cuda-mps-control``, which daemonises, takes
commands through its pipe directory and keeps what it was told (``fake-state.json`` in its log directory), as
NVIDIA documents the real one. The agent runs as a real process over HTTP (tests/support/agents.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

from agent.backend import InstanceSpec
from agent.mps import MpsControl, MpsError, ShareEnforcingBackend
from agent.protocol import AgentHTTPError, Unavailable
from agent.sim import SimBackend
from tests.real_parts import require
from tests.support.agents import AgentProcess

FAKE = str(Path(__file__).resolve().parents[1] / "fixtures" / "fake-nvidia-cuda-mps-control")


def told(mps_dir: Path, gpu_uuid: str) -> dict:
    """What the GPU's (fake) daemon was told."""
    return json.loads((mps_dir / gpu_uuid / "log" / "fake-state.json").read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


@pytest.fixture
def mps_dir():
    """The daemons' directory: short, as their unix sockets need (pytest's tmp_path is too long for them). Every
    fake daemon a test left running there is ended after it (SIGKILL by its pid file)."""
    directory = Path(tempfile.mkdtemp(prefix="gpub-mps-"))
    yield directory
    for pid_file in directory.rglob("nvidia-cuda-mps-control.pid"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def sim(tmp_path) -> SimBackend:
    return SimBackend(tmp_path / "sim", "node-m", [("L4", 2, "shared"), ("A100-80GB", 1, "whole")])


def share(backend, allocation_id: str, gpu: str, milli: int, memory_mib: int) -> dict:
    created, _ = backend.create(allocation_id, InstanceSpec(kind="share", gpu=gpu, milli=milli, memory_mib=memory_mib))
    return created


def test_mps_control_starts_one_daemon_per_gpu_tells_it_and_quits(tmp_path, mps_dir):
    control = MpsControl(tmp_path, FAKE, directory=mps_dir)
    with pytest.raises(MpsError, match="exited 1"):  # no daemon yet: the control client says so
        control.command("GPU-a", "get_server_list")
    pid = control.start("GPU-a")
    assert control.start("GPU-a") == pid and control.running() == ["GPU-a"]  # one that runs is kept
    control.apply("GPU-a", active_thread_percentage=25, pinned_mem_limit_mib=2048)
    assert control.server_list("GPU-a") == []  # no CUDA client here, so no server
    state = told(mps_dir, "GPU-a")
    assert state["cuda_visible_devices"] == "GPU-a"  # the daemon sees its own GPU only
    assert state["default_active_thread_percentage"] == 25
    assert state["default_device_pinned_mem_limit"] == {"0": "2048M"}
    with pytest.raises(MpsError, match="Unknown command"):
        control.command("GPU-a", "set_default_sm_magic 3")
    control.stop("GPU-a")
    assert not alive(pid) and control.running() == [] and told(mps_dir, "GPU-a")["quit"]


def test_shares_start_the_daemon_with_the_tightest_limits_and_the_last_one_stops_it(tmp_path, sim, mps_dir):
    backend = ShareEnforcingBackend(sim, MpsControl(tmp_path, FAKE, directory=mps_dir))
    gpu, other = sim.state["gpus"][0]["uuid"], sim.state["gpus"][1]["uuid"]
    assert {g["share_enforcement"] for g in backend.inventory()["gpus"]} == {"mps"}
    assert backend.control.running() == []  # nothing started before a share exists
    first = share(backend, "s1", gpu, 500, 8192)
    assert first["access"]["CUDA_MPS_PIPE_DIRECTORY"] == str(mps_dir / gpu / "pipe")
    assert first["access"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    share(backend, "s2", gpu, 250, 2048)
    assert backend.control.running() == [gpu]  # one daemon for the GPU, none for the other
    pid = told(mps_dir, gpu)["pid"]
    assert told(mps_dir, gpu)["default_active_thread_percentage"] == 25
    assert told(mps_dir, gpu)["default_device_pinned_mem_limit"] == {"0": "2048M"}
    share(backend, "s3", other, 1000, 1024)
    assert backend.control.running() == sorted([gpu, other])
    assert backend.instance("s2")["access"]["CUDA_MPS_PIPE_DIRECTORY"] == str(mps_dir / gpu / "pipe")
    backend.destroy("s2")  # the tighter share gone: the defaults follow the one left
    assert told(mps_dir, gpu)["default_active_thread_percentage"] == 50
    assert told(mps_dir, gpu)["default_device_pinned_mem_limit"] == {"0": "8192M"}
    backend.destroy("s1")
    assert not alive(pid) and backend.control.running() == [other]
    assert backend.destroy("s1") is False  # already gone: success, nothing to stop


def test_without_mps_every_gpu_says_shares_are_unenforced_and_why(tmp_path, sim):
    missing = ShareEnforcingBackend(sim, MpsControl(tmp_path, "nvidia-cuda-mps-control-not-here"))
    gpus = missing.inventory()["gpus"]
    assert {g["share_enforcement"] for g in gpus} == {"none"}
    assert gpus[0]["share_enforcement_reason"] == "nvidia-cuda-mps-control-not-here is not installed on this node"
    created = share(missing, "s1", sim.state["gpus"][0]["uuid"], 250, 1024)  # sold as unenforced, not refused
    assert "CUDA_MPS_PIPE_DIRECTORY" not in created["access"] and not (tmp_path / "mps").exists()


def test_a_pipe_directory_too_long_for_the_daemons_sockets_is_refused_before_it_starts(tmp_path, sim):
    backend = ShareEnforcingBackend(sim, MpsControl(tmp_path / ("x" * 80), FAKE))
    with pytest.raises(Unavailable, match="too long for the daemon's unix sockets"):
        share(backend, "s1", sim.state["gpus"][0]["uuid"], 250, 1024)
    assert backend.inventory()["instances"] == [] and not (tmp_path / ("x" * 80)).exists()
    off = ShareEnforcingBackend(sim, None)
    assert off.inventory()["gpus"][0]["share_enforcement_reason"].startswith("MPS is turned off")


def test_a_daemon_that_cannot_start_refuses_the_share_and_leaves_nothing_behind(tmp_path, sim, mps_dir):
    broken = tmp_path / "broken-mps-control"
    broken.write_text("#!/bin/sh\necho 'Failed to start: no CUDA-capable device' >&2\nexit 1\n")
    broken.chmod(0o755)
    backend = ShareEnforcingBackend(sim, MpsControl(tmp_path, str(broken), directory=mps_dir))
    gpu = sim.state["gpus"][0]["uuid"]
    with pytest.raises(Unavailable, match="no CUDA-capable device") as refused:
        share(backend, "s1", gpu, 250, 1024)
    assert refused.value.field == "kind"
    assert backend.inventory()["instances"] == []  # not left as a share nothing enforces
    entry = backend.inventory()["gpus"][0]
    assert entry["share_enforcement"] == "none" and "no CUDA-capable device" in entry["share_enforcement_reason"]
    answers = backend.create_many({"a": InstanceSpec(kind="share", gpu=gpu, milli=100, memory_mib=512),
                                   "b": InstanceSpec(kind="whole", gpu=sim.state["gpus"][2]["uuid"])})
    assert answers["a"]["status"] == 503 and answers["a"]["problem"]["field"] == "kind"
    assert answers["b"]["status"] == 201
    assert [i["allocation_id"] for i in backend.inventory()["instances"]] == ["b"]


def test_the_agent_keeps_its_daemon_across_a_kill_9_and_a_workload_gets_the_limits(tmp_path, mps_dir):
    agent = AgentProcess(tmp_path / "a", gpus="l4:2:shared", extra=(
        "--mps-control", FAKE, "--mps-directory", str(mps_dir), "--workload-root", str(tmp_path),
        "--isolation", "none"))  # one user for every workload: what MPS serves at once (see the isolated case)
    agent.start()
    try:
        client = agent.client(retries=0)
        gpu = client.inventory()["gpus"][0]
        assert (gpu["share_enforcement"], gpu["share_enforcement_reason"]) == ("mps", "")
        created = client.create("s1", {"kind": "share", "gpu": gpu["uuid"], "milli": 300, "memory_mib": 3072})
        pipe = created["access"]["CUDA_MPS_PIPE_DIRECTORY"]
        pid = told(mps_dir, gpu["uuid"])["pid"]
        client.workload_start("wl", {"instances": ["s1"], "command": ["/bin/sh", "-c", "env | sort"]})
        deadline = time.monotonic() + 20
        while client.workload("wl")["state"] == "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        env = client.workload_logs("wl")["data"].splitlines()
        assert f"CUDA_MPS_PIPE_DIRECTORY={pipe}" in env and f"CUDA_VISIBLE_DEVICES={gpu['uuid']}" in env
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30" in env and "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3072M" in env

        agent.kill9()
        assert alive(pid)  # the daemon outlives the agent
        agent.start()
        client = agent.client(retries=0)
        state = told(mps_dir, gpu["uuid"])
        assert state["pid"] == pid and alive(pid)  # found again, not started twice
        assert state["commands"][-2:] == ["set_default_active_thread_percentage 30",
                                          "set_default_device_pinned_mem_limit 0 3072M"]  # told again
        client.destroy("s1")
        assert not alive(pid) and told(mps_dir, gpu["uuid"])["quit"]
        assert client.inventory()["gpus"][0]["share_enforcement"] == "mps"
    finally:
        agent.stop()


def test_an_agent_restart_stops_a_daemon_whose_shares_are_gone(tmp_path, mps_dir):
    state_dir = tmp_path / "a"
    agent = AgentProcess(state_dir, gpus="l4:1:shared", extra=("--mps-control", FAKE, "--mps-directory", str(mps_dir),
                                                                   "--isolation", "none"))
    agent.start()
    gpu = agent.client(retries=0).inventory()["gpus"][0]["uuid"]
    agent.stop()
    # as if the agent had died between destroying the last share and telling the daemon to quit
    stray = MpsControl(state_dir, FAKE, directory=mps_dir).start(gpu)
    agent.start()
    try:
        assert not alive(stray)
    finally:
        agent.stop()


def test_an_agent_with_mps_turned_off_reports_shares_unenforced(tmp_path):
    agent = AgentProcess(tmp_path / "a", gpus="l4:1:shared", extra=("--mps-control", ""))
    agent.start()
    try:
        client = agent.client(retries=0)
        gpu = client.inventory()["gpus"][0]
        assert gpu["share_enforcement"] == "none" and "turned off" in gpu["share_enforcement_reason"]
        created = client.create("s1", {"kind": "share", "gpu": gpu["uuid"], "milli": 300, "memory_mib": 3072})
        assert "CUDA_MPS_PIPE_DIRECTORY" not in created["access"]
        with pytest.raises(AgentHTTPError):
            client.create("s1", {"kind": "share", "gpu": gpu["uuid"], "milli": 200, "memory_mib": 3072})
    finally:
        agent.stop()


def test_an_agent_isolating_tenants_by_uid_reports_shares_unenforced(tmp_path, mps_dir):
    """MPS serves one uid at a time (NVIDIA's control daemon starts a server per uid and makes another uid's
    client wait for it to drain), so with workloads under their tenants' own uids shares are reported
    unenforced, with why, and no daemon is started."""
    require("root (isolation uid: the agent starts workloads as other users)", os.geteuid() == 0,
            "run the suite as root, as the node agent runs (its DaemonSet)")
    agent = AgentProcess(tmp_path / "a", gpus="l4:1:shared", extra=(
        "--mps-control", FAKE, "--mps-directory", str(mps_dir), "--isolation", "uid"))
    agent.start()
    try:
        gpu = agent.client(retries=0).inventory()["gpus"][0]
        assert gpu["share_enforcement"] == "none" and "one uid at a time" in gpu["share_enforcement_reason"]
        assert list(mps_dir.rglob("nvidia-cuda-mps-control.pid")) == []
    finally:
        agent.stop()
