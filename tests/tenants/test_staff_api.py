"""The staff API for tenants (tenants/api/platform.py): platform staff create and change tenants, quotas, projects
and SLO contracts through the same services as the staff pages and the admin, audited in their name; bad input is
a problem+json naming the field and writes nothing; a suspended project takes no lease requests. Two tenants
(acme, globex); who may call each route is in test_routes.py."""

from __future__ import annotations

import pytest

from tenants.choices import TenantStatus
from tenants.models import AuditEvent, Project, Quota, SloContract, Tenant, TenantQuota
from tests.factories import api_client, make_user

CONTRACT = {
    "name": "gold", "effective_from": "2026-01-01T00:00:00Z", "effective_to": None,
    "time_to_gpu_p95_seconds": 300, "availability_target_pct": "99.5", "preemption_notice_seconds": 600,
    "max_credit_pct": "30",
    "credit_steps": [{"metric": "availability", "threshold": "99", "credit_pct": "10"},
                     {"metric": "time_to_gpu_p95", "threshold": "600", "credit_pct": "5"}],
}


@pytest.fixture
def staff(db):
    return make_user("root", is_staff=True)


@pytest.fixture
def client(staff):
    client = api_client()
    client.force_login(staff)
    return client


def _problem(response, status: int, field: str) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:400])
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["field"] == field, body
    return body


def _audited(staff, action: str, target: str) -> AuditEvent:
    event = AuditEvent.objects.filter(action=action, target=target).order_by("-pk").first()
    assert event is not None, f"no audit row {action} {target}"
    assert event.actor_id == staff.pk
    return event


