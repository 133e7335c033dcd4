"""An elastic lease's shrink evicts what still holds the device given back (``DELETE /v1/instances/{id}?resize=1``,
agent.workloads ``_revoke`` / ``_evict_due``): on a real agent, real processes hold the "device" of the GPU given
back after SIGUSR1 and are SIGKILLed after the agent's ``--shrink-grace-seconds`` (1 s here); what holds only the
devices the workload kept goes on. The device directory holds regular files ``nvidia0`` / ``nvidia1`` standing in
for the device nodes (a descriptor of a stand-in is found by its inode, a real node's by its device number); the
isolated agent below also runs each workload in its cgroup, which finds a process that left the run's session.
The devices cgroup's deny of a real (mknod) device node is in tests/agent/test_isolation.py."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.isolation import Cgroups
from agent.workloads import device_identity, holds_device, session_members
from core.processes import wait_until
from tests.real_parts import real_part
from tests.support.agents import AgentProcess

GPUS = "a100-80gb:2:whole"
GRACE = 1.0


def wait_for(predicate, timeout: float = 20.0):
    return wait_until(predicate, timeout=timeout, step=0.05)


def alive(pid: int) -> bool:
    """Running (a SIGKILLed child its parent has not reaped yet is a zombie: not alive)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def make_devices(directory: Path) -> Path:
    directory.mkdir(mode=0o755)
    for index in (0, 1):
        (directory / f"nvidia{index}").write_bytes(b"\0" * 4096)  # mmap-able, readable by a workload's uid
        (directory / f"nvidia{index}").chmod(0o644)
    return directory


def start_agent(tmp_path_factory, *extra: str) -> AgentProcess:
    devices = make_devices(tmp_path_factory.mktemp("devroot") / "dev")
    root = tmp_path_factory.mktemp("root")
    process = AgentProcess(tmp_path_factory.mktemp("agent"), gpus=GPUS, extra=(
        "--workload-root", str(root), "--device-dir", str(devices), "--shrink-grace-seconds", str(GRACE),
        "--restart-backoff", "0.2", *extra)).start()
    process.devices = devices
    return process


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    process = start_agent(tmp_path_factory, "--isolation", "none")
    yield process
    process.stop()


@pytest.fixture
def client(agent):
    client = agent.client(retries=0)
    for instance in client.inventory()["instances"]:
        client.destroy(instance["allocation_id"])
    return client


def two_gpus(client, prefix: str) -> tuple[dict, dict]:
    """A whole-GPU instance on GPU 0 and one on GPU 1 (the sim's index is the device node's number)."""
    gpus = {g["index"]: g["uuid"] for g in client.inventory()["gpus"]}
    return tuple(client.create(f"{prefix}-{n}", {"kind": "whole", "gpu": gpus[n]}) for n in (0, 1))


# the workload: its main process handles SIGUSR1 (it was told); each holder opens one device and ignores SIGUSR1
HOLDERS = r"""
import json, os, signal, subprocess, sys, time
devices, escape = sys.argv[1], sys.argv[2] == "escape"
HOLD = ("import os, signal, sys, time\n"
        "signal.signal(signal.SIGUSR1, signal.SIG_IGN)\n"
        "if sys.argv[2] == 'escape': os.setsid()\n"
        "handle = open(sys.argv[1], 'rb')\n"
        "print('holding', sys.argv[1], flush=True)\n"
        "time.sleep(120)\n")
signal.signal(signal.SIGUSR1, lambda signum, frame: os.write(1, b"told\n"))
kids = {n: subprocess.Popen([sys.executable, "-c", HOLD, f"{devices}/nvidia{n}",
                             "escape" if escape and n == 1 else "stay"]).pid for n in (0, 1)}
print("kids", json.dumps(kids), flush=True)
while True:
    time.sleep(0.05)
"""


def holders_started(client, workload_id: str) -> dict[int, int]:
    logs = lambda: client.workload_logs(workload_id)["data"]  # noqa: E731
    wait_for(lambda: logs().count("holding ") == 2)
    line = next(x for x in logs().splitlines() if x.startswith("kids "))
    return {int(n): pid for n, pid in json.loads(line.removeprefix("kids ")).items()}


def events(client, workload_id: str, kind: str) -> list[dict]:
    return [e for e in client.workload(workload_id)["events"] if e["kind"] == kind]


