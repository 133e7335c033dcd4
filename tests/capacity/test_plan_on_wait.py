"""The planner on a wait (issue 30): a schedule cycle that leaves a request waiting for a mode an idle GPU could be
switched to sends the planner's task once it commits, instead of leaving the request to the planner's timer — only
where that pool's kind is ``auto``, and at most once per ``CAPACITY_PLAN_ON_WAIT_SECONDS`` (any run counts).

The project here has no guarantee, so its leases borrow (over quota): an in-quota lease gets its switch from the
cycle itself, which reclaims across modes (tests/capacity/test_switch_for_in_quota.py)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from broker import extensions, services
from broker.choices import LeaseState
from broker.models import Allocation, Gpu, Lease
from capacity import services as capacity_services
from capacity import tasks
from capacity.models import Adjustment
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_world

WHOLE = {"kind": "whole", "model": "H100-80GB"}
MIG = {"kind": "mig", "profile": "3g.40gb", "model": "H100-80GB"}


@pytest.fixture
def world(db, settings):
    from tenants import services as tenant_services

    settings.CAPACITY_PLAN_ON_WAIT_SECONDS = 10
    capacity_services.plan_soon_clear()
    world = make_world()
    tenant_services.quota_set(project=world.project, tier="H100-80GB", deserved_gpu_milli=0, limit_gpu_milli=2000)
    yield world
    capacity_services.plan_soon_clear()


@pytest.fixture
def sent(monkeypatch):
    """The planner's task as the cycle sends it: recorded, not queued (the tests run it when they need to)."""
    calls: list[int] = []
    monkeypatch.setattr(tasks.plan_run, "delay", lambda: calls.append(1))
    return calls


def a_node(mode: str, gpus: int = 2) -> list[Gpu]:
    token = services.enrollment_token_create(uses=1)
    services.node_enroll(node_id="node-a", token=token, address="http://127.0.0.1:9/n/node-a", inventory={
        "gpus": [{"index": i, "uuid": f"GPU-{i}", "model": "H100-80GB", "mode": mode, "memory_mib": 81559}
                 for i in range(gpus)]})
    return list(Gpu.objects.order_by("pk"))


def ask(world, shape: dict) -> Lease:
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease, _ = services.lease_request(actor=actor, project="vision", gpu=shape, duration_seconds=600)
    return lease


def cycle(capture) -> dict:
    with capture(execute=True):
        return services.schedule_cycle()


def test_a_whole_gpu_lease_waiting_on_an_all_mig_pool_gets_its_switch_without_the_timer(
        world, monkeypatch, django_capture_on_commit_callbacks):
    """The demo's case (every H100 in MIG mode): the cycle that leaves the whole-GPU lease waiting sends the planner
    at once; its run switches an idle GPU to whole mode (``auto`` by default: no tenant is touched), and the next
    cycle places the lease there. No timer ran: the test never calls the planner itself."""
    a_node("mig")
    switched, cycles = [], []

    class Agent:
        def set_gpu_mode(self, uuid, mode):
            switched.append((uuid, mode))

    monkeypatch.setattr(services, "agent_client", lambda node: Agent())
    monkeypatch.setattr(services, "schedule_cycle_request", lambda: cycles.append(1))
    runs: list[dict] = []
    monkeypatch.setattr(tasks.plan_run, "delay", lambda: runs.append(capacity_services.plan_run()))
    lease = ask(world, WHOLE)

    counts = cycle(django_capture_on_commit_callbacks)
    assert counts["waiting"] == 1 and counts["pool_wait"] == 1
    assert len(runs) == 1 and runs[0]["applied"] == 1, runs
    switch = Adjustment.objects.get(kind="mode_switch")
    assert (switch.mode, switch.state, switch.applied_by) == ("auto", "applied", "capacity-loop"), switch.outcome
    gpu = Gpu.objects.get(pk=int(switch.change["gpu"].lstrip("g")))
    assert gpu.mode == "whole" and switched == [(gpu.uuid, "whole")] and cycles  # a cycle asked for
    lease.refresh_from_db()
    assert lease.state == LeaseState.QUEUED and "can switch one to whole" in lease.reason

    cycle(django_capture_on_commit_callbacks)  # the cycle the switch asked for
    lease.refresh_from_db()
    assert lease.state != LeaseState.QUEUED
    assert Allocation.objects.get(lease=lease).gpu_id == gpu.pk
    assert len(runs) == 1  # placed: no wait left to plan for


def test_a_mig_lease_on_whole_gpus_sends_the_planner_for_a_mig_layout(world, sent, django_capture_on_commit_callbacks):
    a_node("whole", gpus=1)
    ask(world, MIG)
    counts = cycle(django_capture_on_commit_callbacks)
    assert sent == [1], counts


