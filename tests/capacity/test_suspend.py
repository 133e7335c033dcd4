"""Suspension of idle training that can resume (issue 30), in the service: which leases the loop's snapshot calls
resumable, the notice (the tenant's only: no SIGTERM yet), the suspension (PREEMPTED with the promised notice as
the checkpoint grace) and the requeue at its deadline ("suspended while idle: resumes when capacity frees"), and a
project's opt-out — service (audited, admins and owners), policies, API, portal and admin. End to end with a real
agent running the workload: tests/capacity/test_suspend_e2e.py."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from html import unescape

import pytest
from django.test import Client
from rest_framework.test import APIClient

from broker import services
from broker.choices import LeaseState
from broker.models import Allocation, Lease, Workload
from broker.selectors import workload_resumable
from capacity import selectors as capacity_selectors
from capacity import services as capacity_services
from capacity.models import Adjustment
from capacity.planner import ReclaimClass, Utilisation
from core.errors import PermissionDenied, ValidationFailed
from tenants.access import Actor
from tenants.choices import Role
from tenants.models import AuditEvent, Project
from tests.factories import make_project, make_quota, make_world

NOW = datetime.now(tz=UTC).replace(microsecond=0)
URL = "/api/v1/projects/{}/idle-reclaim"
RESUMABLE_SPEC = {"command": ["python", "train.py"], "checkpoint_dir": "/srv/gpubroker/acme/vision/run-1",
                  "restart_policy": "on-preemption"}


@pytest.fixture
def world(db):
    return make_world()


def actor(world, role: Role = Role.ADMIN) -> Actor:
    user = {Role.OWNER: world.owner, Role.ADMIN: world.admin, Role.MEMBER: world.member}[role]
    return Actor(user=user, tenant=world.acme, role=role)


def client(world, who: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {world.tokens[who]}")
    return api


@pytest.mark.parametrize(("spec", "resumable"), [
    (RESUMABLE_SPEC, True),
    ({**RESUMABLE_SPEC, "restart_policy": "on-failure"}, True),
    ({**RESUMABLE_SPEC, "restart_policy": "never"}, False),  # stopped at a notice, the lease ends
    ({**RESUMABLE_SPEC, "checkpoint_dir": ""}, False),  # nothing to resume from
    ({"command": ["python"], "restart_policy": "on-preemption"}, False),
    (None, False),  # a bare lease
])
def test_suspend_workload_resumable(spec, resumable):
    assert workload_resumable(spec) is resumable


# -- the loop --------------------------------------------------------------------------------------------------
def training_lease(world, project: str, *, spec: dict | None = RESUMABLE_SPEC, at=NOW - timedelta(hours=2)):
    member = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease, _ = services.lease_request(actor=member, project=project, gpu={"kind": "whole", "model": "H100-80GB"},
                                      workload_class="training", now=at, duration_seconds=86400)
    if spec is not None:
        Workload.objects.create(lease=lease, spec=spec)
    return lease


def a_fleet_with_idle_training(world, monkeypatch):
    """Three H100s, three idle in-quota training leases (resumable; resumable of a project that opted out; no
    workload) and a whole H100 request waiting; Prometheus stands in: 1 % engine activity for the last 2 h."""
    token = services.enrollment_token_create(uses=1, now=NOW - timedelta(hours=3))
    services.node_enroll(node_id="node-a", token=token, address="http://127.0.0.1:9/n/node-a",
                         now=NOW - timedelta(hours=3), inventory={"gpus": [
                             {"index": i, "uuid": f"GPU-{i}", "model": "H100-80GB", "mode": "whole",
                              "memory_mib": 81559} for i in range(3)]})
    nlp = make_project(world.acme, "nlp")
    make_quota(nlp)
    bare = make_project(world.acme, "bare")
    make_quota(bare)
    leases = {"resumable": training_lease(world, "vision"), "opted-out": training_lease(world, "nlp"),
              "bare": training_lease(world, "bare", spec=None)}
    services.schedule_cycle(now=NOW - timedelta(hours=2))
    for allocation in Allocation.objects.filter(lease__in=leases.values()):
        services.allocation_ready(allocation=allocation, instance={}, now=NOW - timedelta(hours=2))
    waiting = training_lease(world, "vision", spec=None, at=NOW - timedelta(minutes=30))
    services.schedule_cycle(now=NOW - timedelta(minutes=30))
    assert Lease.objects.get(pk=waiting.pk).state == LeaseState.QUEUED
    capacity_services.suspend_opt_out_set(actor=actor(world), project=nlp, opt_out=True)
    monkeypatch.setattr(capacity_selectors, "_utilisation", lambda now, leases_, policies, notes: tuple(
        Utilisation(str(lease.pk), now.timestamp() - 7200, 60, (10,) * 120, (1000,) * 120)
        for lease in leases.values()))
    capacity_services.policy_set(scope="", values={"mode_switch": "off", "mig_layout": "off", "warm_pool": "off",
                                                   "right_size": "off", "quota_advice": "off"})
    return leases


def test_suspend_the_loop_notices_then_suspends_only_resumable_training_and_requeues_it_at_the_deadline(
        world, monkeypatch, settings, django_capture_on_commit_callbacks):
    settings.LEASE_PREEMPTION_NOTICE_SECONDS = 120
    leases = a_fleet_with_idle_training(world, monkeypatch)
    sent: list[tuple] = []
    monkeypatch.setattr("broker.services.triggers.task", lambda name: type(
        "T", (), {"delay": staticmethod(lambda *args: sent.append((name, *args)))}))
    capacity_services.idle_opt_in_set(actor=actor(world), project=world.project, opt_in=True)  # auto for vision
    resumable = leases["resumable"]

    with django_capture_on_commit_callbacks(execute=True):
        capacity_services.plan_run(now=NOW)

    [notice] = Adjustment.objects.filter(kind="idle_reclaim")  # neither the opted-out nor the bare lease
    assert (notice.lease_id, notice.step, notice.mode, notice.state) == (resumable.pk, "notice", "auto", "applied")
    assert notice.evidence["figures"]["class"] == "resumable-training"
    resumable.refresh_from_db()
    assert resumable.state == LeaseState.ACTIVE and resumable.notice_deadline == NOW + timedelta(seconds=1800)
    assert "it will be suspended" in resumable.reason
    assert ("lease_notice_run", resumable.pk) not in sent  # the workload is not signalled at the notice

    later = NOW + timedelta(seconds=1801)
    monkeypatch.setattr(capacity_selectors, "_utilisation", lambda now, leases_, policies, notes: tuple(
        Utilisation(str(lease.pk), now.timestamp() - 7200, 60, (10,) * 120, (1000,) * 120)
        for lease in leases.values()))
    with django_capture_on_commit_callbacks(execute=True):
        capacity_services.plan_run(now=later)

    suspend = Adjustment.objects.get(kind="idle_reclaim", lease=resumable, change__step="suspend")
    assert suspend.state == "applied" and suspend.outcome.startswith("suspended: 120 s to checkpoint")
    resumable.refresh_from_db()
    assert resumable.state == LeaseState.PREEMPTED
    assert resumable.notice_deadline == later + timedelta(seconds=120)  # the promised notice: the grace
    assert resumable.reason.startswith("suspended while idle (idle")
    assert ("lease_notice_run", resumable.pk) in sent  # now the agent sends SIGTERM
    for name in ("opted-out", "bare"):
        assert Lease.objects.get(pk=leases[name].pk).state == LeaseState.ACTIVE

    # the workload never stopped by itself: at the deadline the broker frees the GPU and requeues the lease
    assert services.lease_preempt_due(now=later + timedelta(seconds=121)) == 1
    resumable.refresh_from_db()
    assert resumable.state == LeaseState.QUEUED and resumable.active_at is None
    assert resumable.reason == "suspended while idle: resumes when capacity frees"
    requeue = resumable.events.get(to_state=LeaseState.QUEUED, from_state=LeaseState.PREEMPTED)
    assert (requeue.reason, requeue.actor) == ("suspended while idle: resumes when capacity frees", "broker")
    assert not Allocation.objects.filter(lease=resumable, freed_at__isnull=True).exists()


def test_suspend_is_advice_without_the_opt_in_and_expires_when_the_project_opts_out(world, monkeypatch):
    leases = a_fleet_with_idle_training(world, monkeypatch)
    capacity_services.plan_run(now=NOW)
    [notice] = Adjustment.objects.filter(kind="idle_reclaim")
    assert (notice.lease_id, notice.step, notice.mode, notice.state) == (
        leases["resumable"].pk, "notice", "advise", "proposed")
    # a person accepts it; then the project opts out before the suspension is applied: it is not suspended
    capacity_services.adjustment_apply(adjustment=notice, actor="user:ann", now=NOW)
    Adjustment.objects.filter(pk=notice.pk).update(finished_at=NOW)
    capacity_services.plan_run(now=NOW + timedelta(seconds=1801))
    suspend = Adjustment.objects.get(kind="idle_reclaim", change__step="suspend")
    assert (suspend.mode, suspend.state) == ("advise", "proposed")
    capacity_services.suspend_opt_out_set(actor=actor(world), project=world.project, opt_out=True)
    capacity_services.adjustment_apply(adjustment=suspend, actor="user:ann", now=NOW + timedelta(seconds=1802))
    suspend.refresh_from_db()
    assert suspend.state == "expired" and "opted out of suspension" in suspend.outcome
    assert Lease.objects.get(pk=leases["resumable"].pk).state == LeaseState.ACTIVE


# -- the opt-out -----------------------------------------------------------------------------------------------
def test_suspend_opt_out_set_by_an_admin_audited_refused_to_a_member_and_in_force_over_any_policy(world):
    with pytest.raises(PermissionDenied):
        capacity_services.suspend_opt_out_set(actor=actor(world, Role.MEMBER), project=world.project, opt_out=True)
    with pytest.raises(ValidationFailed) as refused:
        capacity_services.suspend_opt_out_set(actor=actor(world), project=world.project, opt_out="yes")
    assert refused.value.field == "suspend_opt_out"

    def rule_enabled() -> bool:
        return capacity_selectors.project_policy(world.project.pk).idle_rule(ReclaimClass.RESUMABLE).enabled

    assert rule_enabled()
    capacity_services.suspend_opt_out_set(actor=actor(world), project=world.project, opt_out=True)
    capacity_services.suspend_opt_out_set(actor=actor(world), project=world.project, opt_out=True)  # no change
    [event] = AuditEvent.objects.filter(action="project.idle_suspend_opt_out")
    assert event.tenant == world.acme and event.actor == world.admin and event.target == "vision"
    assert event.data["opt_out"] is True and event.data["mode"] == "off"
    assert not rule_enabled()
    # a staff policy of the project's scope that switches the rule on does not override the tenant's refusal
    capacity_services.policy_set(scope=f"project:{world.project.pk}", values={
        "idle_reclaim": "auto", "idle_rules": {"resumable-training": {"enabled": True}}})
    assert not rule_enabled()
    modes = capacity_selectors.suspend_modes(project=Project.objects.get(pk=world.project.pk))
    assert modes.mode.value == "off" and modes.opt_out and "never suspends" in modes.notice
    capacity_services.suspend_opt_out_set(actor=actor(world, Role.OWNER), project=world.project, opt_out=False)
    assert AuditEvent.objects.filter(action="project.idle_suspend_opt_in", actor=world.owner).count() == 1
    assert rule_enabled()
    assert capacity_selectors.suspend_modes(project=Project.objects.get(pk=world.project.pk)).mode.value == "auto"


def test_suspend_opt_out_api_reads_sets_refuses(world):
    body = client(world, "member").get(URL.format("vision")).json()
    assert body["suspend"]["opt_out"] is False and body["suspend"]["mode"] == "advise"
    assert body["suspend"]["rule"] == {"enabled": True, "threshold_permille": 50, "window_seconds": 3600,
                                       "notice_seconds": 1800}
    assert "checkpoint" in body["suspend"]["notice"] and "only proposes it" in body["suspend"]["notice"]

    assert client(world, "member").put(URL.format("vision"), {"suspend_opt_out": True},
                                       format="json").status_code == 403
    assert client(world, "admin").put(URL.format("secret"), {"suspend_opt_out": True},
                                      format="json").status_code == 404  # globex's
    bad = client(world, "admin").put(URL.format("vision"), {"suspend_opt_out": "yes"}, format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "suspend_opt_out"
    assert not Project.objects.get(pk=world.project.pk).idle_suspend_opt_out

    done = client(world, "admin").put(URL.format("vision"), {"suspend_opt_out": True}, format="json")
    assert done.status_code == 200, done.content
    assert done.json()["suspend"]["opt_out"] is True and done.json()["suspend"]["mode"] == "off"
    assert done.json()["opt_in"] is False  # left as it was
    both = client(world, "owner").put(URL.format("vision"), {"opt_in": True, "suspend_opt_out": False},
                                      format="json").json()
    assert both["opt_in"] is True and both["suspend"] == {**both["suspend"], "opt_out": False, "mode": "auto"}


def test_suspend_opt_out_portal_htmx_and_admin(world):
    def page_text(response) -> str:
        return " ".join(unescape(re.sub(r"<[^>]+>", " ", response.content.decode())).split())

    admin = Client(enforce_csrf_checks=True)
    assert admin.login(username="ann", password="pw-ann")
    page = admin.get("/settings/idle-reclaim")
    assert "Suspension of idle training not opted out · advise" in page_text(page)
    assert 'id="suspend-opt-out-vision"' in page.content.decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
    swapped = admin.post("/settings/idle-reclaim", {"csrfmiddlewaretoken": csrf, "project": "vision",
                                                    "suspend_opt_out": "true"}, HTTP_HX_REQUEST="true")
    assert swapped.status_code == 200 and 'data-suspend-opt-out="true"' in swapped.content.decode()
    assert "opted out · off" in page_text(swapped) and 'id="suspend-opt-in-vision"' in swapped.content.decode()
    assert Project.objects.get(pk=world.project.pk).idle_suspend_opt_out
    bad = admin.post("/settings/idle-reclaim", {"csrfmiddlewaretoken": csrf, "project": "vision",
                                                "suspend_opt_out": "maybe"}, HTTP_HX_REQUEST="true")
    assert bad.status_code == 400 and "suspend_opt_out must be true or false" in page_text(bad)
    member = Client()
    assert member.login(username="max", password="pw-max")
    assert 'id="suspend-opt-in-vision"' not in member.get("/settings/idle-reclaim").content.decode()
    assert member.post("/settings/idle-reclaim", {"project": "vision", "suspend_opt_out": "false"}).status_code == 403
    assert Project.objects.get(pk=world.project.pk).idle_suspend_opt_out

    from django.contrib.auth import get_user_model

    staff = Client()
    staff.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw-root"))
    listing = staff.get("/admin/tenants/project/?idle_suspend_opt_out__exact=1")
    assert listing.status_code == 200 and "vision" in listing.content.decode()
    change = staff.get(f"/admin/tenants/project/{world.project.pk}/change/").content.decode()
    assert "Idle suspend opt out" in change and 'name="idle_suspend_opt_out"' not in change  # read-only
