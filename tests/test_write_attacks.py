"""Write paths and privilege boundaries, tried as an attacker (a review of the tenant-facing writes).

Each test states the rule docs/security.md or docs/tenancy.md promises and tries to break it. The tests marked
"Was a DEFECT" failed when they were written (wave 20's review) and pass since the mend their docstring names;
the others passed from the start and cover a case no other test covers (named in each docstring).

Actors are those of ``tests.factories.make_world``: acme (owner alice, admin ann, member max, viewer vic, project
vision) and globex (owner bob, project secret)."""

from __future__ import annotations

import contextlib
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from broker import services as broker
from broker.models import Allocation, Lease, Node, Workload
from capacity.models import Adjustment
from core.errors import ApplicationError
from pipelines.models import Pipeline
from tenants import offboarding, services
from tenants.access import Actor
from tenants.choices import Role, TenantStatus
from tenants.models import ApiToken, Invitation, Membership, TenantSignIn
from tenants.sso import SsoRefused, sign_in_update, sso_member_sign_in
from tests.factories import api_client, make_project, make_quota, make_token, make_user, make_world

H100 = {"kind": "whole", "model": "H100-80GB"}


@pytest.fixture
def world(db):
    return make_world()


def portal(user) -> Client:
    client = Client()
    client.force_login(user)  # both factors passed (tests/conftest.py)
    return client


def _node(node_id: str = "node-a", gpus: int = 2) -> Node:
    token = broker.enrollment_token_create(uses=1)
    broker.node_enroll(node_id=node_id, token=token, address=f"http://127.0.0.1:9/n/{node_id}", inventory={
        "gpus": [{"index": i, "uuid": f"GPU-{node_id}-{i}", "model": "H100-80GB", "mode": "whole",
                  "memory_mib": 81559} for i in range(gpus)]})
    return Node.objects.get(node_id=node_id)


def _active_lease(world, project: str = "vision") -> Lease:
    """A whole H100 of acme's ``project``, placed and ready (no agent: the cycle places, the test says ready)."""
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease, _ = broker.lease_request(actor=actor, project=project, gpu=H100, duration_seconds=3600)
    broker.schedule_cycle()
    for allocation in Allocation.objects.filter(lease=lease):
        broker.allocation_ready(allocation=allocation, instance={}, now=timezone.now())
    lease.refresh_from_db()
    assert lease.state == "active", (lease.state, lease.reason)
    return lease


@pytest.fixture
def notebooks(world):
    """A second project of acme with its own quota, for the project-limited actors."""
    project = make_project(world.acme, "notebooks")
    make_quota(project)
    return project


# =====================================================================================================
# Single sign-on: a tenant's owner claims another organisation's e-mail domain
# =====================================================================================================

def _attacker_idp(monkeypatch, *, email: str, subject: str = "mallory-at-her-own-idp"):
    """Stands in for the identity provider acme's owner configured (hers: whatever it signs is valid for acme's
    issuer and client id). Only the token exchange and the signature check, against her own provider, are
    skipped; everything the broker decides (``get_or_create_user``: the subject check, ``sso_member_sign_in``)
    runs as in production."""
    import mozilla_django_oidc.auth

    from tenants import sso

    monkeypatch.setattr(sso, "provider_metadata", lambda issuer: {
        "token_endpoint": f"{issuer}/token", "userinfo_endpoint": f"{issuer}/userinfo", "jwks_uri": f"{issuer}/jwks",
        "authorization_endpoint": f"{issuer}/authorize"})

    def authenticate(self, request, **kwargs):  # the library's: exchange the code, verify, then this
        self.request = request
        return self.get_or_create_user("access-token", "id-token", {"sub": subject})

    monkeypatch.setattr(mozilla_django_oidc.auth.OIDCAuthenticationBackend, "authenticate", authenticate)
    monkeypatch.setattr(sso.TenantOIDCBackend, "get_userinfo", lambda self, access_token, id_token, payload: {
        "sub": subject, "email": email, "email_verified": True})


def _through_acmes_sso(world) -> tuple[Client, object]:
    """A browser back from acme's provider at the broker's callback (the state the start page would keep)."""
    browser = Client()
    session = browser.session
    session["oidc_states"] = {"st4te": {"tenant": world.acme.pk, "nonce": "n0nce", "code_verifier": "v"}}
    session.save()
    return browser, browser.get("/accounts/sso/callback", {"state": "st4te", "code": "c0de"})