def test_not_when_no_gpu_of_another_mode_is_idle(world, sent, django_capture_on_commit_callbacks):
    """The planner switches idle GPUs only (a drain is advice by default): no run for a wait it cannot end."""
    a_node("whole", gpus=1)
    ask(world, WHOLE)
    cycle(django_capture_on_commit_callbacks)  # placed: the only GPU is held whole
    ask(world, MIG)
    ask(world, WHOLE)
    counts = cycle(django_capture_on_commit_callbacks)
    assert counts["waiting"] == 2 and "pool_wait" not in counts and sent == []


def test_at_most_one_run_per_debounce_and_any_run_counts(world, sent, settings, django_capture_on_commit_callbacks):
    a_node("mig")
    ask(world, WHOLE)
    cycle(django_capture_on_commit_callbacks)
    cycle(django_capture_on_commit_callbacks)  # still waiting, within the debounce: not sent again
    assert sent == [1]
    capacity_services.plan_soon_clear()  # the debounce over
    cycle(django_capture_on_commit_callbacks)
    assert sent == [1, 1]
    capacity_services.plan_soon_clear()
    capacity_services.plan_run()  # a run on the timer (the agent does not answer: its switch fails, the lease waits)
    cycle(django_capture_on_commit_callbacks)
    assert sent == [1, 1]
    settings.CAPACITY_PLAN_ON_WAIT_SECONDS = 0  # on the timer only
    capacity_services.plan_soon_clear()
    cycle(django_capture_on_commit_callbacks)
    assert sent == [1, 1]


@pytest.mark.parametrize("scope", ["", "pool:H100-80GB"])
def test_not_where_the_pool_only_advises_a_switch(world, sent, scope, django_capture_on_commit_callbacks):
    """Advice waits for a person, not for the planner: a run now would only propose it sooner."""
    capacity_services.policy_set(scope=scope, values={"mode_switch": "advise"})
    a_node("mig")
    ask(world, WHOLE)
    cycle(django_capture_on_commit_callbacks)
    assert sent == []
    capacity_services.plan_soon_clear()
    capacity_services.policy_set(scope="pool:H100-80GB", values={"mode_switch": "auto"})
    cycle(django_capture_on_commit_callbacks)
    assert sent == [1]


def test_the_cycle_tells_its_listeners_what_waits(world, settings, django_capture_on_commit_callbacks):
    settings.CAPACITY_PLAN_ON_WAIT_SECONDS = 0
    told: list[extensions.PoolWait] = []
    unregister = extensions.pool_wait_register(told.append)
    try:
        a_node("mig")
        ask(world, WHOLE)
        ask(world, {"kind": "mig", "profile": "1g.10gb", "model": "H100-80GB"})  # placed: not a wait
        before = timezone.now()
        cycle(django_capture_on_commit_callbacks)
    finally:
        unregister()
    assert [wait.pools for wait in told] == [(("H100-80GB", "whole"),)]
    assert told[0].now >= before


def test_the_switch_for_a_pool_bound_project_lands_in_its_pool(world, monkeypatch, django_capture_on_commit_callbacks):
    """A project bound to the node pool "west" (``Project.pools``): its waiting whole-GPU lease gets its switch on
    the idle GPU of the "west" node, not on the default pool's GPU it could never use (the planner reads the
    binding and each GPU's ``Node.pool``), and the next cycle places it there."""
    from tenants.models import Project

    # enrolled second, the default pool's GPU is the one the planner would pick first without the binding
    for node_id, pool in (("node-b", "west"), ("node-a", "default")):
        token = services.enrollment_token_create(uses=1, pool=pool)
        services.node_enroll(node_id=node_id, token=token, address=f"http://127.0.0.1:9/n/{node_id}", inventory={
            "gpus": [{"index": 0, "uuid": f"GPU-{node_id}", "model": "H100-80GB", "mode": "mig",
                      "memory_mib": 81559}]})
    Project.objects.filter(slug="vision").update(pools=["west"])

    class Agent:
        def set_gpu_mode(self, uuid, mode):
            pass

    monkeypatch.setattr(services, "agent_client", lambda node: Agent())
    monkeypatch.setattr(services, "schedule_cycle_request", lambda: None)
    monkeypatch.setattr(tasks.plan_run, "delay", lambda: capacity_services.plan_run())
    lease = ask(world, WHOLE)
    cycle(django_capture_on_commit_callbacks)
    switch = Adjustment.objects.get(kind="mode_switch")
    gpu = Gpu.objects.get(pk=int(switch.change["gpu"].lstrip("g")))
    assert gpu.node.node_id == "node-b" and gpu.mode == "whole", switch.reason
    assert Gpu.objects.get(node__node_id="node-a").mode == "mig"
    cycle(django_capture_on_commit_callbacks)
    lease.refresh_from_db()
    assert lease.state != LeaseState.QUEUED and Allocation.objects.get(lease=lease).gpu_id == gpu.pk
