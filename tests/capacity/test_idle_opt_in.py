"""A project's opt-in to idle reclaim of its interactive leases (issue 30): set and cleared by the project's
admins and owners (a member is refused, another tenant's project is not found), audited; the loop reclaims an
opted-in project's idle interactive lease automatically and only proposes it for the others; a staff policy of the
project's scope that sets idle reclaim still wins. The GET states the rule, the notice and the saving estimated
from the last seven days' metering ("no estimate" where nothing measured idleness)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from billing import services as billing
from billing.models import AllocationUsage, UtilisationUsage
from broker import services
from broker.models import Allocation
from capacity import selectors as capacity_selectors
from capacity import services as capacity_services
from capacity.models import Adjustment
from capacity.planner import Utilisation
from core.errors import PermissionDenied, ValidationFailed
from tenants.access import Actor
from tenants.choices import Role
from tenants.models import AuditEvent, Project
from tests.factories import make_project, make_quota, make_world

NOW = datetime.now(tz=UTC).replace(microsecond=0)
URL = "/api/v1/projects/{}/idle-reclaim"


@pytest.fixture
def world(db):
    return make_world()


def client(world, who: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {world.tokens[who]}")
    return api


def actor(world, role: Role = Role.ADMIN) -> Actor:
    user = {Role.OWNER: world.owner, Role.ADMIN: world.admin, Role.MEMBER: world.member}[role]
    return Actor(user=user, tenant=world.acme, role=role)


# -- the service -----------------------------------------------------------------------------------------------
def test_idle_opt_in_set_by_an_admin_audited_refused_to_a_member(world):
    with pytest.raises(PermissionDenied):
        capacity_services.idle_opt_in_set(actor=actor(world, Role.MEMBER), project=world.project, opt_in=True)
    with pytest.raises(ValidationFailed) as refused:
        capacity_services.idle_opt_in_set(actor=actor(world), project=world.project, opt_in="yes")
    assert refused.value.field == "opt_in"
    capacity_services.idle_opt_in_set(actor=actor(world), project=world.project, opt_in=True)
    capacity_services.idle_opt_in_set(actor=actor(world), project=world.project, opt_in=True)  # no change, no row
    assert Project.objects.get(pk=world.project.pk).idle_reclaim_opt_in is True
    [event] = AuditEvent.objects.filter(action="project.idle_reclaim_opt_in")
    assert event.tenant == world.acme and event.actor == world.admin and event.target == "vision"
    assert event.data["rule"] == {"enabled": True, "threshold_permille": 50, "window_seconds": 1800,
                                  "notice_seconds": 900} and event.data["mode"] == "auto"
    capacity_services.idle_opt_in_set(actor=actor(world, Role.OWNER), project=world.project, opt_in=False)
    assert AuditEvent.objects.filter(action="project.idle_reclaim_opt_out", actor=world.owner).count() == 1
    assert Project.objects.get(pk=world.project.pk).idle_reclaim_opt_in is False


def test_idle_opt_in_policies_in_force_staff_scope_wins(world):
    def mode() -> str:
        policy = capacity_selectors.project_policy(world.project.pk)
        return policy.idle_mode(capacity_selectors.ReclaimClass.INTERACTIVE).value

    assert mode() == "advise"
    capacity_services.idle_opt_in_set(actor=actor(world), project=world.project, opt_in=True)
    assert mode() == "auto"
    # a staff policy of the scope that does not set idle reclaim leaves the opt-in in force, with its rules
    capacity_services.policy_set(scope=f"project:{world.project.pk}",
                                 values={"idle_rules": {"interactive": {"notice_seconds": 120}}})
    assert mode() == "auto"
    shown = capacity_selectors.idle_opt_in_get(project=Project.objects.get(pk=world.project.pk))
    assert shown.rule.notice_seconds == 120 and shown.mode == "auto" and shown.staff_mode == ""
    # one that sets it wins, whichever way
    capacity_services.policy_set(scope=f"project:{world.project.pk}", values={"idle_reclaim": "advise"})
    assert mode() == "advise"
    shown = capacity_selectors.idle_opt_in_get(project=Project.objects.get(pk=world.project.pk))
    assert (shown.mode, shown.mode_opted_in, shown.staff_mode) == ("advise", "advise", "advise")
    assert "applies whatever you choose" in shown.notice
    # the platform's default off: nothing, opted in or not
    capacity_services.policy_set(scope=f"project:{world.project.pk}", values={"idle_reclaim": ""})
    capacity_services.policy_set(scope="", values={"idle_reclaim": "off"})
    assert mode() == "off"


# -- the loop --------------------------------------------------------------------------------------------------
def an_interactive_lease(world, project: str):
    actor_ = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease, _ = services.lease_request(actor=actor_, project=project, gpu={"kind": "whole", "model": "H100-80GB"},
                                      workload_class="interactive", now=NOW - timedelta(hours=2),
                                      duration_seconds=86400)
    return lease


def test_idle_opt_in_the_loop_reclaims_an_opted_in_projects_idle_interactive_lease_and_advises_the_other(
        world, monkeypatch):
    token = services.enrollment_token_create(uses=1, now=NOW - timedelta(hours=3))
    services.node_enroll(node_id="node-a", token=token, address="http://127.0.0.1:9/n/node-a",
                         now=NOW - timedelta(hours=3), inventory={"gpus": [
                             {"index": i, "uuid": f"GPU-{i}", "model": "H100-80GB", "mode": "whole",
                              "memory_mib": 81559} for i in range(2)]})
    notebooks = make_project(world.acme, "notebooks")
    make_quota(notebooks)
    opted = an_interactive_lease(world, "vision")
    other = an_interactive_lease(world, "notebooks")
    services.schedule_cycle(now=NOW - timedelta(hours=2))
    for allocation in Allocation.objects.filter(lease__in=[opted, other]):
        services.allocation_ready(allocation=allocation, instance={}, now=NOW - timedelta(hours=2))
    capacity_services.idle_opt_in_set(actor=actor(world), project=world.project, opt_in=True)
    # Prometheus stands in: both leases at 1 % engine activity for the last hour
    monkeypatch.setattr(capacity_selectors, "_utilisation", lambda now, leases, policies, notes: tuple(
        Utilisation(str(lease.pk), now.timestamp() - 3600, 60, (10,) * 60, (1000,) * 60)
        for lease in (opted, other)))
    capacity_services.policy_set(scope="", values={"mode_switch": "off", "mig_layout": "off", "warm_pool": "off",
                                                   "right_size": "off", "quota_advice": "off"})

    counts = capacity_services.plan_run(now=NOW)

    assert counts["applied"] == 1
    auto = Adjustment.objects.get(kind="idle_reclaim", lease=opted)
    assert (auto.mode, auto.state, auto.applied_by, auto.step) == ("auto", "applied", "capacity-loop", "notice")
    assert "opted in" in auto.reason
    opted.refresh_from_db()
    assert opted.notice_deadline == NOW + timedelta(seconds=900)  # the interactive rule's notice
    advice = Adjustment.objects.get(kind="idle_reclaim", lease=other)
    assert (advice.mode, advice.state) == ("advise", "proposed")
    other.refresh_from_db()
    assert other.notice_deadline is None


# -- the API ---------------------------------------------------------------------------------------------------
def test_idle_opt_in_api_reads_sets_refuses(world):
    got = client(world, "member").get(URL.format("vision"))
    assert got.status_code == 200, got.content
    body = got.json()
    assert body["opt_in"] is False and body["mode"] == "advise" and body["mode_opted_in"] == "auto"
    assert body["rule"] == {"enabled": True, "threshold_permille": 50, "window_seconds": 1800,
                            "notice_seconds": 900}
    assert body["staff_mode"] is None and "released" in body["notice"]
    assert body["estimate"] is None and body["estimate_note"].startswith("No estimate")

    refused = client(world, "member").put(URL.format("vision"), {"opt_in": True}, format="json")
    assert refused.status_code == 403 and refused["Content-Type"] == "application/problem+json"
    assert client(world, "viewer").put(URL.format("vision"), {"opt_in": True}, format="json").status_code == 403
    assert client(world, "admin").get(URL.format("secret")).status_code == 404  # globex's
    assert client(world, "admin").put(URL.format("secret"), {"opt_in": True}, format="json").status_code == 404
    # every field is optional (opt_in, suspend_opt_out): an empty body changes nothing (tests/capacity/test_suspend.py)
    assert client(world, "admin").put(URL.format("vision"), {}, format="json").json()["opt_in"] is False
    for bad in ({"opt_in": "yes"}, {"opt_in": True, "mode": "auto"}):
        response = client(world, "admin").put(URL.format("vision"), bad, format="json")
        assert response.status_code == 400 and response["Content-Type"] == "application/problem+json"
        assert response.json()["field"] in ("opt_in", "mode"), response.json()
    assert not Project.objects.get(pk=world.project.pk).idle_reclaim_opt_in

    done = client(world, "admin").put(URL.format("vision"), {"opt_in": True}, format="json")
    assert done.status_code == 200 and done.json()["opt_in"] is True and done.json()["mode"] == "auto"
    assert client(world, "owner").put(URL.format("vision"), {"opt_in": False}, format="json").json()["opt_in"] is False


def test_idle_opt_in_estimate_prices_the_idle_interactive_hours(world):
    billing.price_book_create(name="acme contract", currency="USD", tenant=world.acme,
                              effective_from=NOW - timedelta(days=30),
                              rates=[{"tier": "H100-80GB", "per_hour": "4.00"}], interactive_multiplier="1.25")
    actor_ = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease = services.lease_request(actor=actor_, project="vision", gpu={"kind": "whole", "model": "H100-80GB"},
                                   workload_class="interactive")[0]
    hour = NOW.replace(minute=0, second=0) - timedelta(hours=5)
    for index, (engine, klass) in enumerate([(Decimal("0.01"), "interactive"), (Decimal("0.02"), "interactive"),
                                             (Decimal("0.60"), "interactive"), (None, "interactive"),
                                             (Decimal("0.01"), "training")]):
        moment = hour + timedelta(hours=index)
        AllocationUsage.objects.create(tenant=world.acme, project=world.project, lease=lease, hour_start=moment,
                                       seconds=Decimal(3600), tier="H100-80GB", kind="whole", gpu_milli=1000,
                                       memory_mib=81559, workload_class=klass, over_quota=False,
                                       metered_at=timezone.now())
        if engine is not None:
            UtilisationUsage.objects.create(tenant=world.acme, lease=lease, hour_start=moment, engine_active_avg=engine,
                                            samples=60, metered_at=timezone.now())
    body = client(world, "viewer").get(URL.format("vision")).json()
    estimate = body["estimate"]
    assert estimate is not None, body["estimate_note"]
    # four interactive hours held, three measured, two under 5 %: 2 h x 4.00 x 1.25 (interactive) = 10.00 USD
    assert (estimate["interactive_gpu_hours"], estimate["measured_gpu_hours"], estimate["idle_gpu_hours"]) == (
        "4.000000", "3.000000", "2.000000")
    assert estimate["saving"] == {"minor": 1000, "currency": "USD", "formatted": estimate["saving"]["formatted"]}
    assert estimate["price_book"] == "acme contract" and "upper bound" in body["estimate_note"]


# -- the admin -------------------------------------------------------------------------------------------------
def test_idle_opt_in_is_shown_read_only_in_the_project_admin(world):
    from django.contrib.auth import get_user_model
    from django.test import Client

    staff = Client()
    staff.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw-root"))
    capacity_services.idle_opt_in_set(actor=actor(world), project=world.project, opt_in=True)
    listing = staff.get("/admin/tenants/project/?idle_reclaim_opt_in__exact=1")
    assert listing.status_code == 200 and "vision" in listing.content.decode()
    page = staff.get(f"/admin/tenants/project/{world.project.pk}/change/").content.decode()
    assert "Idle reclaim opt in" in page and 'name="idle_reclaim_opt_in"' not in page  # read-only: the tenant's


# -- the portal ------------------------------------------------------------------------------------------------
def test_idle_opt_in_portal_shows_the_notice_and_saving_before_the_choice_htmx(world):
    import re
    from html import unescape

    from django.test import Client

    def page_text(response) -> str:
        return " ".join(unescape(re.sub(r"<[^>]+>", " ", response.content.decode())).split())

    admin = Client(enforce_csrf_checks=True)
    assert admin.login(username="ann", password="pw-ann")
    page = admin.get("/settings/idle-reclaim")
    assert page.status_code == 200
    shown = page_text(page)
    assert "Vision vision" in shown and "not opted in · advise" in shown
    assert "gets a notice" in shown and "still idle 15 min later, it is released" in shown  # the notice, first
    assert "no estimate" in shown and "Secret" not in shown  # globex's project is not listed
    assert 'id="opt-in-vision"' in page.content.decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
    swapped = admin.post("/settings/idle-reclaim", {"csrfmiddlewaretoken": csrf, "project": "vision",
                                                    "opt_in": "true"}, HTTP_HX_REQUEST="true")
    assert swapped.status_code == 200
    card = swapped.content.decode()
    assert card.lstrip().startswith('<article class="project" id="idle-vision"') and 'data-opt-in="true"' in card
    assert "opted in · auto" in page_text(swapped) and 'id="opt-out-vision"' in card
    assert Project.objects.get(pk=world.project.pk).idle_reclaim_opt_in
    bad = admin.post("/settings/idle-reclaim", {"csrfmiddlewaretoken": csrf, "project": "vision", "opt_in": "maybe"},
                     HTTP_HX_REQUEST="true")
    assert bad.status_code == 400 and "opt_in must be true or false" in page_text(bad)
    plain = admin.post("/settings/idle-reclaim", {"csrfmiddlewaretoken": csrf, "project": "vision",
                                                  "opt_in": "false"})
    assert plain.status_code == 302 and plain["Location"].endswith("/settings/idle-reclaim#idle-vision")
    assert not Project.objects.get(pk=world.project.pk).idle_reclaim_opt_in
    assert admin.post("/settings/idle-reclaim", {"csrfmiddlewaretoken": csrf, "project": "secret",
                                                 "opt_in": "true"}).status_code == 404

    member = Client()
    assert member.login(username="max", password="pw-max")
    read = member.get("/settings/idle-reclaim")
    assert read.status_code == 200 and 'id="opt-in-vision"' not in read.content.decode()
    assert "Admins and owners choose" in page_text(read)
    assert member.post("/settings/idle-reclaim", {"project": "vision", "opt_in": "true"}).status_code == 403
    assert not Project.objects.get(pk=world.project.pk).idle_reclaim_opt_in
