"""``POST /v1/faults`` ``pin_activity`` / ``unpin_activity`` (sim): an instance's engine activity (and
memory used) held at a constant in ``/metrics`` instead of its replayed series, so a test can make a lease
idle or busy deterministically; saved like every other change."""

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.protocol import AgentHTTPError
from agent.telemetry import all_series, pick
from gpus.catalogue import model_get
from tests.support.agents import AgentProcess, gpu_of


def samples(client, name: str, allocation_id: str) -> list[float]:
    for family in text_string_to_metric_families(client.metrics()):
        if family.name == name:
            return [s.value for s in family.samples if s.labels["allocation_id"] == allocation_id]
    return []


def series_engine_active(instance: dict, at: float) -> float:
    """What the replayed series says for the instance at ``at`` (agent.sim's own arithmetic)."""
    index, offset = pick(instance["allocation_id"])
    return round(all_series()[index].util(at - instance["created_at"] + offset) / 100, 4)


def mig_instance(client, allocation_id: str = "m-0") -> dict:
    gpu = gpu_of(client.inventory(), "H100-80GB", "mig")["uuid"]
    return client.create(allocation_id, {"kind": "mig", "gpu": gpu, "profile": "3g.40gb", "start": 4})


def test_pin_holds_engine_active_and_memory_then_unpin_returns_to_the_series(client):
    instance = mig_instance(client)

    answer = client.faults(pin_activity={"instance": "m-0", "engine_active": 0.02, "fb_used_mib": 1024})

    assert answer["pinned"] == {"m-0": {"engine_active": 0.02, "fb_used_mib": 1024}}
    for _ in range(2):  # constant, scrape after scrape
        assert samples(client, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "m-0") == [0.02]
        assert samples(client, "DCGM_FI_DEV_FB_USED", "m-0") == [1024]
        assert samples(client, "DCGM_FI_DEV_FB_FREE", "m-0") == [40_320 - 1024]

    client.faults(pin_activity={"instance": "m-0", "engine_active": 0.97})  # busy; memory from the series again
    assert samples(client, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "m-0") == [0.97]
    assert samples(client, "DCGM_FI_DEV_FB_USED", "m-0") != [1024]

    assert client.faults(unpin_activity="m-0")["pinned"] == {}
    before = time.time()
    [value] = samples(client, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "m-0")
    assert value in {series_engine_active(instance, before), series_engine_active(instance, time.time())}
    assert client.faults(unpin_activity="m-0")["pinned"] == {}  # unpinning twice is harmless


def test_pin_on_a_whole_gpu_drives_its_utilisation_and_power(client):
    a100 = gpu_of(client.inventory(), "A100-80GB", "whole")
    client.create("w-0", {"kind": "whole", "gpu": a100["uuid"]})

    client.faults(pin_activity={"instance": "w-0", "engine_active": 0.5, "fb_used_mib": 2048})

    assert samples(client, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "w-0") == [0.5]
    assert samples(client, "DCGM_FI_DEV_GPU_UTIL", "w-0") == [50.0]
    assert samples(client, "DCGM_FI_DEV_FB_USED", "w-0") == [2048]
    power = next(f for f in text_string_to_metric_families(client.metrics()) if f.name == "DCGM_FI_DEV_POWER_USAGE")
    [watts] = [s.value for s in power.samples if s.labels["UUID"] == a100["uuid"]]
    model = model_get("A100-80GB")
    assert watts == model.idle_power_w + (model.max_power_w - model.idle_power_w) * 0.5


@pytest.mark.parametrize(("switches", "status", "error_field"), [
    ({"pin_activity": "m-0"}, 422, "pin_activity"),
    ({"pin_activity": {"instance": "m-0"}}, 422, "pin_activity.engine_active"),
    ({"pin_activity": {"instance": "m-0", "engine_active": 1.5}}, 422, "pin_activity.engine_active"),
    ({"pin_activity": {"instance": "m-0", "engine_active": True}}, 422, "pin_activity.engine_active"),
    ({"pin_activity": {"instance": "m-0", "engine_active": 0.5, "fb_used_mib": 40_321}}, 422,
     "pin_activity.fb_used_mib"),
    ({"pin_activity": {"instance": "m-0", "engine_active": 0.5, "fb_used_mib": 1.5}}, 422,
     "pin_activity.fb_used_mib"),
    ({"pin_activity": {"instance": "m-0", "engine_active": 0.5, "util": 1}}, 422, "pin_activity.util"),
    ({"pin_activity": {"instance": 7, "engine_active": 0.5}}, 422, "pin_activity.instance"),
    ({"pin_activity": {"instance": "nope", "engine_active": 0.5}}, 404, "pin_activity.instance"),
    ({"unpin_activity": ["m-0"]}, 422, "unpin_activity"),
    ({"unpin_activity": "nope"}, 404, "unpin_activity"),
    # one bad switch refuses the whole call: fail_next_create is not armed either
    ({"fail_next_create": "ECC", "pin_activity": {"instance": "m-0", "engine_active": -0.1}}, 422,
     "pin_activity.engine_active"),
])
def test_pin_refusals_name_the_field_and_change_nothing(client, switches, status, error_field):
    mig_instance(client)
    client.faults(pin_activity={"instance": "m-0", "engine_active": 0.25})

    with pytest.raises(AgentHTTPError) as error:
        client.faults(**switches)

    assert (error.value.status, error.value.problem["field"]) == (status, error_field)
    assert samples(client, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "m-0") == [0.25]
    assert client.faults()["fail_next_create"] == ""


def test_a_pin_survives_kill_9_and_goes_with_its_instance(tmp_path):
    agent = AgentProcess(tmp_path / "a").start()
    try:
        client = agent.client(retries=0)
        mig_instance(client)
        client.faults(pin_activity={"instance": "m-0", "engine_active": 0.0, "fb_used_mib": 0})
        agent.kill9()
        agent.start()
        assert samples(client, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "m-0") == [0.0]
        assert samples(client, "DCGM_FI_DEV_FB_USED", "m-0") == [0]
        assert "_pin" not in client.instance("m-0")  # the pin is the sim's, not part of the protocol's instance
        client.destroy("m-0")
        mig_instance(client)  # the same allocation id again: a new instance, on its series
        assert client.faults()["pinned"] == {}
    finally:
        agent.stop()