def test_a_process_still_holding_the_device_given_back_is_killed_after_the_grace_the_rest_goes_on(client, agent):
    two_gpus(client, "ev")
    client.workload_start("wl-ev", {"instances": ["ev-0", "ev-1"],
                                    "command": [sys.executable, "-c", HOLDERS, str(agent.devices), "stay"]})
    kids = holders_started(client, "wl-ev")
    main = client.workload("wl-ev")["runs"][0]["pid"]
    given_back_at = time.monotonic()
    client.destroy("ev-1", resize=True)
    assert alive(kids[1]) and alive(kids[0])  # the broker does not wait: nothing is killed before the grace
    wait_for(lambda: "told" in client.workload_logs("wl-ev")["data"])
    wait_for(lambda: not alive(kids[1]), timeout=10)
    assert time.monotonic() - given_back_at >= GRACE - 0.05
    assert alive(kids[0]) and alive(main)  # it holds only the device kept: the workload runs on its one unit
    workload = client.workload("wl-ev")
    assert workload["state"] == "running" and len(workload["runs"]) == 1
    [revoked] = events(client, "wl-ev", "revoked")
    assert "not taken from its processes (no devices cgroup" in revoked["detail"] and "after 1 s" in revoked["detail"]
    [evicted] = events(client, "wl-ev", "evicted")
    assert evicted["pid"] == kids[1] and evicted["device"] == str(agent.devices / "nvidia1")
    assert evicted["detail"] == (f"evicted pid {kids[1]} from the device given back ({agent.devices}/nvidia1, "
                                 f"instance ev-1): still open after 1 s")
    time.sleep(GRACE)  # one eviction per device given back: nothing more is killed later
    assert alive(kids[0]) and len(events(client, "wl-ev", "evicted")) == 1
    client.workload_stop("wl-ev", grace_seconds=0)
    wait_for(lambda: client.workload("wl-ev")["state"] == "stopped")


LEAVES = r"""
import os, signal, sys, time
held = {"handle": open(sys.argv[1] + "/nvidia1", "rb")}
def usr1(signum, frame):
    held.pop("handle").close()  # what a well-behaved elastic workload does: off the device given back
    os.write(1, b"left it\n")
signal.signal(signal.SIGUSR1, usr1)
keep = open(sys.argv[1] + "/nvidia0", "rb")
print("up", flush=True)
while True:
    time.sleep(0.05)
"""


def test_a_workload_that_leaves_the_device_on_sigusr1_is_not_touched(client, agent):
    two_gpus(client, "lv")
    client.workload_start("wl-lv", {"instances": ["lv-0", "lv-1"],
                                    "command": [sys.executable, "-c", LEAVES, str(agent.devices)]})
    wait_for(lambda: "up" in client.workload_logs("wl-lv")["data"])
    client.destroy("lv-1", resize=True)
    wait_for(lambda: "left it" in client.workload_logs("wl-lv")["data"])
    wait_for(lambda: events(client, "wl-lv", "revoked"))
    time.sleep(GRACE + 1.0)  # past the grace and a few ticks
    workload = client.workload("wl-lv")
    assert workload["state"] == "running" and workload["runs"][0]["ended_at"] is None
    assert not events(client, "wl-lv", "evicted") and not events(client, "wl-lv", "signalled")
    client.workload_stop("wl-lv", grace_seconds=0)
    wait_for(lambda: client.workload("wl-lv")["state"] == "stopped")


MAIN_HOLDS = r"""
import os, signal, sys, time
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
units = int(os.environ["GPUBROKER_UNITS"])  # 2: GPUs 0 and 1; 1 (the next run, after the shrink): GPU 0
handles = [open(f"{sys.argv[1]}/nvidia{n}", "rb") for n in range(units)]
print("up", os.environ["GPUBROKER_UNITS"], os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
while True:
    time.sleep(0.05)
"""


def test_the_main_process_holding_it_is_killed_and_the_restart_policy_applies(client, agent):
    """The workload's own process ignores SIGUSR1 and keeps the device: it is evicted like any other, its run ends
    killed, and ``on-failure`` starts the next run with the devices left (``restart_policy: never`` would end it)."""
    first, _second = two_gpus(client, "mh")
    client.workload_start("wl-mh", {"instances": ["mh-0", "mh-1"], "restart_policy": "on-failure",
                                    "command": [sys.executable, "-c", MAIN_HOLDS, str(agent.devices)]})
    wait_for(lambda: "up 2" in client.workload_logs("wl-mh")["data"])
    client.destroy("mh-1", resize=True)
    workload = wait_for(lambda: (w := client.workload("wl-mh"))["local_restarts"] == 1 and w)
    wait_for(lambda: f"up 1 {first['device_uuid']}" in client.workload_logs("wl-mh")["data"])
    workload = client.workload("wl-mh")
    assert workload["runs"][0]["signal"] == 9 and workload["runs"][0]["outcome"] == "failed"
    [evicted] = [e for e in workload["events"] if e["kind"] == "evicted"]
    assert evicted["detail"].endswith("still open after 1 s; the workload's main process: its run ends")
    assert workload["state"] == "running" and workload["runs"][1]["ended_at"] is None
    client.workload_stop("wl-mh", grace_seconds=0)
    wait_for(lambda: client.workload("wl-mh")["state"] == "stopped")


