"""Suspension (docs/tenancy.md, "Suspension"): a suspended tenant reads and gives back, and starts nothing
that costs money or grants access; read-only tokens write nothing, not even on their own user's things.
The flow across the worker and the agents is in tests/broker/test_suspension_flow.py."""

from django.test import Client

from broker import services as broker
from broker.models import Lease, LeaseEvent
from tenants import services
from tenants.access import Actor
from tenants.choices import Role
from tenants.models import ApiToken, AuditEvent, Membership


def _lease(world):
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    return broker.lease_request(actor=actor, project="vision", gpu={"kind": "mig", "profile": "1g.10gb"})[0]


def test_suspension_member_can_still_release_a_lease(world):
    lease = _lease(world)
    services.tenant_set_status(tenant=world.acme, status="suspended")
    response = world.client("member").delete(f"/api/v1/leases/{lease.pk}")
    assert response.status_code == 202, response.content
    assert Lease.objects.get(pk=lease.pk).state == "released"


def test_suspension_member_can_still_release_in_the_portal(world):
    lease = _lease(world)
    services.tenant_set_status(tenant=world.acme, status="suspended")
    client = Client()
    client.login(username="max", password="pw-max")
    assert "Cancel request" in client.get(f"/leases/{lease.pk}").content.decode()
    response = client.post(f"/leases/{lease.pk}/release")
    assert response.status_code == 302, response.content
    assert Lease.objects.get(pk=lease.pk).state == "released"


def test_suspension_refuses_new_tokens_and_leases_and_renewals(world):
    lease = _lease(world)
    services.tenant_set_status(tenant=world.acme, status="suspended")
    member = world.client("member")
    for method, path, body in [("post", "/api/v1/tokens", {"name": "more", "scopes": ["read", "write"]}),
                               ("post", "/api/v1/tokens", {"name": "more", "scopes": ["read"]}),
                               ("post", "/api/v1/leases", {"project": "vision", "gpu": {"kind": "whole"}}),
                               ("post", f"/api/v1/leases/{lease.pk}/renew", {"duration_seconds": 600})]:
        response = getattr(member, method)(path, body, format="json")
        assert response.status_code == 403 and response.json()["code"] == "tenant_suspended", (path, response.content)
    assert ApiToken.objects.filter(name="more").count() == 0
    client = Client()
    client.login(username="max", password="pw-max")
    response = client.post("/settings/tokens", {"name": "more", "scopes": "write"})
    assert response.status_code == 403 and "suspended" in response.content.decode()
    assert ApiToken.objects.filter(name="more").count() == 0


def test_suspension_still_allows_taking_access_away(world):
    services.tenant_set_status(tenant=world.acme, status="suspended")
    spare = ApiToken.objects.filter(user=world.admin).first()
    # an admin revokes another member's token; a member revokes their own and leaves
    assert world.client("owner").delete(f"/api/v1/tokens/{spare.pk}").status_code == 200
    mine = ApiToken.objects.filter(user=world.member).first()
    assert world.client("member").delete(f"/api/v1/tokens/{mine.pk}").status_code == 200
    assert ApiToken.objects.get(pk=mine.pk).revoked_at is not None
    client = Client()
    client.login(username="max", password="pw-max")
    membership = Membership.objects.get(user=world.member)
    assert client.post(f"/settings/members/{membership.pk}/remove").status_code == 302
    assert not Membership.objects.filter(pk=membership.pk).exists()


def test_suspension_holds_queued_leases_until_reactivated(world):
    from broker.selectors import lease_preview, lease_queue

    lease = _lease(world)
    assert list(lease_queue()) == [lease]
    services.tenant_set_status(tenant=world.acme, status="suspended", reason="unpaid")
    held = Lease.objects.get(pk=lease.pk)
    assert held.state == "queued" and held.reason == "held: tenant 'acme' is suspended (unpaid)"
    assert list(lease_queue()) == []  # the schedule cycle reads this queue: it never places a held lease
    assert LeaseEvent.objects.filter(lease=lease, reason__startswith="held: tenant 'acme'").count() == 1
    preview = lease_preview(actor=Actor(user=world.member, tenant=world.acme, role=Role.MEMBER),
                            project="vision", gpu={"kind": "mig", "profile": "1g.10gb"})
    assert preview.outcome == "waits" and "suspended" in preview.reason
    assert AuditEvent.objects.filter(action="tenant.suspended", data__reason="unpaid").count() == 1
    services.tenant_set_status(tenant=world.acme, status="suspended")  # again: nothing more is written
    assert AuditEvent.objects.filter(action="tenant.suspended").count() == 1
    services.tenant_set_status(tenant=world.acme, status="active")
    assert Lease.objects.get(pk=lease.pk).reason == "waiting for the scheduler"
    assert list(lease_queue()) == [lease]


def test_read_only_token_cannot_revoke_its_users_other_token_or_leave(world):
    """Issue 13 item 8: a read-only token revoked its user's write token and removed its membership."""
    write = ApiToken.objects.filter(user=world.owner, scopes__contains=["write"]).get()
    reader = world.client("owner_read")
    response = reader.delete(f"/api/v1/tokens/{write.pk}")
    assert response.status_code == 403 and response.json()["detail"] == "This API token has read scope only."
    assert ApiToken.objects.get(pk=write.pk).revoked_at is None
    viewer_membership = Membership.objects.get(user=world.viewer)
    response = world.client("viewer").delete(f"/api/v1/members/{viewer_membership.pk}")
    assert response.status_code == 403
    assert Membership.objects.filter(pk=viewer_membership.pk).exists()
    response = reader.post("/api/v1/tokens", {"name": "x", "scopes": ["read"]}, format="json")
    assert response.status_code == 403
