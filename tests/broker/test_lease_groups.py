"""Lease groups through leasing's services on PostgreSQL (docs/scheduling.md "Lease groups"): the cycle places a
group's queued leases together or none; a member preempted takes its active group with it (same notice, same
deadline), the group is requeued together and placed again only when every member fits."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from broker import services
from broker.choices import LeaseState
from broker.models import Lease
from tenants import services as tenant_services
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_world


@pytest.fixture
def world(db, settings):
    settings.LEASE_MIN_RUNTIME_SECONDS = 0
    token = services.enrollment_token_create(uses=1)
    services.node_enroll(node_id="node-a", token=token, address="http://127.0.0.1:9/n/node-a", inventory={
        "gpus": [{"index": i, "uuid": f"GPU-h100-{i}", "model": "H100-80GB", "mode": "whole", "memory_mib": 81559}
                 for i in range(2)]})
    return make_world()


def _member(world, group: str | None, **extra) -> Lease:
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease, _ = services.lease_request(actor=actor, project="vision", gpu={"kind": "whole", "model": "H100-80GB"},
                                      group=group, **extra)
    return lease


def _fresh(*leases: Lease) -> list[Lease]:
    for lease in leases:
        lease.refresh_from_db()
    return list(leases)


def test_a_group_that_does_not_fit_waits_whole_and_its_reason_is_in_the_tenants_terms(world):
    tenant_services.quota_set(project=world.project, tier="H100-80GB", deserved_gpu_milli=3000,
                              limit_gpu_milli=3000)
    tenant_services.tenant_quota_set(tenant=world.acme, tier="H100-80GB", deserved_gpu_milli=3000,
                                     limit_gpu_milli=3000)
    members = [_member(world, "trio") for _ in range(3)]  # three GPUs on a two-GPU node
    services.schedule_cycle()
    members = _fresh(*members)
    assert {m.state for m in members} == {LeaseState.QUEUED}
    for lease in members:
        assert lease.reason.startswith(f"waiting: group 'trio': lease {members[2].pk} (1 x whole GPU) does not fit")
        assert f"{world.acme.pk}:trio" not in lease.reason
    # one member released: the other two are the group now, and they fit
    services.lease_release(lease=members[2], actor="user:member")
    services.schedule_cycle()
    assert [m.state for m in _fresh(*members[:2])] == [LeaseState.PROVISIONING] * 2


def test_a_preempted_member_takes_its_group_which_is_requeued_and_placed_whole_or_not(world):
    # acme deserves nothing on the H100s and borrows both for a group of two; globex asks for one within its quota
    tenant_services.quota_set(project=world.project, tier="H100-80GB", deserved_gpu_milli=0, limit_gpu_milli=2000)
    pair = [_member(world, "pair"), _member(world, "pair")]
    services.schedule_cycle()
    now = timezone.now()
    for lease in _fresh(*pair):
        assert lease.state == LeaseState.PROVISIONING and lease.over_quota, lease.reason
        services.allocation_ready(allocation=lease.allocations.get(), instance={}, now=now)
    assert {lease.state for lease in _fresh(*pair)} == {LeaseState.ACTIVE}

    globex = Actor(user=world.outsider, tenant=world.globex, role=Role.OWNER)
    claimant, _ = services.lease_request(actor=globex, project="secret", gpu={"kind": "whole"})
    services.schedule_cycle()
    pair = _fresh(*pair)
    # the core chose one victim; the service preempted its sibling too, with the same deadline
    assert {lease.state for lease in pair} == {LeaseState.PREEMPTED}
    assert pair[0].notice_deadline == pair[1].notice_deadline
    assert sum("of its group 'pair'" in lease.reason for lease in pair) == 1

    # at the deadline both are requeued together; globex takes one GPU; the pair (two GPUs) does not fit: neither
    # member starts on the GPU left
    services.lease_preempt_due(now=pair[0].notice_deadline + timedelta(seconds=1))
    assert {lease.state for lease in _fresh(*pair)} == {LeaseState.QUEUED}
    services.schedule_cycle()
    claimant.refresh_from_db()
    assert claimant.state == LeaseState.PROVISIONING, claimant.reason
    pair = _fresh(*pair)
    assert {lease.state for lease in pair} == {LeaseState.QUEUED}
    assert all("waiting: group 'pair': lease" in lease.reason and "does not fit" in lease.reason for lease in pair)
    # globex leaves: the pair starts again, both members in one cycle
    services.lease_release(lease=claimant, actor="user:outsider")
    services.allocations_free(lease=claimant, now=timezone.now(), to=LeaseState.RELEASED, reason="released")
    services.schedule_cycle()
    assert [lease.state for lease in _fresh(*pair)] == [LeaseState.PROVISIONING] * 2


def test_the_group_is_part_of_the_idempotent_request(world):
    from core.errors import IdempotencyConflict

    first = _member(world, "g1", idempotency_key="k")
    assert _member(world, "g1", idempotency_key="k").pk == first.pk
    with pytest.raises(IdempotencyConflict):
        _member(world, "g2", idempotency_key="k")


def test_a_member_bound_to_a_warm_instance_waits_for_its_cold_sibling_and_they_start_together(db, settings):
    """Before: the warm-bound member turned ACTIVE (and billed) at once while its sibling was still being made."""
    from django.db.backends.postgresql.psycopg_any import NumericRange

    from broker.choices import AllocationState
    from broker.models import Allocation, Gpu

    token = services.enrollment_token_create(uses=1)
    services.node_enroll(node_id="node-m", token=token, address="http://127.0.0.1:9/n/node-m", inventory={
        "gpus": [{"index": 0, "uuid": "GPU-m0", "model": "H100-80GB", "mode": "mig", "memory_mib": 81559}]})
    world = make_world()
    gpu = Gpu.objects.get()
    warm = Allocation.objects.create(lease=None, gpu=gpu, tier=gpu.model, kind="mig", mig_profile="1g.10gb",
                                     mig_start=0, slots=NumericRange(0, 1), milli=142, memory_mib=9856,
                                     state=AllocationState.WARM, warm_at=timezone.now(), ready_at=timezone.now())
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    pair = [services.lease_request(actor=actor, project="vision", group="mixed", gpu={
        "kind": "mig", "profile": "1g.10gb", "model": "H100-80GB"})[0] for _ in range(2)]
    services.schedule_cycle()
    pair = _fresh(*pair)
    warm.refresh_from_db()
    bound = next(lease for lease in pair if lease.pk == warm.lease_id)
    cold = next(lease for lease in pair if lease.pk != warm.lease_id)
    assert bound.state == cold.state == LeaseState.PROVISIONING  # the warm one waits for the cold one
    services.allocation_ready(allocation=cold.allocations.get(), instance={}, now=timezone.now())
    assert {lease.state for lease in _fresh(*pair)} == {LeaseState.ACTIVE}
