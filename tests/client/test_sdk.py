"""The Python SDK (gpubroker_client.Client): every method's route and HTTP method is an operation of the server's
OpenAPI document, and the SDK drives a real session against the live server: a tenant member's leases, quote and
usage; a staff member's tenant, quotas, projects and SLO contract; errors raised from problem+json."""

from __future__ import annotations

import re

import pytest
from drf_spectacular.generators import SchemaGenerator

from gpubroker_client import ApiError, Client, operations
from tenants.models import AuditEvent, Tenant
from tests.factories import make_member, make_token


def _shape(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path)


def test_sdk_every_method_is_an_operation_of_the_openapi_document(db):
    schema = SchemaGenerator().get_schema(request=None, public=True)
    documented = {(method.upper(), _shape(path)) for path, item in schema["paths"].items() for method in item
                  if method in ("get", "post", "put", "patch", "delete")}
    declared = operations()
    assert len(declared) >= 25
    missing = {name: route for name, route in declared.items() if (route[0], _shape(route[1])) not in documented}
    assert not missing, f"SDK methods whose route the OpenAPI document does not have: {missing}"
    # and the SDK's pages are the document's pages: every list it reads as a Page is paginated there
    for name in ("lease_list", "project_list", "staff_tenant_list", "staff_project_list", "staff_slo_contract_list"):
        method, path = declared[name]
        ok = schema["paths"][next(p for p in schema["paths"] if _shape(p) == _shape(path))][method.lower()]
        body = ok["responses"]["200"]["content"]["application/json"]["schema"]
        ref = body["$ref"].rsplit("/", 1)[-1]
        assert {"count", "next", "previous", "results"} <= set(schema["components"]["schemas"][ref]["properties"])


@pytest.mark.slow
def test_sdk_drives_the_live_server(live_server, world):
    member = Client(live_server.url, world.tokens["member"])
    lease = member.lease_request(project="vision", gpu={"kind": "mig", "profile": "1g.10gb"}, duration_seconds=600,
                                 idempotency_key="sdk-1")
    assert lease["state"] == "queued" and lease["project"] == "vision"
    again = member.lease_request(project="vision", gpu={"kind": "mig", "profile": "1g.10gb"}, duration_seconds=600,
                                 idempotency_key="sdk-1")
    assert again["id"] == lease["id"]  # the same key and body: the same lease
    for _ in range(3):
        member.lease_request(project="vision", gpu={"kind": "mig", "profile": "1g.10gb"})
    page = member.lease_list(limit=2)
    assert page.count == 4 and len(page.results) == 2 and page.next
    assert sorted(item["id"] for item in member.iterate(page)) == sorted(
        item["id"] for item in member.lease_list(limit=500).results)
    assert member.lease_list(state=["queued"], project="vision").count == 4
    assert member.lease_get(lease["id"])["events"][0]["to_state"] == "requested"
    quote = member.quote(project="vision", gpu={"kind": "mig", "profile": "1g.10gb"}, duration_seconds=3600)
    assert "fit" in quote or "price" in quote or quote  # the quote's body is billing's (docs/billing.md)
    assert member.usage(group_by="project")["group_by"] == "project"
    assert member.tenant()["slug"] == "acme" and member.project_list().results[0]["slug"] == "vision"

    with pytest.raises(ApiError) as error:
        member.lease_request(project="nlp", gpu={"kind": "mig", "profile": "1g.10gb"})
    assert (error.value.status, error.value.code, error.value.field) == (404, "not_found", "project")
    with pytest.raises(ApiError) as error:
        member.lease_request(project="vision", gpu={"kind": "mig", "profile": "9g.99gb"})
    assert error.value.status == 400 and error.value.field.startswith("gpu")
    with pytest.raises(ApiError) as error:  # the outsider: another tenant's lease is not found
        Client(live_server.url, world.tokens["outsider"]).lease_get(lease["id"])
    assert error.value.status == 404
    with pytest.raises(ApiError) as error:  # a tenant member is no platform staff
        member.staff_tenant_list()
    assert error.value.status == 403

    released = member.lease_release(lease["id"])
    assert released["state"] in ("released", "releasing")
    assert member.lease_release(lease["id"])["id"] == lease["id"]  # idempotent


