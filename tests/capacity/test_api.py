"""The capacity loop's REST API: tenants see their own advice and the changes that touched their leases
(another tenant's is 404), decide only what the service lets them; platform staff see everything, edit the
policies, read the fleet and run the planner. Errors are problem+json naming the field."""

from __future__ import annotations

import re
import uuid

import pytest
from rest_framework.test import APIClient

from broker import services as broker
from broker.models import Allocation, Gpu, Node
from capacity.models import Adjustment, CapacityPolicy
from tenants.access import Actor
from tenants.choices import Role
from tenants.models import AuditEvent, Membership, Quota
from tests.factories import make_token, make_user, make_world

PROBLEM = "application/problem+json"


@pytest.fixture
def world(db):
    return make_world()


def a_lease(world, tenant="acme"):
    user, owner, project = (world.member, world.acme, "vision") if tenant == "acme" else \
        (world.outsider, world.globex, "secret")
    role = Membership.objects.get(user=user, tenant=owner).role
    return broker.lease_request(actor=Actor(user=user, tenant=owner, role=Role(role)), project=project,
                                 gpu={"kind": "mig", "profile": "1g.10gb"})[0]


def adjustment(kind: str = "right_size", *, tenant=None, lease=None, project=None, tenant_ids=None,
               **fields) -> Adjustment:
    """A row as the planner records it (``capacity.services.adjustments_record``): whom it concerns, its gain."""
    target = fields.pop("target", f"lease:{lease.pk}" if lease else f"pool:H100-80GB/{uuid.uuid4().hex[:6]}")
    if tenant_ids is None:
        tenant_ids = [tenant.pk] if tenant else []
    values = {"mode": "advise", "reason": f"{kind} because", "gain_gpu_seconds": 5400, "gain_money_minor": 1250,
              "currency": "USD", "gain_time_to_gpu_seconds": 30, **fields}
    return Adjustment.objects.create(kind=kind, target=target, fingerprint=uuid.uuid4().hex, tenant=tenant,
                                     lease=lease, project=project or (lease.project if lease else None),
                                     tenant_ids=tenant_ids, **values)


@pytest.fixture
def rows(world):
    """acme's advice, globex's advice, a pool change that would preempt an acme lease, one touching nobody."""
    acme_lease, globex_lease = a_lease(world), a_lease(world, "globex")
    return {
        "acme": adjustment(tenant=world.acme, lease=acme_lease),
        "globex": adjustment(tenant=world.globex, lease=globex_lease),
        "touching": adjustment("mode_switch", tenant_ids=[world.acme.pk], risk=[acme_lease.pk],
                               change={"gpu": "g1", "from_mode": "whole", "to_mode": "mig", "drain": True}),
        "nobody": adjustment("warm_pool", change={"model": "H100-80GB", "profile": "1g.10gb", "slots": [],
                                                  "remove": []}),
    }


def staff_client(username: str = "root") -> APIClient:
    client = APIClient()
    client.force_login(make_user(username, is_staff=True))
    return client


def staff_token(world, scopes=("read", "write")) -> APIClient:
    """A staff user who is also an admin of acme, acting with one of their own tokens."""
    user = make_user(f"ops-{uuid.uuid4().hex[:8]}", is_staff=True)
    Membership.objects.create(user=user, tenant=world.acme, role=Role.ADMIN)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(world.acme, user, scopes=scopes)[1]}")
    return client


def ids(response) -> set[int]:
    assert response.status_code == 200, response.content
    return {row["id"] for row in response.json()["results"]}


def problem(response, status: int, field: str | None = None) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:400])
    assert response["Content-Type"] == PROBLEM
    body = response.json()
    if field is not None:
        assert body["field"] == field, body
    return body


