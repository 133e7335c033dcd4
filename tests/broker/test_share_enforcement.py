"""Shares enforced or not (docs/leasing.md, "Shares: enforced or not"): the broker keeps what each node's agent
reports per GPU (``share_enforcement``: ``mps`` or ``none`` with a reason) and says it on the lease (API and page),
in the offers and in the quote — a tenant is never sold an enforcement that does not exist.

The inventories are real agents' (``python -m agent`` over HTTP): one runs MPS through
tests/fixtures/fake-nvidia-cuda-mps-control, one has MPS turned off; both are the same node (same node id, same
GPU UUIDs), so the node's GPU flips from one to the other as a reconcile would see it."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone

from broker import services
from broker.models import Gpu, Lease, Node
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_quota, make_world
from tests.support.agents import AgentProcess

FAKE_MPS = str(Path(__file__).resolve().parents[1] / "fixtures" / "fake-nvidia-cuda-mps-control")
SHARE = {"kind": "share", "milli": 250, "memory_mib": 4096, "model": "L4"}


@pytest.fixture(scope="module")
def inventories(tmp_path_factory) -> dict[str, dict]:
    """The same node's inventory from an agent that runs MPS and from one with MPS turned off."""
    found = {}
    for name, extra in (("mps", ("--mps-control", FAKE_MPS, "--isolation", "none")), ("none", ("--mps-control", ""))):
        agent = AgentProcess(tmp_path_factory.mktemp(name), node_id="node-s", gpus="l4:1:shared", extra=extra)
        agent.start()
        try:
            found[name] = agent.client(retries=0).inventory()
        finally:
            agent.stop()
    yield found
    for pid_file in tmp_path_factory.getbasetemp().rglob("nvidia-cuda-mps-control.pid"):  # none: no share made
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


@pytest.fixture
def world(db):
    world = make_world()
    make_quota(world.project, tier="L4", deserved=1000, limit=2000)
    return world


def enroll(inventory: dict) -> Node:
    token = services.enrollment_token_create()
    return services.node_enroll(node_id="node-s", token=token, address="http://127.0.0.1:9/n/node-s",
                                inventory={"gpus": inventory["gpus"]})


def share_lease(world) -> Lease:
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease, _ = services.lease_request(actor=actor, project="vision", gpu=SHARE)
    assert services.schedule_cycle()["placed"] == 1
    return lease


def test_share_enforcement_follows_the_agents_inventory_onto_the_lease_and_its_page(world, inventories):
    assert inventories["none"]["gpus"][0]["uuid"] == inventories["mps"]["gpus"][0]["uuid"]
    node = enroll(inventories["none"])
    gpu = Gpu.objects.get(node=node)
    assert (gpu.share_enforcement, gpu.share_enforcement_reason) == (
        "none", "MPS is turned off on this node (mps_control = \"\")")
    lease = share_lease(world)
    body = world.client("member").get(f"/api/v1/leases/{lease.pk}").json()
    assert body["share_enforcement"]["mode"] == "none"
    assert "not enforced" in body["share_enforcement"]["reason"]
    assert "MPS is turned off" in body["share_enforcement"]["reason"]
    assert [d["share_enforcement"] for d in body["devices"]] == ["none"]
    client = Client()
    assert client.login(username="max", password="pw-max")
    page = client.get(f"/leases/{lease.pk}").content.decode()
    assert "not enforced" in page and "MPS is turned off" in page and "enforced by MPS" not in page

    services.node_inventory_sync(node=node, inventory={"gpus": inventories["mps"]["gpus"]}, now=timezone.now())
    body = world.client("member").get(f"/api/v1/leases/{lease.pk}").json()
    assert body["share_enforcement"]["mode"] == "mps" and [d["share_enforcement"] for d in body["devices"]] == ["mps"]
    assert "enforced by MPS" in client.get(f"/leases/{lease.pk}").content.decode()
    assert world.client("outsider").get(f"/api/v1/leases/{lease.pk}").status_code == 404


