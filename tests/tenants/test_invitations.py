"""Invitations (wave 19): an admin invites a user by username; the user joins only when they accept. Before, an
admin named any username of the platform and the user was a member at once: an admin could enrol another tenant's
user without their consent and read their e-mail in the member list, and "No user named …" told them which
usernames exist."""

from __future__ import annotations

import pytest
from django.test import Client

from tenants.models import AuditEvent, Invitation, Membership
from tests.factories import make_token, make_user, make_world


@pytest.fixture
def world(db):
    return make_world()


def portal(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_an_invitation_makes_no_member_until_the_user_accepts_and_says_nothing_of_other_users(world):
    world.outsider.email = "bob@globex.example"
    world.outsider.save()
    admin = world.client("admin")
    known = admin.post("/api/v1/tenant/invitations", {"username": "bob", "role": "viewer"}, format="json")
    unknown = admin.post("/api/v1/tenant/invitations", {"username": "nobody-here", "role": "viewer"}, format="json")
    assert known.status_code == unknown.status_code == 201
    strip = {"id", "username", "created_at"}
    assert {k: v for k, v in known.json().items() if k not in strip} == \
        {k: v for k, v in unknown.json().items() if k not in strip}  # the same answer: no oracle
    assert not Membership.objects.filter(tenant=world.acme, user=world.outsider).exists()
    emails = [m["email"] for m in world.client("viewer").get("/api/v1/members").json()["results"]]
    assert "bob@globex.example" not in emails
    pending = world.client("admin").get("/api/v1/tenant/invitations").json()["results"]
    assert {row["username"] for row in pending} == {"bob", "nobody-here"}
    # bob sees it with his own token (globex's) and accepts
    invitation = known.json()["id"]
    mine = world.client("outsider").get("/api/v1/invitations").json()["results"]
    assert [row["id"] for row in mine] == [invitation] and mine[0]["tenant"] == "acme"
    answer = world.client("outsider").post(f"/api/v1/invitations/{invitation}/accept")
    assert answer.status_code == 200 and answer.json()["state"] == "accepted"
    assert Membership.objects.get(tenant=world.acme, user=world.outsider).role == "viewer"
    assert AuditEvent.objects.filter(tenant=world.acme, action="member.add", target="bob").exists()
    assert AuditEvent.objects.filter(tenant=world.acme, action="member.invite", target="bob").exists()
    again = world.client("outsider").post(f"/api/v1/invitations/{invitation}/accept")
    assert again.status_code == 409 and again.json()["field"] == "id"  # his, no longer pending
    assert world.client("outsider").get("/api/v1/invitations").json()["results"] == []


def test_only_the_named_user_decides_and_an_admin_may_revoke(world):
    invitation = world.client("admin").post("/api/v1/tenant/invitations", {"username": "bob", "role": "member"},
                                            format="json").json()["id"]
    # nobody else accepts it (acme's own member), or sees it
    assert world.client("member").post(f"/api/v1/invitations/{invitation}/accept").status_code == 404
    assert world.client("viewer").get("/api/v1/invitations").json()["results"] == []
    # a member (not an admin) neither lists nor invites nor revokes
    assert world.client("member").get("/api/v1/tenant/invitations").status_code == 403
    assert world.client("member").post("/api/v1/tenant/invitations", {"username": "x", "role": "viewer"},
                                       format="json").status_code == 403
    assert world.client("member").delete(f"/api/v1/tenant/invitations/{invitation}").status_code == 403
    # globex's owner cannot see or revoke acme's invitations
    assert world.client("outsider").delete(f"/api/v1/tenant/invitations/{invitation}").status_code == 404
    assert world.client("admin").delete(f"/api/v1/tenant/invitations/{invitation}").status_code == 204
    assert Invitation.objects.get(pk=invitation).state == "revoked"
    assert world.client("admin").delete(f"/api/v1/tenant/invitations/{invitation}").status_code == 409
    assert world.client("outsider").post(f"/api/v1/invitations/{invitation}/accept").status_code == 409
    assert not Membership.objects.filter(tenant=world.acme, user=world.outsider).exists()


def test_invitation_input_is_checked_and_named(world):
    admin = world.client("admin")
    assert admin.post("/api/v1/tenant/invitations", {"username": "bob", "role": "owner"},
                      format="json").status_code == 403  # admins do not make owners
    bad = admin.post("/api/v1/tenant/invitations", {"username": "bob", "role": "boss"}, format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "role"
    blank = admin.post("/api/v1/tenant/invitations", {"username": "   ", "role": "viewer"}, format="json")
    assert blank.status_code == 400 and blank.json()["field"] == "username"
    member = admin.post("/api/v1/tenant/invitations", {"username": "max", "role": "viewer"}, format="json")
    assert member.status_code == 409 and member.json()["field"] == "username"  # already a member
    assert admin.post("/api/v1/tenant/invitations", {"username": "bob", "role": "viewer"},
                      format="json").status_code == 201
    twice = admin.post("/api/v1/tenant/invitations", {"username": "bob", "role": "member"}, format="json")
    assert twice.status_code == 409 and twice.json()["field"] == "username"


def test_a_read_only_token_cannot_accept(world):
    invitation = world.client("admin").post("/api/v1/tenant/invitations", {"username": "bob", "role": "viewer"},
                                            format="json").json()["id"]
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(world.globex, world.outsider, scopes=('read',))[1]}")
    assert client.post(f"/api/v1/invitations/{invitation}/accept").status_code == 403
    assert client.get("/api/v1/invitations").status_code == 200


def test_the_portal_invites_and_a_user_without_a_tenant_accepts(world):
    nora = make_user("nora")
    ann = portal(world.admin)
    response = ann.post("/settings/members/invite", {"username": "nora", "role": "member"})
    assert response.status_code == 302
    assert not Membership.objects.filter(tenant=world.acme, user=nora).exists()
    page = ann.get("/settings/members").content.decode()
    assert "Pending invitations" in page and "nora" in page
    ghost = ann.post("/settings/members/invite", {"username": "ghost", "role": "member"})
    assert ghost.status_code == 302  # the same as for a user who exists
    # nora has no tenant yet: the portal sends her to her invitations
    client = portal(nora)
    assert b"/invitations" in client.get("/").content
    listing = client.get("/invitations").content.decode()
    invitation = Invitation.objects.get(tenant=world.acme, username="nora")
    assert f'id="accept-invitation-{invitation.pk}"' in listing and world.acme.name in listing
    assert client.post(f"/invitations/{invitation.pk}/accept").status_code == 302
    assert Membership.objects.get(tenant=world.acme, user=nora).role == "member"
    assert client.get("/").status_code == 200  # now her tenant's dashboard
    # a revoked invitation is gone from the admin's list; a declined one makes no member
    ghost_invitation = Invitation.objects.get(tenant=world.acme, username="ghost")
    assert ann.post(f"/settings/members/invitations/{ghost_invitation.pk}/revoke").status_code == 302
    assert Invitation.objects.get(pk=ghost_invitation.pk).state == "revoked"
    ann.post("/settings/members/invite", {"username": "bob", "role": "viewer"})
    bobs = Invitation.objects.get(tenant=world.acme, username="bob", state="pending")
    bob = portal(world.outsider)
    assert b"1 invitation to another tenant waits for you" in bob.get("/").content
    assert bob.post(f"/invitations/{bobs.pk}/decline").status_code == 302
    assert Invitation.objects.get(pk=bobs.pk).state == "declined"
    assert not Membership.objects.filter(tenant=world.acme, user=world.outsider).exists()
    assert portal(nora).post(f"/invitations/{bobs.pk}/accept").status_code == 404  # not hers
