"""Lease API rules that need no worker: tenant isolation, roles, filters, state conflicts, the schema."""

import pytest

from broker import services
from broker.choices import LeaseState
from broker.models import Lease, LeaseEvent
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_world


@pytest.fixture
def world(db):
    return make_world()


def _lease(world, **gpu):
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease, _ = services.lease_request(actor=actor, project="vision", gpu=gpu or {"kind": "whole"})
    return lease


@pytest.mark.parametrize(("method", "path"), [("get", ""), ("delete", ""), ("post", "/renew")])
def test_lease_api_other_tenant_gets_404_and_nothing_changes(world, method, path):
    lease = _lease(world)
    response = getattr(world.client("outsider"), method)(f"/api/v1/leases/{lease.pk}{path}",
                                                         {"duration_seconds": 600}, format="json")
    assert response.status_code == 404
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.QUEUED
    assert world.client("outsider").get("/api/v1/leases").json()["count"] == 0


def test_lease_api_list_filters_and_validates_state(world):
    _lease(world)
    released = _lease(world, kind="mig", profile="1g.10gb")
    services.lease_release(lease=released, actor="test")
    client = world.client("viewer")
    assert client.get("/api/v1/leases").json()["count"] == 2
    assert [x["id"] for x in client.get("/api/v1/leases?state=released").json()["results"]] == [released.pk]
    bad = client.get("/api/v1/leases?state=sleeping")
    assert bad.status_code == 400 and bad.json()["field"] == "state"


def test_lease_api_release_of_a_queued_lease_is_immediate_and_idempotent(world):
    lease = _lease(world)
    client = world.client("member")
    first = client.delete(f"/api/v1/leases/{lease.pk}")
    second = client.delete(f"/api/v1/leases/{lease.pk}")
    assert (first.status_code, second.status_code) == (202, 202)
    assert first.json()["state"] == second.json()["state"] == "released"
    assert list(LeaseEvent.objects.filter(lease=lease).values_list("to_state", flat=True)) == [
        "requested", "queued", "released"]


def test_lease_api_renew_needs_an_active_lease(world):
    lease = _lease(world)
    response = world.client("member").post(f"/api/v1/leases/{lease.pk}/renew", {"duration_seconds": 600},
                                           format="json")
    assert response.status_code == 409 and response.json()["field"] == "state"


def test_lease_events_are_append_only(world):
    from django.db import IntegrityError, transaction

    lease = _lease(world)
    with pytest.raises(IntegrityError), transaction.atomic():
        LeaseEvent.objects.filter(lease=lease).update(reason="rewritten")


def test_lease_api_is_in_the_openapi_schema(world):
    schema = world.client("member").get("/api/schema/?format=json").json()
    assert {"/api/v1/leases", "/api/v1/leases/{id}", "/api/v1/leases/{id}/renew"} <= set(schema["paths"])


def test_lease_api_openapi_document_validates_without_warnings(db, tmp_path):
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))
    assert "/api/v1/leases" in (tmp_path / "schema.yaml").read_text()


@pytest.mark.parametrize(("body", "status", "field"), [
    ({"project": "vision", "gpu": {"kind": "share", "milli": 0, "memory_mib": 1024}}, 400, "gpu.milli"),
    ({"project": "vision", "gpu": {"kind": "share", "milli": 1000, "memory_mib": 1024}}, 400, "gpu.milli"),
    ({"project": "vision", "gpu": {"kind": "share", "milli": 250}}, 400, "gpu.memory_mib"),
    ({"project": "vision", "gpu": {"kind": "whole", "gang": "yes"}}, 400, "gpu.gang"),
    ({"project": "vision", "gpu": {"kind": "whole", "colour": "red"}}, 400, "gpu.colour"),
    ({"project": "vision", "gpu": {"kind": "whole", "profile": "1g.10gb"}}, 400, "gpu.profile"),
    ({"project": "vision", "gpu": {"kind": "mig"}}, 400, "gpu.profile"),
    ({"project": "vision", "gpu": "a100"}, 400, "gpu"),
    ({"project": "vision", "gpu": {"kind": "whole", "count": 65}}, 400, "gpu.count"),
    ({"project": "vision", "gpu": {"kind": "whole"}, "priority": 1000}, 400, "priority"),
    ({"project": "vision", "gpu": {"kind": "whole"}, "workload_class": "mining"}, 400, "workload_class"),
    ({"project": "vision", "gpu": {"kind": "whole"}, "duration_seconds": 10**9}, 400, "duration_seconds"),
    ({"project": "vision", "gpu": {"kind": "whole"}, "extra": 1}, 400, "extra"),
    ({"project": "nowhere", "gpu": {"kind": "whole"}}, 404, "project"),
    ({"project": "vision", "gpu": {"kind": "whole", "model": "L4"}}, 409, "gpu"),  # no L4 quota
])
def test_lease_api_every_bad_request_names_its_field_and_writes_nothing(world, body, status, field):
    response = world.client("member").post("/api/v1/leases", body, format="json")
    assert response.status_code == status, response.json()
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["field"] == field
    assert not Lease.objects.exists()


def test_lease_api_suspended_tenant_cannot_request(world):
    from tenants import services as tenant_services

    tenant_services.tenant_set_status(tenant=world.acme, status="suspended")
    response = world.client("member").post("/api/v1/leases", {"project": "vision", "gpu": {"kind": "whole"}},
                                           format="json")
    assert response.status_code == 403 and not Lease.objects.exists()


def test_lease_api_body_must_be_an_object(world):
    response = world.client("member").post("/api/v1/leases", ["whole"], format="json")
    assert response.status_code == 400 and response.json()["field"] == "body"