# -- reading ---------------------------------------------------------------------------------------------------
def test_api_adjustments_a_tenant_sees_its_advice_and_changes_touching_its_leases_only(world, rows):
    assert ids(world.client("viewer").get("/api/v1/adjustments")) == {rows["acme"].pk, rows["touching"].pk}
    assert ids(world.client("outsider").get("/api/v1/adjustments")) == {rows["globex"].pk}
    for name in ("globex", "nobody"):  # not another tenant's, not a change that touched none of acme's leases
        problem(world.client("owner").get(f"/api/v1/adjustments/{rows[name].pk}"), 404, "id")
        problem(world.client("admin").post(f"/api/v1/adjustments/{rows[name].pk}/accept"), 404, "id")
        problem(world.client("admin").post(f"/api/v1/adjustments/{rows[name].pk}/reject", {}, format="json"), 404)
    assert world.client("owner").get(f"/api/v1/adjustments/{rows['touching'].pk}").json()["kind"] == "mode_switch"


def test_api_a_drain_touching_two_tenants_names_to_each_only_its_own_leases(world):
    """One GPU held by an over-quota lease of each tenant: both see the drain, each its own lease by id and the
    other's only counted (in ``risk``, the reason and the outcome); staff see both ids."""
    acme_lease, globex_lease = a_lease(world), a_lease(world, "globex")
    both = sorted([acme_lease.pk, globex_lease.pk])
    listed = ", ".join(map(str, both))
    row = adjustment("mode_switch", tenant_ids=[world.acme.pk, world.globex.pk], risk=both, state="applying",
                     reason=f"for an in-quota lease: drain over-quota lease(s) {listed}, then switch",
                     outcome=f"draining lease(s) {listed}; the switch follows once they have left",
                     change={"gpu": "g1", "from_mode": "whole", "to_mode": "mig", "drain": True})
    for client, own, other in ((world.client("viewer"), acme_lease.pk, globex_lease.pk),
                               (world.client("outsider"), globex_lease.pk, acme_lease.pk)):
        body = client.get(f"/api/v1/adjustments/{row.pk}").json()
        assert body["risk"] == [own]
        assert body["reason"] == f"for an in-quota lease: drain over-quota lease(s) {own} and 1 of another tenant, " \
                                 "then switch"
        assert body["outcome"] == f"draining lease(s) {own} and 1 of another tenant; the switch follows once they " \
                                  "have left"
        listed_row = next(r for r in client.get("/api/v1/adjustments").json()["results"] if r["id"] == row.pk)
        assert listed_row == body
        assert other not in body["risk"]
        assert re.findall(r"\d+", body["reason"] + body["outcome"]) == [str(own), "1", str(own), "1"]
    staff = staff_client().get(f"/api/v1/adjustments/{row.pk}").json()
    assert staff["risk"] == both and listed in staff["reason"] and listed in staff["outcome"]


def test_api_adjustments_staff_see_every_tenants_by_session_and_by_token(world, rows):
    every = {row.pk for row in rows.values()}
    assert ids(staff_client().get("/api/v1/adjustments")) == every  # staff outside any tenant
    assert ids(staff_token(world).get("/api/v1/adjustments")) == every
    assert staff_client("root2").get(f"/api/v1/adjustments/{rows['globex'].pk}").status_code == 200


def test_api_adjustments_filter_by_kind_state_and_open_and_name_a_bad_filter(world, rows):
    client = world.client("owner")
    Adjustment.objects.filter(pk=rows["touching"].pk).update(state="applied")
    assert ids(client.get("/api/v1/adjustments?kind=mode_switch")) == {rows["touching"].pk}
    assert ids(client.get("/api/v1/adjustments?state=proposed")) == {rows["acme"].pk}
    assert ids(client.get("/api/v1/adjustments?open=true")) == {rows["acme"].pk}
    assert ids(client.get("/api/v1/adjustments?open=false")) == {rows["acme"].pk, rows["touching"].pk}
    problem(client.get("/api/v1/adjustments?kind=shrink"), 400, "kind")
    problem(client.get("/api/v1/adjustments?state="), 400, "state")
    problem(client.get("/api/v1/adjustments?open=yes"), 400, "open")


