"""The TOTP second factor through the real sign-in: a password, then six digits computed with pyotp from the
secret the set-up page shows (RFC 6238, as a phone app would). Staff always need it; a tenant's members when the
tenant requires it; recovery codes work once; a code works once; API tokens are unaffected."""

from __future__ import annotations

import re

import pyotp
import pytest
import time_machine
from django.test import Client
from django.utils import timezone

from tenants.models import AuditEvent, RecoveryCode, TotpDevice
from tenants.sso import sign_in_update
from tests.factories import api_client, make_member, make_tenant, make_token, make_user


def password_sign_in(username: str) -> Client:
    client = Client()
    response = client.post("/accounts/login/", {"username": username, "password": f"pw-{username}"})
    assert response.status_code == 302, response.content[:300]
    return client


def enrol(client: Client) -> tuple[pyotp.TOTP, list[str]]:
    """Set up an authenticator from the page, as a person with a phone app: read the secret, type the code."""
    page = client.get("/accounts/2fa/setup")
    assert page.status_code == 200 and b'src="data:image/png;base64,' in page.content  # the QR code
    secret = re.search(rb'id="totp-secret">([A-Z2-7]+)<', page.content).group(1).decode()
    totp = pyotp.TOTP(secret)
    done = client.post("/accounts/2fa/setup", {"code": totp.now()})
    assert done.status_code == 200, done.content[:300]
    codes = re.findall(r"<li><code>([0-9a-f]{6}-[0-9a-f]{6})</code></li>", done.content.decode())
    assert len(codes) == 10
    return totp, codes


def test_second_factor_staff_must_set_one_up_before_anything_else(db):
    make_user("root", is_staff=True)
    client = password_sign_in("root")
    for path in ("/", "/ops/fleet", "/admin/"):
        response = client.get(path)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/2fa/setup"), path
    api = client.get("/api/v1/tenants")
    assert api.status_code == 403 and api["Content-Type"] == "application/problem+json"
    assert api.json()["code"] == "second_factor_required"
    totp, codes = enrol(client)
    assert client.get("/ops/fleet").status_code == 200
    assert client.get("/api/v1/tenants").status_code == 200
    device = TotpDevice.objects.get(user__username="root")
    assert totp.secret not in device.secret_sealed  # sealed at rest
    assert RecoveryCode.objects.filter(user__username="root").count() == 10
    assert not RecoveryCode.objects.filter(code_hash__in=codes).exists()  # only hashes are kept
    assert AuditEvent.objects.filter(action="second_factor.enrol", target="root").exists()


def test_second_factor_a_later_sign_in_asks_for_a_code_used_once(db):
    make_user("root", is_staff=True)
    with time_machine.travel(timezone.now(), tick=False) as clock:
        totp, _ = enrol(password_sign_in("root"))
        clock.shift(60)
        client = password_sign_in("root")
        assert client.get("/ops/fleet")["Location"].startswith("/accounts/2fa/?next=/ops/fleet")
        wrong = client.post("/accounts/2fa/", {"code": "000000" if totp.now() != "000000" else "111111"})
        assert wrong.status_code == 403 and b"wrong or already used code" in wrong.content
        code = totp.now()
        passed = client.post("/accounts/2fa/", {"code": code, "next": "/ops/fleet"})
        assert passed.status_code == 302 and passed["Location"] == "/ops/fleet"
        assert client.get("/ops/fleet").status_code == 200
        replay = password_sign_in("root")  # the same six digits again, in another session: refused
        assert replay.post("/accounts/2fa/", {"code": code}).status_code == 403
        assert replay.get("/ops/fleet").status_code == 302
        clock.shift(30)  # the next step's code is fine
        assert replay.post("/accounts/2fa/", {"code": totp.now()}).status_code == 302


def test_second_factor_recovery_codes_work_once(db):
    make_user("root", is_staff=True)
    _, codes = enrol(password_sign_in("root"))
    client = password_sign_in("root")
    used = client.post("/accounts/2fa/", {"code": codes[0]})
    assert used.status_code == 200 and b"You have 9 left" in used.content
    assert client.get("/ops/fleet").status_code == 200
    again = password_sign_in("root")
    refused = again.post("/accounts/2fa/", {"code": codes[0]})
    assert refused.status_code == 403 and b"not a valid recovery code" in refused.content
    assert AuditEvent.objects.filter(action="second_factor.recovery_code", data__left=9).count() == 1


def test_second_factor_a_tenant_can_require_it_of_its_members(db):
    acme, globex = make_tenant("acme"), make_tenant("globex")
    make_member(acme, "alice")
    make_member(globex, "bob")
    assert password_sign_in("alice").get("/").status_code == 200  # not required yet
    sign_in_update(tenant=acme, by=None, changes={"totp_required": True})
    alice = password_sign_in("alice")
    assert alice.get("/")["Location"].startswith("/accounts/2fa/setup")
    enrol(alice)
    assert alice.get("/").status_code == 200
    assert password_sign_in("bob").get("/").status_code == 200  # globex does not require it


def test_second_factor_leaves_api_tokens_alone(db):
    acme = make_tenant("acme")
    user = make_member(acme, "alice")
    user.is_staff = True
    user.save()
    sign_in_update(tenant=acme, by=None, changes={"totp_required": True})
    _, secret = make_token(acme, user)
    assert api_client(secret).get("/api/v1/projects").status_code == 200
    assert api_client(secret).get("/api/v1/tenants").status_code == 200  # staff API, by token


@pytest.mark.parametrize("code", ["", "12345a", "9999999"])
def test_second_factor_bad_codes_are_refused_naming_the_field(db, code):
    make_user("root", is_staff=True)
    enrol(password_sign_in("root"))
    response = password_sign_in("root").post("/accounts/2fa/", {"code": code})
    assert response.status_code in (400, 403) and b"code" in response.content
