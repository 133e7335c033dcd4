"""Users' SSH public keys (``tenants.ssh_keys``): added and removed by their user through the API and the portal,
by staff in the admin; each refusal names the field and writes nothing; a private key pasted by mistake is never
stored or shown back. The gateway that uses them: tests/broker/test_ssh_gateway.py."""

from __future__ import annotations

import asyncssh
import pytest
from django.test import Client

from tenants.models import AuditEvent, SshKey
from tenants.ssh_keys import MAX_KEYS_PER_USER
from tests.factories import api_client


def _public(algorithm: str = "ssh-ed25519", **options) -> tuple[asyncssh.SSHKey, str]:
    key = asyncssh.generate_private_key(algorithm, **options)
    return key, key.export_public_key().decode().strip() + " someone@laptop"


@pytest.fixture(scope="module")
def small_rsa() -> str:
    return _public("ssh-rsa", key_size=1024)[1]


def test_a_member_adds_lists_and_removes_a_key_through_the_api(world):
    client = api_client(world.tokens["member"])
    key, public = _public()
    added = client.post("/api/v1/ssh-keys", {"name": "laptop", "public_key": public}, format="json")
    assert added.status_code == 201, added.json()
    body = added.json()
    assert body["fingerprint"] == key.get_fingerprint("sha256") and body["algorithm"] == "ssh-ed25519"
    assert body["public_key"] == " ".join(public.split()[:2])  # the comment is dropped
    assert body["last_used_at"] is None
    assert [k["id"] for k in client.get("/api/v1/ssh-keys").json()["results"]] == [body["id"]]
    assert api_client(world.tokens["admin"]).get("/api/v1/ssh-keys").json()["results"] == []  # one's own only
    assert api_client(world.tokens["admin"]).get(f"/api/v1/ssh-keys/{body['id']}").status_code == 404
    event = AuditEvent.objects.get(action="ssh_key.add")
    assert event.tenant == world.acme and event.target == body["fingerprint"]
    assert client.delete(f"/api/v1/ssh-keys/{body['id']}").status_code == 204
    assert not SshKey.objects.exists() and AuditEvent.objects.filter(action="ssh_key.remove").exists()


def test_refusals_name_the_field_and_write_nothing(world, small_rsa):
    client = api_client(world.tokens["member"])
    private = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()
    _key, public = _public()
    cases = [
        ({"name": "x", "public_key": private}, 400, "private key"),
        ({"name": "x", "public_key": "ssh-ed25519 not-base64"}, 400, "not an OpenSSH public key"),
        ({"name": "x", "public_key": small_rsa}, 400, "at least 2048 bits"),
        ({"name": "x", "public_key": ""}, 400, ""),
        ({"name": " ", "public_key": public}, 400, ""),
        ({"public_key": public}, 400, ""),
        ({"name": "x", "public_key": public, "extra": 1}, 400, ""),
    ]
    for body, status, text in cases:
        answer = client.post("/api/v1/ssh-keys", body, format="json")
        assert answer.status_code == status, (body, answer.json())
        assert answer["Content-Type"] == "application/problem+json"
        assert text in answer.json()["detail"], answer.json()
        assert "PRIVATE KEY" not in answer.content.decode()  # never echoed
    assert not SshKey.objects.exists() and not AuditEvent.objects.filter(action="ssh_key.add").exists()
    assert client.post("/api/v1/ssh-keys", {"name": "a", "public_key": public}, format="json").status_code == 201
    # a key names one user: the same key again, by anyone, is a conflict that says nothing of whose it is
    again = api_client(world.tokens["outsider"]).post("/api/v1/ssh-keys", {"name": "b", "public_key": public},
                                                      format="json")
    assert again.status_code == 409 and again.json()["field"] == "public_key"
    assert "max" not in again.json()["detail"]
    # read-only and project-limited tokens add none
    assert api_client(world.tokens["owner_read"]).post(
        "/api/v1/ssh-keys", {"name": "r", "public_key": _public()[1]}, format="json").status_code == 403


def test_a_user_holds_at_most_twenty_keys(world):
    for n in range(MAX_KEYS_PER_USER):
        key = asyncssh.generate_private_key("ssh-ed25519")
        SshKey.objects.create(user=world.member, name=f"k{n}", public_key=key.export_public_key().decode().strip(),
                              fingerprint=key.get_fingerprint("sha256"))
    answer = api_client(world.tokens["member"]).post("/api/v1/ssh-keys", {"name": "one more",
                                                                          "public_key": _public()[1]}, format="json")
    assert answer.status_code == 409 and "remove one first" in answer.json()["detail"]
    assert SshKey.objects.filter(user=world.member).count() == MAX_KEYS_PER_USER


def test_the_portal_page_adds_and_removes_and_never_shows_a_private_key_back(world):
    portal = Client()
    portal.force_login(world.viewer)  # a viewer's own credential, for the tenants where they may use leases
    private = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()
    refused = portal.post("/settings/ssh-keys", {"name": "oops", "public_key": private})
    assert refused.status_code == 400 and b"that is a private key" in refused.content
    assert b"PRIVATE KEY" not in refused.content and not SshKey.objects.exists()
    key, public = _public()
    assert portal.post("/settings/ssh-keys", {"name": "laptop", "public_key": public}).status_code == 302
    page = portal.get("/settings/ssh-keys")
    assert key.get_fingerprint("sha256").encode() in page.content and b"laptop" in page.content
    stored = SshKey.objects.get(user=world.viewer)
    other = Client()
    other.force_login(world.member)
    assert other.post(f"/settings/ssh-keys/{stored.pk}/remove").status_code == 404  # not theirs
    assert portal.post(f"/settings/ssh-keys/{stored.pk}/remove").status_code == 302
    assert not SshKey.objects.exists()


def test_staff_remove_a_key_in_the_admin_audited(world, admin_client):
    key, public = _public()
    stored = SshKey.objects.create(user=world.member, name="lost laptop", public_key=" ".join(public.split()[:2]),
                                   fingerprint=key.get_fingerprint("sha256"))
    page = admin_client.get("/admin/tenants/sshkey/")
    assert page.status_code == 200 and b"lost laptop" in page.content
    done = admin_client.post("/admin/tenants/sshkey/", {"action": "remove", "_selected_action": [stored.pk]})
    assert done.status_code == 302 and not SshKey.objects.exists()
    event = AuditEvent.objects.get(action="ssh_key.remove")
    assert event.data["by_staff"] is True and event.data["user"] == "max"
