"""Single sign-on end to end against a real OpenID provider (infra/oidc_provider: django-oauth-toolkit, RS256,
discovery, userinfo, in its own process on a loopback port): a good sign-in makes the member just in time with
the mapped role; a wrong audience, an expired ID token, a replayed state and an e-mail outside the allowed
domains are each refused with a message that says why, and nothing is created."""

from __future__ import annotations

import io
import subprocess
from urllib.parse import parse_qsl, urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from core.errors import Conflict, ValidationFailed
from tenants.choices import Role
from tenants.models import AuditEvent, Membership, TenantSignIn
from tenants.sso import sign_in_update
from tests.factories import api_client, make_member, make_project, make_tenant, make_token, make_user
from tests.support.oidc import CLIENT_ID, provider_sign_in, provider_start, provider_stop, sso_sign_in

User = get_user_model()


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    running = provider_start(tmp_path_factory.mktemp("oidc-provider"))
    yield running
    provider_stop(running)


@pytest.fixture
def acme(db, provider):
    tenant = make_tenant("acme")
    sign_in_update(tenant=tenant, by=None, changes={
        "sso_enabled": True, "provider_name": "Acme ID", "issuer": provider.issuer, "client_id": CLIENT_ID,
        "client_secret": provider.client_secret, "allowed_email_domains": ["acme.test"],
        "default_role": Role.VIEWER, "group_roles": {"gpu-admins": Role.ADMIN}})
    return tenant


def nothing_created(email: str) -> bool:
    return not User.objects.filter(email__iexact=email).exists() and not Membership.objects.filter(
        user__email__iexact=email).exists() and not AuditEvent.objects.filter(action="sso.sign_in").exists()


def test_sso_good_sign_in_creates_the_member_with_the_mapped_role(acme, provider):
    client = Client()
    response = sso_sign_in(client, provider, "alice")
    assert response.status_code == 302 and response["Location"] == "/"
    alice = User.objects.get(email="alice@acme.test")
    assert not alice.has_usable_password()
    assert Membership.objects.get(user=alice, tenant=acme).role == Role.ADMIN  # gpu-admins -> admin
    assert AuditEvent.objects.filter(tenant=acme, action="membership.create", target="alice@acme.test",
                                     data__via="sso").exists()
    assert client.get("/").status_code == 200  # signed in, in acme

    bob = Client()
    assert sso_sign_in(bob, provider, "bob").status_code == 302
    assert Membership.objects.get(user__email="bob@acme.test", tenant=acme).role == Role.VIEWER  # the default

    again = sso_sign_in(Client(), provider, "alice")  # a second sign-in: the same user, no second membership
    assert again.status_code == 302 and User.objects.filter(email="alice@acme.test").count() == 1
    assert Membership.objects.filter(user=alice).count() == 1


def test_sso_start_by_email_domain_and_the_sign_in_page_button(acme, provider):
    page = Client().get("/accounts/login/", {"org": "someone@acme.test"})
    assert b"Sign in with Acme ID" in page.content
    assert sso_sign_in(Client(), provider, "bob", org="bob@acme.test").status_code == 302
    unknown = Client().get("/accounts/sso/start", {"org": "nobody.example"})
    assert unknown.status_code == 404 and b"No tenant signs in with single sign-on" in unknown.content


def test_sso_sign_out_ends_the_session_and_goes_to_the_providers_logout(acme, provider):
    client = Client()
    sso_sign_in(client, provider, "bob")
    response = client.post("/accounts/sso/logout")
    assert response.status_code == 302
    target = urlsplit(response["Location"])
    assert f"{target.scheme}://{target.netloc}{target.path}".startswith(f"{provider.issuer}/logout")
    assert "id_token_hint" in dict(parse_qsl(target.query))
    assert client.get("/").status_code == 302  # back to the sign-in page


