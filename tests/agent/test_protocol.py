"""Protocol v1 over real HTTP on loopback: create / idempotency / conflicts / destroy / notice / bad input."""

import pytest

from agent.protocol import AgentHTTPError
from tests.support.agents import gpu_of, snapshot_of


def test_healthz_and_inventory(client):
    assert client.healthz()["status"] == "ok"
    inventory = client.inventory()
    assert inventory["protocol"] == "v1" and inventory["node_id"] == "node-1" and inventory["backend"] == "sim"
    modes = sorted((g["model"], g["mode"]) for g in inventory["gpus"])
    assert modes == [("A100-80GB", "whole"), ("H100-80GB", "mig"), ("H100-80GB", "mig"), ("L4", "shared")]
    assert all(g["uuid"].startswith("GPU-") for g in inventory["gpus"])
    assert inventory["instances"] == []


def test_create_mig_instance_is_idempotent_and_conflicts_on_another_body(client):
    gpu = gpu_of(client.inventory(), "H100-80GB", "mig")
    body = {"kind": "mig", "gpu": gpu["uuid"], "profile": "3g.40gb", "start": 4}
    first = client.create("alloc-1", body)
    assert first["profile"] == "3g.40gb" and first["start"] == 4 and first["gpu_instance_id"] == 1
    assert first["device_uuid"].startswith("MIG-")
    assert first["access"]["CUDA_VISIBLE_DEVICES"] == first["device_uuid"]
    assert client.create("alloc-1", body) == first  # same id, same body: the same instance
    with pytest.raises(AgentHTTPError) as error:
        client.create("alloc-1", {**body, "start": 0})
    assert error.value.status == 409 and error.value.problem["field"] == "allocation_id"
    layout = gpu_of(client.inventory(), "H100-80GB", "mig")["mig_layout"]
    assert [(p["profile"], p["start"]) for p in layout] == [("3g.40gb", 4)]


def test_destroy_and_already_gone_is_success(client):
    gpu = gpu_of(client.inventory(), "A100-80GB", "whole")
    client.create("w-1", {"kind": "whole", "gpu": gpu["uuid"]})
    assert client.destroy("w-1") == {"allocation_id": "w-1", "existed": True}
    assert client.destroy("w-1") == {"allocation_id": "w-1", "existed": False}
    assert client.inventory()["instances"] == []


def test_whole_gpu_is_exclusive(client):
    gpu = gpu_of(client.inventory(), "A100-80GB", "whole")
    client.create("w-1", {"kind": "whole", "gpu": gpu["uuid"]})
    with pytest.raises(AgentHTTPError) as error:
        client.create("w-2", {"kind": "whole", "gpu": gpu["uuid"]})
    assert error.value.status == 409 and "w-1" in error.value.problem["detail"]


