"""An elastic lease shrunk under reclaim grows back (issue 32 item 6): the schedule cycle — with nothing queued — gives
it the units capacity freed back, as allocations of its own, a "resized" event active → active and an audit
``lease.resize``; the node's instances and the workload's new size come after commit (``lease_grow_apply``).
``LEASE_ELASTIC_GROW`` off: it stays shrunk."""

from datetime import UTC, datetime

import pytest
import time_machine

from broker import services
from broker.choices import AllocationState, LeaseState
from broker.models import Allocation, Lease, LeaseEvent
from broker.scheduler import Unit
from tenants.access import Actor
from tenants.audit import AuditEvent
from tenants.choices import Role
from tests.factories import make_quota, make_world


def t(hour, minute=0):
    return datetime(2026, 1, 1, hour, minute, tzinfo=UTC)


@pytest.fixture
def world(db):
    world = make_world()
    token = services.enrollment_token_create()
    services.node_enroll(node_id="n1", token=token, address="http://127.0.0.1:9/n/n1", inventory={"gpus": [
        {"index": index, "uuid": f"GPU-h100-{index}", "model": "H100-80GB", "mode": "whole", "memory_mib": 81559}
        for index in range(8)]})
    make_quota(world.project, "H100-80GB", deserved=0, limit=8000, tenant_deserved=8000, tenant_limit=8000)
    return world


def shrunk_lease(world):
    """An over-quota elastic lease of 8 (at least 4), active, shrunk to 6 (its last 2 given back)."""
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    with time_machine.travel(t(10), tick=False):
        lease, _ = services.lease_request(actor=actor, project="vision", duration_seconds=7200,
                                          gpu={"kind": "whole", "model": "H100-80GB", "count": 8, "min_count": 4})
        services.schedule_cycle(now=t(10))
        for allocation in Allocation.objects.filter(lease=lease):
            services.allocation_ready(allocation=allocation, instance={"device_uuid": f"X{allocation.pk}"}, now=t(10))
    lease = Lease.objects.get(pk=lease.pk)
    assert lease.state == LeaseState.ACTIVE and lease.over_quota
    last = list(Allocation.objects.filter(lease=lease).order_by("-pk")[:2])
    units = tuple(Unit(f"g{a.gpu_id}", a.milli, a.memory_mib) for a in last)
    with time_machine.travel(t(10, 20), tick=False):
        assert services.lease_shrink(lease_id=lease.pk, units=units, claimant=lease.pk, now=t(10, 20))
    assert services.leases_shrunk_exist()
    return lease, {a.gpu_id for a in last}


def test_a_shrunk_lease_grows_back_in_a_cycle_with_nothing_queued(world):
    lease, given_back = shrunk_lease(world)
    with time_machine.travel(t(10, 40), tick=False):
        counts = services.schedule_cycle(now=t(10, 40))
    assert counts["grow"] == 1
    live = Allocation.objects.filter(lease=lease, freed_at__isnull=True)
    assert live.count() == 8
    added = live.filter(state=AllocationState.PENDING)  # the node makes them after commit (lease_grow_apply)
    assert {a.gpu_id for a in added} == given_back  # the GPUs it gave back, on its own node
    assert all(a.preemptible and a.tier == "H100-80GB" and a.milli == 1000 for a in added)
    event = LeaseEvent.objects.filter(lease=lease).latest("pk")
    assert (event.from_state, event.to_state) == ("active", "active")
    assert event.reason.startswith("resized: 6 → 8 units (capacity freed)")
    assert event.at == t(10, 40)
    lease = Lease.objects.get(pk=lease.pk)
    assert lease.state == LeaseState.ACTIVE and lease.reason.startswith("running, grew: resized: 6 → 8")
    audit = AuditEvent.objects.filter(action="lease.resize").latest("pk")
    assert (audit.data["from_units"], audit.data["to_units"]) == (6, 8)
    assert not services.leases_shrunk_exist()
    # at its count: the next cycle (nothing queued) does not run at all
    assert services.schedule_cycle(now=t(10, 41)) == {"placed": 0, "preempt": 0, "waiting": 0}


def test_growth_is_off_with_the_setting_and_waits_for_the_project_limit(world, settings):
    lease, _ = shrunk_lease(world)
    settings.LEASE_ELASTIC_GROW = False
    assert "grow" not in services.schedule_cycle(now=t(10, 40))
    assert Allocation.objects.filter(lease=lease, freed_at__isnull=True).count() == 6
    settings.LEASE_ELASTIC_GROW = True
    make_quota(world.project, "H100-80GB", deserved=0, limit=7000, tenant_deserved=8000, tenant_limit=8000)
    services.schedule_cycle(now=t(10, 41))
    assert Allocation.objects.filter(lease=lease, freed_at__isnull=True).count() == 7  # its limit: one more only
    event = LeaseEvent.objects.filter(lease=lease).latest("pk")
    assert event.reason.startswith("resized: 6 → 7 units (capacity freed)")


def test_a_queued_request_is_placed_before_the_lease_grows(world):
    lease, _ = shrunk_lease(world)
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    with time_machine.travel(t(10, 40), tick=False):
        other, _ = services.lease_request(actor=actor, project="vision", duration_seconds=600,
                                          gpu={"kind": "whole", "model": "H100-80GB", "count": 1})
        counts = services.schedule_cycle(now=t(10, 40))
    assert counts["placed"] == 1 and counts["grow"] == 1
    assert Lease.objects.get(pk=other.pk).state == LeaseState.PROVISIONING
    assert Allocation.objects.filter(lease=lease, freed_at__isnull=True).count() == 7