SSO_SETTINGS = {"sso_enabled": True, "provider_name": "Mallory ID", "issuer": "https://idp.mallory.example",
                "client_id": "gpubroker", "client_secret": "s3cret"}


def _claim_domain(world, domain: str) -> None:
    """acme's owner tries to turn single sign-on on with her own provider and another organisation's e-mail
    domain: refused (accounts of another tenant, or staff, have addresses there); then the platform's staff assign
    the domain to acme anyway (as they may: a domain shared by two organisations, a contractor's address), so the
    sign-in itself is tried too."""
    claimed = world.client("owner").patch("/api/v1/tenant/sign-in", {
        **SSO_SETTINGS, "allowed_email_domains": [domain]}, format="json")
    assert claimed.status_code == 409 and claimed.json()["field"] == "allowed_email_domains", claimed.content
    assert domain in claimed.json()["detail"]
    sign_in_update(tenant=world.acme, by=None, changes={**SSO_SETTINGS, "allowed_email_domains": [domain]})


def test_sso_owner_claiming_another_organisations_domain_signs_in_as_its_existing_user(world, monkeypatch):
    """Was a DEFECT (critical): ``sign_in_update`` let any owner list any e-mail domain in
    ``allowed_email_domains`` (only another tenant's *SSO* claiming it first was refused), and
    ``sso_member_sign_in`` matched the provider's e-mail against every account of the platform, so acme's owner,
    with her own provider, signed a browser in as globex's owner bob, made him an acme member without his consent,
    and minted a globex write token as him. Now the claim is refused (409), and where staff assign the domain the
    provider still cannot take over an account that belongs to another tenant (``tenants.sso._sso_account``)."""
    bob = world.outsider
    bob.email = "bob@globex.example"
    bob.save()
    _claim_domain(world, "globex.example")
    _attacker_idp(monkeypatch, email="bob@globex.example")

    browser, callback = _through_acmes_sso(world)
    signed_in_as = browser.session.get("_auth_user_id")
    joined_acme = Membership.objects.filter(user=bob, tenant=world.acme).exists()
    minted = None
    if signed_in_as == str(bob.pk):  # what the browser can do now: act in globex as bob
        browser.post("/tenant/switch", {"tenant": "globex"})
        page = browser.post("/settings/tokens", {"name": "kept", "scopes": ["read", "write"]})
        minted = (page.status_code, list(ApiToken.objects.filter(user=bob, name="kept").values_list(
            "tenant__slug", "scopes")))
    assert signed_in_as != str(bob.pk) and not joined_acme, (
        f"callback {callback.status_code}: acme's provider signed the browser in as globex's owner bob "
        f"(acme member now: {joined_acme}); as bob it minted a globex write token: HTTP {minted}")
    assert b"may not take it over" in callback.content


def test_sso_links_an_existing_account_only_when_the_provider_gains_nothing_and_then_by_subject(world):
    """The rule that replaced the e-mail match (``tenants.sso._sso_account``): an existing account of acme only is
    linked at its first single sign-on, and from then on its subject signs in as it even when the address
    changes; an account that belongs to acme and globex is not linked (acme's provider would act in globex); a new
    address makes a new account, linked to its subject."""
    sign_in_update(tenant=world.acme, by=None, changes={**SSO_SETTINGS, "allowed_email_domains": ["acme.example"]})
    sign_in = TenantSignIn.objects.get(tenant=world.acme)
    world.member.email = "max@acme.example"
    world.member.save()
    assert sso_member_sign_in(sign_in=sign_in, subject="max-1", claims={"email": "max@acme.example"}) == world.member
    assert sso_member_sign_in(sign_in=sign_in, subject="max-1",
                              claims={"email": "maximilian@acme.example"}) == world.member  # linked: by subject
    both = make_user("both", email="both@acme.example")
    Membership.objects.create(user=both, tenant=world.acme, role=Role.MEMBER)
    Membership.objects.create(user=both, tenant=world.globex, role=Role.MEMBER)
    with pytest.raises(SsoRefused, match="may not take it over"):
        sso_member_sign_in(sign_in=sign_in, subject="both-1", claims={"email": "both@acme.example"})
    fresh = sso_member_sign_in(sign_in=sign_in, subject="new-1", claims={"email": "new@acme.example"})
    assert fresh.pk not in (world.member.pk, both.pk) and not fresh.has_usable_password()
    assert sso_member_sign_in(sign_in=sign_in, subject="new-1", claims={"email": "new@acme.example"}) == fresh


