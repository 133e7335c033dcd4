"""The nodes' own workload roots (their inventory's ``workload_roots``) bound what the broker accepts, on real parts:
the REST API (live server), a real Celery worker, a simulated node over real HTTP that runs the workload.

Issue 29: the docs' example path was accepted by the broker and its preview ("Fits now") while the demo's nodes
allowed only their own directory, so the lease went ACTIVE then FAILED with the final reason "released". Now the
preview and the request refuse a path that no node of the requested model accepts, naming the field, and a lease
that a node refuses anyway ends saying why."""

from __future__ import annotations

import re
import sys
from html import unescape

from django.test import Client

from broker.models import Lease, Node
from tests.factories import make_quota
from tests.support.processes import start_fleet, stop_fleet, wait_until

WHOLE_A100 = {"kind": "whole", "model": "A100-80GB"}


def test_a_path_no_node_accepts_is_refused_by_the_preview_and_the_request_and_the_nodes_root_runs(
        worker, live_server, tmp_path, api, world, settings):
    node_root, broker_only = tmp_path / "nodes", tmp_path / "srv"
    (node_root / "acme" / "vision").mkdir(parents=True)
    settings.WORKLOAD_ALLOWED_ROOTS = [str(broker_only), str(node_root)]  # the broker alone would accept both
    make_quota(world.project, "A100-80GB", deserved=1000, limit=2000, tenant_deserved=1000, tenant_limit=4000)
    fleet = start_fleet(live_server.url, tmp_path / "fleet", 1, "a100-80gb:1:whole",
                        extra=("--workload-root", str(node_root)))
    try:
        assert Node.objects.get().workload_roots == [str(node_root)]  # from the enrollment's inventory
        client = api("member")
        outside = f"{broker_only}/acme/vision"
        body = {"project": "vision", "gpu": WHOLE_A100,
                "workload": {"command": [sys.executable, "-c", "import os; print('in', os.getcwd())"],
                             "workdir": outside}}
        for path in ("/quotes", "/leases"):
            status, problem = client.call("POST", path, body)
            assert status == 400 and problem["field"] == "workload.workdir", (path, problem)
            assert outside in problem["detail"] and f"{node_root}/acme/vision" in problem["detail"], problem
        assert Lease.objects.count() == 0  # nothing half-written

        # the portal's live preview says the same, on the field
        portal = Client()
        assert portal.login(username="max", password="pw-max")
        shown = portal.get("/leases/preview", {"project": "vision", "gpu.kind": "whole", "gpu.model": "A100-80GB",
                                               "workload.command": "python -V", "workload.workdir": outside})
        assert shown.status_code == 200
        text = " ".join(unescape(re.sub(r"<[^>]+>", " ", shown.content.decode())).split())
        assert shown.context["preview"]["field"] == "workload.workdir" and "outside what the nodes" in text, text

        # the node's own root: it fits, runs there and ends released
        inside = str(node_root / "acme" / "vision")
        body["workload"]["workdir"] = inside
        status, quoted = client.call("POST", "/quotes", body)
        assert status == 200 and quoted["outcome"] == "fits", quoted
        status, lease = client.call("POST", "/leases", body)
        assert status == 201, lease
        done = wait_until(lambda: (got := client.call("GET", f"/leases/{lease['id']}")[1])["state"]
                          in ("released", "failed") and got, timeout=60)
        assert done["state"] == "released", done["reason"]
        assert f"in {inside}" in client.call("GET", f"/leases/{lease['id']}/logs")[1]["data"]
    finally:
        stop_fleet(fleet)


def test_a_lease_whose_node_refuses_the_workload_fails_saying_why(worker, workload_fleet, api, world):
    make_quota(world.project, "A100-80GB", deserved=1000, limit=2000, tenant_deserved=1000, tenant_limit=4000)
    client = api("member")
    # an image on a node that runs plain processes: the broker cannot know the runtime, the node refuses it
    status, lease = client.call("POST", "/leases", {"project": "vision", "gpu": WHOLE_A100,
                                                    "workload": {"image": "nvcr.io/nvidia/pytorch:24.05-py3"}})
    assert status == 201, lease
    done = wait_until(lambda: (got := client.call("GET", f"/leases/{lease['id']}")[1])["state"]
                      in ("released", "failed") and got, timeout=60)
    assert done["state"] == "failed"
    final = done["events"][-1]
    assert final["to_state"] == "failed" and final["reason"].startswith("failed: the node refused the workload ("), \
        final
    assert done["reason"] == final["reason"]
