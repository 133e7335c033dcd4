"""Cohorts, node pools and the SLO minimum runtime through the services and the API (issue 32 item 7;
docs/scheduling.md, "Cohorts, node pools and minimum runtime"): staff create cohorts, put tenants in them and set
their lending and borrowing limits, audited; a tenant reads its own cohort and limits, nothing of another tenant;
tenant admins bind projects to pools of the fleet (an unknown pool is a problem+json naming ``pools``, nothing
written); the live cycle places a bound project's lease only in its pools, lends a cohort member's idle guarantee
only within its cohort, and keeps a gold tenant's borrowed lease for its contract's minimum runtime. Two tenants
(acme, globex)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from broker import services as broker
from broker.models import Gpu, Lease, Node
from tenants import services
from tenants.access import Actor
from tenants.choices import Role
from tenants.models import AuditEvent, Project, SloContract, Tenant, TenantQuota
from tests.factories import api_client, make_quota, make_user

H100 = "H100-80GB"


@pytest.fixture
def staff_client(db):
    client = api_client()
    client.force_login(make_user("root", is_staff=True))
    return client


def _node(node_id: str, pool: str, gpus: int) -> Node:
    node = Node.objects.create(node_id=node_id, address="http://127.0.0.1:1", secret="s", status="ready", pool=pool)
    for index in range(gpus):
        Gpu.objects.create(node=node, uuid=f"GPU-{node_id}-{index}", index=index, model=H100, mode="whole",
                           memory_mib=81559)
    return node


def _problem(response, status: int, field: str) -> None:
    assert response.status_code == status, (response.status_code, response.content[:400])
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["field"] == field, response.json()


def test_cohorts_api_staff_create_join_and_limits(world, staff_client):
    created = staff_client.post("/api/v1/cohorts", {"name": "research", "description": "labs"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["members"] == []
    _problem(staff_client.post("/api/v1/cohorts", {"name": "research"}, format="json"), 409, "name")
    _problem(staff_client.post("/api/v1/cohorts", {"name": "Not A Slug"}, format="json"), 400, "name")

    joined = staff_client.patch("/api/v1/tenants/acme", {"cohort": "research"}, format="json")
    assert joined.status_code == 200 and joined.json()["cohort"] == "research"
    _problem(staff_client.patch("/api/v1/tenants/globex", {"cohort": "nobody"}, format="json"), 404, "cohort")
    assert Tenant.objects.get(slug="globex").cohort is None
    event = AuditEvent.objects.get(action="tenant.cohort_set", target="acme")
    assert event.data == {"from": None, "to": "research"}
    listed = staff_client.get("/api/v1/cohorts").json()["results"]
    assert listed == [created.json() | {"members": ["acme"]}]

    bound = staff_client.put(f"/api/v1/tenants/acme/quotas/{H100}", {
        "deserved_gpu_milli": 4000, "limit_gpu_milli": 8000, "lending_limit_gpu_milli": 2000}, format="json")
    assert bound.status_code == 200, bound.content
    assert bound.json()["lending_limit_gpu_milli"] == 2000 and bound.json()["borrowing_limit_gpu_milli"] is None
    # a PUT that leaves the limits out keeps them
    staff_client.put(f"/api/v1/tenants/acme/quotas/{H100}", {"deserved_gpu_milli": 4000, "limit_gpu_milli": 8000},
                     format="json")
    assert TenantQuota.objects.get(tenant__slug="acme", tier=H100).lending_limit_gpu_milli == 2000
    _problem(staff_client.put(f"/api/v1/tenants/acme/quotas/{H100}", {
        "deserved_gpu_milli": 4000, "limit_gpu_milli": 8000, "borrowing_limit_gpu_milli": -1}, format="json"),
        400, "borrowing_limit_gpu_milli")

    # the tenant reads its own cohort and limits; the outsider sees no cohort and acme's limits nowhere
    assert world.client("viewer").get("/api/v1/tenant").json()["cohort"] == "research"
    tenant_row = world.client("viewer").get("/api/v1/quotas").json()["tenant"][0]
    assert tenant_row["lending_limit_gpu_milli"] == 2000
    assert world.client("outsider").get("/api/v1/tenant").json()["cohort"] is None
    assert all(row["lending_limit_gpu_milli"] is None
               for row in world.client("outsider").get("/api/v1/quotas").json()["tenant"])
    # a tenant member is no staff
    assert world.client("owner").get("/api/v1/cohorts").status_code == 403

    left = staff_client.patch("/api/v1/tenants/acme", {"cohort": None}, format="json")
    assert left.json()["cohort"] is None


def test_cohorts_api_project_pools_set_by_tenant_admins(world):
    _node("a1", "east", 1)
    _node("b1", "west", 1)
    admin = world.client("admin")
    bound = admin.patch("/api/v1/projects/vision", {"pools": ["west", "east", "west"]}, format="json")
    assert bound.status_code == 200, bound.content
    assert bound.json()["pools"] == ["east", "west"]
    assert AuditEvent.objects.filter(action="project.update", target="vision").exists()
    # an unknown pool, with a rename in the same call: refused naming the field, nothing written
    _problem(admin.patch("/api/v1/projects/vision", {"pools": ["north"], "name": "Renamed"}, format="json"),
             400, "pools")
    project = Project.objects.get(pk=world.project.pk)
    assert project.pools == ["east", "west"] and project.name != "Renamed"
    _problem(admin.patch("/api/v1/projects/vision", {"pools": "east"}, format="json"), 400, "pools")
    # a member may not; the outsider does not see it
    assert world.client("member").patch("/api/v1/projects/vision", {"pools": []}, format="json").status_code == 403
    assert world.client("outsider").patch("/api/v1/projects/vision", {"pools": []},
                                          format="json").status_code == 404
    cleared = admin.patch("/api/v1/projects/vision", {"pools": []}, format="json")
    assert cleared.json()["pools"] == []


def test_cohorts_api_slo_min_runtime_in_the_contract(world, staff_client):
    contract = {"name": "gold", "effective_from": "2026-01-01T00:00:00Z", "effective_to": None,
                "time_to_gpu_p95_seconds": 300, "availability_target_pct": "99.5", "preemption_notice_seconds": 60,
                "min_runtime_seconds": 900}
    made = staff_client.post("/api/v1/tenants/acme/slo-contracts", contract, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["min_runtime_seconds"] == 900
    assert world.client("viewer").get("/api/v1/slo-contracts").json()["results"][0]["min_runtime_seconds"] == 900
    _problem(staff_client.put(f"/api/v1/tenants/acme/slo-contracts/{made.json()['id']}",
                              {**contract, "min_runtime_seconds": -5}, format="json"), 400, "min_runtime_seconds")
    default = staff_client.put(f"/api/v1/tenants/acme/slo-contracts/{made.json()['id']}",
                               {**contract, "min_runtime_seconds": None}, format="json")
    assert default.json()["min_runtime_seconds"] is None
    assert SloContract.objects.get(pk=made.json()["id"]).min_runtime_seconds is None


# -- the live cycle ----------------------------------------------------------------------------------------------
def _borrower_only(world, limit: int) -> None:
    """globex: guaranteed nothing on H100, may borrow up to ``limit``."""
    services.quota_set(project=world.other_project, tier=H100, deserved_gpu_milli=0, limit_gpu_milli=limit)
    services.tenant_quota_set(tenant=world.globex, tier=H100, deserved_gpu_milli=0, limit_gpu_milli=limit)


def _ask(world, tenant, user, project: str, count: int = 1) -> Lease:
    actor = Actor(user=user, tenant=tenant, role=Role.OWNER)
    lease, _ = broker.lease_request(actor=actor, project=project, gpu={"kind": "whole", "model": H100,
                                                                         "count": count}, duration_seconds=3600)
    return lease


def test_cohorts_api_live_cycle_places_in_the_projects_pools(world, settings):
    _node("a1", "east", 2)
    _node("b1", "west", 2)
    actor = Actor(user=world.admin, tenant=world.acme, role=Role.ADMIN)
    services.project_update(actor=actor, project=world.project, pools=["west"])
    make_quota(world.project, H100, deserved=4000, limit=4000)
    now = timezone.now()
    leases = [_ask(world, world.acme, world.owner, "vision") for _ in range(3)]
    broker.schedule_cycle(now=now)
    for lease in leases:
        lease.refresh_from_db()
    placed = [lease for lease in leases if lease.state != "queued"]
    assert len(placed) == 2
    assert {a.gpu.node.node_id for lease in placed for a in lease.allocations.all()} == {"b1"}
    waiting = next(lease for lease in leases if lease.state == "queued")
    assert "no node in pool(s) west has room" in waiting.reason


def test_cohorts_api_live_cycle_lends_only_within_the_cohort(world, settings):
    # 4 GPUs: acme (cohort "research") is guaranteed 2 of them and lends none; globex (no cohort) guaranteed
    # nothing borrows: only the 2 no cohort member is guaranteed
    settings.LEASE_MIN_RUNTIME_SECONDS = 0
    _node("a1", "default", 4)
    make_quota(world.project, H100, deserved=2000, limit=4000, tenant_deserved=2000, tenant_limit=4000)
    _borrower_only(world, 4000)
    cohort = services.cohort_create(name="research")
    services.tenant_cohort_set(tenant=world.acme, cohort=cohort)
    leases = [_ask(world, world.globex, world.outsider, "secret") for _ in range(4)]
    broker.schedule_cycle(now=timezone.now())
    states = []
    for lease in leases:
        lease.refresh_from_db()
        states.append(lease.state)
    assert states.count("queued") == 2, [lease.reason for lease in leases]
    waiting = next(lease for lease in leases if lease.state == "queued")
    assert "guaranteed to tenants of a cohort" in waiting.reason
    # out of the cohort, acme's idle guarantee is borrowable again
    services.tenant_cohort_set(tenant=world.acme, cohort=None)
    broker.schedule_cycle(now=timezone.now())
    assert not Lease.objects.filter(pk__in=[lease.pk for lease in leases], state="queued").exists()


def test_cohorts_api_live_cycle_keeps_the_contracts_min_runtime(world, settings):
    settings.LEASE_MIN_RUNTIME_SECONDS = 0
    _node("a1", "default", 1)
    _borrower_only(world, 1000)
    make_quota(world.project, H100, deserved=1000, limit=1000)
    start = timezone.now() - timedelta(seconds=100)
    services.slo_contract_create(tenant=world.globex, name="gold", effective_from=start - timedelta(days=1),
                                 effective_to=None, time_to_gpu_p95_seconds=300, availability_target_pct=99,
                                 preemption_notice_seconds=0, credit_steps=[], min_runtime_seconds=600)
    borrowed = _ask(world, world.globex, world.outsider, "secret")
    broker.schedule_cycle(now=start)
    borrowed.refresh_from_db()
    assert borrowed.state == "provisioning", borrowed.reason
    assert "minimum runtime of 600 s" in borrowed.reason
    for allocation in borrowed.allocations.all():
        broker.allocation_ready(allocation=allocation, instance={}, now=start)
    claim = _ask(world, world.acme, world.owner, "vision")
    broker.schedule_cycle(now=start + timedelta(seconds=100))
    claim.refresh_from_db()
    assert claim.state == "queued"
    assert "within their minimum runtime" in claim.reason


def test_cohorts_api_portal_pools_page(world):
    from django.test import Client

    _node("a1", "east", 1)
    _node("b1", "west", 1)
    cohort = services.cohort_create(name="research")
    services.tenant_cohort_set(tenant=world.acme, cohort=cohort)
    admin = Client()
    assert admin.login(username="ann", password="pw-ann")
    page = admin.get("/settings/pools")
    assert page.status_code == 200
    assert b"research" in page.content and b'value="west"' in page.content
    saved = admin.post("/settings/pools", {"project": "vision", "pools": ["west"]})
    assert saved.status_code == 302
    assert Project.objects.get(pk=world.project.pk).pools == ["west"]
    refused = admin.post("/settings/pools", {"project": "vision", "pools": ["north"]})
    assert refused.status_code == 400 and b"No node pool" in refused.content
    assert Project.objects.get(pk=world.project.pk).pools == ["west"]
    viewer = Client()
    assert viewer.login(username="vic", password="pw-vic")
    assert viewer.post("/settings/pools", {"project": "vision", "pools": []}).status_code == 403
    outsider = Client()
    assert outsider.login(username="bob", password="pw-bob")
    assert b"research" not in outsider.get("/settings/pools").content


def test_cohorts_api_ops_page_sets_the_contracts_min_runtime(world):
    from django.test import Client

    make_user("root", is_staff=True)
    client = Client()
    assert client.login(username="root", password="pw-root")
    form = {"name": "gold", "effective_from": "2030-01-01T00:00", "time_to_gpu_p95_seconds": "300",
            "availability_target_pct": "99.5", "preemption_notice_seconds": "120", "min_runtime_seconds": "900"}
    assert client.post("/ops/tenants/acme/slo-contracts", form).status_code == 302
    contract = SloContract.objects.get(tenant=world.acme)
    assert contract.min_runtime_seconds == 900
    assert f'id="contract-{contract.pk}-min_runtime_seconds"' in client.get("/ops/tenants/acme").content.decode()
    refused = client.post(f"/ops/tenants/acme/slo-contracts/{contract.pk}", {**form, "min_runtime_seconds": "soon"})
    assert refused.status_code == 400 and b"min_runtime_seconds must be a whole number" in refused.content
    assert client.post(f"/ops/tenants/acme/slo-contracts/{contract.pk}",
                       {**form, "min_runtime_seconds": ""}).status_code == 302
    contract.refresh_from_db()
    assert contract.min_runtime_seconds is None  # empty: the platform's


@pytest.mark.django_db(transaction=True)
def test_cohorts_api_kept_snapshot_follows_a_nodes_pool():
    # the snapshot the scheduler keeps between cycles learns a node's new pool from the change log (broker 0020)
    from broker.snapshot import SnapshotCache

    node = _node("a1", "east", 1)
    cache = SnapshotCache()
    now = timezone.now()
    assert [n.pool for n in cache.load(now=now).nodes] == ["east"]
    Node.objects.filter(pk=node.pk).update(pool="west")
    assert [n.pool for n in cache.load(now=now).nodes] == ["west"]
    assert cache.stats["delta"] == 1
