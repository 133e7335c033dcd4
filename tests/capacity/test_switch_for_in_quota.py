"""Reclaim across modes in the live service (issue 30): an in-quota lease that fits nowhere in its mode gets a GPU of
another mode from the schedule cycle itself — an idle one, or one held only by over-quota leases, which get their
notice — where the loop switches that pool's GPUs on its own (mode switch / MIG layout ``auto``, the default). The
loop records the switch as its own applied adjustment, closes the GPU, and switches it once the leases have left
(``capacity.drains_run``); the next cycle places the lease there. The end-to-end run with agents and a worker:
tests/capacity/test_loop_e2e.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from broker import services
from broker.choices import AllocationState, LeaseState
from broker.models import Allocation, Gpu, Lease
from capacity import services as capacity_services
from capacity import tasks
from capacity.models import Adjustment
from capacity.selectors import capacity_snapshot
from tenants.access import Actor
from tenants.choices import Role
from tests.capacity.test_plan_on_wait import a_node, cycle
from tests.factories import make_world

WHOLE = {"kind": "whole", "model": "H100-80GB"}
MIG = {"kind": "mig", "profile": "1g.10gb", "model": "H100-80GB"}


@pytest.fixture
def world(db, settings, monkeypatch):
    settings.CAPACITY_PLAN_ON_WAIT_SECONDS = 0  # the planner on its timer only: what happens here is the cycle's
    capacity_services.plan_soon_clear()
    return make_world()


@pytest.fixture
def agent(monkeypatch):
    """The node agent's mode switch, recorded; the cycle asked for after a switch, counted."""
    switched: list[tuple[str, str]] = []

    class Agent:
        def set_gpu_mode(self, uuid, mode):
            switched.append((uuid, mode))

    monkeypatch.setattr(services, "agent_client", lambda node: Agent())
    monkeypatch.setattr(services, "schedule_cycle_request", lambda: None)
    return switched


@pytest.fixture
def drains(monkeypatch):
    """The drain task as the listener sends it: its countdown recorded, not queued (the tests run it)."""
    sent: list[float] = []
    monkeypatch.setattr(tasks.drains_run, "apply_async", lambda countdown=0, kwargs=None: sent.append(countdown))
    return sent


def ask(world, shape: dict, *, tenant="acme", project="vision") -> Lease:
    if tenant == "acme":
        actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    else:
        actor = Actor(user=world.outsider, tenant=world.globex, role=Role.OWNER)
    lease, _ = services.lease_request(actor=actor, project=project, gpu=shape, duration_seconds=600)
    return lease


def test_an_idle_gpu_of_another_mode_is_switched_by_the_cycle_for_an_in_quota_lease(
        world, agent, drains, django_capture_on_commit_callbacks):
    a_node("mig")
    lease = ask(world, WHOLE)
    counts = cycle(django_capture_on_commit_callbacks)
    assert counts.get("switch") == 1 and counts["waiting"] == 0, counts
    switch = Adjustment.objects.get()
    assert (switch.kind, switch.mode, switch.state, switch.applied_by) == ("mode_switch", "auto", "applying",
                                                                           "capacity-loop")
    assert switch.risk == [] and "for an in-quota lease" in switch.reason and str(lease.pk) not in switch.reason
    gpu = Gpu.objects.get(pk=switch.gpu_id)
    assert gpu.mode == "mig" and gpu.mode_target == "whole"  # closed to the scheduler while it changes
    lease.refresh_from_db()
    assert lease.state == LeaseState.QUEUED and "an idle H100-80GB GPU is being switched to whole mode" in lease.reason
    assert drains == [1.0]  # nothing to wait for: the switch at once

    assert capacity_services.drains_run() == {"switched": 1, "waiting": 0}
    assert agent == [(gpu.uuid, "whole")]
    switch.refresh_from_db()
    gpu.refresh_from_db()
    assert switch.state == "applied" and gpu.mode == "whole" and gpu.mode_target == ""
    cycle(django_capture_on_commit_callbacks)
    lease.refresh_from_db()
    assert lease.state != LeaseState.QUEUED and Allocation.objects.get(lease=lease).gpu_id == gpu.pk
    assert Gpu.objects.exclude(pk=gpu.pk).get().mode == "mig"  # one GPU for one lease