def test_sso_links_made_before_the_rule_come_from_the_audit_trail(world):
    """tenants migration 0015: each subject that signed in before ``SsoIdentity`` existed keeps the account its
    ``sso.sign_in`` audit row names (the first row wins), so an existing member of two tenants is not refused."""
    import importlib

    from django.apps import apps

    from tenants.audit import audit_record
    from tenants.models import SsoIdentity

    migration = importlib.import_module("tenants.migrations.0015_wave20_sso_identities")
    for user, subject in ((world.member, "max-1"), (world.admin, "max-1"), (world.admin, "ann-1")):
        audit_record(tenant=world.acme, by=user, action="sso.sign_in", target=user.get_username(),
                     data={"issuer": "https://idp.acme.example", "subject": subject, "user_created": False})
    migration.links_from_the_audit_trail(apps, None)
    assert sorted(SsoIdentity.objects.values_list("subject", "user__username")) == [
        ("ann-1", world.admin.username), ("max-1", world.member.username)]


def test_sso_domain_claim_and_recovery_codes_chain_to_a_staff_session(world, monkeypatch):
    """Was a DEFECT (the two above, chained): a staff account was matched by e-mail like any other, and the session
    it got had not passed the second factor, which ``/accounts/2fa/recovery-codes`` then handed over: any tenant
    owner, with no password of staff, reached the ops pages and suspended another tenant. Now the claim of the
    staff domain is refused, a staff account is never signed in through a tenant's provider, and recovery codes
    are only for a session that has passed the second factor."""
    import re

    import pyotp

    root = make_user("root", is_staff=True, email="root@ops.example")
    enrolling = Client()
    enrolling.post("/accounts/login/", {"username": "root", "password": "pw-root"})
    secret = re.search(rb'id="totp-secret">([A-Z2-7]+)<', enrolling.get("/accounts/2fa/setup").content).group(1)
    assert enrolling.post("/accounts/2fa/setup", {"code": pyotp.TOTP(secret.decode()).now()}).status_code == 200

    _claim_domain(world, "ops.example")
    _attacker_idp(monkeypatch, email="root@ops.example")
    browser, _ = _through_acmes_sso(world)
    assert browser.session.get("_auth_user_id") != str(root.pk)
    minted = browser.post("/accounts/2fa/recovery-codes")
    codes = re.findall(r"<code>([0-9a-f]{6}-[0-9a-f]{6})</code>", minted.content.decode())
    if codes:
        browser.post("/accounts/2fa/", {"code": codes[0]})
    suspended = browser.post("/ops/tenants/globex/status", {"status": "suspended", "reason": "pwned"})
    world.globex.refresh_from_db()
    assert world.globex.status == TenantStatus.ACTIVE, (
        f"acme's owner, as staff root: /ops/tenants/globex/status -> {suspended.status_code}, globex "
        f"{world.globex.status}")


def test_sso_closed_tenant_takes_members_in_again_through_single_sign_on(world):
    """Was a DEFECT (mended in wave 20). docs/tenancy.md, Closure: every membership removed, every token revoked,
    "nobody can sign in to the closed tenant". ``tenant_close`` leaves the tenant's ``TenantSignIn`` on, and
    ``sso_member_sign_in`` checks neither ``closed_at`` nor the status: the provider's next sign-in makes a member
    of the closed tenant again."""
    sign_in_update(tenant=world.acme, by=None, changes={
        "sso_enabled": True, "issuer": "https://idp.acme.example", "client_id": "gpubroker", "client_secret": "x",
        "allowed_email_domains": ["acme.example"], "default_role": Role.ADMIN})
    offboarding.tenant_close(actor=Actor(user=world.owner, tenant=world.acme, role=Role.OWNER), confirm="acme")
    world.acme.refresh_from_db()
    assert world.acme.closed_at is not None and not Membership.objects.filter(tenant=world.acme).exists()

    sign_in = TenantSignIn.objects.get(tenant=world.acme)
    try:
        user = sso_member_sign_in(sign_in=sign_in, subject="carol-1", claims={
            "email": "carol@acme.example", "email_verified": True})
    except SsoRefused:
        user = None
    back = Membership.objects.filter(tenant=world.acme).values_list("user__username", "role")
    assert user is None and not back, f"the closed tenant has members again: {list(back)}"


