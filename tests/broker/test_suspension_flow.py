"""Suspension end to end (issue 13 item 2), through the HTTP API and the staff portal, with a real Celery
worker and real agents (tests/broker/conftest.py): suspending releases the running lease (its instance is
destroyed on the agent), holds the queued one through schedule cycles that place another tenant's work,
lets members release but not request, mint tokens or renew; reactivating schedules the held lease."""

from django.test import Client

from broker import services
from broker.models import Node
from tests.factories import make_user
from tests.support.processes import wait_until

SLICE = {"kind": "mig", "profile": "1g.10gb"}


def test_suspension_flow_stops_the_meter_and_holds_the_queue(worker, fleet, api, world):
    member, outsider = api("member"), api("outsider")
    status, running = member.call("POST", "/leases", {"project": "vision", "gpu": SLICE, "duration_seconds": 600})
    assert status == 201, running
    lease_state = lambda client, pk: client.call("GET", f"/leases/{pk}")[1]  # noqa: E731
    wait_until(lambda: lease_state(member, running["id"])["state"] == "active")
    node = Node.objects.get(node_id=lease_state(member, running["id"])["devices"][0]["node"])
    instance = lease_state(member, running["id"])["devices"][0]["instance_id"]
    # nothing can be placed while every node is cordoned: the next two requests wait in the queue
    for each in Node.objects.all():
        services.node_cordon(node=each)
    _, queued = member.call("POST", "/leases", {"project": "vision", "gpu": SLICE, "duration_seconds": 600})
    _, cancelled = member.call("POST", "/leases", {"project": "vision", "gpu": SLICE, "duration_seconds": 600})
    wait_until(lambda: lease_state(member, queued["id"])["reason"].startswith("waiting:"))

    staff = Client()
    staff.force_login(make_user("root", is_staff=True))
    response = staff.post("/ops/tenants/acme/status", {"status": "suspended", "reason": "unpaid"})
    assert response.status_code == 302

    # the running lease is released by the suspension, its instance destroyed by the worker
    released = wait_until(lambda: (body := lease_state(member, running["id"]))["state"] == "released" and body)
    assert "tenant 'acme' was suspended (unpaid)" in released["events"][-2]["reason"]
    assert instance not in {i["allocation_id"] for i in services.agent_client(node).inventory()["instances"]}
    # members: no new lease, token or renewal; releasing is always allowed
    for path, body in [("/leases", {"project": "vision", "gpu": SLICE}),
                       ("/tokens", {"name": "more", "scopes": ["read", "write"]}),
                       (f"/leases/{queued['id']}/renew", {"duration_seconds": 600})]:
        status, problem = member.call("POST", path, body)
        assert status == 403 and problem["code"] == "tenant_suspended", (path, problem)
    status, body = member.call("DELETE", f"/leases/{cancelled['id']}")
    assert status == 202 and body["state"] == "released"

    # capacity opens and cycles run (another tenant's lease is placed): acme's queued lease stays held
    for each in Node.objects.all():
        services.node_uncordon(node=each)
    _, theirs = outsider.call("POST", "/leases", {"project": "secret", "gpu": SLICE, "duration_seconds": 600})
    wait_until(lambda: lease_state(outsider, theirs["id"])["state"] == "active")
    # (the cycle that placed it saw acme's older lease first, on free capacity, and left it alone)
    held = lease_state(member, queued["id"])
    assert held["state"] == "queued", held
    assert held["reason"] == "held: tenant 'acme' is suspended (unpaid)"

    # reactivation gives it back to the scheduler
    assert staff.post("/ops/tenants/acme/status", {"status": "active"}).status_code == 302
    wait_until(lambda: lease_state(member, queued["id"])["state"] == "active")