def test_sso_refuses_an_id_token_for_another_audience(acme, provider):
    response = sso_sign_in(Client(), provider, "wrong-audience")
    assert response.status_code == 403
    assert b"issued for another client" in response.content
    assert nothing_created("wa@acme.test")


def test_sso_refuses_an_expired_id_token(acme, provider):
    response = sso_sign_in(Client(), provider, "expired")
    assert response.status_code == 403
    assert b"ID token has expired" in response.content
    assert nothing_created("ex@acme.test")


def test_sso_refuses_a_replayed_state(acme, provider):
    client = Client()
    begun = client.get("/accounts/sso/start", {"org": "acme"})
    callback = urlsplit(provider_sign_in(provider, begun["Location"], "bob"))
    query = dict(parse_qsl(callback.query))
    assert client.get(callback.path, query).status_code == 302  # the real answer, once
    events = AuditEvent.objects.count()
    for replayer in (client, Client()):  # the same browser again; another browser with the stolen answer
        response = replayer.get(callback.path, query)
        assert response.status_code == 400
        assert b"already used or was not started in this browser" in response.content
    assert AuditEvent.objects.count() == events and User.objects.filter(email="bob@acme.test").count() == 1


def test_sso_refuses_an_email_outside_the_allowed_domains(acme, provider):
    response = sso_sign_in(Client(), provider, "eve")
    assert response.status_code == 403
    assert b"eve@evil.test is not in a domain" in response.content
    assert nothing_created("eve@evil.test")


def test_sso_tenant_switch_turns_local_passwords_off_for_its_members(acme, provider):
    make_member(acme, "carol")
    make_user("root", is_staff=True)
    Membership.objects.create(user=User.objects.get(username="root"), tenant=acme, role=Role.ADMIN)
    assert Client().post("/accounts/login/", {"username": "carol", "password": "pw-carol"}).status_code == 302
    sign_in_update(tenant=acme, by=None, changes={"local_passwords_disabled": True})
    refused = Client().post("/accounts/login/", {"username": "carol", "password": "pw-carol"})
    assert refused.status_code == 200 and b"signs its members in through Acme ID" in refused.content
    wrong = Client().post("/accounts/login/", {"username": "carol", "password": "wrong"})
    assert b"signs its members in" not in wrong.content  # nothing said without the right password
    staff = Client().post("/accounts/login/", {"username": "root", "password": "pw-root"})
    assert staff.status_code == 302  # staff keep their password (and need their second factor)


def test_sso_ends_password_sessions_opened_before_passwords_were_switched_off(acme, provider):
    """The switch takes effect for sessions already open: a password session ends at its next request (audited,
    said on the sign-in page); a session opened through single sign-on and a staff session stay."""
    make_member(acme, "carol")
    make_user("root", is_staff=True)
    Membership.objects.create(user=User.objects.get(username="root"), tenant=acme, role=Role.ADMIN)
    carol, staff, sso = Client(), Client(), Client()
    assert carol.post("/accounts/login/", {"username": "carol", "password": "pw-carol"}).status_code == 302
    staff.force_login(User.objects.get(username="root"))
    assert sso_sign_in(sso, provider, "bob").status_code == 302
    assert carol.get("/").status_code == 200 and sso.get("/").status_code == 200

    sign_in_update(tenant=acme, by=None, changes={"sso_enabled": True, "local_passwords_disabled": True})
    ended = carol.get("/", follow=True)
    assert ended.redirect_chain[-1][0].startswith("/accounts/login/")
    assert b"You were signed out" in ended.content and b"signs its members in through Acme ID" in ended.content
    assert carol.get("/").status_code == 302  # and stays out
    assert AuditEvent.objects.filter(tenant=acme, action="signin.session_ended", target="carol").count() == 1
    assert sso.get("/").status_code == 200  # single sign-on's session stays
    staff.get("/")
    assert "_auth_user_id" in staff.session  # staff keep their password session (and their second factor)
    assert not AuditEvent.objects.filter(action="signin.session_ended").exclude(target="carol").exists()
    # tokens are not sessions: switching passwords off revokes none (docs/security.md)
    secret = make_token(acme, User.objects.get(username="carol"))[1]
    assert api_client(secret).get("/api/v1/projects").status_code == 200