def test_api_adjustment_shows_the_gain_in_gpu_hours_and_money(world, rows):
    body = world.client("viewer").get(f"/api/v1/adjustments/{rows['acme'].pk}").json()
    assert body["expected_gain"] == {"gpu_hours": "1.50", "money": {"minor": 1250, "currency": "USD",
                                                                    "formatted": "12.50 USD"},
                                     "priced_with": "", "time_to_gpu_seconds": 30}
    Adjustment.objects.filter(pk=rows["acme"].pk).update(priced_with="acme contract")
    body = world.client("viewer").get(f"/api/v1/adjustments/{rows['acme'].pk}").json()
    assert body["expected_gain"]["priced_with"] == "acme contract"  # the book that priced the saving, a field
    assert body["lease"] == rows["acme"].lease_id and body["project"] == "vision"
    assert body["state"] == "proposed" and body["decided_at"] is None and body["effect"] is None
    assert set(body) == {"id", "kind", "target", "state", "mode", "reason", "change", "evidence", "expected_gain",
                         "risk", "lease", "project", "proposed_at", "decided_at", "applied_by", "finished_at",
                         "outcome", "effect"}


# -- deciding ----------------------------------------------------------------------------------------------------
def test_api_accept_right_sizing_needs_an_admin_and_happens_once(world, rows):
    url = f"/api/v1/adjustments/{rows['acme'].pk}/accept"
    assert problem(world.client("viewer").post(url), 403)["detail"] == "This API token has read scope only."
    assert problem(world.client("owner_read").post(url), 403)["detail"] == "This API token has read scope only."
    problem(world.client("member").post(url), 403)  # right-sizing is decided by the tenant's admins
    response = world.client("admin").post(url)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["state"] == "applied" and body["applied_by"] == "user:ann" and body["decided_at"]
    assert "accepted" in body["outcome"]
    assert AuditEvent.objects.filter(action="adjustment.accept", target=f"adjustment:{rows['acme'].pk}").exists()
    problem(world.client("admin").post(url), 409, "state")  # already decided
    problem(world.client("admin").post(f"/api/v1/adjustments/{rows['acme'].pk}/reject", {}, format="json"), 409,
            "state")


def test_api_pool_changes_and_quota_advice_are_decided_by_staff_only(world, rows):
    touching = f"/api/v1/adjustments/{rows['touching'].pk}/accept"
    problem(world.client("owner").post(touching), 403, "id")  # it touched acme's lease: acme sees, cannot decide
    assert Adjustment.objects.get(pk=rows["touching"].pk).state == "proposed"
    warm = rows["nobody"]
    response = staff_client().post(f"/api/v1/adjustments/{warm.pk}/accept")
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "applied" and response.json()["applied_by"] == "user:root"
    advice = quota_advice(world)
    problem(world.client("owner").post(f"/api/v1/adjustments/{advice.pk}/accept"), 403)
    assert Adjustment.objects.get(pk=advice.pk).state == "proposed"


def quota_advice(world) -> Adjustment:
    return adjustment("quota_advice", tenant=world.acme, project=world.project,
                      target=f"project:{world.project.pk}/H100-80GB",
                      change={"model": "H100-80GB", "size_before": 1000, "size_after": 1500})


def test_api_staff_accepting_quota_advice_sets_the_quota(world):
    advice = quota_advice(world)
    response = staff_token(world).post(f"/api/v1/adjustments/{advice.pk}/accept")
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "applied" and "1500 milli" in response.json()["outcome"]
    assert Quota.objects.get(project=world.project, tier="H100-80GB").deserved_gpu_milli == 1500