def test_over_quota_work_on_a_gpu_of_another_mode_gets_notice_and_the_gpu_follows_once_it_has_left(
        world, agent, drains, settings, django_capture_on_commit_callbacks):
    """Globex holds both whole GPUs, one of them over its guarantee. Acme's in-quota MIG lease: the over-quota lease
    gets its notice (the cycle), the loop switches that GPU once it has been released, the MIG lease starts there."""
    settings.LEASE_MIN_RUNTIME_SECONDS = 0
    a_node("whole")
    inside, over = ask(world, WHOLE, tenant="globex", project="secret"), ask(world, WHOLE, tenant="globex",
                                                                              project="secret")
    cycle(django_capture_on_commit_callbacks)
    victim = Allocation.objects.get(lease=over)
    assert victim.preemptible and not Allocation.objects.get(lease=inside).preemptible
    Lease.objects.filter(pk__in=[inside.pk, over.pk]).update(state=LeaseState.ACTIVE, active_at=timezone.now())

    lease = ask(world, MIG)
    counts = cycle(django_capture_on_commit_callbacks)
    assert counts.get("switch") == 1, counts
    switch = Adjustment.objects.get()
    assert switch.kind == "mig_layout" and switch.risk == [over.pk] and switch.gpu_id == victim.gpu_id
    over.refresh_from_db()
    assert over.state == LeaseState.PREEMPTED and over.notice_deadline is not None
    assert "for in-quota work (another tenant)" in over.reason
    lease.refresh_from_db()
    assert "emptied of 1 over-quota lease(s) given notice" in lease.reason and str(over.pk) not in lease.reason
    assert drains and drains[0] >= settings.LEASE_PREEMPTION_NOTICE_SECONDS  # sent for the end of its notice

    # before the lease has left, the drain waits (and looks again)
    assert capacity_services.drains_run() == {"switched": 0, "waiting": 1}
    assert agent == [] and len(drains) == 2
    # the planner neither switches another GPU for the waiting lease nor touches the one that is changing
    snapshot, _ = capacity_snapshot(now=timezone.now())
    changing = [gpu for gpu in snapshot.gpus if gpu.changing]
    assert [(gpu.id, gpu.mode.value) for gpu in changing] == [(f"g{victim.gpu_id}", "mig")]
    capacity_services.plan_run()
    assert Adjustment.objects.count() == 1

    # the notice runs out: the lease is released (its allocation freed), the drain switches the GPU
    services.lease_expire_due(now=over.notice_deadline + timedelta(seconds=1))
    Allocation.objects.filter(lease=over).update(state=AllocationState.FREED, freed_at=timezone.now())
    assert capacity_services.drains_run()["switched"] == 1
    gpu = Gpu.objects.get(pk=victim.gpu_id)
    assert gpu.mode == "mig" and agent == [(gpu.uuid, "mig")]
    cycle(django_capture_on_commit_callbacks)
    lease.refresh_from_db()
    assert lease.state != LeaseState.QUEUED and Allocation.objects.get(lease=lease).gpu_id == gpu.pk
    inside.refresh_from_db()
    assert inside.state == LeaseState.ACTIVE  # in-quota work is never touched


@pytest.mark.parametrize("scope", ["", "pool:H100-80GB"])
def test_not_where_the_pool_only_advises_its_switches(world, agent, drains, scope, django_capture_on_commit_callbacks):
    capacity_services.policy_set(scope=scope, values={"mode_switch": "advise"})
    a_node("mig")
    lease = ask(world, WHOLE)
    counts = cycle(django_capture_on_commit_callbacks)
    assert "switch" not in counts and counts["waiting"] == 1
    assert not Adjustment.objects.exists() and drains == []
    lease.refresh_from_db()
    assert "can switch one to whole" in lease.reason


def test_over_quota_leases_do_not_switch_a_gpu(world, agent, drains, django_capture_on_commit_callbacks):
    """Borrowed work waits for the planner (tests/capacity/test_plan_on_wait.py); only a guarantee reclaims."""
    from tenants import services as tenant_services

    tenant_services.quota_set(project=world.project, tier="H100-80GB", deserved_gpu_milli=0, limit_gpu_milli=2000)
    a_node("mig")
    ask(world, WHOLE)
    counts = cycle(django_capture_on_commit_callbacks)
    assert "switch" not in counts and not Adjustment.objects.exists()


def test_the_switch_is_audited_and_shown_to_staff(world, agent, drains, client, django_capture_on_commit_callbacks):
    from tenants.models import AuditEvent

    a_node("mig")
    ask(world, WHOLE)
    cycle(django_capture_on_commit_callbacks)
    switch = Adjustment.objects.get()
    event = AuditEvent.objects.get(action="adjustment.apply", target=f"adjustment:{switch.pk}")
    lease = Lease.objects.get()
    assert event.data["actor"] == "capacity-loop" and event.data["for_lease"] == lease.pk
    assert event.tenant is None  # staff's trail: the lease it was for is not the drained tenants' business
    from tests.portal.test_pages import login, text

    staff = world.admin
    staff.is_staff = True
    staff.save(update_fields=["is_staff"])
    page = text(login(client, staff.username).get("/ops/capacity"))
    assert "for an in-quota lease" in page and "switching the idle GPU" in page
