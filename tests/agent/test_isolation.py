"""Isolation of the process runtime (issue 28; issue 27's "a workload can no longer read a token of any
kind"): a real agent, as root, runs each tenant's workload as that tenant's own uid, in its own cgroup and
mount namespace. A hostile workload's every attempt is made for real and must fail: the node secret, the
agent's state, another tenant's environment, logs and files, another GPU's device node, a signal to another
tenant's process, a write outside its own directories. Stand-in GPU device nodes (character devices of
NVIDIA's major 195, made with mknod) sit in a directory the agent takes as its ``--device-dir``."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agent.isolation import (
    Cgroups,
    Isolation,
    Limits,
    UidMap,
    missing_capabilities,
    parse_uid_range,
    resolve_mode,
)
from agent.protocol import AgentHTTPError
from agent.workloads import WorkloadManager
from core.processes import wait_until
from tests.real_parts import real_part, require
from tests.support.agents import SECRET, AgentProcess

# the agent switches users: only root can (skipped elsewhere locally, a failure with CI=true)
pytestmark = [real_part("root (the agent starts workloads as other users)", os.geteuid() == 0,
                        "run the suite as root, as the node agent runs (its DaemonSet)")]

GPUS = "a100-80gb:2:whole,h100-80gb:1:mig"
PLANTED = "planted-api-key-of-acme-5d1e0b"


def wait_for(predicate, timeout: float = 20.0):
    return wait_until(predicate, timeout=timeout, step=0.05)


def final(client, workload_id: str) -> dict:
    return wait_for(lambda: (w := client.workload(workload_id))["state"] not in ("running", "backoff") and w)


def child_of(pid: int) -> int:
    """The workload's own process: the shim's child (the shim is the run's pid)."""
    return wait_for(lambda: [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()])[0]


@pytest.fixture(scope="module")
def devices(tmp_path_factory) -> Path:
    """nvidia0, nvidia1 (the node's two A100s) and nvidiactl as NVIDIA's driver numbers them."""
    directory = tmp_path_factory.mktemp("dev")
    directory.chmod(0o755)  # as /dev
    for name, minor in (("nvidia0", 0), ("nvidia1", 1), ("nvidia2", 2), ("nvidiactl", 255)):
        os.mknod(directory / name, stat.S_IFCHR | 0o666, os.makedev(195, minor))
        (directory / name).chmod(0o666)  # as the driver makes them: the device cgroup is what keeps a run out
    return directory


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("shared")


@pytest.fixture(scope="module")
def agent(tmp_path_factory, shared, devices):
    state = tmp_path_factory.mktemp("agent")
    descriptor = os.open(state / "secret", os.O_WRONLY | os.O_CREAT, 0o600)  # a node secret where an enrolled
    os.write(descriptor, SECRET.encode())  # agent keeps it (this one is also given --secret)
    os.close(descriptor)
    process = AgentProcess(state, gpus=GPUS,
                           extra=("--workload-root", str(shared), "--device-dir", str(devices))).start()
    yield process
    process.stop()


def whole(client, allocation_id: str, index: int) -> dict:
    gpu = next(g for g in client.inventory()["gpus"] if g["mode"] == "whole" and g["index"] == index)
    return client.create(allocation_id, {"kind": "whole", "gpu": gpu["uuid"]})


VICTIM = """
import os, sys, time
open(os.path.join(os.environ["CHECKPOINT_DIR"], "weights.bin"), "w").write("acme's model")
print("victim up", os.getuid(), flush=True)
while not os.path.exists(os.path.join(os.environ["CHECKPOINT_DIR"], "stop")):
    time.sleep(0.05)
"""

# The attacker: every probe is a real system call; each result is what the call did.
ATTACK = r"""
import errno, json, os, signal, sys
probes = json.loads(sys.argv[1])
found = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "home": os.environ["HOME"]}
def attempt(name, action):
    try:
        result = action()
        found[name] = "ok" if result is None else result
    except OSError as error:
        found[name] = errno.errorcode[error.errno]
def read(path):
    with open(path, "rb") as handle:
        return "read %d bytes" % len(handle.read())
def write(path):
    with open(path, "w") as handle:
        handle.write("x")
for name, path in probes["read"].items():
    attempt("read " + name, lambda path=path: read(path))
for name, path in probes["list"].items():
    attempt("list " + name, lambda path=path: sorted(os.listdir(path)))
for name, path in probes["write"].items():
    attempt("write " + name, lambda path=path: write(path))
for name, path in probes["open"].items():
    attempt("open " + name, lambda path=path: os.close(os.open(path, os.O_RDWR)))
for name, pid in probes["signal"].items():
    attempt("signal " + name, lambda pid=pid: os.kill(pid, signal.SIGTERM))
found["visible pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
found["own pid"] = os.getpid()
print(json.dumps(found), flush=True)
"""


def test_isolation_a_hostile_workload_reads_no_token_reaches_no_other_gpu_and_signals_no_one(
        client, agent, shared, devices):
    whole(client, "victim-gpu", 0)
    whole(client, "attacker-gpu", 1)
    client.workload_start("wl-victim", {
        "instances": ["victim-gpu"], "command": [sys.executable, "-c", VICTIM], "scope": "acme/vision",
        "checkpoint_dir": str(shared / "acme/vision/ckpt"), "secret_env": {"ACME_API_KEY": PLANTED}})
    wait_for(lambda: "victim up" in client.workload_logs("wl-victim")["data"])
    victim = client.workload("wl-victim")
    victim_pid = child_of(victim["runs"][0]["pid"])
    assert PLANTED.encode() in Path(f"/proc/{victim_pid}/environ").read_bytes()  # its own secret works
    state = agent.state_dir
    logs = sorted(p for p in (state / "workloads" / "wl-victim").iterdir() if p.name.startswith("stdout"))
    probes = {
        "read": {"node secret": str(state / "secret"), "victim environ": f"/proc/{victim_pid}/environ",
                 "victim log": str(logs[0]), "victim secret file": str(state / "workloads/wl-victim/secret_env.json"),
                 "workloads.json": str(state / "workloads.json"), "uid map": str(state / "isolation.json"),
                 "victim checkpoint": str(shared / "acme/vision/ckpt/weights.bin"),
                 "agent environ": f"/proc/{agent.process.pid}/environ", "shadow": "/etc/shadow"},
        "list": {"state dir": str(state), "victim tenant": str(shared / "acme"), "shared root": str(shared)},
        "write": {"state dir": str(state / "planted"), "victim checkpoint": str(shared / "acme/vision/ckpt/x"),
                  "shared root": str(shared / "planted"), "etc": "/etc/planted",
                  "own checkpoint": str(shared / "rival/ml/ckpt/mine"), "private tmp": "/tmp/mine"},
        "open": {"leased gpu": str(devices / "nvidia1"), "victim gpu": str(devices / "nvidia0"),
                 "third gpu": str(devices / "nvidia2")},
        "signal": {"victim": victim_pid, "victim's shim": victim["runs"][0]["pid"], "agent": agent.process.pid},
    }
    client.workload_start("wl-attacker", {
        "instances": ["attacker-gpu"], "command": [sys.executable, "-c", ATTACK], "args": [json.dumps(probes)],
        "scope": "rival/ml", "checkpoint_dir": str(shared / "rival/ml/ckpt")})
    assert final(client, "wl-attacker")["state"] == "succeeded"
    found = json.loads(client.workload_logs("wl-attacker")["data"].splitlines()[-1])
    victim_uid = Path(f"/proc/{victim_pid}").stat().st_uid
    low, high = parse_uid_range("200000-265535")
    assert low <= found["uid"] <= high and low <= victim_uid <= high and found["uid"] != victim_uid
    assert found["gid"] == found["uid"] and found["groups"] == []
    # every token and every other workload's file: not even there to be opened (its own view) or refused
    for name in probes["read"]:
        assert found[f"read {name}"] in ("ENOENT", "EACCES", "EPERM"), (name, found[f"read {name}"])
    for name in probes["list"]:
        assert found[f"list {name}"] in ("ENOENT", "EACCES"), (name, found[f"list {name}"])
    for name in ("state dir", "victim checkpoint", "shared root", "etc"):
        assert found[f"write {name}"] in ("ENOENT", "EACCES", "EROFS"), (name, found[f"write {name}"])
    assert found["write own checkpoint"] == "ok" and found["write private tmp"] == "ok"
    assert not Path("/tmp/mine").exists()
    # its leased GPU passes the device cgroup (no driver behind the stand-in node: ENXIO); the others do not
    assert found["open leased gpu"] == "ENXIO"
    assert found["open victim gpu"] == "EPERM" and found["open third gpu"] == "EPERM"
    for name in probes["signal"]:
        assert found[f"signal {name}"] == "EPERM", (name, found[f"signal {name}"])
    assert found["visible pids"] == [found["own pid"]]  # hidepid: no other process, command line or environment
    assert PLANTED not in json.dumps(found) and SECRET not in json.dumps(found)
    # the victim lived through it all, its secret still in its own environment only
    assert client.workload("wl-victim")["state"] == "running"
    (shared / "acme/vision/ckpt/stop").touch()
    assert final(client, "wl-victim")["state"] == "succeeded"


def test_isolation_uid_per_tenant_kept_across_restarts_and_directories_owned(client, agent, shared):
    uids = {}
    for n, scope in enumerate(("acme/vision", "acme/speech", "rival/ml")):
        whole(client, f"u{n}", n % 2)
        client.workload_start(f"wl-uid-{n}", {
            "instances": [f"u{n}"], "command": [sys.executable, "-c", "import os; print(os.getuid())"],
            "scope": scope, "workdir": str(shared / scope / "work")})
        assert final(client, f"wl-uid-{n}")["state"] == "succeeded"
        uids[scope] = int(client.workload_logs(f"wl-uid-{n}")["data"].splitlines()[-1])
        client.destroy(f"u{n}")
    assert uids["acme/vision"] == uids["acme/speech"] != uids["rival/ml"]
    for scope in uids:
        for path in (shared / scope.split("/")[0], shared / scope, shared / scope / "work"):
            info = path.stat()
            assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (uids[scope], 0o700), path
    mapping = json.loads((agent.state_dir / "isolation.json").read_text())["uids"]
    assert mapping == {"acme": uids["acme/vision"], "rival": uids["rival/ml"]}
    for path in (agent.state_dir, agent.state_dir / "isolation.json", agent.state_dir / "workloads.json",
                 agent.state_dir / "secret"):
        assert stat.S_IMODE(path.stat().st_mode) in (0o700, 0o600) and path.stat().st_uid == 0, path
    # the map is kept: a fresh map over the same state directory gives the same uids
    assert UidMap(agent.state_dir, 200000, 265535).uid_for("rival") == uids["rival/ml"]


SLEEPER = "import time; print('up', flush=True); time.sleep(60)"
# an elastic workload: told its new size by SIGUSR1 (whose default action would end it), it carries on
ELASTIC_SLEEPER = ("import signal, time; signal.signal(signal.SIGUSR1, lambda *_: None); print('up', flush=True); "
                   "time.sleep(60)")


def cgroup_of(pid: int, workload_id: str) -> dict[str, Path]:
    """The v1 groups a running process is in (controller -> directory), checked to be the workload's."""
    lines = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        lines.update({name: path for name in names.split(",")})
    group = {}
    for controller in ("memory", "cpu", "pids", "devices"):  # nested under the agent's own group
        assert lines[controller].endswith(f"/gpubroker/{workload_id}"), (controller, lines)
        group[controller] = Path("/sys/fs/cgroup") / controller / lines[controller].lstrip("/")
    return group


V1 = ("cgroup v1 controllers (memory, cpu, pids, devices) under /sys/fs/cgroup",
      "a machine with cgroup v1 (the v2 driver is tested on a cgroup2-shaped tree below)")


def test_isolation_cgroup_holds_the_lease_limits_and_ends_with_the_run(client, agent):
    """No host ask in the workload: the node's share per leased GPU (a whole GPU of three: a third)."""
    require(V1[0], Cgroups().version == "v1", V1[1])
    whole(client, "cg", 1)
    client.workload_start("wl-cg", {"instances": ["cg"], "command": [sys.executable, "-c", SLEEPER]})
    wait_for(lambda: "up" in client.workload_logs("wl-cg")["data"])
    pid = child_of(client.workload("wl-cg")["runs"][0]["pid"])
    group = cgroup_of(pid, "wl-cg")
    gpus = 3  # the agent's GPUS: two A100s and an H100 -- one whole GPU is a third of the node
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1 << 20) // gpus << 20
    assert int((group["memory"] / "memory.limit_in_bytes").read_text()) == memory // 4096 * 4096
    quota = int((os.cpu_count() / gpus) * 1000) * 100
    assert (group["cpu"] / "cpu.cfs_quota_us").read_text().strip() == str(quota)
    assert (group["pids"] / "pids.max").read_text().strip() == "4096"
    allowed = (group["devices"] / "devices.list").read_text().split("\n")
    assert "c 195:1 rwm" in allowed and "c 195:255 rwm" in allowed and "c 195:0 rwm" not in allowed
    assert client.workload("wl-cg")["limits"] == {"cpu_milli": quota // 100, "memory_bytes": memory}
    client.workload_stop("wl-cg", grace_seconds=0)
    assert final(client, "wl-cg")["state"] == "stopped"
    assert not any(path.exists() for path in group.values())  # removed with the run
    client.destroy("cg")


def test_isolation_cgroup_holds_the_host_cpu_and_memory_the_lease_asked_for(client, agent):
    """The broker sends the lease's host ask on this node (``cpu_milli``, ``memory_mib``): half a CPU and
    256 MiB, whatever the node's share per GPU; read from the cgroup files while the run goes on. A bad ask is
    refused with a problem naming the field, and nothing runs."""
    require(V1[0], Cgroups().version == "v1", V1[1])
    whole(client, "cg-ask", 1)
    for bad, field in (({"cpu_milli": -1}, "cpu_milli"), ({"memory_mib": "256"}, "memory_mib"),
                       ({"cpu_milli": True}, "cpu_milli"), ({"memory_mib": 1 << 40}, "memory_mib")):
        with pytest.raises(AgentHTTPError) as refused:
            client.workload_start("wl-ask-bad", {"instances": ["cg-ask"], "command": ["true"], **bad})
        assert refused.value.status == 422 and refused.value.problem["field"] == field, refused.value.problem
    client.workload_start("wl-ask", {"instances": ["cg-ask"], "command": [sys.executable, "-c", SLEEPER],
                                     "cpu_milli": 500, "memory_mib": 256})
    wait_for(lambda: "up" in client.workload_logs("wl-ask")["data"])
    pid = child_of(client.workload("wl-ask")["runs"][0]["pid"])
    group = cgroup_of(pid, "wl-ask")
    quota = int((group["cpu"] / "cpu.cfs_quota_us").read_text())
    period = int((group["cpu"] / "cpu.cfs_period_us").read_text())
    assert (quota, period) == (50_000, 100_000) and quota / period == 0.5
    assert int((group["memory"] / "memory.limit_in_bytes").read_text()) == 256 << 20
    assert (group["pids"] / "pids.max").read_text().strip() == "4096"
    allowed = (group["devices"] / "devices.list").read_text().split("\n")
    assert "c 195:1 rwm" in allowed and "c 195:0 rwm" not in allowed  # the devices as without an ask
    answer = client.workload("wl-ask")
    assert answer["limits"] == {"cpu_milli": 500, "memory_bytes": 256 << 20}
    assert (answer["spec"]["cpu_milli"], answer["spec"]["memory_mib"]) == (500, 256)
    again = client.workload_start("wl-ask", {"instances": ["cg-ask"], "command": [sys.executable, "-c", SLEEPER],
                                             "cpu_milli": 500, "memory_mib": 256})
    assert again["runs"] == answer["runs"]  # the same body again: the workload as it is
    client.workload_stop("wl-ask", grace_seconds=0)
    assert final(client, "wl-ask")["state"] == "stopped"
    assert not any(path.exists() for path in group.values())
    client.destroy("cg-ask")


def test_isolation_an_elastic_resize_scales_the_asked_cpu_and_memory_in_the_running_cgroup(client, agent):
    """Two units asked 1 CPU and 512 MiB (the lease's ask per unit × 2): a shrink to one unit halves the running
    cgroup's CPU quota and memory limit at once, as the scheduler's reservation shrinks; growing back restores
    them. The spec's ask and the workload's ``limits`` follow."""
    require(V1[0], Cgroups().version == "v1", V1[1])
    whole(client, "rs0", 0)
    whole(client, "rs1", 1)
    client.workload_start("wl-rs", {"instances": ["rs0", "rs1"], "command": [sys.executable, "-c", ELASTIC_SLEEPER],
                                    "cpu_milli": 1000, "memory_mib": 512})
    wait_for(lambda: "up" in client.workload_logs("wl-rs")["data"])
    group = cgroup_of(child_of(client.workload("wl-rs")["runs"][0]["pid"]), "wl-rs")

    def limits():
        return (int((group["cpu"] / "cpu.cfs_quota_us").read_text()),
                int((group["memory"] / "memory.limit_in_bytes").read_text()) >> 20)

    assert limits() == (100_000, 512)
    client.destroy("rs1", resize=True)
    assert limits() == (50_000, 256)
    answer = client.workload("wl-rs")
    assert answer["limits"] == {"cpu_milli": 500, "memory_bytes": 256 << 20}
    assert (answer["spec"]["cpu_milli"], answer["spec"]["memory_mib"]) == (500, 256)
    assert [e["detail"] for e in answer["events"] if e["kind"] == "limits"] == [
        "cgroup resized for 1 unit(s): 500 milli-CPU, 256 MiB"]
    whole(client, "rs1b", 1)
    client.workload_grow("wl-rs", ["rs1b"])
    assert limits() == (100_000, 512)
    assert client.workload("wl-rs")["limits"] == {"cpu_milli": 1000, "memory_bytes": 512 << 20}
    client.workload_stop("wl-rs", grace_seconds=0)
    assert final(client, "wl-rs")["state"] == "stopped"


PROBE_GPUS = """
import errno, json, os, signal, sys, time
def probe(tag):
    found = {}
    for n in (0, 1):
        try:
            os.close(os.open(f"{sys.argv[1]}/nvidia{n}", os.O_RDWR))
            found[n] = "ok"
        except OSError as error:
            found[n] = errno.errorcode[error.errno]
    os.write(1, (tag + " " + json.dumps(found) + "\\n").encode())
signal.signal(signal.SIGUSR1, lambda signum, frame: probe("after"))
probe("before")
while True:
    time.sleep(0.05)
"""


def test_isolation_a_gpu_given_back_by_a_shrink_is_denied_to_the_running_workload_at_once(client, devices):
    """An elastic lease's ``DELETE ?resize=1``: the device node of the GPU given back leaves the workload's devices
    cgroup before it is told (SIGUSR1), so from then on no open of it succeeds; the GPU it kept still opens (the
    stand-in has no driver behind it: ENXIO, not EPERM). Its holders are evicted after the grace
    (tests/agent/test_shrink_eviction.py)."""
    require("cgroup v1 controllers (memory, cpu, pids, devices) under /sys/fs/cgroup", Cgroups().version == "v1",
            "a machine with cgroup v1 (v2 has no devices controller: a shrink only evicts there)")
    whole(client, "rv0", 0)
    whole(client, "rv1", 1)
    client.workload_start("wl-rv", {"instances": ["rv0", "rv1"], "scope": "acme/vision",
                                    "command": [sys.executable, "-c", PROBE_GPUS, str(devices)]})
    seen = lambda tag: next((json.loads(x.split(" ", 1)[1]) for x in  # noqa: E731
                             client.workload_logs("wl-rv")["data"].splitlines() if x.startswith(tag + " ")), None)
    assert wait_for(lambda: seen("before")) == {"0": "ENXIO", "1": "ENXIO"}
    pid = child_of(client.workload("wl-rv")["runs"][0]["pid"])
    path = next(line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                if "devices" in line.split(":")[1].split(","))
    listed = Path("/sys/fs/cgroup/devices") / path.lstrip("/") / "devices.list"
    assert {"c 195:0 rwm", "c 195:1 rwm"} <= set(listed.read_text().splitlines())
    client.destroy("rv1", resize=True)
    assert wait_for(lambda: seen("after")) == {"0": "ENXIO", "1": "EPERM"}
    allowed = set(listed.read_text().splitlines())
    assert "c 195:0 rwm" in allowed and "c 195:1 rwm" not in allowed and "c 195:255 rwm" in allowed
    [revoked] = [e for e in client.workload("wl-rv")["events"] if e["kind"] == "revoked"]
    assert f"{devices}/nvidia1 denied to its cgroup (c 195:1 rwm)" in revoked["detail"]
    # the lease grows back onto that GPU (``POST /v1/workloads/{id}/grow``) within the grace: the device is
    # allowed again before the workload is told, and the eviction still pending for it is dropped
    whole(client, "rv1b", 1)
    client.workload_grow("wl-rv", ["rv1b"])
    assert wait_for(lambda: [x for x in client.workload_logs("wl-rv")["data"].splitlines()
                             if x.startswith("after ")][1:]) == ['after {"0": "ENXIO", "1": "ENXIO"}']
    assert "c 195:1 rwm" in set(listed.read_text().splitlines())
    events = client.workload("wl-rv")["events"]
    assert [e["detail"] for e in events if e["kind"] == "granted"] == [
        f"{devices}/nvidia1 allowed in its cgroup (c 195:1 rwm)"]
    assert any("eviction from" in e["detail"] and "dropped" in e["detail"] for e in events if e["kind"] == "revoked")
    assert client.workload("wl-rv")["state"] == "running"
    client.workload_stop("wl-rv", grace_seconds=0)
    assert final(client, "wl-rv")["state"] == "stopped"


STAT_GPUS = """
import os, signal, sys, time
def seen(tag):
    nodes = [os.stat(f"{sys.argv[1]}/nvidia{n}").st_rdev for n in (0, 1)]
    os.write(1, (tag + " " + " ".join(f"{os.major(r)}:{os.minor(r)}" for r in nodes) + "\\n").encode())
signal.signal(signal.SIGUSR1, lambda signum, frame: seen("after"))
seen("before")
while True:
    time.sleep(0.05)
"""


def test_isolation_without_a_devices_cgroup_a_gpu_given_back_is_masked_in_the_runs_namespace(
        tmp_path, shared, devices):
    """cgroup v2 has no devices controller (here: no cgroups at all, ``--cgroup-root`` an empty directory): at a
    shrink the agent binds /dev/null over the GPU given back inside the running workload's own mount namespace
    (``setns`` from a helper), before telling it; the node's own view and the GPU kept are untouched."""
    empty = tmp_path / "no-cgroups"
    empty.mkdir()
    agent = AgentProcess(tmp_path / "agent", gpus=GPUS, extra=(
        "--workload-root", str(shared), "--device-dir", str(devices), "--cgroup-root", str(empty))).start()
    try:
        client = agent.client(retries=0)
        assert client.inventory()["isolation"]["devices"] == "namespace"
        whole(client, "ns0", 0)
        whole(client, "ns1", 1)
        client.workload_start("wl-ns", {"instances": ["ns0", "ns1"], "scope": "acme/vision",
                                        "command": [sys.executable, "-c", STAT_GPUS, str(devices)]})
        line = lambda tag: next((x for x in client.workload_logs("wl-ns")["data"].splitlines()  # noqa: E731
                                 if x.startswith(tag + " ")), None)
        assert wait_for(lambda: line("before")) == "before 195:0 195:1"
        client.destroy("ns1", resize=True)
        assert wait_for(lambda: line("after")) == "after 195:0 1:3"  # in its view: /dev/null
        assert os.stat(devices / "nvidia1").st_rdev == os.makedev(195, 1)  # the node's view: the GPU
        [revoked] = [e for e in client.workload("wl-ns")["events"] if e["kind"] == "revoked"]
        assert f"{devices}/nvidia1 masked with /dev/null in its mount namespace;" in revoked["detail"]
        # grown back onto that GPU: the masks are unmounted in its namespace, it sees the device node again
        whole(client, "ns1b", 1)
        client.workload_grow("wl-ns", ["ns1b"])
        assert wait_for(lambda: [x for x in client.workload_logs("wl-ns")["data"].splitlines()
                                 if x.startswith("after ")][1:]) == ["after 195:0 195:1"]
        assert [e["detail"] for e in client.workload("wl-ns")["events"] if e["kind"] == "granted"] == [
            f"{devices}/nvidia1 unmasked in its mount namespace"]
        client.workload_stop("wl-ns", grace_seconds=0)
        assert final(client, "wl-ns")["state"] == "stopped"
    finally:
        agent.stop()


def test_isolation_a_process_that_left_its_group_is_killed_with_the_run(client):
    """``setsid`` takes a process out of the run's process group (SIGKILL to the group misses it); the
    cgroup does not let it go."""
    escape = ("import os, subprocess, sys, time; "
              "p = subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(60)']); "
              "print('child', p.pid, flush=True); time.sleep(60)")
    whole(client, "esc", 0)
    client.workload_start("wl-esc", {"instances": ["esc"], "command": [sys.executable, "-c", escape]})
    line = wait_for(lambda: next((x for x in client.workload_logs("wl-esc")["data"].splitlines()
                                  if x.startswith("child")), None))
    # the pid it printed is its own namespace's... the same pid namespace: the node's pid
    escaped = int(line.split()[1])
    wait_for(lambda: os.getsid(escaped) == escaped)
    client.workload_stop("wl-esc", grace_seconds=0)
    assert final(client, "wl-esc")["state"] == "stopped"
    wait_for(lambda: not Path(f"/proc/{escaped}").exists() or
             Path(f"/proc/{escaped}/stat").read_text().split()[2] == "Z", timeout=10)


def test_isolation_a_symbolic_link_in_a_tenant_directory_never_leads_the_agent_out(client, shared, tmp_path):
    """The agent creates and hands over the tenant's directories as root: a link the tenant left where its
    checkpoint directory goes is refused (422 naming the field), and its target is not handed over."""
    target = tmp_path / "not-yours"
    target.mkdir()
    (shared / "evil/p").mkdir(parents=True)
    (shared / "evil/p/ckpt").symlink_to(target)
    whole(client, "sym", 0)
    with pytest.raises(AgentHTTPError) as refused:
        client.workload_start("wl-sym", {"instances": ["sym"], "command": ["true"], "scope": "evil/p",
                                         "checkpoint_dir": str(shared / "evil/p/ckpt")})
    assert refused.value.status in (400, 422) and refused.value.problem["field"] == "checkpoint_dir"
    assert target.stat().st_uid == 0
    with pytest.raises(AgentHTTPError):
        client.workload("wl-sym")  # nothing recorded


def test_isolation_inventory_reports_it(client, agent):
    inventory = client.inventory()
    assert inventory["workload_runtime"] == "process"
    assert inventory["isolation"]["mode"] == "uid" and inventory["isolation"]["cgroup"] in ("v1", "v2")


def test_isolation_none_is_reported_and_warned(tmp_path):
    agent = AgentProcess(tmp_path / "a", gpus=GPUS, extra=("--isolation", "none")).start()
    try:
        assert agent.client(retries=0).inventory()["isolation"] == {"mode": "none", "cgroup": "", "devices": "none"}
    finally:
        agent.stop()
    log = agent.process.stderr.read().decode()
    assert "workloads run as the agent's own user (isolation none)" in log


def test_isolation_auto_is_uid_for_root_only_and_uid_needs_root():
    assert resolve_mode("auto", euid=0, missing=[]) == "uid" and resolve_mode("auto", euid=1000) == "none"
    assert resolve_mode("auto", euid=0, missing=["SETUID"]) == "none"  # a container that dropped it
    with pytest.raises(ValueError, match="needs the agent to run as root"):
        resolve_mode("uid", euid=1000)
    with pytest.raises(ValueError, match="lacks KILL"):
        resolve_mode("uid", euid=0, missing=["KILL"])
    assert missing_capabilities() == []  # this test's root has them all (the agent tests above ran with them)
    with pytest.raises(ValueError, match="isolation must be one of"):
        resolve_mode("sometimes", euid=0)
    for bad in ("0-10", "300-200", "abc", "5000"):
        with pytest.raises(ValueError, match="workload_uids"):
            parse_uid_range(bad)


def test_isolation_environ_of_another_users_process_is_unreadable(tmp_path):
    """Without any namespace: the kernel's ptrace rule alone keeps one uid from another's environment."""
    python = "/usr/bin/python3"
    require("/usr/bin/python3 (a python an unprivileged user may run)", os.access(python, os.X_OK),
            "apt-get install python3")
    victim = subprocess.Popen([python, "-c", "import time; time.sleep(30)"], user=210001, group=210001,
                              extra_groups=[], env={"ACME_API_KEY": PLANTED})
    try:
        wait_for(lambda: Path(f"/proc/{victim.pid}/status").read_text().count("210001") >= 2)
        reader = subprocess.run([python, "-c", f"open('/proc/{victim.pid}/environ', 'rb').read()"], user=210002,
                                group=210002, extra_groups=[], capture_output=True, text=True, check=False)
        assert reader.returncode != 0 and "PermissionError" in reader.stderr
        assert PLANTED.encode() in Path(f"/proc/{victim.pid}/environ").read_bytes()  # it is there to be read
    finally:
        victim.kill()
        victim.wait()


# -- the cgroup driver's v2 path on a cgroup2-shaped tree ------------------------------------------------
def test_cgroup_v2_driver_writes_the_limits_and_delegates_controllers(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    (tmp_path / "cgroup.procs").write_text("")
    driver = Cgroups(tmp_path)
    assert driver.version == "v2" and not driver.restricts_devices
    (tmp_path / "gpubroker").mkdir()
    (tmp_path / "gpubroker/cgroup.subtree_control").write_text("")
    procs = driver.create("wl-a", Limits(cpu_milli=2500, memory_bytes=8 << 30, pids=512))
    group = tmp_path / "gpubroker/wl-a"
    assert procs == [group / "cgroup.procs"]
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (tmp_path / "gpubroker/cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (group / "memory.max").read_text() == str(8 << 30)
    assert (group / "cpu.max").read_text() == "250000 100000"
    assert (group / "pids.max").read_text() == "512"
    driver.create("wl-b", Limits())
    assert (tmp_path / "gpubroker/wl-b/memory.max").read_text() == "max"
    assert (tmp_path / "gpubroker/wl-b/cpu.max").read_text() == "max 100000"


def test_cgroup_driver_without_controllers_is_none(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("\n")  # a cgroup2 mount with nothing delegated (this VM's)
    driver = Cgroups(tmp_path)
    assert driver.version == "" and driver.create("x", Limits()) == []


def test_isolation_on_v2_masks_every_gpu_not_leased(tmp_path, devices):
    isolation = Isolation(mode="none", state_dir=tmp_path, device_dir=devices)
    masked = isolation.masked_devices([{"kind": "whole", "gpu_index": 1}])
    assert masked == [str(devices / "nvidia0"), str(devices / "nvidia2")]  # nvidiactl stays reachable
    limits = isolation.limits([{"kind": "share", "milli": 250, "gpu_index": 1}])
    assert "c 195:1 rwm" in limits.devices and "c 195:255 rwm" in limits.devices
    assert "c 195:0 rwm" not in limits.devices


def test_isolation_host_limits_are_the_ask_else_the_share_of_the_nodes_per_gpu():
    isolation = Isolation(mode="none", cpu_milli_per_gpu=8000, memory_bytes_per_gpu=64 << 30)
    whole_gpu = {"kind": "whole", "gpu_index": 0, "gpu_fraction": 1.0}
    assert isolation.host_limits([whole_gpu, whole_gpu]) == (16_000, 128 << 30)
    # a share or MIG instance: its fraction of its GPU (as the manager records it), else milli / slots of 8
    assert isolation.host_limits([{"kind": "share", "gpu_fraction": 0.25}]) == (2000, 16 << 30)
    assert isolation.host_limits([{"kind": "share", "milli": 500}]) == (4000, 32 << 30)
    assert isolation.host_limits([{"kind": "mig", "slots": 2}]) == (2000, 16 << 30)
    # the lease's ask, each on its own; the floors (a 1 ms quota, 6 MiB)
    assert isolation.host_limits([whole_gpu], {"cpu_milli": 500, "memory_mib": 256}) == (500, 256 << 20)
    assert isolation.host_limits([whole_gpu], {"cpu_milli": 1500}) == (1500, 64 << 30)
    assert isolation.host_limits([whole_gpu], {"memory_mib": 1024}) == (8000, 1 << 30)
    assert isolation.host_limits([whole_gpu], {"cpu_milli": 1, "memory_mib": 1}) == (10, 6 << 20)
    assert Isolation(mode="none").host_limits([whole_gpu]) == (0, 0)  # per-GPU figures unknown: no limit


def test_isolation_masked_gpu_node_in_the_launchers_view_is_dev_null(tmp_path, devices):
    """The v2 way (no devices controller): the launcher binds /dev/null over every GPU not leased in the
    run's own mount namespace; the node's own view is untouched."""
    launcher = [sys.executable, "-I", str(Path("agent/isolation.py").resolve()), "--uid", "210003", "--gid", "210003",
                "--mask-device", str(devices / "nvidia0"), "--share", str(devices), "--private-tmp", "--hide-proc",
                "--", "/usr/bin/python3", "-c",
                f"import os; s = os.stat('{devices}/nvidia0'); t = os.stat('{devices}/nvidia1'); "
                "print(os.major(s.st_rdev), os.minor(s.st_rdev), os.major(t.st_rdev), os.minor(t.st_rdev))"]
    require("/usr/bin/python3 (a python an unprivileged user may run)", os.access("/usr/bin/python3", os.X_OK),
            "apt-get install python3")
    ran = subprocess.run(launcher, capture_output=True, text=True, check=False, timeout=30)
    assert ran.returncode == 0, ran.stderr
    seen = ran.stdout.split()
    assert seen == ["1", "3", "195", "1"]  # nvidia0 is /dev/null in there; nvidia1 is the GPU
    assert os.major(os.stat(devices / "nvidia0").st_rdev) == 195  # outside: unchanged


def test_a_manager_without_root_isolates_nothing_and_says_so(tmp_path, caplog):
    from agent.daemon import AgentConfig, build_isolation

    config = AgentConfig(node_id="n", state_dir=str(tmp_path), isolation="none").validate()
    with caplog.at_level(logging.WARNING, logger="agent"):
        isolation = build_isolation(config, tmp_path)
    assert isolation.describe()["mode"] == "none"
    assert "the agent's own user" in caplog.text
    manager = WorkloadManager(tmp_path, isolation=isolation)
    assert manager.report() == {"workload_runtime": "process", "isolation": isolation.describe()}


def test_isolation_a_fleets_nodes_share_one_uid_map(tmp_path):
    """Simulated nodes of one ``agent.fleet`` run on one machine: a tenant has one uid on all of them, and two
    tenants never share one (one map in the fleet's directory, not one per node)."""
    from agent.protocol import AgentClient
    from core import processes
    from core.processes import ROOT, free_port, wait_http

    port = free_port()
    fleet = processes.start([sys.executable, "-m", "agent.fleet", "--nodes", "2", "--listen", f"127.0.0.1:{port}",
                             "--state-dir", str(tmp_path), "--shape", "a100-80gb:1:whole", "--log-level", "WARNING"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", fleet)
        manifest = json.loads((tmp_path / "fleet.json").read_text())
        nodes = manifest["nodes"] if isinstance(manifest, dict) else manifest
        uids = {}
        for run, (node, scope) in enumerate([(nodes[0], "acme/a"), (nodes[1], "acme/b"), (nodes[1], "rival/c")]):
            client = AgentClient(node["url"], node["node_id"], node["secret"], retries=0)
            gpu = client.inventory()["gpus"][0]["uuid"]
            client.create(f"f{run}", {"kind": "whole", "gpu": gpu})
            client.workload_start(f"wl-f{run}", {"instances": [f"f{run}"], "scope": scope, "command": [
                sys.executable, "-c", "import os; print(os.getuid())"]})
            assert final(client, f"wl-f{run}")["state"] == "succeeded"
            uids[scope] = int(client.workload_logs(f"wl-f{run}")["data"].splitlines()[-1])
            client.destroy(f"f{run}")
        assert uids["acme/a"] == uids["acme/b"] != uids["rival/c"]
        assert json.loads((tmp_path / "isolation.json").read_text())["uids"] == {
            "acme": uids["acme/a"], "rival": uids["rival/c"]}
    finally:
        processes.stop(fleet, timeout=20)


# -- workload_network = "closed-local": the node's own services are closed to workloads ------------------
CLOSED_UIDS = (310000, 310999)  # a range of its own: the firewall's chain matches these uids only

PROBE_NETWORK = r"""
import errno, json, socket, sys
ports = json.loads(sys.argv[1])
found = {}
own = socket.socket()
own.bind(("127.0.0.1", 0))
own.listen()
ports["own listener"] = own.getsockname()[1]
for name, port in ports.items():
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        found[name] = "ok"
    except OSError as error:
        found[name] = errno.errorcode.get(error.errno, str(error))
for name, path in json.loads(sys.argv[2]).items():
    client = socket.socket(socket.AF_UNIX)
    try:
        client.connect(path)
        found[name] = "ok"
    except OSError as error:
        found[name] = errno.errorcode.get(error.errno, str(error))
print(json.dumps(found), flush=True)
"""


@pytest.fixture
def node_services(tmp_path):
    """Three services of the node, as root: a "database" on loopback, the broker's port that workloads may
    reach, and a unix socket under /run (as PostgreSQL's /run/postgresql)."""
    import socket

    listeners = []
    for _ in range(2):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listeners.append(listener)
    run_dir = Path(f"/run/gpub-test-{os.getpid()}")
    run_dir.mkdir(exist_ok=True)
    run_dir.chmod(0o755)
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(run_dir / "service.sock"))
    (run_dir / "service.sock").chmod(0o777)  # as PostgreSQL's: anyone may connect, the file system decides
    unix.listen()
    yield {"database": listeners[0].getsockname()[1], "broker": listeners[1].getsockname()[1],
           "socket": str(run_dir / "service.sock")}
    for item in (*listeners, unix):
        item.close()
    (run_dir / "service.sock").unlink(missing_ok=True)
    run_dir.rmdir()


def test_isolation_closed_local_network_keeps_the_nodes_services_from_workloads(tmp_path, shared, node_services):
    """A node that also serves a password-less database on loopback (make run's demo): with closed-local, a
    workload's connection to it is refused, its unix socket is not in the workload's view, the one port the
    operator allows (the broker's) and the workload's own listener stay reachable. Without it (the default)
    the same workload reaches them all: the test sees the difference, not an assumption."""
    from agent.isolation import LocalServicesFirewall

    if shutil.which("iptables") is None:
        require("iptables (apt-get install iptables)", False)
    state = tmp_path / "agent"
    state.mkdir()
    results = {}
    try:
        for network in ("node", "closed-local"):
            process = AgentProcess(state / network, gpus="a100-80gb:1:whole", extra=(
                "--workload-root", str(shared), "--workload-uids", f"{CLOSED_UIDS[0]}-{CLOSED_UIDS[1]}",
                "--workload-network", network, "--workload-local-port", str(node_services["broker"]))).start()
            try:
                client = process.client(retries=0)
                if network == "closed-local":
                    assert client.inventory()["isolation"]["network"] == "closed-local"
                whole(client, "net-gpu", 0)
                client.workload_start("wl-net", {
                    "instances": ["net-gpu"], "command": [sys.executable, "-c", PROBE_NETWORK],
                    "args": [json.dumps({"database": node_services["database"], "broker": node_services["broker"]}),
                             json.dumps({"run socket": node_services["socket"]})],
                    "scope": "rival/ml"})
                assert final(client, "wl-net")["state"] == "succeeded"
                results[network] = json.loads(client.workload_logs("wl-net")["data"].splitlines()[-1])
            finally:
                process.stop()
    finally:
        LocalServicesFirewall(CLOSED_UIDS).remove()
    assert results["node"] == {"database": "ok", "broker": "ok", "own listener": "ok", "run socket": "ok"}
    assert results["closed-local"] == {"database": "ECONNREFUSED", "broker": "ok", "own listener": "ok",
                                       "run socket": "ENOENT"}


def test_isolation_closed_local_is_refused_without_uid_isolation(tmp_path):
    from agent.daemon import AgentConfig, build_isolation

    config = AgentConfig(node_id="n1", state_dir=str(tmp_path), isolation="none",
                         workload_network="closed-local").validate()
    assert build_isolation(config, tmp_path).network == "node"  # nothing to tell apart: nothing closed
    with pytest.raises(ValueError, match="needs isolation uid"):
        Isolation(mode="none", state_dir=tmp_path, network="closed-local")
    with pytest.raises(ValueError, match="workload_network must be one of"):
        AgentConfig(node_id="n1", state_dir=str(tmp_path), workload_network="open").validate()