def test_sso_group_roles_cannot_make_owners(world):
    """Was a DEFECT (low; mended in wave 20). docs/tenancy.md: a just-in-time member gets the role of their highest
    group in group_roles "(never owner: owners are made by owners)"; ``default_role`` refuses owner, but
    ``_validate_group_roles`` accepts ``{"group": "owner"}``, and ``sso_member_sign_in`` then makes owners (and
    promotes an existing admin to owner at each sign-in): the identity provider's group admins mint owners."""
    response = world.client("owner").patch("/api/v1/tenant/sign-in", {"group_roles": {"it-staff": "owner"}},
                                           format="json")
    assert response.status_code == 400 and response.json()["field"] == "group_roles", response.content


# =====================================================================================================
# Project-limited tokens and members writing outside their projects
# =====================================================================================================

def _split_applied_in_vision(world) -> int:
    gpus = [{"id": f"h{i}", "node": "n1", "model": "H100-80GB", "free_mib": 16000} for i in range(2)]
    created = world.client("member").post("/api/v1/model-splits", {"architecture": "llama-2-13b", "gpus": gpus},
                                          format="json")
    assert created.status_code == 201, created.content
    split = created.json()["id"]
    applied = world.client("member").post(f"/api/v1/model-splits/{split}/apply", {"project": "vision"},
                                          format="json")
    assert applied.status_code == 200 and applied.json()["project"] == "vision", applied.content
    return split


@pytest.mark.parametrize("how", ["api-token", "portal-member"])
def test_project_limited_actor_cannot_release_another_projects_model_split(world, notebooks, how):
    """Was a DEFECT (mended in wave 20). docs/tenancy.md, Scoped tokens and Members limited to projects: such an actor
    acts only inside its projects; another project's lease is 404 to it. ``pipelines.selectors.model_split_get``
    finds the split by tenant only (``ModelSplit`` has no ``project_lookup``) and ``model_split_release`` releases
    the split's lease group in project vision for a token limited to notebooks (API) or a member limited to
    notebooks (portal)."""
    split = _split_applied_in_vision(world)
    leases = list(Lease.objects.filter(group_key=f"model-split-{split}"))
    assert leases and {lease.project.slug for lease in leases} == {"vision"}
    if how == "api-token":
        secret = make_token(world.acme, world.member, projects=["notebooks"])[1]
        assert api_client(secret).delete(f"/api/v1/leases/{leases[0].pk}").status_code == 404  # the rule
        answer = api_client(secret).post(f"/api/v1/model-splits/{split}/release", {}, format="json")
        status = answer.status_code
    else:
        limited = make_user("lim")
        Membership.objects.create(user=limited, tenant=world.acme, role=Role.MEMBER, project_ids=[notebooks.pk])
        client = portal(limited)
        assert client.post(f"/leases/{leases[0].pk}/release").status_code == 404  # the rule
        client.post(f"/model-splits/{split}/release")
        status = None
    states = sorted(Lease.objects.filter(pk__in=[lease.pk for lease in leases]).values_list("state", flat=True))
    assert "released" not in states, f"vision's split leases {states} released by an actor limited to notebooks " \
                                     f"(HTTP {status})"


def test_project_limited_token_accepts_idle_reclaim_of_another_projects_lease(world, notebooks):
    """Was a DEFECT (mended in wave 20). ``capacity.services.decisions._may_decide`` lets any actor of the adjustment's
    tenant with ``release`` decide idle-reclaim advice, and ``capacity.selectors.adjustment_list`` filters by tenant
    only: a token limited to notebooks (which gets 404 on vision's lease) accepts the idle-reclaim release step of
    vision's lease, and the lease is released."""
    _node()
    lease = _active_lease(world, "vision")
    Lease.objects.filter(pk=lease.pk).update(notice_deadline=timezone.now() - timedelta(seconds=1))
    advice = Adjustment.objects.create(
        kind="idle_reclaim", target=f"lease:{lease.pk}", fingerprint=uuid.uuid4().hex, mode="advise",
        reason="idle", change={"lease": lease.pk, "step": "release"}, tenant=world.acme, project=world.project,
        lease=lease, tenant_ids=[world.acme.pk])
    secret = make_token(world.acme, world.member, projects=["notebooks"])[1]
    assert api_client(secret).delete(f"/api/v1/leases/{lease.pk}").status_code == 404  # the rule
    answer = api_client(secret).post(f"/api/v1/adjustments/{advice.pk}/accept")
    lease.refresh_from_db()
    assert answer.status_code == 404 and lease.state == "active", (
        f"HTTP {answer.status_code}: vision's lease is {lease.state} after a notebooks-only token accepted its "
        f"idle reclaim")


