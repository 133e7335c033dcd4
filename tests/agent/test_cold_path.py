"""The sim's cold-path latency: ``--create-latency`` and ``--mode-change-latency`` make a create and a
mode change answer that much later (the change is saved at once), while the agent keeps answering
everything else; a repeat or a refusal answers at once."""

import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from agent.daemon import load_config
from agent.protocol import AgentClient, AgentHTTPError
from tests.agent.test_fleet import FleetProcess
from tests.support.agents import AgentProcess, gpu_of
from tests.support.processes import ROOT

LATENCY = 1.0
QUICK = LATENCY / 2  # an answer that did not wait for the latency


@pytest.fixture(scope="module")
def slow_agent(tmp_path_factory):
    process = AgentProcess(tmp_path_factory.mktemp("slow"), extra=(
        "--create-latency", str(LATENCY), "--mode-change-latency", str(LATENCY))).start()
    yield process
    process.stop()


@pytest.fixture
def client(slow_agent):
    client = slow_agent.client(retries=0, timeout=LATENCY * 10)
    for instance in client.inventory()["instances"]:
        client.destroy(instance["allocation_id"])
    return client


def timed(call) -> tuple[object, float, float]:
    """(result, start, end) on the monotonic clock."""
    start = time.monotonic()
    result = call()
    return result, start, time.monotonic()


def test_a_create_waits_the_latency_while_the_agent_answers_other_requests_at_once(slow_agent, client):
    gpu = gpu_of(client.inventory(), "H100-80GB", "mig")["uuid"]
    spec = {"kind": "mig", "gpu": gpu, "profile": "3g.40gb", "start": 4}
    outcome = {}
    creating = threading.Thread(target=lambda: outcome.update(create=timed(lambda: client.create("c-1", spec))))
    creating.start()
    time.sleep(LATENCY / 5)

    def get(path: str) -> bytes:
        with urllib.request.urlopen(slow_agent.url + path, timeout=5) as response:
            return response.read()

    _, health_start, health_end = timed(lambda: get("/healthz"))
    _, metrics_start, metrics_end = timed(lambda: get("/metrics"))  # takes the node's lock: not held meanwhile
    _, inventory_start, inventory_end = timed(client.inventory)  # signed, the same node
    creating.join(LATENCY * 10)

    instance, create_start, create_end = outcome["create"]
    assert instance["allocation_id"] == "c-1"
    assert create_end - create_start >= LATENCY
    for start, end in ((health_start, health_end), (metrics_start, metrics_end), (inventory_start, inventory_end)):
        assert create_start < start and end < create_end  # answered while the create was still waiting
        assert end - start < QUICK

    again, start, end = timed(lambda: client.create("c-1", spec))  # an identical repeat: no new instance
    assert again == instance and end - start < QUICK
    with pytest.raises(AgentHTTPError) as error:  # a refusal creates nothing and owes nothing
        timed(lambda: client.create("c-2", {**spec, "start": 5}))
    assert error.value.status == 422


def test_a_batch_create_waits_once_per_instance_it_created(client):
    gpu = gpu_of(client.inventory(), "H100-80GB", "mig")["uuid"]
    client.create("b-0", {"kind": "mig", "gpu": gpu, "profile": "1g.10gb", "start": 0})
    specs = {"b-0": {"kind": "mig", "gpu": gpu, "profile": "1g.10gb", "start": 0},  # exists: 200
             "b-1": {"kind": "mig", "gpu": gpu, "profile": "1g.10gb", "start": 1},
             "b-2": {"kind": "mig", "gpu": gpu, "profile": "1g.10gb", "start": 2},
             "b-3": {"kind": "mig", "gpu": gpu, "profile": "1g.10gb", "start": 9}}  # refused: 422

    answers, start, end = timed(lambda: client.create_many(specs))

    assert [answers[i]["status"] for i in ("b-0", "b-1", "b-2", "b-3")] == [200, 201, 201, 422]
    assert end - start >= 2 * LATENCY


def test_a_mode_change_waits_the_latency_and_the_same_mode_again_does_not(client):
    a100 = gpu_of(client.inventory(), "A100-80GB", "whole")["uuid"]

    entry, start, end = timed(lambda: client.set_gpu_mode(a100, "mig"))
    assert entry["mode"] == "mig" and end - start >= LATENCY
    entry, start, end = timed(lambda: client.set_gpu_mode(a100, "mig"))
    assert entry["mode"] == "mig" and end - start < QUICK
    client.set_gpu_mode(a100, "whole")


def test_the_fleet_takes_the_latency_flags(tmp_path):
    fleet = FleetProcess(tmp_path / "fleet", 1, "--create-latency", str(LATENCY)).start()
    try:
        node = fleet.manifest()["nodes"][0]
        client = AgentClient(node["url"], node["node_id"], node["secret"], retries=0, timeout=LATENCY * 10)
        gpu = gpu_of(client.inventory(), "H100-80GB", "mig")["uuid"]
        _, start, end = timed(lambda: client.create("f-1", {"kind": "mig", "gpu": gpu, "profile": "7g.80gb",
                                                             "start": 0}))
        assert end - start >= LATENCY
        _, start, end = timed(lambda: client.set_gpu_mode(gpu, "mig"))  # no --mode-change-latency: at once
        assert end - start < QUICK
    finally:
        fleet.stop()


def test_latency_settings_from_the_config_file(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text('node_id = "n"\ncreate_latency_seconds = 2.5\nmode_change_latency_seconds = 30\n')
    config = load_config(str(path), {"create_latency_seconds": None})
    assert (config.create_latency_seconds, config.mode_change_latency_seconds) == (2.5, 30)
    assert load_config(str(path), {"create_latency_seconds": 0.25}).create_latency_seconds == 0.25  # flags win


@pytest.mark.parametrize(("text", "words"), [
    ('node_id = "n"\ncreate_latency_seconds = -1\n', "create_latency_seconds must be a number of seconds 0..600"),
    ('node_id = "n"\nmode_change_latency_seconds = "1s"\n', "mode_change_latency_seconds must be a number"),
    ('node_id = "n"\nbackend = "nvml"\ncreate_latency_seconds = 1\n', "in the sim backend only"),
])
def test_bad_latency_settings_are_named(tmp_path, text, words):
    path = tmp_path / "agent.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=words):
        load_config(str(path), {})


def test_the_command_refuses_a_negative_latency_with_exit_2(tmp_path):
    result = subprocess.run([sys.executable, "-m", "agent", "--node-id", "n", "--mode-change-latency", "-2",
                             "--state-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "mode_change_latency_seconds must be" in result.stderr
