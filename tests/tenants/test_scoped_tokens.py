"""API tokens limited to named projects (``ApiToken.project_ids``), read or write, with an expiry; their last
use shown to their owner. A token scoped to project A does not see project B's leases (404) and cannot
request a lease in B."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.test import Client

from broker import services as broker
from broker.models import Lease
from tenants.access import Actor
from tenants.choices import Role
from tenants.models import ApiToken, AuditEvent
from tests.factories import api_client, make_project, make_quota, make_token

MIG = {"kind": "mig", "profile": "1g.10gb"}


@pytest.fixture
def two_projects(world):
    """acme's projects ``vision`` (A) and ``speech`` (B), a lease in each, and a write token of the member
    limited to A."""
    speech = make_project(world.acme, "speech")
    make_quota(speech, tenant_deserved=8000, tenant_limit=16000)
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease_a = broker.lease_request(actor=actor, project="vision", gpu=MIG)[0]
    lease_b = broker.lease_request(actor=actor, project="speech", gpu=MIG)[0]
    token, secret = make_token(world.acme, world.member, name="vision-ci", projects=["vision"])
    return speech, lease_a, lease_b, token, secret


def test_scoped_token_sees_only_its_projects_leases(world, two_projects):
    _speech, lease_a, lease_b, _token, secret = two_projects
    client = api_client(secret)
    listed = {lease["id"] for lease in client.get("/api/v1/leases").json()["results"]}
    assert lease_a.pk in listed and lease_b.pk not in listed
    assert client.get(f"/api/v1/leases/{lease_a.pk}").status_code == 200
    for method in ("get", "delete"):
        response = getattr(client, method)(f"/api/v1/leases/{lease_b.pk}")
        assert response.status_code == 404, method
    assert client.post(f"/api/v1/leases/{lease_b.pk}/renew", {"duration_seconds": 600},
                       format="json").status_code == 404
    assert Lease.objects.get(pk=lease_b.pk).state == lease_b.state  # nothing happened to B's lease
    projects = [project["slug"] for project in client.get("/api/v1/projects").json()["results"]]
    assert projects == ["vision"]
    assert client.get("/api/v1/projects/speech").status_code == 404


def test_scoped_token_cannot_request_a_lease_in_another_project(world, two_projects):
    *_rest, secret = two_projects
    before = Lease.objects.count()
    response = api_client(secret).post("/api/v1/leases", {"project": "speech", "gpu": MIG}, format="json")
    assert response.status_code == 404
    assert response.json()["field"] == "project"
    assert Lease.objects.count() == before
    made = api_client(secret).post("/api/v1/leases", {"project": "vision", "gpu": MIG}, format="json")
    assert made.status_code == 201, made.json()


def test_scoped_token_cannot_act_on_the_whole_tenant(world, two_projects):
    *_rest, secret = two_projects
    client = api_client(secret)
    refused = client.post("/api/v1/tokens", {"name": "wider", "scopes": ["read"]}, format="json")
    assert refused.status_code == 403
    assert "limited to named projects" in refused.json()["detail"]
    admin_token = make_token(world.acme, world.admin, projects=["vision"])[1]
    assert api_client(admin_token).post("/api/v1/projects", {"slug": "new", "name": "New"},
                                        format="json").status_code == 403
    assert api_client(admin_token).get("/api/v1/audit-events").status_code == 403


def test_scoped_read_token_cannot_write_even_in_its_project(world, two_projects):
    _speech, lease_a, *_rest = two_projects
    secret = make_token(world.acme, world.member, scopes=("read",), projects=["vision"])[1]
    assert api_client(secret).get(f"/api/v1/leases/{lease_a.pk}").status_code == 200
    assert api_client(secret).delete(f"/api/v1/leases/{lease_a.pk}").status_code == 403


def test_scoped_token_shows_its_projects_and_last_use(world, two_projects):
    _speech, _a, _b, token, secret = two_projects
    owner = world.client("member")
    shown = owner.get(f"/api/v1/tokens/{token.pk}").json()
    assert shown["projects"] == ["vision"] and shown["last_used_at"] is None
    assert api_client(secret).get("/api/v1/leases").status_code == 200
    shown = owner.get(f"/api/v1/tokens/{token.pk}").json()
    assert shown["last_used_at"] is not None
    assert owner.get("/api/v1/tokens").json()["results"][0]["projects"] is not None
    created = AuditEvent.objects.get(action="token.create", target=token.prefix)
    assert created.data["projects"] == ["vision"]


@pytest.mark.parametrize("projects,field", [(["nope"], "projects"), (["secret"], "projects"), ([], "projects"),
                                            (["Bad Slug"], "projects")])
def test_scoped_token_create_refuses_unknown_projects(world, projects, field):
    before = ApiToken.objects.count()
    response = world.client("member").post("/api/v1/tokens", {"name": "t", "scopes": ["read"],
                                                              "projects": projects}, format="json")
    assert response.status_code == 400
    assert response.json()["field"].startswith(field)
    assert ApiToken.objects.count() == before  # globex's project "secret" is not acme's: refused too


def test_scoped_token_expiry(world):
    expires = datetime.now(UTC) + timedelta(days=1)
    response = world.client("member").post("/api/v1/tokens", {
        "name": "short", "scopes": ["read", "write"], "projects": ["vision"],
        "expires_at": expires.isoformat()}, format="json")
    assert response.status_code == 201
    secret = response.json()["token"]
    assert api_client(secret).get("/api/v1/leases").status_code == 200
    with time_machine.travel(expires + timedelta(seconds=1)):
        assert api_client(secret).get("/api/v1/leases").status_code == 401


def test_scoped_token_portal_form_and_list(world):
    client = Client()
    client.force_login(world.member)
    response = client.post("/settings/tokens", {"name": "vision only", "scopes": ["read"], "projects": ["vision"],
                                                "expires_in_days": "30"})
    assert response.status_code == 201
    token = ApiToken.objects.get(name="vision only")
    assert token.project_ids == [world.project.pk]
    page = client.get("/settings/tokens").content.decode()
    assert "vision only" in page and "<td>vision</td>" in page