@pytest.mark.slow
def test_sdk_staff_onboards_a_tenant_on_the_live_server(live_server, world):
    operator = make_member(world.globex, "ops", "owner")
    operator.is_staff = True
    operator.save(update_fields=["is_staff"])
    staff = Client(live_server.url, make_token(world.globex, operator)[1])
    tenant = staff.staff_tenant_create(slug="initech", name="Initech", billing_email="ap@initech.example")
    assert tenant["status"] == "active"
    staff.staff_tenant_quota_set("initech", "H100-80GB", deserved_gpu_milli=2000, limit_gpu_milli=4000)
    staff.staff_project_create("initech", project="nlp", name="NLP")
    quota = staff.staff_project_quota_set("initech", "nlp", "H100-80GB", deserved_gpu_milli=1000,
                                          limit_gpu_milli=2000)
    assert quota["limit_gpu_milli"] == 2000
    contract = staff.staff_slo_contract_create(
        "initech", name="gold", effective_from="2026-01-01T00:00:00Z", time_to_gpu_p95_seconds=300,
        availability_target_pct="99.5", preemption_notice_seconds=600,
        credit_steps=[{"metric": "availability", "threshold": "99", "credit_pct": "10"}])
    assert staff.staff_slo_contract_list("initech").results[0]["id"] == contract["id"]
    staff.staff_slo_contract_update("initech", contract["id"], name="gold-2", effective_from="2026-01-01T00:00:00Z",
                                    time_to_gpu_p95_seconds=200, availability_target_pct="99.9",
                                    preemption_notice_seconds=600, credit_steps=[])
    assert staff.staff_project_set_status("initech", "nlp", status="suspended")["status"] == "suspended"
    assert staff.staff_tenant_set_status("initech", status="suspended", reason="sdk")["status"] == "suspended"
    assert staff.staff_quotas("initech")["projects"][0]["project"] == "nlp"
    assert [t["slug"] for t in staff.iterate(staff.staff_tenant_list(limit=1))] == ["acme", "globex", "initech"]
    with pytest.raises(ApiError) as error:
        staff.staff_project_quota_set("initech", "nlp", "H100-80GB", deserved_gpu_milli=9000, limit_gpu_milli=9000)
    assert (error.value.status, error.value.field) == (409, "deserved_gpu_milli")
    assert Tenant.objects.get(slug="initech").status == "suspended"
    actions = set(AuditEvent.objects.filter(tenant__slug="initech", actor=operator).values_list("action", flat=True))
    assert {"tenant.create", "tenant_quota.set", "project.create", "quota.set", "slo_contract.create",
            "slo_contract.update", "project.suspended", "tenant.suspended"} <= actions


def test_cli_accepts_every_value_the_server_does():
    """The CLI's fixed choices (``--class``, ``--group-by``, ``--stream``) take every value the API documents."""
    from broker.choices import WorkloadClass
    from gpubroker_client.cli import build_parser

    parser = build_parser()
    for value in WorkloadClass.values:
        assert parser.parse_args(["quote", "--project", "p", "--gpu", "auto", "--class", value]).workload_class == value
    schema = SchemaGenerator().get_schema(request=None, public=True)
    usage = {p["name"]: p for p in schema["paths"]["/api/v1/usage"]["get"]["parameters"]}
    for value in usage["group_by"]["schema"]["enum"]:
        assert parser.parse_args(["usage", "--group-by", value]).group_by == value
    for value in ("stdout", "stderr"):
        assert parser.parse_args(["lease", "logs", "1", "--stream", value]).stream == value
