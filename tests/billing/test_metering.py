"""Allocation metering from lease events: exact seconds per lease per UTC hour, split at hour and month
boundaries, stopping when the lease stops holding; metering a window again changes nothing."""

from datetime import UTC, datetime
from decimal import Decimal

import pytest
import time_machine

from billing.core.metering import held_intervals, split_hours
from billing.models import AllocationUsage
from billing.services import usage_meter_window
from broker import services
from broker.choices import LeaseState
from broker.models import Allocation, Lease
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_world


def t(day, hour, minute=0, second=0, month=1):
    return datetime(2026, month, day, hour, minute, second, tzinfo=UTC)


def test_metering_held_intervals_follow_the_events():
    events = [(t(1, 9), "requested"), (t(1, 9), "queued"), (t(1, 9, 1), "provisioning"), (t(1, 9, 2), "active"),
              (t(1, 9, 30), "active"), (t(1, 10), "preempted"), (t(1, 10, 0, 30), "queued"),
              (t(1, 11), "provisioning"), (t(1, 11, 1), "active")]
    assert held_intervals(events, until=t(1, 12)) == [(t(1, 9, 2), t(1, 10, 0, 30)), (t(1, 11, 1), t(1, 12))]


def test_metering_split_at_hours_and_months_within_the_window():
    start, end = datetime(2026, 1, 31, 23, 15, tzinfo=UTC), datetime(2026, 2, 1, 1, 0, 0, 500000, tzinfo=UTC)
    window = (datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC))
    assert split_hours(start, end, window=window) == [
        (datetime(2026, 1, 31, 23, tzinfo=UTC), 2700.0), (datetime(2026, 2, 1, 0, tzinfo=UTC), 3600.0),
        (datetime(2026, 2, 1, 1, tzinfo=UTC), 0.5)]
    january = (datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC))
    assert split_hours(start, end, window=january) == [(datetime(2026, 1, 31, 23, tzinfo=UTC), 2700.0)]


@pytest.fixture
def world(db):
    world = make_world()
    token = services.enrollment_token_create()
    services.node_enroll(node_id="n1", token=token, address="http://127.0.0.1:9/n/n1", inventory={"gpus": [
        {"index": 0, "uuid": "GPU-h100-0", "model": "H100-80GB", "mode": "mig", "memory_mib": 81559}]})
    return world


def test_metering_a_lease_from_events_exactly_and_idempotently(world):
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    with time_machine.travel(t(1, 10, 50), tick=False):  # 2 h planned: released (12:10:30) before its end
        lease, _ = services.lease_request(actor=actor, project="vision", gpu={"kind": "mig", "profile": "3g.40gb"},
                                          duration_seconds=7200)
        services.schedule_cycle()
    allocation = Allocation.objects.get(lease=lease)
    with time_machine.travel(t(1, 10, 55), tick=False):
        services.allocation_ready(allocation=allocation, instance={"device_uuid": "MIG-1"}, now=t(1, 10, 55))
    with time_machine.travel(t(1, 12, 10, 30), tick=False):
        services.lease_release(lease=lease, actor="test", now=t(1, 12, 10, 30))
        services.allocations_free(lease=Lease.objects.get(pk=lease.pk), now=t(1, 12, 10, 30),
                                  to=LeaseState.RELEASED, reason="released")
    day = (t(1, 0), t(2, 0))
    assert usage_meter_window(start=day[0], end=day[1], now=t(3, 0)) == 3
    rows = list(AllocationUsage.objects.order_by("hour_start").values_list("hour_start", "seconds", "gpu_milli",
                                                                            "memory_mib", "tier", "mig_profile"))
    assert rows == [(t(1, 10), Decimal("300"), 428, 40320, "H100-80GB", "3g.40gb"),
                    (t(1, 11), Decimal("3600"), 428, 40320, "H100-80GB", "3g.40gb"),
                    (t(1, 12), Decimal("630"), 428, 40320, "H100-80GB", "3g.40gb")]
    # again, and in two halves: the same rows
    usage_meter_window(start=day[0], end=day[1], now=t(3, 0))
    usage_meter_window(start=t(1, 11), end=t(1, 12), now=t(3, 0))
    assert list(AllocationUsage.objects.order_by("hour_start").values_list("hour_start", "seconds")) == [
        (r[0], r[1]) for r in rows]


def test_metering_the_hour_in_progress_is_completed_later(world):
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    with time_machine.travel(t(1, 9, 0), tick=False):
        lease, _ = services.lease_request(actor=actor, project="vision", gpu={"kind": "mig", "profile": "1g.10gb"})
        services.schedule_cycle()
        services.allocation_ready(allocation=Allocation.objects.get(lease=lease), instance={}, now=t(1, 9, 0))
    usage_meter_window(start=t(1, 9), end=t(1, 10), now=t(1, 9, 20))
    assert AllocationUsage.objects.get().seconds == Decimal("1200")
    usage_meter_window(start=t(1, 9), end=t(1, 10), now=t(1, 11))
    assert AllocationUsage.objects.get().seconds == Decimal("3600")


def test_metering_window_must_be_whole_hours(world):
    from core.errors import ValidationFailed

    with pytest.raises(ValidationFailed):
        usage_meter_window(start=t(1, 9, 30), end=t(1, 10))
    assert usage_meter_window(start=t(1, 9), end=t(1, 10), now=t(1, 11)) == 0
    assert not AllocationUsage.objects.exists()
