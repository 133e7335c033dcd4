"""The tenant's sign-in settings page (portal/sso.py): owners change them, the client secret never comes back,
a refusal names its field, nothing half-written."""

from __future__ import annotations

from django.test import Client

from tenants.models import AuditEvent, TenantSignIn

FORM = {"sso_enabled": "on", "provider_name": "Acme ID", "issuer": "https://login.acme.test/realms/acme",
        "client_id": "gpubroker", "client_secret": "s3cr3t-value-never-shown", "allowed_email_domains": "acme.test",
        "default_role": "member", "group_roles": "gpu-admins=admin\nresearch=member", "totp_required": "on"}


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_sign_in_page_owner_saves_and_the_secret_never_comes_back(world):
    owner = signed_in(world.owner)
    response = owner.post("/settings/sign-in", FORM)
    assert response.status_code == 302
    sign_in = TenantSignIn.objects.get(tenant=world.acme)
    assert sign_in.sso_enabled and sign_in.group_roles == {"gpu-admins": "admin", "research": "member"}
    assert sign_in.totp_required
    page = owner.get("/settings/sign-in")
    assert page.status_code == 200 and b"s3cr3t-value-never-shown" not in page.content
    assert b"(set; leave empty to keep it)" in page.content and b"/accounts/sso/callback" in page.content
    assert AuditEvent.objects.filter(tenant=world.acme, action="tenant.sign_in.update").exists()
    api = owner.get("/api/v1/tenant/sign-in").json()
    assert api["client_secret_set"] is True and "client_secret" not in api
    assert b"s3cr3t" not in owner.get("/api/v1/tenant/sign-in").content


def test_sign_in_page_refusal_names_the_field_and_writes_nothing(world):
    response = signed_in(world.owner).post("/settings/sign-in", {**FORM, "issuer": "http://login.acme.test"})
    assert response.status_code == 400 and b"issuer must be an https:// URL" in response.content
    assert not TenantSignIn.objects.filter(tenant=world.acme).exists()
    assert not AuditEvent.objects.filter(action="tenant.sign_in.update").exists()


def test_sign_in_page_admins_read_but_only_owners_change(world):
    admin = signed_in(world.admin)
    assert admin.get("/settings/sign-in").status_code == 200
    assert admin.post("/settings/sign-in", FORM).status_code == 403
    assert not TenantSignIn.objects.filter(tenant=world.acme).exists()


def test_sign_in_page_log_out_of_a_password_session_goes_back_to_the_sign_in_page(world):
    owner = signed_in(world.owner)
    response = owner.post("/accounts/sso/logout")  # the portal's "Log out" (base.html)
    assert response.status_code == 302 and response["Location"] == "/accounts/login/"
    assert owner.get("/").status_code == 302