def test_project_limited_token_cannot_create_a_pipeline_in_another_project(world, notebooks):
    """Was a DEFECT (low; mended in wave 20). ``pipelines.services.pipeline_create`` looks the project up by tenant only
    (``Project.objects.filter(tenant=...)``, not ``restrict``): a token limited to notebooks writes a pipeline
    into vision (which it then cannot even read)."""
    secret = make_token(world.acme, world.member, projects=["notebooks"])[1]
    body = {"project": "vision", "name": "planted", "slo_ms": 60.0, "rate_rps": 20.0, "tiers": ["H100-80GB"],
            "stages": [{"name": "detect", "architecture": "resnet-50"}], "edges": []}
    answer = api_client(secret).post("/api/v1/pipelines", body, format="json")
    assert answer.status_code == 404 and answer.json()["field"] == "project", answer.content
    assert not Pipeline.objects.filter(name="planted").exists()


def test_project_limited_token_writes_no_profiling_run_in_another_project(world, notebooks):
    """Was a DEFECT (low; mended in wave 20). ``tiering.profiler.profiling_start`` checks the project by tenant only
    and commits the ``ProfilingRun`` (and its audit row) before ``lease_request`` refuses the project for the token:
    the answer is 404 on ``project``, yet a (failed) run of vision is written by a token limited to notebooks."""
    from tiering.models import ProfilingRun

    secret = make_token(world.acme, world.member, projects=["notebooks"])[1]
    client = api_client(secret)
    assert client.post("/api/v1/workloads", {"name": "w", "architecture": "resnet-50", "target_throughput": 10.0},
                       format="json").status_code == 201  # the tenant's workloads: not narrowed (documented)
    answer = client.post("/api/v1/workloads/w/profiling-runs", {"project": "vision", "slices": ["H100-80GB"]},
                         format="json")
    written = list(ProfilingRun.objects.values_list("project__slug", "state"))
    assert answer.status_code == 404 and not written, (answer.status_code, written)


def test_staff_members_project_limited_token_is_not_a_staff_credential(world):
    """Was a DEFECT (mended in wave 20). docs/tenancy.md: a project-limited token "may do only what stays inside a
    project ... never act on the tenant as a whole"; the staff API takes a staff member's own tokens.
    ``StaffOrTenantPermission`` checks the read scope but not ``token_project_scoped``, so a staff member's token
    limited to acme's project vision (say, a CI job's) suspends another tenant."""
    ops = make_user("ops", is_staff=True)
    Membership.objects.create(user=ops, tenant=world.acme, role=Role.ADMIN)
    secret = make_token(world.acme, ops, projects=["vision"])[1]
    answer = api_client(secret).put("/api/v1/tenants/globex/status", {"status": "suspended", "reason": "ci"},
                                    format="json")
    world.globex.refresh_from_db()
    assert answer.status_code == 403 and world.globex.status == TenantStatus.ACTIVE, (
        f"HTTP {answer.status_code}: globex is {world.globex.status}")


# =====================================================================================================
# The second factor and the interactive proxy
# =====================================================================================================