def test_shares_fit_within_compute_and_memory(client):
    gpu = gpu_of(client.inventory(), "L4", "shared")
    first = client.create("s-1", {"kind": "share", "gpu": gpu["uuid"], "milli": 600, "memory_mib": 12000})
    assert first["access"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "60"
    assert first["access"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=12000M"
    client.create("s-2", {"kind": "share", "gpu": gpu["uuid"], "milli": 400, "memory_mib": 8000})
    before = snapshot_of(client)
    with pytest.raises(AgentHTTPError) as error:
        client.create("s-3", {"kind": "share", "gpu": gpu["uuid"], "milli": 1, "memory_mib": 1})
    assert error.value.status == 422 and error.value.problem["field"] == "milli"
    client.destroy("s-2")
    with pytest.raises(AgentHTTPError) as error:
        client.create("s-3", {"kind": "share", "gpu": gpu["uuid"], "milli": 100, "memory_mib": 20000})
    assert error.value.problem["field"] == "memory_mib" and "MiB free" in error.value.problem["detail"]
    assert snapshot_of(client) != before  # s-2 went
    assert [i["allocation_id"] for i in client.inventory()["instances"]] == ["s-1"]


def test_notice_records_the_deadline(client):
    gpu = gpu_of(client.inventory(), "H100-80GB", "mig")
    client.create("a-1", {"kind": "mig", "gpu": gpu["uuid"], "profile": "1g.10gb", "start": 6})
    noticed = client.notice("a-1", 1_900_000_000.0, "reclaimed for project b")
    assert noticed["notice"] == {"deadline": 1_900_000_000.0, "reason": "reclaimed for project b"}
    assert client.instance("a-1")["notice"]["deadline"] == 1_900_000_000.0
    with pytest.raises(AgentHTTPError) as error:
        client.notice("missing", 1_900_000_000.0)
    assert error.value.status == 404


BAD_REQUESTS = [
    # (allocation id, body or callable(gpus) -> body, status, field, words in the detail)
    ("b-1", lambda g: {"kind": "mig", "gpu": g["mig"], "profile": "5g.50gb", "start": 0}, 422, "profile",
     "not offered"),
    ("b-1", lambda g: {"kind": "mig", "gpu": g["mig"], "profile": "3g.40gb", "start": 2}, 422, "start",
     "cannot start at slot 2"),
    ("b-1", lambda g: {"kind": "mig", "gpu": g["mig"], "profile": "4g.40gb", "start": 4}, 422, "start", "valid: 0"),
    ("b-1", lambda g: {"kind": "mig", "gpu": g["whole"], "profile": "1g.10gb", "start": 0}, 422, "kind",
     "whole mode"),
    ("b-1", lambda g: {"kind": "whole", "gpu": g["mig"]}, 422, "kind", "mig mode"),
    ("b-1", lambda g: {"kind": "share", "gpu": g["shared"], "milli": 1001, "memory_mib": 1}, 422, "milli", "1..1000"),
    ("b-1", lambda g: {"kind": "share", "gpu": g["shared"], "milli": 0, "memory_mib": 1}, 422, "milli", "1..1000"),
    ("b-1", lambda g: {"kind": "share", "gpu": g["shared"], "milli": 10}, 422, "memory_mib", "integer"),
    ("b-1", lambda g: {"kind": "whole", "gpu": "GPU-nope"}, 422, "gpu", "no GPU"),
    ("b-1", lambda g: {"kind": "tpu", "gpu": g["whole"]}, 422, "kind", "one of"),
    ("b-1", lambda g: {"kind": "whole", "gpu": g["whole"], "colour": "red"}, 422, "colour", "unknown field"),
    ("b-1", lambda g: {"kind": "whole", "gpu": g["whole"], "milli": 5}, 422, "milli", "does not apply"),
    ("b-1", lambda g: ["not", "an", "object"], 422, "body", "JSON object"),
    ("-bad id", lambda g: {"kind": "whole", "gpu": g["whole"]}, 422, "allocation_id", "allocation_id must"),
]


@pytest.mark.parametrize(("allocation_id", "make", "status", "field", "words"), BAD_REQUESTS)
def test_bad_requests_get_the_reason_and_change_nothing(client, allocation_id, make, status, field, words):
    inventory = client.inventory()
    gpus = {mode: gpu_of(inventory, model, mode)["uuid"]
            for model, mode in (("H100-80GB", "mig"), ("A100-80GB", "whole"), ("L4", "shared"))}
    client.create("keep", {"kind": "mig", "gpu": gpus["mig"], "profile": "4g.40gb", "start": 0})
    before = snapshot_of(client)
    with pytest.raises(AgentHTTPError) as error:
        client.create(allocation_id, make(gpus))
    assert error.value.status == status
    assert error.value.problem["field"] == field
    assert words in error.value.problem["detail"]
    assert snapshot_of(client) == before


def test_overlapping_mig_instance_is_refused(client):
    gpu = gpu_of(client.inventory(), "H100-80GB", "mig")["uuid"]
    client.create("a", {"kind": "mig", "gpu": gpu, "profile": "2g.20gb", "start": 2})
    before = snapshot_of(client)
    with pytest.raises(AgentHTTPError) as error:
        client.create("b", {"kind": "mig", "gpu": gpu, "profile": "3g.40gb", "start": 0})
    assert error.value.problem["field"] == "start"
    assert "slots 0-3 overlap 2g.20gb at slot 2 (allocation 'a')" in error.value.problem["detail"]
    assert snapshot_of(client) == before


def test_malformed_json_is_a_clear_error(agent):
    from agent.protocol import AgentClient

    raw = AgentClient(agent.url, agent.node_id, "test-secret-for-node-agent-0123456789", retries=0)
    with pytest.raises(AgentHTTPError) as error:
        raw.request("PUT", "/v1/instances/x", None)  # no body at all
    assert error.value.status == 422 and error.value.problem["field"] == "body"


@pytest.mark.parametrize("extra", [1, 4096, 1 << 20])  # past MAX_BODY; past aiohttp's own client_max_size too
def test_oversized_body_is_a_413_typed_too_large(agent, extra):
    """Issue 27, item 11: a body past aiohttp's limit was a 413 problem typed ``method_not_allowed``."""
    import json
    import urllib.error
    import urllib.request

    from agent.server import MAX_BODY

    request = urllib.request.Request(agent.url + "/v1/instances/x", data=b"x" * (MAX_BODY + extra), method="PUT",
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, timeout=10)
    problem = json.loads(answer.value.read())
    assert answer.value.code == 413 and answer.value.headers["Content-Type"].startswith("application/problem+json")
    assert (problem["status"], problem["code"], problem["type"].rsplit("/", 1)[1]) == (413, "too_large", "too_large")
