"""Role rules: viewers read, members use, admins manage, owners own; read tokens never write."""

import pytest

from tenants import services
from tenants.choices import Role
from tenants.models import Membership, Project

NEW_PROJECT = {"slug": "new-one", "name": "New one"}


@pytest.mark.parametrize(
    ("who", "status"),
    [("owner", 201), ("admin", 201), ("member", 403), ("viewer", 403), ("owner_read", 403)],
)
def test_roles_project_create(world, who, status):
    response = world.client(who).post("/api/v1/projects", NEW_PROJECT, format="json")
    assert response.status_code == status, response.content
    if status == 403:
        assert response["Content-Type"] == "application/problem+json"
        assert not Project.objects.filter(slug="new-one").exists()


@pytest.mark.parametrize("who", ["owner", "admin", "member", "viewer", "owner_read"])
def test_roles_everyone_reads(world, who):
    client = world.client(who)
    for url in ["/api/v1/tenant", "/api/v1/projects", "/api/v1/projects/vision", "/api/v1/quotas",
                "/api/v1/members", "/api/v1/tokens", "/api/v1/slo-contracts"]:
        assert client.get(url).status_code == 200, url


def test_roles_viewer_cannot_write_anything(world):
    client = world.client("viewer")
    member_pk = Membership.objects.get(user=world.member).pk
    assert client.patch("/api/v1/projects/vision", {"name": "x"}, format="json").status_code == 403
    assert client.delete("/api/v1/projects/vision").status_code == 403
    assert client.patch(f"/api/v1/members/{member_pk}", {"role": "admin"}, format="json").status_code == 403
    assert client.patch("/api/v1/tenant", {"name": "x"}, format="json").status_code == 403
    assert client.post("/api/v1/tokens", {"name": "w", "scopes": ["write"]}, format="json").status_code == 403
    assert Project.objects.get(slug="vision").name == "Vision"


def test_roles_read_token_of_owner_cannot_write(world):
    response = world.client("owner_read").patch("/api/v1/tenant", {"name": "Renamed"}, format="json")
    assert response.status_code == 403 and "read scope" in response.json()["detail"]


def test_roles_only_owner_changes_tenant(world):
    assert world.client("admin").patch("/api/v1/tenant", {"name": "A"}, format="json").status_code == 403
    response = world.client("owner").patch("/api/v1/tenant", {"name": "Acme Labs"}, format="json")
    assert response.status_code == 200 and response.json()["name"] == "Acme Labs"


def test_roles_admin_cannot_grant_ownership_but_owner_can(world):
    pk = Membership.objects.get(user=world.member).pk
    assert world.client("admin").patch(f"/api/v1/members/{pk}", {"role": "owner"}, format="json").status_code == 403
    assert world.client("admin").patch(f"/api/v1/members/{pk}", {"role": "viewer"}, format="json").status_code == 200
    assert world.client("owner").patch(f"/api/v1/members/{pk}", {"role": "owner"}, format="json").status_code == 200


def test_roles_last_owner_cannot_leave_or_be_demoted(world):
    pk = Membership.objects.get(user=world.owner, tenant=world.acme).pk
    response = world.client("owner").patch(f"/api/v1/members/{pk}", {"role": "admin"}, format="json")
    assert response.status_code == 409 and response.json()["field"] == "role"
    assert world.client("owner").delete(f"/api/v1/members/{pk}").status_code == 409
    assert Membership.objects.get(pk=pk).role == Role.OWNER


def test_roles_removing_member_revokes_their_tokens(world):
    pk = Membership.objects.get(user=world.member).pk
    assert world.client("admin").delete(f"/api/v1/members/{pk}").status_code == 204
    assert world.client("member").get("/api/v1/tenant").status_code == 401


def test_roles_members_see_only_their_own_tokens_admins_all(world):
    member_tokens = world.client("member").get("/api/v1/tokens").json()["results"]
    assert {t["username"] for t in member_tokens} == {"max"}
    admin_tokens = world.client("admin").get("/api/v1/tokens").json()["results"]
    assert {t["username"] for t in admin_tokens} == {"alice", "ann", "max", "vic"}


def test_roles_member_cannot_revoke_others_token(world):
    owner_token = next(t for t in world.client("owner").get("/api/v1/tokens").json()["results"]
                       if t["username"] == "alice")
    assert world.client("member").delete(f"/api/v1/tokens/{owner_token['id']}").status_code == 404
    assert world.client("admin").delete(f"/api/v1/tokens/{owner_token['id']}").status_code == 200


def test_roles_suspended_tenant_reads_but_cannot_write(world):
    services.tenant_set_status(tenant=world.acme, status="suspended")
    client = world.client("owner")
    assert client.get("/api/v1/projects").status_code == 200
    response = client.post("/api/v1/projects", NEW_PROJECT, format="json")
    assert response.status_code == 403 and response.json()["code"] == "tenant_suspended"


def test_roles_no_membership_is_403(db, client):
    from tests.factories import make_user

    make_user("loner")
    client.login(username="loner", password="pw-loner")
    response = client.get("/api/v1/projects")
    assert response.status_code == 403 and "not a member" in response.json()["detail"]


def test_roles_anonymous_is_401(db, client):
    response = client.get("/api/v1/projects")
    assert response.status_code in (401, 403)
    assert response["Content-Type"] == "application/problem+json"
