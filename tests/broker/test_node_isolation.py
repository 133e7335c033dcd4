"""A node's workload isolation as its agent reports it (``agent.isolation``; issue 28): recorded from the real
agent's inventory (reconcile, enrollment), audited when it changes, and a ``process`` node that runs
workloads as the agent's own user while serving several tenants is flagged to staff on the fleet page and in
the admin."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from broker import services
from broker.models import Allocation, Gpu, Lease, Node
from broker.selectors import node_isolation_warning, node_tenant_count
from core.errors import ValidationFailed
from tenants.models import AuditEvent
from tests.factories import make_project, make_tenant, make_user
from tests.support.agents import SECRET, AgentProcess

WARNING = "runs workloads as its agent's own user (isolation none) and serves 2 tenants"


@pytest.fixture
def agent(tmp_path):
    process = AgentProcess(tmp_path / "agent", node_id="iso-node", gpus="a100-80gb:2:whole",
                           extra=("--isolation", "none")).start()
    yield process
    process.stop()


def lease_on(gpu: Gpu, tenant_slug: str) -> Lease:
    tenant = make_tenant(tenant_slug)
    project = make_project(tenant, "p")
    lease = Lease.objects.create(tenant=tenant, project=project, kind="whole", tier=gpu.model, state="active",
                                 duration_seconds=3600)
    Allocation.objects.create(lease=lease, gpu=gpu, tier=gpu.model, kind="whole", slots=(0, 8), milli=1000,
                              memory_mib=gpu.memory_mib)
    return lease


def test_node_isolation_none_serving_two_tenants_is_flagged_to_staff(agent, db):
    node = Node.objects.create(node_id="iso-node", address=agent.url, secret=SECRET, status="ready")
    services.node_reconcile(node=node)  # GET /v1/inventory of the real agent
    node.refresh_from_db()
    assert (node.workload_runtime, node.isolation) == ("process", "none")
    assert AuditEvent.objects.filter(action="node.isolation", target="iso-node").count() == 1
    gpus = list(node.gpus.order_by("index"))
    lease_on(gpus[0], "acme")
    assert node_isolation_warning(node=node, tenant_count=node_tenant_count(node=node)) == ""  # one tenant
    lease_on(gpus[1], "rival")
    assert WARNING in node_isolation_warning(node=node, tenant_count=node_tenant_count(node=node))
    staff = Client()
    staff.force_login(make_user("root", is_staff=True, is_superuser=True))
    page = staff.get(reverse("portal:fleet")).content.decode()
    assert escape(WARNING) in page and "isolation none" in page
    admin = staff.get(reverse("admin:broker_node_changelist")).content.decode()
    assert escape(WARNING) in admin
    services.node_reconcile(node=node)  # the same again: nothing new to audit
    assert AuditEvent.objects.filter(action="node.isolation", target="iso-node").count() == 1


def test_node_isolation_uid_is_not_flagged(db):
    node = Node.objects.create(node_id="iso-uid", address="http://127.0.0.1:1", secret="s", status="ready",
                               workload_runtime="process", isolation="uid")
    assert node_isolation_warning(node=node, tenant_count=5) == ""


@pytest.mark.parametrize("report", [{"isolation": "none"}, {"isolation": {"mode": "sometimes"}},
                                    {"isolation": {"mode": "uid"}, "workload_runtime": ["process"]}])
def test_node_isolation_malformed_report_names_the_field(db, report):
    node = Node.objects.create(node_id="iso-bad", address="http://127.0.0.1:1", secret="s", status="ready")
    with pytest.raises(ValidationFailed) as refused:
        services.node_inventory_sync(node=node, inventory={"gpus": [], **report}, now=node.enrolled_at)
    assert refused.value.field == "inventory.isolation"
    node.refresh_from_db()
    assert node.isolation == ""