def test_password_alone_cannot_mint_recovery_codes_and_pass_the_second_factor(db):
    """Was a DEFECT (critical; mended in wave 20). docs/tenancy.md: staff always need the second factor; after the
    password a session that has not passed it "reaches only /accounts/2fa/… and sign-out".
    ``portal.otp.RecoveryCodesView`` (POST ``/accounts/2fa/recovery-codes``) is under that exempt prefix and needs
    only a signed-in session (``LoginRequiredMixin``), and ``tenants.otp.recovery_codes_regenerate`` only checks
    that a device exists: with the password alone, a browser (CSRF checks on) has ten fresh recovery codes shown,
    spends one at ``/accounts/2fa/`` and is a staff session on the ops pages — the phone never used, the owner's
    codes voided."""
    import re

    import pyotp

    make_user("root", is_staff=True)
    owner = Client()
    assert owner.post("/accounts/login/", {"username": "root", "password": "pw-root"}).status_code == 302
    secret = re.search(rb'id="totp-secret">([A-Z2-7]+)<', owner.get("/accounts/2fa/setup").content).group(1)
    assert owner.post("/accounts/2fa/setup", {"code": pyotp.TOTP(secret.decode()).now()}).status_code == 200

    thief = Client(enforce_csrf_checks=True)  # knows the password, not the phone
    form = thief.get("/accounts/login/")
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', form.content).group(1).decode()
    assert thief.post("/accounts/login/", {"username": "root", "password": "pw-root",
                                           "csrfmiddlewaretoken": token}).status_code == 302
    assert thief.get("/ops/fleet")["Location"].startswith("/accounts/2fa/")  # the gate, as documented
    page = thief.get("/accounts/2fa/")
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page.content).group(1).decode()
    minted = thief.post("/accounts/2fa/recovery-codes", {"csrfmiddlewaretoken": token})
    codes = re.findall(r"<code>([0-9a-f]{6}-[0-9a-f]{6})</code>", minted.content.decode())
    if codes:
        thief.post("/accounts/2fa/", {"code": codes[0], "csrfmiddlewaretoken": token})
    fleet = thief.get("/ops/fleet")
    assert not codes and fleet.status_code != 200, (
        f"password only: POST /accounts/2fa/recovery-codes -> {minted.status_code} with {len(codes)} codes; "
        f"after spending one, GET /ops/fleet -> {fleet.status_code}")


def test_interactive_proxy_refuses_a_session_that_has_not_passed_the_second_factor(world, monkeypatch):
    """Was a DEFECT (mended in wave 20). docs/tenancy.md: a session that has not passed the second factor "reaches only
    /accounts/2fa/… and sign-out; the API answers such a session 403 second_factor_required".
    ``broker.interactive_proxy.authorize`` loads the session cookie and its user itself (no Django middleware runs
    there) and never asks ``tenants.otp.second_factor_passed``: with the password alone, the session reaches the
    lease's workload port (a notebook: code run on the tenant's lease)."""
    from broker import interactive_proxy
    from tenants.otp import SESSION_KEY

    node = _node()
    lease = _active_lease(world, "vision")
    Workload.objects.create(lease=lease, spec={"command": ["jupyter"], "port": 8888}, state="running", node=node,
                            agent_workload_id=f"lease-{lease.pk}-p1", placements=1)
    sign_in_update(tenant=world.acme, by=None, changes={"totp_required": True})

    browser = portal(world.member)  # then: the password passed, the second factor not
    session = browser.session
    del session[SESSION_KEY]
    session.save()
    api = browser.get("/api/v1/leases")
    assert api.status_code == 403 and api.json()["code"] == "second_factor_required"  # the rule, on the API

    monkeypatch.setattr("django.db.close_old_connections", lambda: None)  # keep the test's transaction
    cookie = {settings.SESSION_COOKIE_NAME: browser.cookies[settings.SESSION_COOKIE_NAME].value}
    try:
        target, _session = interactive_proxy.authorize(lease_id=lease.pk, authorization="", cookies=cookie,
                                                       remote_addr="127.0.0.1")
        outcome = f"relayed to {target['agent_url']} workload {target['agent_workload_id']}"
    except interactive_proxy.Refused as refused:
        outcome = refused.code
    assert outcome in ("second_factor_required", "not_authenticated", "permission_denied"), outcome


# =====================================================================================================
# Invitations
# =====================================================================================================