def test_staff_api_tenant_lifecycle(client, staff, world):
    created = client.post("/api/v1/tenants", {"slug": "initech", "name": "Initech",
                                              "billing_email": "ap@initech.example", "currency": "EUR"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json() | {"created_at": None, "updated_at": None} == {
        "slug": "initech", "name": "Initech", "status": "active", "billing_email": "ap@initech.example",
        "currency": "EUR", "created_at": None, "updated_at": None, "project_count": 0, "member_count": 0,
        "cohort": None}
    _audited(staff, "tenant.create", "initech")

    listed = client.get("/api/v1/tenants?limit=2").json()
    assert listed["count"] == 3 and [t["slug"] for t in listed["results"]] == ["acme", "globex"]
    assert listed["next"].endswith("offset=2") and listed["results"][0]["project_count"] == 1

    renamed = client.patch("/api/v1/tenants/initech", {"name": "Initech Corp"}, format="json")
    assert renamed.status_code == 200 and renamed.json()["name"] == "Initech Corp"
    assert Tenant.objects.get(slug="initech").name == "Initech Corp"
    _audited(staff, "tenant.update", "initech")

    bound = client.put("/api/v1/tenants/initech/quotas/H100-80GB",
                       {"deserved_gpu_milli": 4000, "limit_gpu_milli": 8000}, format="json")
    assert bound.json() == {"tier": "H100-80GB", "deserved_gpu_milli": 4000, "limit_gpu_milli": 8000,
                            "lending_limit_gpu_milli": None, "borrowing_limit_gpu_milli": None}
    project = client.post("/api/v1/tenants/initech/projects", {"slug": "nlp", "name": "NLP"}, format="json")
    assert project.status_code == 201 and project.json()["status"] == "active"
    _audited(staff, "project.create", "nlp")
    quota = client.put("/api/v1/tenants/initech/projects/nlp/quotas/H100-80GB",
                       {"deserved_gpu_milli": 1000, "limit_gpu_milli": 2000, "over_quota_weight": 3}, format="json")
    assert quota.status_code == 200, quota.content
    assert quota.json() == {"project": "nlp", "tier": "H100-80GB", "deserved_gpu_milli": 1000,
                            "limit_gpu_milli": 2000, "over_quota_weight": 3}
    _audited(staff, "quota.set", "nlp/H100-80GB")
    quotas = client.get("/api/v1/tenants/initech/quotas").json()
    assert quotas["tenant"][0]["deserved_gpu_milli"] == 4000 and quotas["projects"][0]["over_quota_weight"] == 3
    assert client.get("/api/v1/tenants/initech/projects/nlp").json()["quotas"][0]["limit_gpu_milli"] == 2000

    contract = client.post("/api/v1/tenants/initech/slo-contracts", CONTRACT, format="json")
    assert contract.status_code == 201, contract.content
    body = contract.json()
    assert body["effective_from"] == "2026-01-01T00:00:00Z"  # ISO 8601, UTC
    assert {(s["metric"], s["credit_pct"]) for s in body["credit_steps"]} == {("availability", "10.00"),
                                                                             ("time_to_gpu_p95", "5.00")}
    changed = client.put(f"/api/v1/tenants/initech/slo-contracts/{body['id']}",
                         {**CONTRACT, "name": "silver", "credit_steps": []}, format="json")
    assert changed.status_code == 200 and changed.json()["name"] == "silver" and changed.json()["credit_steps"] == []
    _audited(staff, "slo_contract.update", "silver")
    assert client.get("/api/v1/tenants/initech/slo-contracts").json()["count"] == 1

    suspended = client.put("/api/v1/tenants/initech/status", {"status": "suspended", "reason": "unpaid"},
                           format="json")
    assert suspended.status_code == 200 and suspended.json()["status"] == "suspended"
    assert _audited(staff, "tenant.suspended", "initech").data == {"reason": "unpaid"}
    # a suspended tenant starts nothing: no new project, the same rule as the admin and the tenant's own API
    refused = client.post("/api/v1/tenants/initech/projects", {"slug": "later", "name": "Later"}, format="json")
    assert refused.status_code == 403 and refused.json()["code"] == "tenant_suspended"
    assert not Project.objects.filter(slug="later").exists()
    again = client.put("/api/v1/tenants/initech/status", {"status": "active"}, format="json")
    assert again.json()["status"] == TenantStatus.ACTIVE


def test_staff_api_bad_input_names_the_field_and_writes_nothing(client, world):
    audit_rows = AuditEvent.objects.count()
    _problem(client.post("/api/v1/tenants", {"slug": "Bad Slug", "name": "x", "billing_email": "a@b.example"},
                         format="json"), 400, "slug")
    _problem(client.post("/api/v1/tenants", {"slug": "acme", "name": "x", "billing_email": "a@b.example"},
                         format="json"), 409, "slug")
    _problem(client.post("/api/v1/tenants", {"slug": "ok", "name": "x", "billing_email": "nope"}, format="json"),
             400, "billing_email")
    _problem(client.post("/api/v1/tenants", {"slug": "ok", "name": "x", "billing_email": "a@b.example",
                                             "plan": "gold"}, format="json"), 400, "plan")
    assert not Tenant.objects.filter(slug="ok").exists()

    _problem(client.put("/api/v1/tenants/acme/quotas/Z80", {"deserved_gpu_milli": 1, "limit_gpu_milli": 1},
                        format="json"), 400, "tier")
    _problem(client.put("/api/v1/tenants/acme/quotas/H100-80GB", {"deserved_gpu_milli": 5, "limit_gpu_milli": 1},
                        format="json"), 400, "limit_gpu_milli")
    # vision holds 1000 deserved of acme's 4000: the tenant bound cannot go below what its projects hold
    _problem(client.put("/api/v1/tenants/acme/quotas/H100-80GB", {"deserved_gpu_milli": 500, "limit_gpu_milli": 8000},
                        format="json"), 409, "deserved_gpu_milli")
    _problem(client.put("/api/v1/tenants/acme/projects/vision/quotas/H100-80GB",
                        {"deserved_gpu_milli": 5000, "limit_gpu_milli": 5000}, format="json"),
             409, "deserved_gpu_milli")
    assert TenantQuota.objects.get(tenant=world.acme).deserved_gpu_milli == 4000
    assert Quota.objects.get(project=world.project).deserved_gpu_milli == 1000

    bad_step = {**CONTRACT, "credit_steps": [{"metric": "uptime", "threshold": "1", "credit_pct": "1"}]}
    _problem(client.post("/api/v1/tenants/acme/slo-contracts", bad_step, format="json"), 400,
             "credit_steps[0].metric")
    over = {**CONTRACT, "credit_steps": [{"metric": "availability", "threshold": "101", "credit_pct": "1"}]}
    _problem(client.post("/api/v1/tenants/acme/slo-contracts", over, format="json"), 400,
             "credit_steps[0].threshold")
    backwards = {**CONTRACT, "effective_to": "2025-01-01T00:00:00Z"}
    _problem(client.post("/api/v1/tenants/acme/slo-contracts", backwards, format="json"), 400, "effective_to")
    assert client.post("/api/v1/tenants/acme/slo-contracts", CONTRACT, format="json").status_code == 201
    _problem(client.post("/api/v1/tenants/acme/slo-contracts", {**CONTRACT, "name": "twice"}, format="json"), 409,
             "effective_from")
    assert SloContract.objects.filter(tenant=world.acme).count() == 1

    _problem(client.put("/api/v1/tenants/acme/status", {"status": "closed"}, format="json"), 400, "status")
    _problem(client.get("/api/v1/tenants/nobody"), 404, "tenant")
    _problem(client.get("/api/v1/tenants/acme/projects/secret"), 404, "project")  # globex's project
    assert Tenant.objects.get(slug="acme").status == "active"
    assert AuditEvent.objects.count() == audit_rows + 1  # the one contract


def test_staff_api_suspended_project_takes_no_requests(client, staff, world):
    member = world.client("member")
    lease = {"project": "vision", "gpu": {"kind": "mig", "profile": "1g.10gb"}}
    suspended = client.put("/api/v1/tenants/acme/projects/vision/status", {"status": "suspended", "reason": "audit"},
                           format="json")
    assert suspended.status_code == 200 and suspended.json()["status"] == "suspended"
    assert _audited(staff, "project.suspended", "vision").data == {"reason": "audit"}
    assert member.get("/api/v1/projects/vision").json()["status"] == "suspended"  # the tenant sees why
    refused = member.post("/api/v1/leases", lease, format="json")
    body = _problem(refused, 403, "project")
    assert "suspended" in body["detail"]
    assert not world.project.leases.exists()
    # the other tenant's project of another name is untouched, and reactivation lets requests in again
    assert world.client("outsider").post("/api/v1/leases", {**lease, "project": "secret"},
                                         format="json").status_code == 201
    client.put("/api/v1/tenants/acme/projects/vision/status", {"status": "active"}, format="json")
    assert member.post("/api/v1/leases", lease, format="json").status_code == 201


def test_staff_api_staff_token_reads_and_writes_a_read_token_only_reads(world):
    from tests.factories import make_member, make_token

    operator = make_member(world.globex, "ops", "owner")
    operator.is_staff = True
    operator.save(update_fields=["is_staff"])
    write = api_client(make_token(world.globex, operator)[1])
    read = api_client(make_token(world.globex, operator, scopes=("read",))[1])
    assert read.get("/api/v1/tenants/acme/projects").status_code == 200
    _problem(read.post("/api/v1/tenants/acme/projects", {"slug": "p9", "name": "P9"}, format="json"), 403, None)
    assert write.post("/api/v1/tenants/acme/projects", {"slug": "p9", "name": "P9"}, format="json").status_code == 201
    assert Project.objects.get(slug="p9").tenant == world.acme
