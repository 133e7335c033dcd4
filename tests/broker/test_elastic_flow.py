"""Elastic leases end to end (issue 32 item 6): project A borrows all 4 A100s of a node with one elastic lease (4,
at least 2); project B asks for 1 within its quota → A's lease gives back 1 GPU (a "resized" event, its instance
destroyed on the node) and keeps running on 3, instead of being preempted whole; B runs on the GPU given back. Once
B's lease ends, A's grows back to 4 (a second "resized" event; the instance made again on the node) and its workload
is told its new size (its units file and SIGUSR1)."""

import json
import sys

import pytest

from agent.protocol import AgentHTTPError
from broker.models import Allocation, Lease, Node
from broker.services import agent_client
from tests.factories import make_project, make_quota
from tests.support.processes import start_fleet, stop_fleet, wait_until


@pytest.fixture
def four(live_server, tmp_path, transactional_db):
    process = start_fleet(live_server.url, tmp_path / "fleet", 1, "a100-80gb:4:whole")
    yield process
    stop_fleet(process)


@pytest.fixture
def four_running(live_server, tmp_path, transactional_db, shared):
    """The node of four A100s, its agent running workloads."""
    process = start_fleet(live_server.url, tmp_path / "fleet", 1, "a100-80gb:4:whole",
                          extra=("--workload-root", str(shared)))
    yield process
    # a workload runs in a session of its own and outlives its agent (by design): stop what still runs, or the
    # elastic workload (a loop with no end) is left behind after the test
    for node in Node.objects.all():
        client = agent_client(node)
        for workload in client.workloads():
            if workload["state"] in ("running", "backoff"):  # agent.workloads.ACTIVE
                client.workload_stop(workload["workload_id"], grace_seconds=0, reason="test teardown")
    stop_fleet(process)


# the elastic lease's workload: its size at start, and its units file each time it is told of a resize (SIGUSR1)
ELASTIC = ("import os, signal, time\n"
           "def usr1(signum, frame):\n"
           "    os.write(1, ('resized ' + open(os.environ['GPUBROKER_UNITS_FILE']).read().strip() + '\\n').encode())\n"
           "signal.signal(signal.SIGUSR1, usr1)\n"
           "print('up', os.environ['GPUBROKER_UNITS'], flush=True)\n"
           "while True: time.sleep(0.05)\n")


def test_an_elastic_lease_shrinks_for_in_quota_work_instead_of_being_preempted(worker, four, api, world):
    make_quota(world.project, "A100-80GB", deserved=0, limit=4000, tenant_deserved=1000, tenant_limit=8000)
    nlp = make_project(world.acme, "nlp")
    make_quota(nlp, "A100-80GB", deserved=1000, limit=1000, tenant_deserved=1000, tenant_limit=8000)
    client = api("member")

    def state(lease_id):
        return client.call("GET", f"/leases/{lease_id}")[1]

    status, elastic = client.call("POST", "/leases", {"project": "vision", "gpu": {
        "kind": "whole", "model": "A100-80GB", "count": 4, "min_count": 2}})
    assert status == 201 and elastic["gpu"]["min_count"] == 2
    wait_until(lambda: state(elastic["id"])["state"] == "active")
    assert state(elastic["id"])["over_quota"]
    devices = state(elastic["id"])["devices"]
    assert len(devices) == 4

    _, claim = client.call("POST", "/leases", {"project": "nlp", "gpu": {"kind": "whole", "model": "A100-80GB"}})
    wait_until(lambda: state(claim["id"])["state"] == "active")
    body = state(elastic["id"])
    assert body["state"] == "active"  # shrunk, not preempted
    assert len(body["devices"]) == 3
    resized = [e for e in body["events"] if e["reason"].startswith("resized:")]
    assert len(resized) == 1 and "4 → 3 units" in resized[0]["reason"]
    assert f"lease {claim['id']}" in resized[0]["reason"]
    assert [e["to_state"] for e in body["events"]][-1] == "active"
    # the GPU given back is the one the claim runs on, and its instance is gone from the node
    given = {d["gpu_uuid"] for d in devices} - {d["gpu_uuid"] for d in body["devices"]}
    assert {d["gpu_uuid"] for d in state(claim["id"])["devices"]} == given
    freed = Allocation.objects.get(lease_id=elastic["id"], freed_at__isnull=False)
    node = Node.objects.get(node_id=devices[0]["node"])

    def gone() -> bool:
        try:
            agent_client(node).instance(freed.instance_id)
        except AgentHTTPError as error:
            return error.status == 404
        return False

    wait_until(gone)
    assert Lease.objects.get(pk=elastic["id"]).min_count == 2


def test_a_shrunk_elastic_lease_grows_back_when_the_claimant_ends_and_its_workload_is_told(worker, four_running, api,
                                                                                         world):
    make_quota(world.project, "A100-80GB", deserved=0, limit=4000, tenant_deserved=1000, tenant_limit=8000)
    nlp = make_project(world.acme, "nlp")
    make_quota(nlp, "A100-80GB", deserved=1000, limit=1000, tenant_deserved=1000, tenant_limit=8000)
    client = api("member")

    def state(lease_id):
        return client.call("GET", f"/leases/{lease_id}")[1]

    def told() -> list[dict]:
        data = client.call("GET", f"/leases/{elastic['id']}/logs?tail=65536")[1].get("data", "")
        return [json.loads(line.removeprefix("resized ")) for line in data.splitlines() if line.startswith("resized ")]

    status, elastic = client.call("POST", "/leases", {"project": "vision", "gpu": {
        "kind": "whole", "model": "A100-80GB", "count": 4, "min_count": 2},
        "workload": {"command": [sys.executable, "-c", ELASTIC]}})
    assert status == 201
    wait_until(lambda: "up 4" in client.call("GET", f"/leases/{elastic['id']}/logs")[1].get("data", ""))
    devices = {d["gpu_uuid"] for d in state(elastic["id"])["devices"]}
    assert len(devices) == 4

    _, claim = client.call("POST", "/leases", {"project": "nlp", "gpu": {"kind": "whole", "model": "A100-80GB"}})
    wait_until(lambda: state(claim["id"])["state"] == "active")
    assert len(state(elastic["id"])["devices"]) == 3
    wait_until(lambda: [size["units"] for size in told()] == [3])  # the shrink: told it runs on 3

    status, _ = client.call("DELETE", f"/leases/{claim['id']}")
    assert status in (200, 202)
    wait_until(lambda: state(claim["id"])["state"] == "released")
    wait_until(lambda: len(state(elastic["id"])["devices"]) == 4)
    body = state(elastic["id"])
    assert body["state"] == "active" and {d["gpu_uuid"] for d in body["devices"]} == devices  # its GPU back
    resized = [e["reason"] for e in body["events"] if e["reason"].startswith("resized:")]
    assert len(resized) == 2 and resized[1].startswith("resized: 3 → 4 units (capacity freed)")
    wait_until(lambda: [size["units"] for size in told()] == [3, 4])  # the growth: told it runs on 4 again
    assert len(told()[-1]["devices"]) == 4
    assert Lease.objects.get(pk=elastic["id"]).reason.startswith("running, grew:")