def test_invitation_to_a_suspended_tenant_is_not_accepted(world):
    """Was a DEFECT (low; mended in wave 20). docs/tenancy.md, Suspension: "nothing new: ... no projects, roles or
    invitations"; tenants/access.py: a suspended tenant "can start nothing that ... grants access".
    ``invitation_decide`` refuses a closed tenant only: an invitation made before the suspension is accepted while
    it lasts (portal ``/invitations/<id>/accept``; a user without a tenant has no token for the API's route)."""
    nora = make_user("nora")
    invitation = services.membership_invite(actor=Actor(user=world.admin, tenant=world.acme, role=Role.ADMIN),
                                            username="nora", role=Role.MEMBER)
    services.tenant_set_status(tenant=world.acme, status=TenantStatus.SUSPENDED, reason="unpaid")
    portal(nora).post(f"/invitations/{invitation.pk}/accept")
    invitation.refresh_from_db()
    assert not Membership.objects.filter(user=nora, tenant=world.acme).exists(), (
        f"nora joined the suspended tenant (invitation {invitation.state})")


def test_a_removed_owners_pending_owner_invitation_no_longer_makes_an_owner(world):
    """Was a DEFECT (low; mended in wave 20). docs/tenancy.md: "Removing a member revokes their tokens in the same
    transaction"; only owners invite owners. The invitations a member issued are delegated access of the same kind,
    but ``membership_remove`` (and a demotion by ``membership_change_role``) leaves them pending: an owner removed
    from the tenant (or demoted) still makes an owner of whoever holds the invited username (e.g. an account they
    control, created later)."""
    second = make_user("olga")
    Membership.objects.create(user=second, tenant=world.acme, role=Role.OWNER)
    alice = Actor(user=world.owner, tenant=world.acme, role=Role.OWNER)
    invitation = services.membership_invite(actor=alice, username="mallory", role=Role.OWNER)
    olga = Actor(user=second, tenant=world.acme, role=Role.OWNER)
    services.membership_remove(actor=olga, membership=Membership.objects.get(user=world.owner, tenant=world.acme))
    mallory = make_user("mallory")
    with contextlib.suppress(ApplicationError):  # any refusal is the rule holding
        services.invitation_decide(user=mallory, invitation=invitation, accept=True)
    made = Membership.objects.filter(user=mallory, tenant=world.acme).values_list("role", flat=True).first()
    assert made is None, f"alice was removed, yet her invitation made mallory a{'n' if made == 'owner' else ''} {made}"


# =====================================================================================================
# Defences that hold (cases no other test covers)
# =====================================================================================================

def test_admin_cannot_demote_remove_or_uninvite_an_owner_even_when_another_owner_remains(world):
    """Holds. tests/tenants/test_roles.py covers an admin *granting* ownership and the *last* owner; here there are
    two owners, so the last-owner rule does not stop anything and only ``own`` does: an admin's PATCH to demote
    an owner, DELETE of an owner's membership (API and portal), and revoking an owner's pending invitation are
    refused (403; the portal's revoke says why on the members page), and nothing changes."""
    second = make_user("olga")
    owner_two = Membership.objects.create(user=second, tenant=world.acme, role=Role.OWNER)
    invite = services.membership_invite(actor=Actor(user=world.owner, tenant=world.acme, role=Role.OWNER),
                                        username="oscar", role=Role.OWNER)
    admin = world.client("admin")
    assert admin.patch(f"/api/v1/members/{owner_two.pk}", {"role": "viewer"}, format="json").status_code == 403
    assert admin.delete(f"/api/v1/members/{owner_two.pk}").status_code == 403
    assert admin.delete(f"/api/v1/tenant/invitations/{invite.pk}").status_code == 403
    ann = portal(world.admin)
    assert ann.post(f"/settings/members/{owner_two.pk}/role", {"role": "member"}).status_code == 403
    assert ann.post(f"/settings/members/{owner_two.pk}/remove").status_code == 403
    refused = ann.post(f"/settings/members/invitations/{invite.pk}/revoke", follow=True)  # the message, no change
    assert "does not allow this" in refused.content.decode()
    owner_two.refresh_from_db()
    invite.refresh_from_db()
    assert owner_two.role == Role.OWNER and invite.state == Invitation.State.PENDING