def test_sso_group_claims_map_members_to_projects(acme, provider):
    """With a group → projects mapping, a member or viewer signing in reaches their mapped groups' projects (none
    when no group of theirs is mapped), set again at each sign-in and audited; admins reach every project."""
    make_project(acme, "audio")
    speech = make_project(acme, "speech")
    vision = make_project(acme, "vision")
    sign_in_update(tenant=acme, by=None, changes={"group_projects": {"vision-team": ["vision"],
                                                                    "ml-platform": ["speech", "vision"]}})
    stored = TenantSignIn.objects.get(tenant=acme).group_projects
    assert stored == {"vision-team": [vision.pk], "ml-platform": sorted([speech.pk, vision.pk])}

    dana = Client()
    assert sso_sign_in(dana, provider, "dana").status_code == 302
    membership = Membership.objects.get(user__email="dana@acme.test", tenant=acme)
    assert membership.role == Role.VIEWER and sorted(membership.project_ids) == sorted([speech.pk, vision.pk])
    created = AuditEvent.objects.get(tenant=acme, action="membership.create", target="dana@acme.test")
    assert created.data["projects"] == ["speech", "vision"]
    assert b"audio" not in dana.get("/").content and b"speech" in dana.get("/").content

    assert sso_sign_in(Client(), provider, "bob").status_code == 302  # in no mapped group: no project yet
    assert Membership.objects.get(user__email="bob@acme.test").project_ids == []
    assert sso_sign_in(Client(), provider, "alice").status_code == 302  # gpu-admins -> admin: every project
    assert Membership.objects.get(user__email="alice@acme.test").project_ids is None

    sign_in_update(tenant=acme, by=None, changes={"group_projects": {"vision-team": ["vision"]}})
    assert sso_sign_in(Client(), provider, "dana").status_code == 302
    assert Membership.objects.get(user__email="dana@acme.test").project_ids == [vision.pk]
    changed = AuditEvent.objects.get(tenant=acme, action="membership.projects", target="dana@acme.test")
    assert changed.data["from"] == ["speech", "vision"] and changed.data["to"] == ["vision"]

    sign_in_update(tenant=acme, by=None, changes={"group_projects": {}})  # off: SSO leaves limits alone
    assert sso_sign_in(Client(), provider, "dana").status_code == 302
    assert Membership.objects.get(user__email="dana@acme.test").project_ids == [vision.pk]


def test_sso_settings_refusals_name_the_field(acme, provider):
    other = make_tenant("other")
    cases = [
        ({"issuer": "http://idp.example.com"}, ValidationFailed, "issuer"),
        ({"allowed_email_domains": ["acme.test"]}, Conflict, "allowed_email_domains"),
        ({"allowed_email_domains": ["not a domain"]}, ValidationFailed, "allowed_email_domains"),
        ({"default_role": Role.OWNER}, ValidationFailed, "default_role"),
        ({"group_roles": {"x": "boss"}}, ValidationFailed, "group_roles"),
        ({"group_projects": {"x": ["no-such-project"]}}, ValidationFailed, "group_projects"),
        ({"group_projects": {"x": "vision"}}, ValidationFailed, "group_projects"),
        ({"group_projects": ["x"]}, ValidationFailed, "group_projects"),
        ({"local_passwords_disabled": True}, ValidationFailed, "local_passwords_disabled"),
        ({"sso_enabled": True, "issuer": "https://idp.example.com", "allowed_email_domains": ["other.test"]},
         ValidationFailed, "client_id"),
    ]
    for changes, error, field in cases:
        with pytest.raises(error) as caught:
            sign_in_update(tenant=other, by=None, changes=changes)
        assert caught.value.field == field, changes
    assert not TenantSignIn.objects.filter(tenant=other).exists()
    stored = TenantSignIn.objects.get(tenant=acme)
    assert provider.client_secret not in stored.client_secret_sealed  # sealed at rest
    assert AuditEvent.objects.get(tenant=acme, action="tenant.sign_in.update").data["client_secret"] == "changed"


