"""Request → ACTIVE with devices → release → RELEASED, renew and expiry, through the HTTP API only, with a
real worker and real agents (tests/broker/conftest.py)."""

import time

from broker.choices import AllocationState
from broker.models import Allocation, LeaseEvent
from tests.support.processes import wait_until


def test_leasing_flow_mig_slice_from_request_to_released(worker, fleet, api):
    client = api("member")
    status, lease = client.call("POST", "/leases", {"project": "vision", "gpu": {"kind": "mig", "profile": "1g.10gb"},
                                                    "duration_seconds": 600}, {"Idempotency-Key": "k-1"})
    assert status == 201, lease
    assert lease["state"] == "queued"

    def active():
        _, body = client.call("GET", f"/leases/{lease['id']}")
        return body if body["state"] == "active" else None

    body = wait_until(active)
    [device] = body["devices"]
    assert device["mig_profile"] == "1g.10gb" and device["model"] == "H100-80GB"
    assert device["device_uuid"].startswith("MIG-")
    assert device["access"]["CUDA_VISIBLE_DEVICES"] == device["device_uuid"]
    assert [e["to_state"] for e in body["events"]] == ["requested", "queued", "provisioning", "active"]
    # the agent really holds the instance
    from broker.models import Node
    from broker.services import agent_client

    node = Node.objects.get(node_id=device["node"])
    assert device["instance_id"] in {i["allocation_id"] for i in agent_client(node).inventory()["instances"]}
    # the same key and body: the same lease, not a second one
    again = client.call("POST", "/leases", {"project": "vision", "gpu": {"kind": "mig", "profile": "1g.10gb"},
                                            "duration_seconds": 600}, {"Idempotency-Key": "k-1"})
    assert again[0] == 200 and again[1]["id"] == lease["id"]
    other = client.call("POST", "/leases", {"project": "vision", "gpu": {"kind": "whole"}}, {"Idempotency-Key": "k-1"})
    assert other[0] == 409 and other[1]["field"] == "Idempotency-Key"
    # renew, then release
    status, renewed = client.call("POST", f"/leases/{lease['id']}/renew", {"duration_seconds": 1200})
    assert status == 200 and renewed["ends_at"] > body["ends_at"]
    status, released = client.call("DELETE", f"/leases/{lease['id']}")
    assert status == 202 and released["state"] == "releasing"
    wait_until(lambda: client.call("GET", f"/leases/{lease['id']}")[1]["state"] == "released")
    assert device["instance_id"] not in {i["allocation_id"] for i in agent_client(node).inventory()["instances"]}
    assert not Allocation.objects.filter(lease_id=lease["id"]).exclude(state=AllocationState.FREED).exists()
    states = list(LeaseEvent.objects.filter(lease_id=lease["id"]).values_list("to_state", flat=True))
    assert states == ["requested", "queued", "provisioning", "active", "active", "releasing", "released"]


def test_leasing_flow_lease_expires_at_its_end(worker, fleet, api):
    from broker.tasks import lease_expire_due

    client = api("member")
    _, lease = client.call("POST", "/leases", {"project": "vision", "gpu": {"kind": "whole", "model": "H100-80GB"},
                                               "duration_seconds": 1})
    # H100s of the fleet are in MIG mode: a whole H100 cannot be placed, it waits with the reason
    body = wait_until(lambda: (b := client.call("GET", f"/leases/{lease['id']}")[1])["reason"].startswith("waiting:")
                      and b)
    assert body["state"] == "queued" and "H100-80GB" in body["reason"]
    client.call("DELETE", f"/leases/{lease['id']}")
    assert client.call("GET", f"/leases/{lease['id']}")[1]["state"] == "released"
    # a MIG slice for 1 s: active, then expired by the periodic task
    _, lease = client.call("POST", "/leases", {"project": "vision", "gpu": {"kind": "mig", "profile": "3g.40gb"},
                                               "duration_seconds": 1})
    wait_until(lambda: client.call("GET", f"/leases/{lease['id']}")[1]["state"] == "active")
    time.sleep(1.2)
    lease_expire_due.delay()
    wait_until(lambda: client.call("GET", f"/leases/{lease['id']}")[1]["state"] == "expired")


def test_leasing_flow_bad_requests_are_named(api):
    client = api("member")
    cases = [
        ({"project": "vision", "gpu": {"kind": "mig", "profile": "9g.99gb"}}, 400, "gpu.profile"),
        ({"project": "vision", "gpu": {"kind": "mig", "profile": "1g.10gb", "model": "L4"}}, 400, "gpu.profile"),
        ({"project": "vision", "gpu": {"kind": "whole", "count": 0}}, 400, "gpu.count"),
        ({"project": "vision", "gpu": {"kind": "whole"}, "duration_seconds": 0}, 400, "duration_seconds"),
        ({"project": "vision", "gpu": {"kind": "tpu"}}, 400, "gpu.kind"),
        ({"project": "vision", "gpu": {"kind": {}}}, 400, "gpu.kind"),  # unhashable: once a 500 (the contract test)
        ({"project": "vision", "gpu": {"kind": ["mig"]}}, 400, "gpu.kind"),
        ({"project": "vision", "gpu": {"kind": "whole", "model": "B900"}}, 400, "gpu.model"),
        ({"project": "secret", "gpu": {"kind": "whole"}}, 404, "project"),  # globex's project
        ({"project": "vision", "gpu": {"kind": "whole", "count": 3}}, 409, "gpu"),  # limit 2000 milli
    ]
    for body, status, field in cases:
        got, problem = client.call("POST", "/leases", body)
        assert (got, problem["field"]) == (status, field), (body, problem)
    assert client.call("GET", "/leases")[1]["count"] == 0
    viewer = api("viewer")
    assert viewer.call("POST", "/leases", {"project": "vision", "gpu": {"kind": "whole"}})[0] == 403
