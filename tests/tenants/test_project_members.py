"""Members and viewers limited to named projects (``Membership.project_ids``): set by an admin through the API,
the portal and (read-only) the admin, or by single sign-on's group → project mapping (tests/tenants/test_sso.py).
A limited member sees and leases in their projects only, in the portal and through every token of theirs (the
actor's projects are the token's and the member's in common); admins and owners always reach every project."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction
from django.test import Client

from broker import services as broker
from broker.models import Lease
from tenants.access import Actor
from tenants.choices import Role
from tenants.models import AuditEvent, Membership
from tests.factories import api_client, make_project, make_quota, make_token

MIG = {"kind": "mig", "profile": "1g.10gb"}


@pytest.fixture
def speech(world):
    """A second project of acme, with a lease in each of vision and speech."""
    speech = make_project(world.acme, "speech")
    make_quota(speech, tenant_deserved=8000, tenant_limit=16000)
    actor = Actor(user=world.owner, tenant=world.acme, role=Role.OWNER)
    lease_vision = broker.lease_request(actor=actor, project="vision", gpu=MIG)[0]
    lease_speech = broker.lease_request(actor=actor, project="speech", gpu=MIG)[0]
    return speech, lease_vision, lease_speech


def member_of(world, user) -> Membership:
    return Membership.objects.get(tenant=world.acme, user=user)


def limit(world, user, projects, token="admin"):
    return api_client(world.tokens[token]).patch(f"/api/v1/members/{member_of(world, user).pk}",
                                                 {"projects": projects}, format="json")


def test_an_admin_limits_a_member_and_every_token_of_theirs_follows(world, speech):
    _speech, lease_vision, lease_speech = speech
    answer = limit(world, world.member, ["vision"])
    assert answer.status_code == 200, answer.json()
    assert answer.json()["projects"] == ["vision"] and answer.json()["role"] == "member"
    event = AuditEvent.objects.get(tenant=world.acme, action="member.projects")
    assert event.data == {"old": None, "new": ["vision"]} and event.actor == world.admin

    client = api_client(world.tokens["member"])  # made before the limit, naming no project: the limit applies
    assert [p["slug"] for p in client.get("/api/v1/projects").json()["results"]] == ["vision"]
    listed = {lease["id"] for lease in client.get("/api/v1/leases").json()["results"]}
    assert lease_vision.pk in listed and lease_speech.pk not in listed
    assert client.get(f"/api/v1/leases/{lease_speech.pk}").status_code == 404
    assert client.delete(f"/api/v1/leases/{lease_speech.pk}").status_code == 404
    assert Lease.objects.get(pk=lease_speech.pk).state == lease_speech.state
    before = Lease.objects.count()
    refused = client.post("/api/v1/leases", {"project": "speech", "gpu": MIG}, format="json")
    assert refused.status_code == 404 and refused.json()["field"] == "project"
    assert Lease.objects.count() == before
    made = client.post("/api/v1/leases", {"project": "vision", "gpu": MIG}, format="json")
    assert made.status_code == 201, made.json()

    owner = Client()
    owner.force_login(world.owner)
    assert all(b"speech" in owner.get(page).content for page in ("/", "/leases/new"))
    portal = Client()
    portal.force_login(world.member)
    for page in ("/", "/leases/new"):  # the dashboard's project cards, the request form's project choices
        content = portal.get(page).content
        assert b"vision" in content and b"speech" not in content, page
    assert portal.get(f"/leases/{lease_speech.pk}").status_code == 404
    assert portal.get(f"/leases/{lease_vision.pk}").status_code == 200

    lifted = limit(world, world.member, None)
    assert lifted.status_code == 200 and lifted.json()["projects"] is None
    assert client.get(f"/api/v1/leases/{lease_speech.pk}").status_code == 200  # the next request sees it


def test_a_limited_members_own_tokens_stay_inside_their_projects(world, speech):
    limit(world, world.member, ["vision"])
    client = api_client(world.tokens["member"])
    wider = client.post("/api/v1/tokens", {"name": "ci", "scopes": ["read"], "projects": ["speech"]},
                        format="json")
    assert wider.status_code == 400 and wider.json()["field"] == "projects"
    assert "No project 'speech'" in wider.json()["detail"]  # another project is not found, as for any reader
    made = client.post("/api/v1/tokens", {"name": "ci", "scopes": ["read", "write"]}, format="json")
    assert made.status_code == 201, made.json()
    assert made.json()["projects"] is None  # follows the member's limit as it changes
    token = made.json()["token"]
    projects = api_client(token).get("/api/v1/projects").json()["results"]
    assert [p["slug"] for p in projects] == ["vision"]
    # a token made for another project before the limit reaches what both name: here nothing
    limit(world, world.member, None)
    older = make_token(world.acme, world.member, name="speech-ci", projects=["speech"])[1]
    limit(world, world.member, ["vision"])
    assert api_client(older).get("/api/v1/projects").json()["results"] == []
    assert api_client(older).get("/api/v1/projects/speech").status_code == 404


def test_an_empty_limit_reaches_no_project_yet(world, speech):
    assert limit(world, world.viewer, []).json()["projects"] == []
    client = api_client(world.tokens["viewer"])
    assert client.get("/api/v1/projects").json()["results"] == []
    assert client.get("/api/v1/leases").json()["results"] == []
    portal = Client()
    portal.force_login(world.viewer)
    assert portal.get("/").status_code == 200


def test_limits_are_refused_on_admins_and_owners_and_unknown_projects_writing_nothing(world, speech):
    cases = [
        ("admin", world.admin, {"projects": ["vision"]}, "projects", "only members and viewers"),
        ("owner", world.owner, {"projects": ["vision"]}, "projects", "only members and viewers"),
        ("admin", world.member, {"projects": ["nope"]}, "projects", "No project 'nope'"),
        ("admin", world.member, {"projects": "vision"}, "projects", ""),
        ("admin", world.member, {"role": "admin", "projects": ["vision"]}, "projects", "only members and viewers"),
        ("admin", world.outsider, {"projects": ["vision"]}, None, ""),  # another tenant's member: 404
    ]
    for token, user, body, field, text in cases:
        target = Membership.objects.get(user=user)
        answer = api_client(world.tokens[token]).patch(f"/api/v1/members/{target.pk}", body, format="json")
        if field is None:
            assert answer.status_code == 404
            continue
        assert answer.status_code == 400, (body, answer.json())
        assert answer.json()["field"] == field and text in answer.json()["detail"], answer.json()
        assert answer["Content-Type"].startswith("application/problem+json")
    assert member_of(world, world.member).role == Role.MEMBER  # the combined PATCH changed nothing
    assert not Membership.objects.filter(project_ids__isnull=False).exists()
    assert not AuditEvent.objects.filter(action__in=["member.projects", "member.role"]).exists()
    # members cannot limit anyone; a member's own limit is an admin's to set
    assert limit(world, world.viewer, ["vision"], token="member").status_code == 403


def test_promoting_a_limited_member_to_admin_lifts_the_limit(world, speech):
    limit(world, world.member, ["vision"])
    answer = api_client(world.tokens["owner"]).patch(f"/api/v1/members/{member_of(world, world.member).pk}",
                                                     {"role": "admin"}, format="json")
    assert answer.status_code == 200 and answer.json()["projects"] is None
    assert AuditEvent.objects.get(action="member.role").data["projects_cleared"] is True


def test_the_portal_members_page_limits_and_lifts(world, speech):
    portal = Client()
    portal.force_login(world.admin)
    pk = member_of(world, world.member).pk
    page = portal.get("/settings/members")
    assert page.status_code == 200 and b"Limit" in page.content
    saved = portal.post(f"/settings/members/{pk}/projects", {"scope": "listed", "projects": ["speech"]})
    assert saved.status_code == 302
    assert member_of(world, world.member).project_ids == [speech[0].pk]
    assert b"speech" in portal.get("/settings/members").content
    refused = portal.post(f"/settings/members/{member_of(world, world.owner).pk}/projects",
                          {"scope": "listed", "projects": ["vision"]})
    assert refused.status_code == 400 and b"only members and viewers" in refused.content
    assert portal.post(f"/settings/members/{pk}/projects", {"scope": "all"}).status_code == 302
    assert member_of(world, world.member).project_ids is None
    member = Client()
    member.force_login(world.member)
    assert member.post(f"/settings/members/{pk}/projects", {"scope": "listed"}).status_code == 403
    assert member_of(world, world.member).project_ids is None


def test_the_database_refuses_a_limit_on_an_admin(world):
    with pytest.raises(IntegrityError), transaction.atomic():
        Membership.objects.filter(user=world.admin).update(project_ids=[world.project.pk])


def test_a_limited_member_sees_only_their_projects_pipelines(world, speech):
    body = {"name": "r", "slo_ms": 200.0, "rate_rps": 5.0, "tiers": ["H100-80GB"],
            "stages": [{"name": "a", "architecture": "resnet-50"}], "edges": []}
    owner = api_client(world.tokens["owner"])
    made = {project: owner.post("/api/v1/pipelines", {**body, "project": project}, format="json")
            for project in ("vision", "speech")}
    assert all(answer.status_code == 201 for answer in made.values()), {p: a.json() for p, a in made.items()}
    limit(world, world.member, ["vision"])
    client = api_client(world.tokens["member"])
    listed = {p["id"] for p in client.get("/api/v1/pipelines").json()["results"]}
    assert listed == {made["vision"].json()["id"]}
    assert client.get(f"/api/v1/pipelines/{made['speech'].json()['id']}").status_code == 404