def test_sso_settings_over_the_api_as_docs_tenancy_shows(world, provider):
    """The request docs/tenancy.md ("Single sign-on") shows, by an owner's token; the secret never answered."""
    body = {"sso_enabled": True, "provider_name": "Acme ID", "issuer": provider.issuer, "client_id": CLIENT_ID,
            "client_secret": provider.client_secret, "allowed_email_domains": ["acme.test"],
            "default_role": "member", "group_roles": {"gpu-admins": "admin"}, "totp_required": False}
    response = world.client("owner").patch("/api/v1/tenant/sign-in", body, format="json")
    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer["client_secret_set"] is True and provider.client_secret not in response.content.decode()
    assert answer["callback_url"] == "http://testserver/accounts/sso/callback"
    viewer = world.client("admin").patch("/api/v1/tenant/sign-in", {"totp_required": True}, format="json")
    assert viewer.status_code == 403 and viewer["Content-Type"] == "application/problem+json"
    bad = world.client("owner").patch("/api/v1/tenant/sign-in", {"default_role": "owner"}, format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "default_role"
    assert sso_sign_in(Client(), provider, "alice").status_code == 302  # the settings work
    assert Membership.objects.get(user__email="alice@acme.test", tenant=world.acme).role == Role.ADMIN


def test_sso_demo_of_make_run_signs_globex_in_through_its_local_provider(db, settings, tmp_path):
    """make run's demo (infra/run.py): seed_demo --sso-issuer, the provider started with the command and config
    make run gives it; grace is made a globex admin just in time, carol is the demo's existing carol."""
    import json

    from django.core.management import call_command

    from core.processes import free_port, start, wait_http
    from infra.run import oidc_provider_command, oidc_provider_files
    from tests.support.oidc import Provider

    settings.VAR_DIR = tmp_path
    port = free_port()
    call_command("seed_demo", "--sso-issuer", f"http://127.0.0.1:{port}/o", stdout=io.StringIO())
    credentials = json.loads((tmp_path / "demo-credentials.json").read_text())
    config = oidc_provider_files(tmp_path, tmp_path / "demo-credentials.json")
    assert oct(config.stat().st_mode & 0o777) == "0o600"
    process = start(oidc_provider_command(port=port, site="http://testserver", var=tmp_path, config=config),
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    running = Provider(process=process, base=f"http://127.0.0.1:{port}", client_secret="")
    try:
        wait_http(f"{running.issuer}/.well-known/openid-configuration", process, timeout=240)
        page = Client().get("/accounts/login/", {"org": "globex"})
        assert b"Sign in with Local OpenID provider" in page.content
        grace = Client()
        assert sso_sign_in(grace, running, "grace", org="globex", password=credentials["users"]).status_code == 302
        assert Membership.objects.get(user__email="grace@globex.example", tenant__slug="globex").role == Role.ADMIN
        carol = Client()
        assert sso_sign_in(carol, running, "carol", org="globex", password=credentials["users"]).status_code == 302
        assert User.objects.filter(email="carol@globex.example").count() == 1
        assert carol.get("/").context["user"].username == "carol"
    finally:
        provider_stop(running)


def test_sso_then_the_second_factor_where_the_tenant_requires_it(acme, provider):
    sign_in_update(tenant=acme, by=None, changes={"totp_required": True})
    client = Client()
    assert sso_sign_in(client, provider, "bob").status_code == 302
    assert client.get("/")["Location"].startswith("/accounts/2fa/setup")  # single sign-on is one factor here
