"""Restarts (kill -9 and SIGTERM), the metrics page through a Prometheus text parser, client retries."""

import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.protocol import AgentClient, AgentHTTPError, AgentUnreachable
from agent.sim import usable_mib
from tests.support.agents import SECRET, AgentProcess, gpu_of, snapshot_of


def families(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


def populate(client) -> None:
    inventory = client.inventory()
    mig = [g["uuid"] for g in inventory["gpus"] if g["mode"] == "mig"]
    client.create("m-0", {"kind": "mig", "gpu": mig[0], "profile": "4g.40gb", "start": 0})
    client.create("m-1", {"kind": "mig", "gpu": mig[0], "profile": "2g.20gb", "start": 4})
    client.create("m-2", {"kind": "mig", "gpu": mig[1], "profile": "1g.10gb", "start": 3})
    client.create("w-0", {"kind": "whole", "gpu": gpu_of(inventory, "A100-80GB", "whole")["uuid"]})
    shared = gpu_of(inventory, "L4", "shared")["uuid"]
    client.create("s-0", {"kind": "share", "gpu": shared, "milli": 250, "memory_mib": 4096})
    client.notice("m-1", time.time() + 30, "reclaim")


def test_kill_9_then_restart_shows_the_identical_inventory(tmp_path):
    agent = AgentProcess(tmp_path / "a").start()
    try:
        client = agent.client(retries=0)
        populate(client)
        before = snapshot_of(client)
        energy_before = families(client.metrics())["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].samples
        agent.kill9()
        agent.start()
        assert snapshot_of(client) == before
        energy_after = families(client.metrics())["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].samples
        by_uuid = {s.labels["UUID"]: s.value for s in energy_before}
        assert all(s.value >= by_uuid[s.labels["UUID"]] for s in energy_after)  # the counter never goes back
    finally:
        agent.stop()


def test_sigterm_finishes_the_request_in_flight_and_exits_0(tmp_path):
    agent = AgentProcess(tmp_path / "a").start()
    client = agent.client(retries=0, timeout=10)
    gpu = gpu_of(client.inventory(), "A100-80GB", "whole")["uuid"]
    client.faults(hang_seconds=1.5)  # the next request takes 1.5 s
    result = {}

    def slow_create():
        started = time.monotonic()
        result["instance"] = client.create("late", {"kind": "whole", "gpu": gpu})
        result["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=slow_create)
    thread.start()
    time.sleep(0.5)
    assert agent.stop() == 0  # SIGTERM while the create is in flight
    thread.join(10)
    assert result["instance"]["allocation_id"] == "late" and result["seconds"] >= 1.4
    agent.start()
    assert [i["allocation_id"] for i in client.inventory()["instances"]] == ["late"]
    agent.stop()


def test_metrics_use_dcgm_names_and_never_double_count_power(client):
    populate(client)
    parsed = families(client.metrics())
    power = parsed["DCGM_FI_DEV_POWER_USAGE"].samples
    assert len(power) == 4  # one per physical GPU, none per instance or share
    assert all(s.labels["GPU_I_ID"] == "" and s.labels["allocation_id"] == "" for s in power)
    energy = parsed["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    assert energy.type == "counter" and len(energy.samples) == 4
    util = parsed["DCGM_FI_DEV_GPU_UTIL"].samples
    assert sorted(s.labels["modelName"] for s in util) == ["A100-80GB", "L4"]  # not reported on MIG GPUs
    active = {s.labels["allocation_id"]: s for s in parsed["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].samples}
    assert set(active) == {"m-0", "m-1", "m-2", "w-0", "s-0"}
    assert active["m-1"].labels["GPU_I_PROFILE"] == "2g.20gb" and active["m-1"].labels["GPU_I_ID"] == "2"
    assert all(0.0 <= s.value <= 1.0 for s in active.values())
    used = parsed["DCGM_FI_DEV_FB_USED"].samples
    free = {(s.labels["UUID"], s.labels["GPU_I_ID"], s.labels["allocation_id"]): s.value
            for s in parsed["DCGM_FI_DEV_FB_FREE"].samples}
    totals = {}
    for sample in used:
        key = (sample.labels["UUID"], sample.labels["GPU_I_ID"], sample.labels["allocation_id"])
        totals[sample.labels["allocation_id"]] = sample.value + free[key]
    # a whole GPU's used + free is what processes can have: the nameplate (81,920) less the driver's reservation
    assert totals["m-0"] == 40_320 and totals["s-0"] == 4096 and totals["w-0"] == usable_mib("A100-80GB") == 81_438
    for sample in used + power:
        assert {"gpu", "UUID", "device", "modelName", "Hostname", "GPU_I_ID", "GPU_I_PROFILE"} <= set(sample.labels)
        assert sample.labels["Hostname"]


def test_client_retries_a_failed_call_and_does_not_retry_a_4xx(agent, client):
    gpu = gpu_of(client.inventory(), "A100-80GB", "whole")["uuid"]
    client.faults(fail_next_create="GPU busy")
    retrying = agent.client(retries=2, backoff=0.01)
    instance = retrying.create("r-1", {"kind": "whole", "gpu": gpu})  # 503 once, then created
    assert instance["allocation_id"] == "r-1"
    client.faults(fail_next_create="GPU busy")
    shared = gpu_of(client.inventory(), "L4", "shared")["uuid"]
    with pytest.raises(AgentUnreachable, match="503"):
        client.create("r-2", {"kind": "share", "gpu": shared, "milli": 100, "memory_mib": 100})
    assert "r-2" not in {i["allocation_id"] for i in client.inventory()["instances"]}
    with pytest.raises(AgentHTTPError) as error:
        retrying.create("r-3", {"kind": "whole", "gpu": "GPU-missing"})
    assert error.value.status == 422


def test_client_times_out_on_a_hung_agent_then_succeeds_on_retry(agent, client):
    client.faults(hang_seconds=3)
    quick = agent.client(retries=1, timeout=0.5, backoff=0.01)
    assert quick.inventory()["node_id"] == agent.node_id  # first attempt timed out, the retry answered


def test_client_reports_an_unreachable_agent():
    dead = AgentClient("http://127.0.0.1:9", "n", SECRET, retries=1, backoff=0.01, timeout=0.5)
    with pytest.raises(AgentUnreachable, match="after 2 attempts"):
        dead.inventory()