def test_suspended_tenant_starts_no_work_through_pipelines_splits_workloads_or_webhooks(world):
    """Holds. tests/tenants/test_suspension.py covers leases, renewals and tokens; the other paths that make leases
    or grant something (a pipeline, a model split and its apply, a workload, a webhook, a spend cap) are refused
    403 tenant_suspended too."""
    gpus = [{"id": "h0", "node": "n1", "model": "H100-80GB", "free_mib": 16000}]
    split = world.client("member").post("/api/v1/model-splits", {"architecture": "bert-base", "gpus": gpus},
                                        format="json").json()["id"]
    services.tenant_set_status(tenant=world.acme, status=TenantStatus.SUSPENDED, reason="unpaid")
    member, owner = world.client("member"), world.client("owner")
    attempts = {
        "pipeline": member.post("/api/v1/pipelines", {
            "project": "vision", "name": "p", "slo_ms": 60.0, "rate_rps": 1.0, "tiers": ["H100-80GB"],
            "stages": [{"name": "a", "architecture": "resnet-50"}], "edges": []}, format="json"),
        "split": member.post("/api/v1/model-splits", {"architecture": "bert-base", "gpus": gpus}, format="json"),
        "split apply": member.post(f"/api/v1/model-splits/{split}/apply", {"project": "vision"}, format="json"),
        "workload": member.post("/api/v1/workloads", {"name": "w", "architecture": "resnet-50",
                                                      "target_throughput": 10.0}, format="json"),
        "webhook": owner.post("/api/v1/webhooks", {"url": "https://hooks.example.com/x",
                                                   "event_types": ["lease.notice"]}, format="json"),
        "spend cap": owner.post("/api/v1/spend-caps", {"monthly_minor": 100}, format="json"),
    }
    refused = {name: (r.status_code, r.json().get("code")) for name, r in attempts.items()}
    assert all(answer == (403, "tenant_suspended") for answer in refused.values()), refused
    assert not Lease.objects.filter(tenant=world.acme).exists()


@pytest.mark.parametrize(("path", "method", "body", "field"), [
    ("/api/v1/leases", "post", {"project": "vision", "gpu": {"kind": "mig", "profile": "1g.10gb"},
                                "tenant": "globex"}, "tenant"),
    ("/api/v1/leases", "post", {"project": "vision", "gpu": {"kind": "mig", "profile": "1g.10gb"},
                                "state": "active"}, "state"),
    ("/api/v1/leases", "post", {"project": "vision", "gpu": {"kind": "mig", "profile": "1g.10gb"},
                                "access_extra": {"x": 1}}, "access_extra"),
    ("/api/v1/leases", "post", {"project": "vision", "gpu": {"kind": "mig", "profile": "1g.10gb"},
                                "profiling": True}, "profiling"),
    ("/api/v1/tokens", "post", {"name": "t", "scopes": ["read"], "user": 1}, "user"),
    ("/api/v1/tokens", "post", {"name": "t", "scopes": ["read"], "tenant": "globex"}, "tenant"),
    ("/api/v1/members/{member}", "patch", {"role": "member", "user": 1}, "user"),
    ("/api/v1/members/{member}", "patch", {"tenant": "globex"}, "tenant"),
    ("/api/v1/tenant/invitations", "post", {"username": "zed", "role": "viewer", "state": "accepted"}, "state"),
    ("/api/v1/tenant", "patch", {"status": "active"}, "status"),
    ("/api/v1/tenant", "patch", {"slug": "globex"}, "slug"),
    ("/api/v1/projects/vision", "patch", {"status": "active"}, "status"),
    ("/api/v1/projects/vision", "patch", {"tenant": "globex"}, "tenant"),
    ("/api/v1/spend-caps", "post", {"monthly_minor": 100, "tenant": "globex"}, "tenant"),
    ("/api/v1/webhooks", "post", {"url": "https://hooks.example.com/x", "event_types": ["lease.notice"],
                                  "secret": "mine"}, "secret"),
])
def test_server_set_fields_are_refused_not_assigned(world, path, method, body, field):
    """Holds (mass assignment). Every tenant-facing write parses a ``StrictSerializer``: a field the server sets
    (tenant, state, status, slug, the signing secret, the apps' lease fields) is 400 naming it, nothing written.
    tests/broker/test_lease_input.py covers ``group`` on a lease; these are the others."""
    member_pk = Membership.objects.get(user=world.member).pk
    before = (Lease.objects.count(), Invitation.objects.count(), world.acme.slug)
    response = getattr(world.client("owner"), method)(path.format(member=member_pk), body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json().get("errors", {}) or response.json().get("field") == field, response.json()
    world.acme.refresh_from_db()
    assert (Lease.objects.count(), Invitation.objects.count(), world.acme.slug) == before