def test_api_quota_advice_beyond_the_tenants_bound_fails_by_field_and_changes_nothing(world):
    advice = adjustment("quota_advice", tenant=world.acme, project=world.project,
                        target=f"project:{world.project.pk}/H100-80GB",
                        change={"model": "H100-80GB", "size_before": 1000, "size_after": 50_000})
    response = staff_token(world).post(f"/api/v1/adjustments/{advice.pk}/accept")
    assert 400 <= response.status_code < 500 and response.json().get("field"), response.content
    advice.refresh_from_db()
    assert advice.state == "failed" and "not changed" in advice.outcome
    assert Quota.objects.get(project=world.project, tier="H100-80GB").deserved_gpu_milli == 1000


def test_api_reject_keeps_the_reason_and_refuses_a_long_one(world, rows):
    url = f"/api/v1/adjustments/{rows['acme'].pk}/reject"
    problem(world.client("viewer").post(url, {"reason": "no"}, format="json"), 403)
    problem(world.client("admin").post(url, {"reason": "x" * 2001}, format="json"), 400, "reason")
    problem(world.client("admin").post(url, {"why": "no"}, format="json"), 400, "why")
    response = world.client("admin").post(url, {"reason": "we need the memory"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "rejected"
    assert response.json()["outcome"] == "rejected by ann: we need the memory"
    problem(world.client("admin").post(url, {}, format="json"), 409, "state")


# -- staff: policies ----------------------------------------------------------------------------------------------
def test_api_policies_crud_as_staff(world):
    client = staff_client()
    created = client.post("/api/v1/capacity/policies", {"scope": "pool:H100-80GB", "modes": {"warm_pool": "auto"},
                                                        "warm_min_arrivals": 3}, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["scope"] == "pool:H100-80GB" and body["warm_min_arrivals"] == 3
    assert body["modes"] == {"mode_switch": None, "mig_layout": None, "warm_pool": "auto", "idle_reclaim": None,
                             "right_size": None, "quota_advice": None}
    again = client.post("/api/v1/capacity/policies", {"scope": "pool:H100-80GB", "modes": {"mig_layout": "off"}},
                        format="json")
    assert again.status_code == 200 and again.json()["id"] == body["id"]
    assert again.json()["modes"]["warm_pool"] == "auto" and again.json()["modes"]["mig_layout"] == "off"
    url = f"/api/v1/capacity/policies/{body['id']}"
    changed = client.patch(url, {"modes": {"warm_pool": None}, "idle_rules": {"training": {"notice_seconds": 60}},
                                 "warm_min_arrivals": None}, format="json")
    assert changed.status_code == 200, changed.content
    assert changed.json()["modes"]["warm_pool"] is None and changed.json()["warm_min_arrivals"] is None
    assert changed.json()["idle_rules"] == {"training": {"notice_seconds": 60}}
    assert client.get(url).json() == changed.json()
    assert [p["scope"] for p in client.get("/api/v1/capacity/policies").json()["results"]] == ["pool:H100-80GB"]
    assert client.delete(url).status_code == 204
    problem(client.get(url), 404, "id")
    assert AuditEvent.objects.filter(action="capacity_policy.delete").count() == 1
    default = client.post("/api/v1/capacity/policies", {"scope": ""}, format="json").json()
    problem(client.delete(f"/api/v1/capacity/policies/{default['id']}"), 400, "scope")  # the default stays


@pytest.mark.parametrize(("body", "field"), [
    ({"scope": "pool:NOPE"}, "scope"),
    ({"scope": "project:999999"}, "scope"),
    ({"scope": "", "modes": {"warm_pool": "sometimes"}}, "modes.warm_pool"),
    ({"scope": "", "modes": {"colour": "auto"}}, "modes.colour"),
    ({"scope": "", "warm_min_arrivals": -1}, "warm_min_arrivals"),
    ({"scope": "", "mode_hold_seconds": "long"}, "mode_hold_seconds"),
    ({"scope": "", "idle_rules": {"gaming": {}}}, "idle_rules.gaming"),
    ({"scope": "", "idle_rules": {"training": {"enabled": "yes"}}}, "idle_rules.training.enabled"),
    ({"scope": "", "colour": "red"}, "colour"),
    ({"modes": {}}, "scope"),
])
def test_api_policies_bad_input_is_a_problem_naming_the_field(world, body, field):
    problem(staff_client().post("/api/v1/capacity/policies", body, format="json"), 400, field)
    assert not CapacityPolicy.objects.exists()


def test_api_capacity_endpoints_refuse_non_staff_and_read_only_tokens(world):
    policy = CapacityPolicy.objects.create(scope="")
    for path in ("/api/v1/capacity/policies", f"/api/v1/capacity/policies/{policy.pk}", "/api/v1/capacity/fleet"):
        for who in ("owner", "admin", "viewer", "outsider"):
            body = problem(world.client(who).get(path), 403)
            assert body["detail"] == "This endpoint is for platform staff.", (who, path)
        assert staff_token(world, scopes=("read",)).get(path).status_code == 200
    for method, path in (("post", "/api/v1/capacity/policies"), ("patch", f"/api/v1/capacity/policies/{policy.pk}"),
                         ("delete", f"/api/v1/capacity/policies/{policy.pk}"), ("post", "/api/v1/capacity/run")):
        problem(getattr(world.client("owner"), method)(path, {"scope": ""}, format="json"), 403)
        body = problem(getattr(staff_token(world, scopes=("read",)), method)(path, {"scope": ""}, format="json"), 403)
        assert body["detail"] == "This API token has read scope only."
        assert APIClient().get(path).status_code == 401
    assert CapacityPolicy.objects.get().pk == policy.pk


# -- staff: the fleet and a planner run ----------------------------------------------------------------------------
def test_api_fleet_shows_pools_warm_instances_and_recent_adjustments(world, rows):
    node = Node.objects.create(node_id="node-w", address="http://127.0.0.1:1", secret="s", status="ready")
    gpu = Gpu.objects.create(node=node, uuid="GPU-w", index=0, model="H100-80GB", mode="mig", memory_mib=81559)
    Gpu.objects.create(node=node, uuid="GPU-x", index=1, model="H100-80GB", mode="whole", memory_mib=81559,
                       mode_target="mig")
    from django.db.backends.postgresql.psycopg_any import NumericRange
    from django.utils import timezone

    warm = Allocation.objects.create(lease=None, gpu=gpu, tier="H100-80GB", kind="mig", mig_profile="1g.10gb",
                                     mig_start=0, slots=NumericRange(0, 1), milli=142, memory_mib=9856,
                                     state="warm", warm_at=timezone.now())
    body = staff_client().get("/api/v1/capacity/fleet").json()
    assert body["pools"] == [{"model": "H100-80GB", "gpus": 2, "modes": {"mig": 1, "whole": 1}, "changing": 1,
                              "warm": [{"profile": "1g.10gb", "ready": 1, "creating": 0}]}]
    assert [(w["id"], w["node"], w["profile"], w["state"]) for w in body["warm_instances"]] == \
        [(warm.pk, "node-w", "1g.10gb", "warm")]
    assert {row["id"] for row in body["recent"]} == {row.pk for row in rows.values()}
    assert body["warm_holding"]["pools"][0]["members"] == 1 and body["warm_holding"]["currency"] == "USD"


def test_api_run_plans_now_and_returns_its_counts(world, settings):
    settings.PROMETHEUS_URL = "http://127.0.0.1:9"  # nothing answers: the run says so instead of failing
    response = staff_client().post("/api/v1/capacity/run")
    assert response.status_code == 200, response.content
    body = response.json()
    assert {"proposed", "new", "expired", "applied", "failed", "drained", "measured"} <= set(body)
    assert body["proposed"] == 0 and body["new"] == 0
