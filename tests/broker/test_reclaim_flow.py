"""Reclaim end to end: project A borrows every A100; project B asks within its quota → A's newest lease
gets a notice on its node, is released at the deadline and requeued; B becomes ACTIVE; A's lease
restarts when B gives the GPU back."""

from broker.models import Node
from broker.services import agent_client
from tests.factories import make_project, make_quota
from tests.support.processes import wait_until


def test_reclaim_flow_preempts_over_quota_work_and_requeues_it(worker, fleet, api, world):
    make_quota(world.project, "A100-80GB", deserved=0, limit=2000, tenant_deserved=1000, tenant_limit=4000)
    nlp = make_project(world.acme, "nlp")
    make_quota(nlp, "A100-80GB", deserved=1000, limit=1000, tenant_deserved=1000, tenant_limit=4000)
    client = api("member")

    def state(lease_id):
        return client.call("GET", f"/leases/{lease_id}")[1]

    borrowed = []
    for _ in range(2):  # both A100s, over quota (deserved 0): preemptible
        _, lease = client.call("POST", "/leases", {"project": "vision", "gpu": {"kind": "whole", "model": "A100-80GB"}})
        borrowed.append(lease["id"])
        wait_until(lambda lease=lease: state(lease["id"])["state"] == "active")
    assert all(state(i)["over_quota"] for i in borrowed)

    _, claim = client.call("POST", "/leases", {"project": "nlp", "gpu": {"kind": "whole", "model": "A100-80GB"}})
    # the newest borrowed lease is the victim: notice with a deadline, delivered to its node
    victim = wait_until(lambda: (body := state(borrowed[1]))["state"] == "preempted" and body)
    assert victim["notice_deadline"] and f"lease {claim['id']}" in victim["reason"]
    device = state(borrowed[1])["devices"][0]
    node = Node.objects.get(node_id=device["node"])
    wait_until(lambda: agent_client(node).instance(device["instance_id"])["notice"] is not None)
    assert state(borrowed[0])["state"] == "active"  # only as many victims as needed
    # at the deadline: the victim leaves and waits again; the claim runs, in quota
    wait_until(lambda: state(claim["id"])["state"] == "active")
    body = state(claim["id"])
    assert body["over_quota"] is False and body["devices"][0]["gpu_uuid"] == device["gpu_uuid"]
    requeued = state(borrowed[1])
    assert requeued["state"] == "queued"
    events = [e["to_state"] for e in requeued["events"]]
    assert events[-4:] == ["provisioning", "active", "preempted", "queued"]
    # the claim gives the GPU back: the preempted lease restarts
    client.call("DELETE", f"/leases/{claim['id']}")
    wait_until(lambda: state(borrowed[1])["state"] == "active")
