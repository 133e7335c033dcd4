"""``PUT /v1/instances``: several creates in one signed request and one save, each item exactly a
``PUT /v1/instances/{id}`` (idempotent, refused item by item); the client falls back for older agents."""

import pytest

from agent.protocol import AgentClient, AgentHTTPError
from tests.support.agents import AgentProcess, gpu_of, snapshot_of


def _mig_batch(client) -> dict:
    gpu = gpu_of(client.inventory(), "H100-80GB", "mig")["uuid"]
    return {"b-0": {"kind": "mig", "gpu": gpu, "profile": "1g.10gb", "start": 0},
            "b-1": {"kind": "mig", "gpu": gpu, "profile": "1g.10gb", "start": 1},
            "b-2": {"kind": "mig", "gpu": gpu, "profile": "9g.99gb", "start": 2},  # no such profile
            "b 3": {"kind": "mig", "gpu": gpu, "profile": "1g.10gb", "start": 2}}  # malformed id


def test_batch_create_answers_item_by_item_and_is_idempotent(client):
    specs = _mig_batch(client)
    first = client.create_many(specs)
    assert [first[i]["status"] for i in ("b-0", "b-1", "b-2", "b 3")] == [201, 201, 422, 422]
    assert first["b-2"]["problem"]["field"] == "profile" and first["b 3"]["problem"]["field"] == "allocation_id"
    assert (first["b-0"]["instance"]["start"], first["b-1"]["instance"]["start"]) == (0, 1)
    assert sorted(i["allocation_id"] for i in client.inventory()["instances"]) == ["b-0", "b-1"]
    again = client.create_many(specs)  # the same ids and bodies: the same instances, nothing new
    assert [again[i]["status"] for i in ("b-0", "b-1", "b-2", "b 3")] == [200, 200, 422, 422]
    assert again["b-0"]["instance"] == first["b-0"]["instance"] == client.instance("b-0")
    other = client.create_many({"b-0": {**specs["b-0"], "start": 4}})  # the id exists with another body
    assert other["b-0"]["status"] == 409


@pytest.mark.parametrize("body", [{"instances": []}, {"instances": {}}, [1], {
    "instances": {f"x-{n}": {"kind": "whole", "gpu": "GPU-x"} for n in range(65)}}])
def test_batch_create_refuses_a_malformed_body_whole(client, body):
    with pytest.raises(AgentHTTPError) as error:
        client.request("PUT", "/v1/instances", body)
    assert error.value.status == 422 and error.value.problem["field"] == "instances"
    assert client.inventory()["instances"] == []


def test_batch_create_must_be_signed(agent, client):
    stranger = AgentClient(agent.url, agent.node_id, "not-the-secret", retries=0)
    with pytest.raises(AgentHTTPError) as error:
        stranger.create_many(_mig_batch(client))
    assert error.value.status == 401
    assert client.inventory()["instances"] == []


def test_batch_create_is_saved_before_the_answer(tmp_path):
    agent = AgentProcess(tmp_path / "a").start()
    try:
        client = agent.client(retries=0)
        answers = client.create_many(_mig_batch(client))
        assert sum(answer["status"] == 201 for answer in answers.values()) == 2
        before = snapshot_of(client)
        agent.kill9()
        agent.start()
        assert snapshot_of(client) == before
    finally:
        agent.stop()


def test_create_many_falls_back_to_one_put_each_on_an_agent_without_the_call(client, monkeypatch):
    request = client.request
    calls = []

    def older_agent(method, path, body=None, **kwargs):
        calls.append((method, path))
        if path == "/v1/instances":  # what an agent before the batch call answers
            raise AgentHTTPError(404, {"status": 404, "detail": "PUT /v1/instances: Not Found"})
        return request(method, path, body, **kwargs)

    monkeypatch.setattr(client, "request", older_agent)
    answers = client.create_many(_mig_batch(client))
    assert [answers[i]["status"] for i in ("b-0", "b-1", "b-2", "b 3")] == [200, 200, 422, 422]
    assert answers["b-0"]["instance"]["start"] == 0
    assert ("PUT", "/v1/instances/b-0") in calls and ("PUT", "/v1/instances/b%203") in calls
