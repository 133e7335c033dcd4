"""Tenant isolation: with two tenants, no API route shows or changes the other tenant's objects.

The route table below must name every route of the tenant API; a new route without an isolation case
fails ``test_isolation_every_route_is_covered``.
"""

import pytest
from django.urls import URLPattern

from tenants.api.urls import urlpatterns
from tenants.models import ApiToken, Invitation, Membership, Project, SshKey, TenantExport


def _other_ids(world):
    return {
        "slug": world.other_project.slug,
        "member": Membership.objects.get(user=world.outsider).pk,
        "token": ApiToken.objects.filter(user=world.outsider).first().pk,
        "export": TenantExport.objects.get_or_create(tenant=world.globex, requested_by=world.outsider)[0].pk,
        "ssh_key": _outsider_ssh_key(world),
        # globex's invitation of a name nobody has: not acme's to revoke, nobody's of acme to accept
        "invitation": Invitation.objects.get_or_create(tenant=world.globex, username="zed", role="viewer")[0].pk,
    }


def _outsider_ssh_key(world) -> int:
    import asyncssh

    found = SshKey.objects.filter(user=world.outsider).first()
    if found is None:
        key = asyncssh.generate_private_key("ssh-ed25519")
        found = SshKey.objects.create(user=world.outsider, name="bob's laptop", fingerprint=key.get_fingerprint(
            "sha256"), public_key=key.export_public_key().decode().strip())
    return found.pk


# (route name, method, path template, body) — the path names an object of the *other* tenant.
CASES = [
    ("api-project", "get", "/api/v1/projects/{slug}", None),
    ("api-project", "patch", "/api/v1/projects/{slug}", {"name": "pwned"}),
    ("api-project", "delete", "/api/v1/projects/{slug}", None),
    ("api-member", "get", "/api/v1/members/{member}", None),
    ("api-member", "patch", "/api/v1/members/{member}", {"role": "viewer"}),
    ("api-member", "delete", "/api/v1/members/{member}", None),
    ("api-token", "get", "/api/v1/tokens/{token}", None),
    ("api-token", "delete", "/api/v1/tokens/{token}", None),
    ("api-quotas", "get", "/api/v1/quotas?project={slug}", None),
    ("api-ssh-key", "get", "/api/v1/ssh-keys/{ssh_key}", None),  # another user's key, of any tenant: not found
    ("api-ssh-key", "delete", "/api/v1/ssh-keys/{ssh_key}", None),
    ("api-tenant-invitation", "delete", "/api/v1/tenant/invitations/{invitation}", None),
    ("api-invitation-accept", "post", "/api/v1/invitations/{invitation}/accept", None),  # another user's
    ("api-invitation-decline", "post", "/api/v1/invitations/{invitation}/decline", None),
    ("api-tenant-export", "get", "/api/v1/tenant/exports/{export}", None),
    ("api-tenant-export-archive", "get", "/api/v1/tenant/exports/{export}/archive", None),
]
# Routes without an object id: their lists must not contain the other tenant's objects.
LIST_ROUTES = {"api-tenant", "api-projects", "api-quotas", "api-members", "api-tokens", "api-slo-contracts",
               "api-ssh-keys", "api-tenant-invitations", "api-invitations",
               "api-tenant-sign-in", "api-audit-events", "api-tenant-exports",
               "api-tenant-close"}  # closes the caller's own tenant: test_offboarding.py


# The staff API (tenants/api/platform.py) crosses tenants by design, for platform staff only: no tenant member reaches
# it, whatever their role (test_isolation_staff_routes_refuse_tenant_members; every method in test_routes.py).
STAFF_CASES = [
    ("api-staff-cohorts", "get", "/api/v1/cohorts", None),
    ("api-staff-cohorts", "post", "/api/v1/cohorts", {"name": "pwned"}),
    ("api-staff-tenant", "patch", "/api/v1/tenants/globex", {"cohort": None}),
    ("api-staff-tenants", "get", "/api/v1/tenants", None),
    ("api-staff-tenant", "get", "/api/v1/tenants/globex", None),
    ("api-staff-tenant", "patch", "/api/v1/tenants/globex", {"name": "pwned"}),
    ("api-staff-tenant-status", "put", "/api/v1/tenants/globex/status", {"status": "suspended"}),
    ("api-staff-quotas", "get", "/api/v1/tenants/globex/quotas", None),
    ("api-staff-tenant-quota", "put", "/api/v1/tenants/globex/quotas/H100-80GB",
     {"deserved_gpu_milli": 0, "limit_gpu_milli": 0}),
    ("api-staff-projects", "get", "/api/v1/tenants/globex/projects", None),
    ("api-staff-project", "patch", "/api/v1/tenants/globex/projects/secret", {"name": "pwned"}),
    ("api-staff-project-status", "put", "/api/v1/tenants/globex/projects/secret/status", {"status": "suspended"}),
    ("api-staff-project-quota", "put", "/api/v1/tenants/globex/projects/secret/quotas/H100-80GB",
     {"deserved_gpu_milli": 0, "limit_gpu_milli": 0}),
    ("api-staff-slo-contracts", "get", "/api/v1/tenants/globex/slo-contracts", None),
    ("api-staff-slo-contract", "get", "/api/v1/tenants/globex/slo-contracts/1", None),
    ("api-staff-tenant-sign-in", "get", "/api/v1/tenants/globex/sign-in", None),
    ("api-staff-tenant-sign-in", "patch", "/api/v1/tenants/globex/sign-in", {"totp_required": True}),
]


