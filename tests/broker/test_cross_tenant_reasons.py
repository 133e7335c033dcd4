"""A lease's reason and events never name another tenant's objects (issue 30 wave 19's review): what a node
answers about the GPU it was asked for, and what a lease group would have reclaimed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from broker import services
from broker.models import Allocation, Lease, Node
from broker.services.provisioning import agent_detail_seen
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_project, make_quota, make_world


@pytest.fixture
def world(db):
    return make_world()


def _acme(world):
    return Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)


def _globex(world):
    return Actor(user=world.outsider, tenant=world.globex, role=Role.OWNER)


def test_a_nodes_refusal_names_no_other_tenants_allocation(world, tmp_path, settings):
    """globex's instance stays on the node (its destroy found the node down); acme's lease is placed on that GPU
    and the node refuses it, naming what holds the GPU: acme reads that another lease holds it, not which."""
    from tests.support.agents import SECRET, AgentProcess

    settings.NODE_ADDRESS_NETWORKS = ["127.0.0.0/8"]
    agent = AgentProcess(tmp_path / "agent", node_id="n1", gpus="a100-80gb:1:whole").start()
    try:
        inventory = agent.client().inventory()
        token = services.enrollment_token_create()
        services.node_enroll(node_id="n1", token=token, address=agent.url, inventory={"gpus": inventory["gpus"]})
        Node.objects.filter(node_id="n1").update(secret=SECRET)
        make_quota(world.project, "A100-80GB", deserved=1000, limit=1000)
        make_quota(world.other_project, "A100-80GB", deserved=1000, limit=1000)
        theirs, _ = services.lease_request(actor=_globex(world), project="secret",
                                           gpu={"kind": "whole", "model": "A100-80GB"})
        services.schedule_cycle()
        services.leases_provision(lease_ids=[theirs.pk])
        assert Lease.objects.get(pk=theirs.pk).state == "active"
        their_alloc = Allocation.objects.get(lease=theirs)
        now = timezone.now()
        with transaction.atomic():
            locked = Lease.objects.select_for_update().get(pk=theirs.pk)
            services.lease_preempt(lease=locked, actor="test", now=now, why="test", notice_seconds=0)
        agent.stop()  # the preemption's destroy finds no node: globex's instance stays there
        services.lease_preempt_due(now=now + timedelta(seconds=1))
        services.lease_release(lease=Lease.objects.get(pk=theirs.pk), actor="test")
        agent.start()
        mine, _ = services.lease_request(actor=_acme(world), project="vision",
                                         gpu={"kind": "whole", "model": "A100-80GB"})
        services.schedule_cycle()
        services.leases_provision(lease_ids=[mine.pk])
    finally:
        agent.stop()
    body = world.client("viewer").get(f"/api/v1/leases/{mine.pk}").json()
    texts = [body["reason"], *[event["reason"] for event in body["events"]]]
    refused = [text for text in texts if "the node refused the instance" in text]
    assert refused, texts  # the case happened: the node refused acme's instance
    assert "held by allocation of another lease" in refused[0], refused
    assert not any(their_alloc.instance_id in text for text in texts), texts


def test_an_agents_detail_keeps_the_leases_own_names_and_hides_the_others(world):
    token = services.enrollment_token_create()
    services.node_enroll(node_id="n1", token=token, address="http://127.0.0.1:9/n/n1", inventory={"gpus": [
        {"index": 0, "uuid": "GPU-a100-0", "model": "A100-80GB", "mode": "whole", "memory_mib": 81920}]})
    make_quota(world.project, "A100-80GB", deserved=1000, limit=1000)
    mine, _ = services.lease_request(actor=_acme(world), project="vision", gpu={"kind": "whole", "model": "A100-80GB"})
    services.schedule_cycle()
    own = Allocation.objects.get(lease=mine).instance_id
    detail = (f"GPU 0 is held by allocation 'alloc-{mine.pk + 1000}'; host port 8080 is taken by workload "
              f"'lease-9-a3'; allocation '{own}', workload 'lease-{mine.pk}-a1' and workload 'lease-{mine.pk}1-a1'")
    assert agent_detail_seen(detail, mine) == (
        "GPU 0 is held by allocation of another lease; host port 8080 is taken by workload of another lease; "
        f"allocation '{own}', workload 'lease-{mine.pk}-a1' and workload of another lease")
    assert agent_detail_seen("no such profile", mine) == "no such profile"
    assert agent_detail_seen("", mine) == ""


def test_a_groups_wait_names_its_own_leases_and_counts_another_tenants(world, settings):
    """globex's over-quota lease of 2 GPUs is placed first in the over-quota pass; acme's group would have to
    reclaim it in the same cycle, so it waits: its reason counts globex's lease without naming it."""
    settings.LEASE_MIN_RUNTIME_SECONDS = 0
    token = services.enrollment_token_create()
    services.node_enroll(node_id="n1", token=token, address="http://127.0.0.1:9/n/n1", inventory={"gpus": [
        {"index": i, "uuid": f"GPU-a100-{i}", "model": "A100-80GB", "mode": "whole", "memory_mib": 81920}
        for i in range(2)]})
    g2 = make_project(world.globex, "g2")  # created first: the lower project id wins the fair-share tie
    a2 = make_project(world.acme, "a2")
    make_quota(g2, "A100-80GB", deserved=0, limit=2000)
    make_quota(a2, "A100-80GB", deserved=1000, limit=2000)
    theirs, _ = services.lease_request(actor=_globex(world), project="g2",
                                       gpu={"kind": "whole", "model": "A100-80GB", "count": 2})
    mine = [services.lease_request(actor=_acme(world), project="a2", gpu={"kind": "whole", "model": "A100-80GB"},
                                   group="grp")[0] for _ in range(2)]
    services.schedule_cycle()
    assert Lease.objects.get(pk=theirs.pk).state == "provisioning"
    reason = world.client("viewer").get(f"/api/v1/leases/{mine[0].pk}").json()["reason"]
    assert "would reclaim capacity placed in this cycle (1 lease(s) of another tenant)" in reason, reason
    assert f"({theirs.pk})" not in reason and "group 'grp'" in reason
