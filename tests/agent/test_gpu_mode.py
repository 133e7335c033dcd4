"""``PUT /v1/gpus/{uuid}/mode`` over real HTTP against a sim agent: the inventory entry after the change,
idempotency, refusals that change nothing (409 while the GPU holds an instance), and a change that
survives ``kill -9``."""

import pytest

from agent.protocol import AgentClient, AgentHTTPError
from tests.support.agents import AgentProcess, gpu_of, snapshot_of

ORIGINAL_MODES = {0: "mig", 1: "mig", 2: "whole", 3: "shared"}  # conftest.GPUS


@pytest.fixture
def client(agent):
    """The module's agent with no instances and every GPU back in the mode it started in."""
    client = agent.client(retries=0)
    for instance in client.inventory()["instances"]:
        client.destroy(instance["allocation_id"])
    for gpu in client.inventory()["gpus"]:
        if gpu["mode"] != ORIGINAL_MODES[gpu["index"]]:
            client.set_gpu_mode(gpu["uuid"], ORIGINAL_MODES[gpu["index"]])
    return client


def refused(call) -> AgentHTTPError:
    with pytest.raises(AgentHTTPError) as error:
        call()
    return error.value


def test_gpu_mode_change_answers_the_gpus_inventory_entry_and_is_idempotent(client):
    a100 = gpu_of(client.inventory(), "A100-80GB", "whole")

    entry = client.set_gpu_mode(a100["uuid"], "shared")

    assert entry == gpu_of(client.inventory(), "A100-80GB", "shared")
    assert (entry["uuid"], entry["mode"], entry["shares"]) == (a100["uuid"], "shared", {"milli_used": 0,
                                                                                         "memory_used_mib": 0})
    assert client.set_gpu_mode(a100["uuid"], "shared") == entry  # the same mode again: 200, nothing changes
    share = client.create("s-1", {"kind": "share", "gpu": a100["uuid"], "milli": 500, "memory_mib": 1024})
    assert share["gpu"] == a100["uuid"]
    error = refused(lambda: client.create("w-1", {"kind": "whole", "gpu": a100["uuid"]}))
    assert (error.status, error.problem["field"]) == (422, "kind")

    client.destroy("s-1")
    mig = client.set_gpu_mode(a100["uuid"], "mig")
    assert (mig["mode"], mig["mig_layout"]) == ("mig", [])
    instance = client.create("m-1", {"kind": "mig", "gpu": a100["uuid"], "profile": "3g.40gb", "start": 4})
    assert gpu_of(client.inventory(), "A100-80GB", "mig")["mig_layout"][0]["device_uuid"] == instance["device_uuid"]


def test_gpu_mode_change_is_refused_while_the_gpu_holds_an_instance(client):
    h100 = gpu_of(client.inventory(), "H100-80GB", "mig")
    client.create("m-0", {"kind": "mig", "gpu": h100["uuid"], "profile": "3g.40gb", "start": 4})
    client.create("m-1", {"kind": "mig", "gpu": h100["uuid"], "profile": "1g.10gb", "start": 0})
    before = snapshot_of(client)

    error = refused(lambda: client.set_gpu_mode(h100["uuid"], "whole"))

    assert (error.status, error.problem["field"], error.problem["code"]) == (409, "gpu", "conflict")
    assert "holds instance(s) m-0, m-1" in error.problem["detail"]
    assert snapshot_of(client) == before
    client.destroy("m-0")
    assert refused(lambda: client.set_gpu_mode(h100["uuid"], "shared")).status == 409  # m-1 still there
    client.destroy("m-1")
    assert client.set_gpu_mode(h100["uuid"], "whole")["mode"] == "whole"


@pytest.mark.parametrize(("gpu", "body", "status", "error_field", "words"), [
    ("GPU-00000000-0000-0000-0000-000000000000", {"mode": "whole"}, 404, "gpu", "no GPU"),
    ("L4", {"mode": "mig"}, 422, "mode", "L4 offers no MIG"),
    ("A100-80GB", {"mode": "exclusive"}, 422, "mode", "mode must be one of whole, mig, shared"),
    ("A100-80GB", {}, 422, "mode", "mode must be one of"),
    ("A100-80GB", ["mig"], 422, "body", "JSON object"),
    ("A100-80GB", {"mode": "mig", "force": True}, 422, "force", "unknown field 'force'"),
])
def test_gpu_mode_change_refusals_name_the_field_and_change_nothing(client, gpu, body, status, error_field, words):
    inventory = client.inventory()
    uuid = next((g["uuid"] for g in inventory["gpus"] if g["model"] == gpu), gpu)
    before = snapshot_of(client)

    error = refused(lambda: client.request("PUT", f"/v1/gpus/{uuid}/mode", body))

    assert (error.status, error.problem["field"]) == (status, error_field)
    assert words in error.problem["detail"]
    assert snapshot_of(client) == before


def test_gpu_mode_change_must_be_signed(agent, client):
    a100 = gpu_of(client.inventory(), "A100-80GB", "whole")
    stranger = AgentClient(agent.url, agent.node_id, "not-the-secret", retries=0)

    assert refused(lambda: stranger.set_gpu_mode(a100["uuid"], "mig")).status == 401
    assert gpu_of(client.inventory(), "A100-80GB", "whole")["uuid"] == a100["uuid"]


def test_gpu_mode_changes_survive_kill_9(tmp_path):
    agent = AgentProcess(tmp_path / "a").start()
    try:
        client = agent.client(retries=0)
        inventory = client.inventory()
        h100 = gpu_of(inventory, "H100-80GB", "mig")["uuid"]
        a100 = gpu_of(inventory, "A100-80GB", "whole")["uuid"]
        l4 = gpu_of(inventory, "L4", "shared")["uuid"]
        client.set_gpu_mode(h100, "whole")
        client.set_gpu_mode(a100, "mig")
        client.set_gpu_mode(l4, "whole")
        before = snapshot_of(client)

        agent.kill9()  # every change was saved before it was answered
        agent.start()

        assert snapshot_of(client) == before
        modes = {g["uuid"]: g["mode"] for g in client.inventory()["gpus"]}
        assert (modes[h100], modes[a100], modes[l4]) == ("whole", "mig", "whole")
        assert client.create("w-0", {"kind": "whole", "gpu": h100})["gpu"] == h100
    finally:
        agent.stop()
