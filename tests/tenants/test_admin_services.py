"""The Django admin writes through ``tenants.services`` (docs/tour.md: "writing through the same services"): each
change made there leaves the service's audit event in the staff user's name, keeps the service's rules (the
last owner stays), and a refusal is a message or a form error — nothing of it saved, never a 500. Bulk
"delete selected" is gone, and what no service writes is read-only.

Committed transactions (``transactional_db``), as in production: the services' durable transactions must not
run inside one of the admin's own."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from broker import services as broker
from tenants import services
from tenants.access import Actor
from tenants.choices import Role
from tenants.models import ApiToken, AuditEvent, Membership, Project, Quota, SloContract, Tenant, TenantQuota
from tests.factories import make_user, make_world


@pytest.fixture
def world(transactional_db):
    return make_world()


@pytest.fixture
def staff(world) -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-root")
    client = Client()
    client.force_login(user)
    client.user = user
    return client


def shown(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def audited(action: str, target: str, staff: Client) -> bool:
    return AuditEvent.objects.filter(action=action, target=target, actor=staff.user).exists()


def page_data(client: Client, url: str) -> dict:
    """The change form as the page fills it in, its inlines included: what a save without edits posts."""
    response = client.get(url)
    assert response.status_code == 200, response.status_code
    data: dict = {}

    def add(form) -> None:
        for name, field in form.fields.items():
            value = form[name].value()
            if field.disabled or value is None or value is False:
                continue
            data[form.add_prefix(name)] = "on" if value is True else str(value)

    add(response.context["adminform"].form)
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        data.update({f"{formset.prefix}-{name}": value for name, value in formset.management_form.initial.items()})
        for form in formset.initial_forms:
            add(form)
    return data


def row(data: dict, prefix: str, membership: Membership) -> str:
    """The inline row prefix of ``membership`` in ``data``."""
    return next(key.removesuffix("-id") for key, value in data.items()
                if key.startswith(prefix) and key.endswith("-id") and value == str(membership.pk))


def no_bulk_delete(client: Client, changelist: str) -> bool:
    return "delete_selected" not in client.get(changelist).content.decode()


# -- tenants ---------------------------------------------------------------------------------------------------
def test_admin_tenant_create_rename_suspend_through_the_services(world, staff):
    empty = {f"{prefix}-{name}": "0" for prefix in ("memberships", "tenant_quotas")
             for name in ("TOTAL_FORMS", "INITIAL_FORMS", "MIN_NUM_FORMS")}
    response = staff.post("/admin/tenants/tenant/add/", {
        **empty, "name": "Initech", "slug": "initech", "billing_email": "ap@initech.example", "currency": "EUR",
        "memberships-TOTAL_FORMS": "1", "memberships-0-user": str(world.owner.pk), "memberships-0-role": "owner"})
    assert response.status_code == 302, response.content[:2000]
    tenant = Tenant.objects.get(slug="initech")
    assert (tenant.status, tenant.currency) == ("active", "EUR")
    assert audited("tenant.create", "initech", staff)
    assert audited("member.add", world.owner.get_username(), staff)
    assert Membership.objects.get(tenant=tenant).role == Role.OWNER

    url = f"/admin/tenants/tenant/{tenant.pk}/change/"
    data = page_data(staff, url)
    assert "slug" not in data and "currency" not in data  # read-only once created
    response = staff.post(url, {**data, "name": "Initech Ltd", "status": "suspended"})
    assert response.status_code == 302
    tenant.refresh_from_db()
    assert (tenant.name, tenant.status) == ("Initech Ltd", "suspended")
    assert AuditEvent.objects.get(action="tenant.update", target="initech").data == {"fields": ["name"]}
    assert audited("tenant.suspended", "initech", staff)
    # a suspended tenant's details do not change (the service's rule): said on the page, nothing saved
    response = staff.post(url, {**page_data(staff, url), "name": "Renamed"}, follow=True)
    assert response.status_code == 200
    assert any(note.startswith("Not saved — Tenant 'initech' is suspended") for note in shown(response))
    assert Tenant.objects.get(pk=tenant.pk).name == "Initech Ltd"
    # reactivated and renamed in one save: reactivation first
    response = staff.post(url, {**page_data(staff, url), "name": "Initech", "status": "active"})
    assert response.status_code == 302
    assert Tenant.objects.get(pk=tenant.pk).name == "Initech" and audited("tenant.active", "initech", staff)

    assert staff.get(f"/admin/tenants/tenant/{tenant.pk}/delete/").status_code == 403
    assert no_bulk_delete(staff, "/admin/tenants/tenant/")


def test_admin_tenant_actions_report_each_tenant(world, staff):
    response = staff.post("/admin/tenants/tenant/", {"action": "suspend", "_selected_action": [world.acme.pk]},
                          follow=True)
    assert "1 suspended." in shown(response)
    assert Tenant.objects.get(pk=world.acme.pk).status == "suspended" and audited("tenant.suspended", "acme", staff)


# -- memberships: the last owner stays -----------------------------------------------------------------------
def test_admin_membership_page_cannot_demote_or_remove_the_last_owner(world, staff):
    owner = Membership.objects.get(user=world.owner, tenant=world.acme)
    url = f"/admin/tenants/membership/{owner.pk}/change/"
    response = staff.post(url, {"role": "admin"}, follow=True)
    assert response.status_code == 200
    assert "Not saved — role: A tenant must keep at least one owner." in shown(response)
    response = staff.post(f"/admin/tenants/membership/{owner.pk}/delete/", {"post": "yes"}, follow=True)
    assert response.status_code == 200
    assert "Not saved — role: A tenant must keep at least one owner." in shown(response)
    assert Membership.objects.get(pk=owner.pk).role == Role.OWNER
    assert not AuditEvent.objects.filter(action__in=("member.role", "member.remove")).exists()
    assert no_bulk_delete(staff, "/admin/tenants/membership/")


def test_admin_membership_page_add_change_remove_are_audited(world, staff):
    newcomer = make_user("nora")
    response = staff.post("/admin/tenants/membership/add/", {"user": newcomer.pk, "tenant": world.acme.pk,
                                                              "role": "viewer"})
    assert response.status_code == 302
    membership = Membership.objects.get(user=newcomer)
    assert audited("member.add", "nora", staff)
    response = staff.post(f"/admin/tenants/membership/{membership.pk}/change/",
                          {"role": "member", "user": world.owner.pk})  # the user is read-only: ignored
    assert response.status_code == 302
    membership.refresh_from_db()
    assert (membership.role, membership.user_id) == (Role.MEMBER, newcomer.pk)
    assert AuditEvent.objects.get(action="member.role", target=str(newcomer.pk)).data == {"old": "viewer",
                                                                                          "new": "member"}
    token, _ = services.api_token_create(actor=Actor(user=newcomer, tenant=world.acme, role=Role.MEMBER),
                                         name="t", scopes=["read"])
    assert staff.post(f"/admin/tenants/membership/{membership.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not Membership.objects.filter(pk=membership.pk).exists() and audited("member.remove", str(newcomer.pk),
                                                                                staff)
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None  # as the service does


def test_admin_tenant_inline_keeps_an_owner_and_hands_ownership_over(world, staff):
    url = f"/admin/tenants/tenant/{world.acme.pk}/change/"
    owner = Membership.objects.get(user=world.owner, tenant=world.acme)
    admin = Membership.objects.get(user=world.admin, tenant=world.acme)
    data = page_data(staff, url)
    for edit in ({f"{row(data, 'memberships', owner)}-role": "admin"},
                 {f"{row(data, 'memberships', owner)}-DELETE": "on"}):
        response = staff.post(url, {**data, **edit})
        assert response.status_code == 200  # the form again, with the rule next to the rows
        assert "A tenant must keep at least one owner." in response.content.decode()
        assert Membership.objects.get(pk=owner.pk).role == Role.OWNER
    # promote ann and step alice down in one save: the grant goes first, so the tenant always has an owner
    response = staff.post(url, {**data, f"{row(data, 'memberships', admin)}-role": "owner",
                                f"{row(data, 'memberships', owner)}-role": "member"})
    assert response.status_code == 302, response.content[:3000]
    assert Membership.objects.get(pk=admin.pk).role == Role.OWNER
    assert Membership.objects.get(pk=owner.pk).role == Role.MEMBER
    assert AuditEvent.objects.filter(action="member.role", actor=staff.user).count() == 2
    # add one and remove one inline: each through its service
    data = page_data(staff, url)
    newcomer = make_user("nora")
    total = int(data["memberships-TOTAL_FORMS"])
    member = Membership.objects.get(user=world.member, tenant=world.acme)
    response = staff.post(url, {**data, "memberships-TOTAL_FORMS": str(total + 1),
                                f"memberships-{total}-user": str(newcomer.pk), f"memberships-{total}-role": "viewer",
                                f"{row(data, 'memberships', member)}-DELETE": "on"})
    assert response.status_code == 302
    assert audited("member.add", "nora", staff) and audited("member.remove", str(world.member.pk), staff)
    assert not Membership.objects.filter(pk=member.pk).exists()
    assert not ApiToken.objects.filter(user=world.member, revoked_at__isnull=True).exists()


# -- projects ------------------------------------------------------------------------------------------------
def test_admin_project_create_rename_delete_through_the_services(world, staff):
    empty = {f"quotas-{name}": "0" for name in ("TOTAL_FORMS", "INITIAL_FORMS", "MIN_NUM_FORMS")}
    response = staff.post("/admin/tenants/project/add/", {**empty, "tenant": world.acme.pk, "slug": "speech",
                                                          "name": "Speech"})
    assert response.status_code == 302
    project = Project.objects.get(slug="speech")
    assert audited("project.create", "speech", staff)
    response = staff.post("/admin/tenants/project/add/", {**empty, "tenant": world.acme.pk, "slug": "speech",
                                                          "name": "Again"})
    assert response.status_code == 200 and Project.objects.filter(slug="speech").count() == 1  # taken: form error
    url = f"/admin/tenants/project/{project.pk}/change/"
    assert staff.post(url, {**page_data(staff, url), "name": "Speech AI"}).status_code == 302
    assert Project.objects.get(pk=project.pk).name == "Speech AI" and audited("project.update", "speech", staff)
    assert staff.post(f"/admin/tenants/project/{project.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not Project.objects.filter(pk=project.pk).exists() and audited("project.delete", "speech", staff)
    assert no_bulk_delete(staff, "/admin/tenants/project/")


# -- API tokens ----------------------------------------------------------------------------------------------
def test_admin_tokens_are_read_only_and_revoked_by_an_audited_action(world, staff):
    token = ApiToken.objects.filter(user=world.member).get()
    assert staff.get("/admin/tenants/apitoken/add/").status_code == 403  # the secret is its member's
    url = f"/admin/tenants/apitoken/{token.pk}/change/"
    page = staff.get(url)
    assert page.status_code == 200 and b'name="_save"' not in page.content
    staff.post(url, {"name": "renamed", "scopes": "read", "revoked_at_0": "2026-01-01", "revoked_at_1": "00:00"})
    token.refresh_from_db()
    assert (token.name, token.revoked_at) == ("test", None)
    assert staff.get(f"/admin/tenants/apitoken/{token.pk}/delete/").status_code == 403
    assert no_bulk_delete(staff, "/admin/tenants/apitoken/")

    response = staff.post("/admin/tenants/apitoken/", {"action": "revoke", "_selected_action": [token.pk]},
                          follow=True)
    assert "1 revoked." in shown(response)
    token.refresh_from_db()
    assert token.revoked_at is not None and audited("token.revoke", token.prefix, staff)
    # revoking again changes nothing and writes no second event (the service is idempotent)
    staff.post("/admin/tenants/apitoken/", {"action": "revoke", "_selected_action": [token.pk]})
    assert AuditEvent.objects.filter(action="token.revoke", target=token.prefix).count() == 1
    # the token no longer authenticates
    assert world.client("member").get("/api/v1/leases").status_code == 401


# -- quotas ----------------------------------------------------------------------------------------------------
def test_admin_quota_refusal_is_a_message_and_success_is_audited(world, staff):
    bound = TenantQuota.objects.get(tenant=world.acme, tier="H100-80GB")  # 4000 / 8000; vision holds 1000
    url = f"/admin/tenants/tenantquota/{bound.pk}/change/"
    response = staff.post(url, {"deserved_gpu_milli": "500", "limit_gpu_milli": "8000"}, follow=True)
    assert response.status_code == 200
    assert any(note.startswith("Not saved — deserved_gpu_milli: Projects of 'acme' already hold 1000")
               for note in shown(response))
    assert TenantQuota.objects.get(pk=bound.pk).deserved_gpu_milli == 4000
    assert staff.post(url, {"deserved_gpu_milli": "3000", "limit_gpu_milli": "8000"}).status_code == 302
    assert TenantQuota.objects.get(pk=bound.pk).deserved_gpu_milli == 3000
    assert AuditEvent.objects.filter(action="tenant_quota.set", target="H100-80GB", actor=staff.user).exists()
    quota = Quota.objects.get(project=world.project)
    response = staff.post(f"/admin/tenants/quota/{quota.pk}/change/",
                          {"deserved_gpu_milli": "2000", "limit_gpu_milli": "2000", "over_quota_weight": "2"})
    assert response.status_code == 302 and Quota.objects.get(pk=quota.pk).over_quota_weight == 2
    assert audited("quota.set", "vision/H100-80GB", staff)
    for path in (f"/admin/tenants/tenantquota/{bound.pk}/delete/", f"/admin/tenants/quota/{quota.pk}/delete/"):
        assert staff.get(path).status_code == 403


# -- SLO contracts -------------------------------------------------------------------------------------------
def slo_form(world, **values) -> dict:
    form = {"tenant": world.acme.pk, "name": "gold", "effective_from_0": "2026-01-01", "effective_from_1": "00:00:00",
            "effective_to_0": "", "effective_to_1": "", "time_to_gpu_p95_seconds": "600",
            "availability_target_pct": "99.5", "preemption_notice_seconds": "120", "max_credit_pct": "50",
            "credit_steps-TOTAL_FORMS": "1", "credit_steps-INITIAL_FORMS": "0", "credit_steps-MIN_NUM_FORMS": "0",
            "credit_steps-0-metric": "availability", "credit_steps-0-threshold": "99",
            "credit_steps-0-credit_pct": "10"}
    return {**form, **values}


def test_admin_slo_contract_saved_with_its_steps_through_the_service(world, staff):
    response = staff.post("/admin/tenants/slocontract/add/", slo_form(world))
    assert response.status_code == 302, response.content[:3000]
    contract = SloContract.objects.get(tenant=world.acme)
    assert contract.effective_from == datetime(2026, 1, 1, tzinfo=UTC) and contract.preemption_notice_seconds == 120
    assert [(s.metric, str(s.credit_pct)) for s in contract.credit_steps.all()] == [("availability", "10.00")]
    assert audited("slo_contract.create", "gold", staff)
    # another contract over the same period: the form already checks the database's exclusion constraint (the
    # service checks it again): a form error, nothing saved
    response = staff.post("/admin/tenants/slocontract/add/", slo_form(world, name="silver"))
    assert response.status_code == 200 and SloContract.objects.count() == 1
    errors = str(response.context["adminform"].form.non_field_errors())
    assert "overlaps another SLO contract of this tenant" in errors  # in the staff's words
    assert "slocontract_no_overlap_per_tenant" not in errors  # not the constraint's name
    # a step over 100 % on a percentage metric: refused on the form (the constraint the service also checks)
    step = contract.credit_steps.get()
    url = f"/admin/tenants/slocontract/{contract.pk}/change/"
    bad = slo_form(world, **{"credit_steps-INITIAL_FORMS": "1", "credit_steps-0-id": str(step.pk),
                             "credit_steps-0-contract": str(contract.pk), "credit_steps-0-threshold": "150"})
    response = staff.post(url, bad)
    assert response.status_code == 200 and "slocreditstep_pct_threshold_range" in response.content.decode()
    assert [str(s.threshold) for s in contract.credit_steps.all()] == ["99.000"]
    # the steps and the contract replaced together
    edit = slo_form(world, **{"credit_steps-INITIAL_FORMS": "1", "credit_steps-0-id": str(step.pk),
                              "credit_steps-0-contract": str(contract.pk), "credit_steps-0-credit_pct": "100",
                              "credit_steps-0-threshold": "98", "preemption_notice_seconds": "300"})
    response = staff.post(url, edit)
    assert response.status_code == 302, response.content[:3000]
    contract.refresh_from_db()
    assert contract.preemption_notice_seconds == 300
    assert [str(s.threshold) for s in contract.credit_steps.all()] == ["98.000"]
    assert audited("slo_contract.update", "gold", staff)
    assert staff.get(f"/admin/tenants/slocontract/{contract.pk}/delete/").status_code == 403
    assert no_bulk_delete(staff, "/admin/tenants/slocontract/")


def test_admin_audit_log_stays_read_only(world, staff):
    event = AuditEvent.objects.first()
    assert staff.get("/admin/tenants/auditevent/add/").status_code == 403
    assert staff.get(f"/admin/tenants/auditevent/{event.pk}/delete/").status_code == 403


def test_admin_project_with_a_lease_is_not_deleted(world, staff):
    """A project its leases name stays (the service's 409 in the API): the admin's confirmation page lists the
    lease as protected and a confirmation posted anyway gets the same page: no service runs."""
    broker.lease_request(actor=Actor(user=world.member, tenant=world.acme, role=Role.MEMBER), project="vision",
                          gpu={"kind": "mig", "profile": "1g.10gb"})
    url = f"/admin/tenants/project/{world.project.pk}/delete/"
    assert "<title>Cannot delete project" in staff.get(url).content.decode()
    refused = staff.post(url, {"post": "yes"})
    assert refused.status_code == 200 and "<title>Cannot delete project" in refused.content.decode()
    assert Project.objects.filter(pk=world.project.pk).exists()
    assert not AuditEvent.objects.filter(action="project.delete").exists()


# -- cohorts, a tenant's cohort and limits, a project's pools, a contract's minimum runtime (issue 32 item 7) -------
def test_admin_cohort_and_tenant_membership_through_the_services(world, staff):
    from broker.models import Node
    from tenants.models import Cohort

    response = staff.post("/admin/tenants/cohort/add/", {"name": "research", "description": "labs"})
    assert response.status_code == 302, response.content[:2000]
    cohort = Cohort.objects.get(name="research")
    assert audited("cohort.create", "research", staff)
    assert no_bulk_delete(staff, "/admin/tenants/cohort/")

    url = f"/admin/tenants/tenant/{world.acme.pk}/change/"
    response = staff.post(url, {**page_data(staff, url), "cohort": str(cohort.pk)})
    assert response.status_code == 302
    assert Tenant.objects.get(pk=world.acme.pk).cohort_id == cohort.pk
    assert AuditEvent.objects.get(action="tenant.cohort_set", target="acme").data == {"from": None, "to": "research"}
    assert "acme" in staff.get(f"/admin/tenants/cohort/{cohort.pk}/change/").content.decode()

    Node.objects.create(node_id="n1", address="http://127.0.0.1:1", secret="s", pool="west")
    url = f"/admin/tenants/project/{world.project.pk}/change/"
    response = staff.post(url, {**page_data(staff, url), "pools": "west"})
    assert response.status_code == 302
    world.project.refresh_from_db()
    assert world.project.pools == ["west"]
    response = staff.post(url, {**page_data(staff, url), "pools": "north"}, follow=True)
    assert any("No node pool" in message for message in shown(response))
    world.project.refresh_from_db()
    assert world.project.pools == ["west"]
