"""A lease group member that stops while a sibling is still provisioning takes the group with it, on simulated
agents (two nodes of one H100 each, so a pair of members lands on two nodes; no Celery worker: each agent step is
driven by hand, so the moment a sibling is mid-provisioning is exact).

- a member **fails** (its instance vanishes from its node, found by the reconcile) while its sibling's instance
  is still being made: the sibling is released, never ACTIVE, and no instance is left on either node;
- a member is **preempted** while its sibling provisions: the sibling is requeued at once (its instance
  destroyed), waits while the preempted member serves its notice, and the pair is placed again whole."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from broker import services
from broker.choices import LeaseState
from broker.models import Allocation, Lease, LeaseEvent, Node
from broker.services import agent_client
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_quota, make_world
from tests.support.processes import start_fleet


@pytest.fixture
def pair_fleet(live_server, tmp_path, transactional_db, settings):
    settings.LEASE_MIN_RUNTIME_SECONDS = 0
    world = make_world()
    make_quota(world.project, deserved=2000, limit=2000)
    fleet = start_fleet(live_server.url, tmp_path / "fleet", 2, "h100-80gb:1:whole")
    yield world
    fleet.terminate()
    fleet.wait(30)


def _pair(world) -> list[Lease]:
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    return [services.lease_request(actor=actor, project="vision", gpu={"kind": "whole", "model": "H100-80GB"},
                                   group="pair", workload_class="inference")[0] for _ in range(2)]


def _fresh(leases: list[Lease]) -> list[Lease]:
    return [Lease.objects.get(pk=lease.pk) for lease in leases]


def _node_of(lease: Lease) -> Node:
    return Allocation.objects.filter(lease=lease, freed_at__isnull=True).select_related("gpu__node").get().gpu.node


def _instances(node: Node) -> set[str]:
    return {i["allocation_id"] for i in agent_client(node).inventory()["instances"]}


def test_a_member_failing_while_its_sibling_provisions_releases_the_group(pair_fleet):
    pair = _pair(pair_fleet)
    services.schedule_cycle()
    first, second = _fresh(pair)
    assert first.state == second.state == LeaseState.PROVISIONING
    node_a, node_b = _node_of(first), _node_of(second)
    assert node_a != node_b
    # the first member's instance is made and recorded; it waits for its group (the second is not made yet)
    services.leases_provision(lease_ids=[first.pk])
    assert [lease.state for lease in _fresh(pair)] == [LeaseState.PROVISIONING] * 2
    made = Allocation.objects.get(lease=first, freed_at__isnull=True)
    assert made.state == "ready" and _instances(node_a) == {made.instance_id}
    # its GPU is lost behind the broker's back: the reconcile fails that member ...
    agent_client(node_a).faults(drop_instance=made.instance_id)
    assert services.node_reconcile(node=node_a)["vanished"] == 1
    first, second = _fresh(pair)
    assert first.state == LeaseState.FAILED
    # ... and its sibling, still provisioning, is released with it (not left to start alone when its instance
    # arrives): RELEASING now, RELEASED once the worker's release has run
    assert second.state == LeaseState.RELEASING
    assert second.reason.startswith(f"released with lease {first.pk} of its group 'pair', which failed (")
    services.leases_provision(lease_ids=[second.pk])  # a provisioning task that was already running: no effect
    assert Lease.objects.get(pk=second.pk).state == LeaseState.RELEASING
    assert services.lease_release_finish(lease_id=second.pk, final=LeaseState.RELEASED) == LeaseState.RELEASED
    assert not LeaseEvent.objects.filter(lease__in=pair, to_state=LeaseState.ACTIVE).exists()
    assert _instances(node_a) == set() and _instances(node_b) == set()
    assert not Allocation.objects.filter(lease__in=pair, freed_at__isnull=True).exists()


def test_a_member_preempted_while_its_sibling_provisions_requeues_the_sibling_and_the_pair_restarts_whole(
        pair_fleet):
    pair = _pair(pair_fleet)
    services.schedule_cycle()
    services.leases_provision(lease_ids=[lease.pk for lease in pair])
    assert [lease.state for lease in _fresh(pair)] == [LeaseState.ACTIVE] * 2
    # the second member's workload kept failing on its node: it alone is placed again (ACTIVE -> QUEUED), and is
    # provisioning on its new GPU while the first runs
    second = Lease.objects.get(pk=pair[1].pk)
    old_node = _node_of(second)
    agent_client(old_node).destroy(Allocation.objects.get(lease=second, freed_at__isnull=True).instance_id)
    services.allocations_free(lease=second, now=timezone.now(), to=LeaseState.QUEUED, reason="workload failing")
    services.schedule_cycle()
    first, second = _fresh(pair)
    assert (first.state, second.state) == (LeaseState.ACTIVE, LeaseState.PROVISIONING)
    node_b = _node_of(second)
    # now the first is preempted (a reclaim's victim): the second must not start alone when its instance arrives
    now = timezone.now()
    with transaction.atomic():
        locked = Lease.objects.select_for_update().get(pk=first.pk)
        services.lease_preempt(lease=locked, actor="scheduler", now=now, why="for in-quota work (test)",
                               notice_seconds=30)
    first, second = _fresh(pair)
    assert first.state == LeaseState.PREEMPTED
    assert second.state == LeaseState.QUEUED
    assert second.reason.startswith(f"requeued with lease {first.pk} of its group 'pair', preempted while this "
                                    "member was provisioning")
    assert not Allocation.objects.filter(lease=second, freed_at__isnull=True).exists()
    services.allocations_destroy(allocation_ids=list(Allocation.objects.filter(lease=second)
                                                     .values_list("pk", flat=True)))
    assert _instances(node_b) <= {a.instance_id for a in Allocation.objects.filter(lease=first, freed_at=None)}
    # a cycle during the notice places neither: the group waits for its preempted member
    services.schedule_cycle()
    second = Lease.objects.get(pk=second.pk)
    assert second.state == LeaseState.QUEUED
    assert second.reason == (f"waiting: group 'pair': lease {first.pk} is serving its preemption notice; the group "
                             "is placed again whole once it has left")
    # at the deadline the first is requeued; the next cycle places the pair whole, in one decision
    services.lease_preempt_due(now=now + timedelta(seconds=31))
    services.schedule_cycle()
    assert [lease.state for lease in _fresh(pair)] == [LeaseState.PROVISIONING] * 2
    placed = LeaseEvent.objects.filter(lease__in=pair, to_state=LeaseState.PROVISIONING).order_by("-at")[:2]
    assert len({event.at for event in placed}) == 1
    services.leases_provision(lease_ids=[lease.pk for lease in pair])
    assert [lease.state for lease in _fresh(pair)] == [LeaseState.ACTIVE] * 2
