"""The admin's sign-in pages write through the services: a tenant's SSO settings (the secret write-only, the
refusals as form messages) and the reset of a user's lost authenticator, each audited in the staff user's name."""

from __future__ import annotations

import pyotp
from django.contrib.auth import get_user_model
from django.test import Client

from tenants.models import AuditEvent, RecoveryCode, TenantSignIn, TotpDevice
from tenants.otp import totp_device_confirm, totp_device_start
from tests.factories import make_tenant, make_user


def staff_client() -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw-root"))
    return client


def test_sign_in_admin_saves_through_the_service_and_never_shows_the_secret(db):
    acme = make_tenant("acme")
    client = staff_client()
    form = {"tenant": acme.pk, "sso_enabled": "on", "provider_name": "Acme ID",
            "issuer": "https://login.acme.test/realms/acme", "client_id": "gpubroker", "client_secret": "adm1n-s3cret",
            "allowed_email_domains": "acme.test", "default_role": "member", "group_roles": "{}"}
    response = client.post("/admin/tenants/tenantsignin/add/", form)
    assert response.status_code == 302, response.content[:2000]
    sign_in = TenantSignIn.objects.get(tenant=acme)
    assert sign_in.sso_enabled and sign_in.client_secret_sealed and "adm1n" not in sign_in.client_secret_sealed
    event = AuditEvent.objects.get(action="tenant.sign_in.update")
    assert event.actor.username == "root" and event.data["client_secret"] == "changed"
    page = client.get(f"/admin/tenants/tenantsignin/{sign_in.pk}/change/")
    assert page.status_code == 200 and b"adm1n-s3cret" not in page.content
    refused = client.post(f"/admin/tenants/tenantsignin/{sign_in.pk}/change/",
                          {**form, "issuer": "http://login.acme.test", "client_secret": ""}, follow=True)
    assert b"issuer must be an https:// URL" in refused.content
    assert TenantSignIn.objects.get(tenant=acme).issuer == "https://login.acme.test/realms/acme"


def test_sign_in_admin_resets_a_lost_authenticator(db):
    user = make_user("max")
    secret = totp_device_start(user=user)
    totp_device_confirm(user=user, code=pyotp.TOTP(secret).now())
    device = TotpDevice.objects.get(user=user)
    client = staff_client()
    response = client.post("/admin/tenants/totpdevice/", {"action": "reset", "_selected_action": [device.pk]})
    assert response.status_code == 302
    assert not TotpDevice.objects.filter(user=user).exists() and not RecoveryCode.objects.filter(user=user).exists()
    assert AuditEvent.objects.get(action="second_factor.reset", target="max").actor.username == "root"
