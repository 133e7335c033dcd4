"""The container runtime: the ``docker`` / ``podman`` command line for whole, MIG and share leases, checked
against the NVIDIA container toolkit's documented CDI device selection (``--device nvidia.com/gpu=<name>``,
names as ``nvidia-ctk cdi generate`` lists them: a GPU by index or UUID, a MIG device by its MIG UUID).
No container engine runs here, so the agent is also run against a stand-in ``docker`` on PATH that records
what it was asked, to check the same contract end to end: the command line, the env file, the SIGTERM
at a notice and ``docker kill`` at the deadline."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from agent.backend import InstanceSpec
from agent.protocol import InvalidRequest, spec_from_json
from agent.sim import SimBackend
from agent.workloads import ContainerRuntime, WorkloadManager, device_env
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
    assert argv[argv.index("-p") + 1] == "20003:8888"
    plain = command_line(tmp_path, [whole], port=8888)  # no host port given: the same port on the node
    assert plain[plain.index("-p") + 1] == "8888:8888"
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
    assert argv[argv.index("-p") + 1] == "8888:8888"
    assert argv[argv.index("--entrypoint") + 1] == "python"
    assert argv[-3:] == ["nvcr.io/nvidia/pytorch:24.05-py3", "-u", "train.py"]


def test_a_share_gets_its_gpu_and_the_mps_limits(tmp_path, sim):
    share = instance(sim, "s", kind="share", gpu=sim.state["gpus"][3]["uuid"], milli=250, memory_mib=6144)
    argv = command_line(tmp_path, [share])
    assert devices_of(argv) == [f"nvidia.com/gpu={share['gpu']}"]
    assert "--ipc=host" in argv and "/tmp/nvidia-mps:/tmp/nvidia-mps" in argv
    assert device_env([share]) == {"CUDA_VISIBLE_DEVICES": share["gpu"], "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                                   "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=6144M"}


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
                                                 "args": ["sh", "-c", "sleep 1000"], "restart_count": 1})
        assert devices_of(started["argv"]) == [f"nvidia.com/gpu={created['device_uuid']}"]
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
