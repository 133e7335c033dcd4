"""Applying adjustments races the scheduler and people: each is taken once (a conditional state change),
re-checks the world under locks, and never double-books — a warm member taken or removed since a cycle read
it refuses that placement; a GPU a lease now holds is left alone."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.backends.postgresql.psycopg_any import NumericRange
from django.utils import timezone

from broker import services
from broker.choices import AllocationState, LeaseState
from broker.models import Allocation, Gpu, Lease
from capacity import services as capacity_services
from capacity.models import Adjustment
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_world


@pytest.fixture
def world(db):
    return make_world()


def a_node(mode: str = "mig") -> Gpu:
    token = services.enrollment_token_create(uses=1)
    services.node_enroll(node_id="node-a", token=token, address="http://127.0.0.1:9/n/node-a", inventory={
        "gpus": [{"index": 0, "uuid": "GPU-0", "model": "H100-80GB", "mode": mode, "memory_mib": 81559}]})
    return Gpu.objects.get()


def a_warm_member(gpu: Gpu, start: int = 0) -> Allocation:
    return Allocation.objects.create(lease=None, gpu=gpu, tier=gpu.model, kind="mig", mig_profile="1g.10gb",
                                     mig_start=start, slots=NumericRange(start, start + 1), milli=142,
                                     memory_mib=9856, state=AllocationState.WARM, warm_at=timezone.now(),
                                     ready_at=timezone.now())


def ask(world, shape: dict) -> Lease:
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease, _ = services.lease_request(actor=actor, project="vision", gpu=shape, duration_seconds=600)
    return lease


ONE_G = {"kind": "mig", "profile": "1g.10gb", "model": "H100-80GB"}


def test_a_cycle_binds_a_warm_member_without_the_agent(world):
    gpu = a_node()
    member = a_warm_member(gpu)
    lease = ask(world, ONE_G)
    services.schedule_cycle()  # the node's address answers nothing: a cold path would fail to provision
    lease.refresh_from_db()
    assert lease.state == LeaseState.ACTIVE and lease.active_at is not None
    member.refresh_from_db()
    assert member.lease_id == lease.pk and member.state == AllocationState.READY and member.bound_at is not None
    assert list(lease.events.values_list("to_state", flat=True)) [-3:] == ["queued", "provisioning", "active"]
    assert lease.guarantee_covered is True  # recorded for a warm bind too (its own write: docs/billing.md)


def test_a_warm_member_removed_under_a_cycle_refuses_that_placement(world, monkeypatch):
    gpu = a_node()
    member = a_warm_member(gpu)
    lease = ask(world, ONE_G)
    from broker.services import cycle

    class RacingScheduler(cycle.Scheduler):
        def schedule(self, *args, **kwargs):
            decisions = super().schedule(*args, **kwargs)
            assert decisions[0].warm == (str(member.pk),)
            # a warm-pool shrink takes the member between the cycle's read and its write
            Allocation.objects.filter(pk=member.pk).update(state=AllocationState.FREED, freed_at=timezone.now())
            return decisions

    monkeypatch.setattr(cycle, "Scheduler", RacingScheduler)  # the core as the cycle calls it
    services.schedule_cycle()
    lease.refresh_from_db()
    assert lease.state == LeaseState.QUEUED and "vacated" in lease.reason
    assert not Allocation.objects.filter(lease=lease).exists()


def test_a_warm_member_is_never_bound_twice(world):
    gpu = a_node()
    a_warm_member(gpu)
    first, second = ask(world, ONE_G), ask(world, ONE_G)
    services.schedule_cycle()
    first.refresh_from_db()
    second.refresh_from_db()
    bound = Allocation.objects.filter(bound_at__isnull=False)
    assert bound.count() == 1 and bound.get().lease_id == first.pk
    # the second is placed the cold way beside it (its provisioning goes to the agent, which here is absent)
    assert second.state == LeaseState.PROVISIONING
    assert Allocation.objects.get(lease=second).mig_start != bound.get().mig_start


def proposal(kind: str, change: dict, **extra) -> Adjustment:
    import hashlib

    print_ = hashlib.sha256(f"{kind}{sorted(change.items())}".encode()).hexdigest()
    return Adjustment.objects.create(kind=kind, target=extra.pop("target", "gpu:g0"), fingerprint=print_,
                                     mode="advise", reason="test", change=change, **extra)


def test_a_mode_switch_leaves_a_gpu_a_lease_now_holds_alone(world, admin_user):
    gpu = a_node(mode="whole")
    lease = ask(world, {"kind": "whole", "model": "H100-80GB"})
    services.schedule_cycle()
    switch = proposal("mode_switch", {"gpu": f"g{gpu.pk}", "from_mode": "whole", "to_mode": "mig", "drain": False},
                      target=f"gpu:g{gpu.pk}")
    done = capacity_services.adjustment_accept(adjustment=switch, user=admin_user)
    assert done.state == "expired" and "left alone" in done.outcome
    gpu.refresh_from_db()
    assert gpu.mode == "whole" and gpu.mode_target == ""
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.PROVISIONING
    with pytest.raises(capacity_services.AdjustmentConflict):  # taken once: a decided row is not applied again
        capacity_services.adjustment_accept(adjustment=switch, user=admin_user)


def test_a_drain_preempts_only_the_over_quota_leases_it_named(world, admin_user):
    gpu = a_node(mode="whole")
    lease = ask(world, {"kind": "whole", "model": "H100-80GB"})
    services.schedule_cycle()
    allocation = Allocation.objects.get(lease=lease)
    services.allocation_ready(allocation=allocation, instance={}, now=timezone.now())
    # in quota: a drain proposal naming it is refused (the planner never proposes it; applying re-checks)
    drain = proposal("mode_switch", {"gpu": f"g{gpu.pk}", "from_mode": "whole", "to_mode": "mig", "drain": True},
                     target=f"gpu:g{gpu.pk}", risk=[lease.pk])
    assert capacity_services.adjustment_accept(adjustment=drain, user=admin_user).state == "expired"
    # over quota: it is preempted with its notice, the GPU closed until it has left
    Allocation.objects.filter(pk=allocation.pk).update(preemptible=True)
    again = proposal("mode_switch", {"gpu": f"g{gpu.pk}", "from_mode": "whole", "to_mode": "mig", "drain": True,
                                     "n": 2}, target=f"gpu:g{gpu.pk}", risk=[lease.pk])
    done = capacity_services.adjustment_accept(adjustment=again, user=admin_user)
    assert done.state == "applying" and "draining" in done.outcome
    lease.refresh_from_db()
    assert lease.state == LeaseState.PREEMPTED and lease.notice_deadline is not None
    gpu.refresh_from_db()
    assert gpu.mode_target == "mig"
    # the scheduler places nothing new on the closed GPU, even after the lease left
    services.lease_preempt_due(now=timezone.now() + timedelta(hours=1))
    other = ask(world, {"kind": "whole", "model": "H100-80GB"})
    services.schedule_cycle()
    assert not Allocation.objects.filter(lease=other).exists()


def test_a_rejected_proposal_is_not_proposed_again_every_run(world, admin_user):
    """The planner makes the same proposal each minute while the world stays the same: a person's reject
    stands (no new row), while an unrelated proposal is still recorded."""
    from capacity.planner import Adjustment as Proposal
    from capacity.planner import AdjustmentKind, Change, Evidence, Gain, Mode

    def proposal(target: str) -> Proposal:
        return Proposal(AdjustmentKind.MODE_SWITCH, target, Change(gpu=target[4:], from_mode="whole", to_mode="mig"),
                        Evidence(0.0, 1.0, (("queued", 1),)), Gain(gpu_seconds=1), (), Mode.ADVISE, "test")

    now = timezone.now()
    rows, _ = capacity_services.adjustments_record([proposal("gpu:g1")], now=now, currency="USD")
    capacity_services.adjustment_reject(adjustment=rows[0], user=admin_user, reason="not now")
    again, counts = capacity_services.adjustments_record([proposal("gpu:g1"), proposal("gpu:g2")],
                                                      now=now + timedelta(minutes=1), currency="USD")
    assert [r.target for r in again] == ["gpu:g2"] and counts["new"] == 1
    assert Adjustment.objects.filter(target="gpu:g1").count() == 1