def test_isolation_every_route_is_covered():
    names = {p.name for p in urlpatterns if isinstance(p, URLPattern)}
    covered = {case[0] for case in CASES} | LIST_ROUTES | {case[0] for case in STAFF_CASES}
    assert names <= covered, f"routes without an isolation case: {names - covered}"


@pytest.mark.parametrize("who", ["owner", "admin", "viewer"])
@pytest.mark.parametrize(("name", "method", "path", "body"), CASES)
def test_isolation_other_tenants_objects_are_404(world, who, name, method, path, body):
    url = path.format(**_other_ids(world))
    response = getattr(world.client(who), method)(url, body, format="json")
    assert response["Content-Type"] == "application/problem+json"
    if response.status_code == 403:
        # A role that may not write at all is refused before any lookup: the answer is the same for an
        # object that does not exist, so it reveals nothing about the other tenant.
        missing = path.format(slug="no-such-project", member=10**9, token=10**9, export=10**9, ssh_key=10**9,
                              invitation=10**9)
        assert getattr(world.client(who), method)(missing, body, format="json").status_code == 403
    else:
        assert response.status_code == 404, (url, response.content)
    # and nothing changed
    assert Project.objects.get(pk=world.other_project.pk).name == "Secret"
    assert Membership.objects.get(user=world.outsider).role == "owner"
    assert ApiToken.objects.filter(user=world.outsider, revoked_at__isnull=True).exists()
    assert SshKey.objects.filter(user=world.outsider).exists()
    assert not Invitation.objects.filter(tenant=world.globex).exclude(state="pending").exists()


def test_isolation_lists_hold_only_own_objects(world):
    client = world.client("owner")
    assert client.get("/api/v1/tenant").json()["slug"] == "acme"
    projects = [p["slug"] for p in client.get("/api/v1/projects").json()["results"]]
    assert projects == ["vision"]
    quotas = client.get("/api/v1/quotas").json()
    assert [q["project"] for q in quotas["projects"]] == ["vision"]
    members = {m["username"] for m in client.get("/api/v1/members").json()["results"]}
    assert "bob" not in members
    tokens = {t["username"] for t in client.get("/api/v1/tokens").json()["results"]}
    assert "bob" not in tokens
    _outsider_ssh_key(world)
    assert client.get("/api/v1/ssh-keys").json()["results"] == []  # the acting user's own keys only
    slo = client.get("/api/v1/slo-contracts").json()["results"]
    assert slo == []
    audit = client.get("/api/v1/audit-events?limit=500").json()["results"]
    assert audit and {e["actor"] for e in audit} <= {"alice", "ann", "max", "vic", None}
    assert "bob" not in {e["actor"] for e in audit} and "globex" not in {e["object"] for e in audit}
    Invitation.objects.create(tenant=world.globex, username="zed", role="viewer")
    assert client.get("/api/v1/tenant/invitations").json()["results"] == []
    assert client.get("/api/v1/invitations").json()["results"] == []  # alice is invited nowhere


def test_isolation_same_slug_in_two_tenants_resolves_to_own(world):
    from tests.factories import make_project

    make_project(world.globex, "vision", name="Globex vision")
    response = world.client("owner").get("/api/v1/projects/vision")
    assert response.json()["name"] == "Vision"
    response = world.client("outsider").get("/api/v1/projects/vision")
    assert response.json()["name"] == "Globex vision"


def test_isolation_portal_dashboard_shows_only_own_tenant(world, client):
    client.login(username="alice", password="pw-alice")
    page = client.get("/").content.decode()
    assert "Vision" in page and "Secret" not in page


def test_isolation_portal_cannot_switch_to_foreign_tenant(world, client):
    client.login(username="alice", password="pw-alice")
    client.post("/tenant/switch", {"tenant": "globex"})
    page = client.get("/").content.decode()
    assert "Secret" not in page and "Acme" in page


@pytest.mark.parametrize("who", ["owner", "admin"])
@pytest.mark.parametrize(("name", "method", "path", "body"), STAFF_CASES)
def test_isolation_staff_routes_refuse_tenant_members(world, who, name, method, path, body):
    response = getattr(world.client(who), method)(path, body, format="json")
    assert response.status_code == 403, (path, response.content)
    assert response.json()["detail"] == "This endpoint is for platform staff."
    world.globex.refresh_from_db()
    assert (world.globex.name, world.globex.status) == ("Globex", "active")
    assert Project.objects.get(pk=world.other_project.pk).name == "Secret"


def test_isolation_sign_in_settings_are_the_callers_tenants(world):
    """The sign-in settings route names no tenant: it reads and changes the caller's own, never the other's."""
    from tenants.models import TenantSignIn

    owner = world.client("owner")
    assert owner.patch("/api/v1/tenant/sign-in", {"totp_required": True}, format="json").status_code == 200
    assert TenantSignIn.objects.get(totp_required=True).tenant == world.acme
    assert not TenantSignIn.objects.filter(tenant=world.globex).exists()
    assert owner.get("/api/v1/tenant/sign-in").json()["totp_required"] is True
