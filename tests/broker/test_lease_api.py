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