def test_a_pending_eviction_survives_an_agent_restart(client, agent):
    two_gpus(client, "rs")
    client.workload_start("wl-rs", {"instances": ["rs-0", "rs-1"],
                                    "command": [sys.executable, "-c", HOLDERS, str(agent.devices), "stay"]})
    kids = holders_started(client, "wl-rs")
    client.destroy("rs-1", resize=True)
    agent.kill9()  # before the grace is over: the eviction is in workloads.json
    saved = json.loads((agent.state_dir / "workloads.json").read_text())["workloads"]["wl-rs"]
    assert [e["allocation_id"] for e in saved["evictions"]] == ["rs-1"]
    agent.start()
    client = agent.client(retries=0)
    wait_for(lambda: not alive(kids[1]), timeout=10)
    assert alive(kids[0])
    assert [e["pid"] for e in events(client, "wl-rs", "evicted")] == [kids[1]]
    assert "evictions" not in client.workload("wl-rs")  # internal: the events say what happened
    client.workload_stop("wl-rs", grace_seconds=0)
    wait_for(lambda: client.workload("wl-rs")["state"] == "stopped")


def test_holds_device_sees_a_descriptor_and_a_mapping_without_one(tmp_path):
    devices = make_devices(tmp_path / "dev")
    path = devices / "nvidia1"
    identity = device_identity(path)
    libc = ctypes.CDLL(None, use_errno=True)  # mmap(2) itself: Python's mmap keeps a descriptor of its own
    libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                              ctypes.c_int, ctypes.c_int, ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    descriptor = os.open(path, os.O_RDONLY)
    assert holds_device(os.getpid(), identity, path) == "open"
    address = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, descriptor, 0)
    os.close(descriptor)
    try:
        assert address not in (None, ctypes.c_void_p(-1).value)
        assert holds_device(os.getpid(), identity, path) == "mapped"  # the descriptor closed, the mapping kept
    finally:
        libc.munmap(address, 4096)
    assert holds_device(os.getpid(), identity, path) == ""
    assert device_identity(devices / "nvidia7") is None
    leader = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
                               "time.sleep(30)"], start_new_session=True)
    try:
        members = wait_for(lambda: len(m := session_members(leader.pid)) == 2 and m)
        assert leader.pid in members and os.getpid() not in members
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()


# -- isolated: the run's cgroup finds a holder that left its session ---------------------------------------------
ROOT = real_part("root (the agent starts workloads as other users)", os.geteuid() == 0,
                 "run the suite as root, as the node agent runs (its DaemonSet)")


@pytest.fixture(scope="module")
def isolated(tmp_path_factory):
    process = start_agent(tmp_path_factory, "--isolation", "uid")
    yield process
    process.stop()


@ROOT
def test_isolated_a_holder_that_left_the_session_is_found_in_the_cgroup_and_killed(isolated):
    client = isolated.client(retries=0)
    if not Cgroups().version:
        pytest.skip("no writable cgroups here: an isolated run has no group to be found in")
    two_gpus(client, "is")
    client.workload_start("wl-is", {"instances": ["is-0", "is-1"], "scope": "acme/vision",
                                    "command": [sys.executable, "-c", HOLDERS, str(isolated.devices), "escape"]})
    kids = holders_started(client, "wl-is")
    run = client.workload("wl-is")["runs"][0]["pid"]
    wait_for(lambda: os.getsid(kids[1]) == kids[1] != run)  # out of the run's session and process group
    client.destroy("is-1", resize=True)
    wait_for(lambda: not alive(kids[1]), timeout=10)
    assert alive(kids[0])
    [revoked] = events(client, "wl-is", "revoked")
    assert "not taken from its processes" in revoked["detail"]  # a stand-in file is no character device
    assert [e["pid"] for e in events(client, "wl-is", "evicted")] == [kids[1]]
    client.workload_stop("wl-is", grace_seconds=0)
    wait_for(lambda: client.workload("wl-is")["state"] == "stopped")
