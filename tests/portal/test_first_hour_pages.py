"""Pages a new user meets in the first hour say what the code does (issue 29).

- ``/ops/queue`` described an order (priority first) that the scheduler does not follow (docs/scheduling.md, rule
  1: across projects by fair share, never by priority). The page now says the rule, and lists the leases in the
  positions the scheduler gave: a high-priority over-quota request of one project comes after another project's
  in-quota one.
- The request form's workload placeholders name the root the broker accepts (``WORKLOAD_ALLOWED_ROOTS``, which
  ``make run`` sets to its nodes' root)."""

from __future__ import annotations

import pytest

from broker import services as broker
from broker.models import Lease
from tenants.access import Actor
from tenants.choices import Role
from tenants.models import Quota, TenantQuota
from tests.factories import make_user
from tests.portal.test_pages import fleet_node, login, text


@pytest.fixture
def staff(db):
    return make_user("root", is_staff=True)


def test_the_queue_page_says_the_schedulers_order_and_lists_leases_in_it(world, client, staff):
    fleet_node(mode="whole", gpus=1)  # one H100: both requests wait once a third holds it
    Quota.objects.filter(project=world.other_project).update(deserved_gpu_milli=0)  # globex runs over quota only
    TenantQuota.objects.filter(tenant=world.globex).update(deserved_gpu_milli=0)
    acme = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    globex = Actor(user=world.outsider, tenant=world.globex, role=Role.OWNER)
    whole = {"kind": "whole", "model": "H100-80GB"}
    broker.lease_request(actor=acme, project="vision", gpu=whole, duration_seconds=3600)  # takes the one GPU
    broker.schedule_cycle()
    urgent, _ = broker.lease_request(actor=globex, project="secret", gpu=whole, duration_seconds=3600, priority=10)
    mine, _ = broker.lease_request(actor=acme, project="vision", gpu=whole, duration_seconds=3600, priority=0)
    broker.schedule_cycle()
    positions = dict(Lease.objects.filter(pk__in=[urgent.pk, mine.pk]).values_list("pk", "queue_position"))
    assert positions[mine.pk] < positions[urgent.pk], positions  # priority 10 does not jump another project

    body = text(login(client, "root").get("/ops/queue"))
    assert "across projects by fair share, never by priority" in body
    assert "priority, then in-quota before over-quota" not in body
    assert body.index(f"#{mine.pk}") < body.index(f"#{urgent.pk}")


def test_the_request_forms_workload_placeholders_name_the_root_the_broker_accepts(world, client, settings):
    settings.WORKLOAD_ALLOWED_ROOTS = ["/data/gpub"]
    page = login(client, "max").get("/leases/new").content.decode()
    assert "/data/gpub/acme/" in page and "/srv/gpubroker" not in page


def test_the_fleet_map_shows_where_each_nodes_workloads_may_name_paths(world, client, staff):
    from broker.models import Node

    fleet_node("gpu-node-01")
    fleet_node("gpu-node-02")
    Node.objects.filter(node_id="gpu-node-01").update(workload_roots=["/srv/gpubroker"])
    body = text(login(client, "root").get("/ops/fleet"))
    assert "workloads under /srv/gpubroker" in body
    assert body.count("workloads under") == 1  # gpu-node-02's agent reports none: nothing is claimed for it