def test_a_lease_without_shares_says_nothing_of_enforcement(world, inventories):
    enroll(inventories["none"])
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease, _ = services.lease_request(actor=actor, project="vision", gpu={"kind": "whole", "model": "L4"})
    body = world.client("member").get(f"/api/v1/leases/{lease.pk}").json()
    assert body["share_enforcement"] is None


def test_offers_and_quotes_say_whether_a_share_would_be_enforced(world, inventories):
    node = enroll(inventories["none"])
    client = world.client("member")
    [offer] = [o for o in client.get("/api/v1/offers").json()["offers"] if o["model"] == "L4"]
    assert offer["share"]["enforcement"] == "none" and offer["share"]["unenforced_gpus"] == 1
    assert "MPS is turned off" in offer["share"]["detail"]
    quote = client.post("/api/v1/quotes", {"project": "vision", "gpu": SHARE}, format="json").json()
    assert quote["share_enforcement"]["enforcement"] == "none"
    assert quote["share_enforcement"]["detail"].startswith("Not enforced")
    whole = client.post("/api/v1/quotes", {"project": "vision", "gpu": {"kind": "whole", "model": "L4"}},
                        format="json").json()
    assert whole["share_enforcement"] is None

    services.node_inventory_sync(node=node, inventory={"gpus": inventories["mps"]["gpus"]}, now=timezone.now())
    [offer] = [o for o in client.get("/api/v1/offers").json()["offers"] if o["model"] == "L4"]
    assert (offer["share"]["enforcement"], offer["share"]["mps_gpus"]) == ("mps", 1)
    quote = client.post("/api/v1/quotes", {"project": "vision", "gpu": SHARE}, format="json").json()
    assert quote["share_enforcement"]["enforcement"] == "mps"
    portal = Client()
    assert portal.login(username="max", password="pw-max")
    preview = portal.get("/leases/preview", {"project": "vision", "gpu.kind": "share", "gpu.milli": "250",
                                             "gpu.memory_mib": "4096", "gpu.model": "L4"})
    html = preview.content.decode()  # the request form's live preview renders the same quote
    assert preview.status_code == 200 and "Share limits" in html and "Enforced by MPS" in html, html


def test_an_inventory_with_an_unknown_enforcement_is_refused_naming_the_field(world, inventories):
    gpus = [{**inventories["mps"]["gpus"][0], "share_enforcement": "hope"}]
    response = world.client("member").post("/api/v1/agents/enroll", {
        "node_id": "node-x", "token": services.enrollment_token_create(), "address": "http://127.0.0.1:9/n/node-x",
        "inventory": {"gpus": gpus}}, format="json")
    assert response.status_code == 400 and response.json()["field"] == "inventory.gpus[0].share_enforcement"
    assert not Node.objects.filter(node_id="node-x").exists() and not Gpu.objects.exists()
    old = {key: value for key, value in inventories["mps"]["gpus"][0].items() if not key.startswith("share_")}
    node = enroll({"gpus": [old]})  # an agent from before: counted as unenforced
    gpu = Gpu.objects.get(node=node)
    assert gpu.share_enforcement == "none" and "does not report" in gpu.share_enforcement_reason


def test_staff_see_each_gpus_enforcement_in_the_admin(world, inventories, admin_client):
    node = enroll(inventories["none"])
    gpu = Gpu.objects.get(node=node)
    listed = admin_client.get("/admin/broker/gpu/?share_enforcement__exact=none").content.decode()
    assert gpu.uuid in listed and "Not enforced" in listed
    assert gpu.uuid not in admin_client.get("/admin/broker/gpu/?share_enforcement__exact=mps").content.decode()
    page = admin_client.get(f"/admin/broker/gpu/{gpu.pk}/change/").content.decode()
    assert "MPS is turned off on this node" in page
