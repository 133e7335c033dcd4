"""Metering an elastic lease across a shrink (issue 32 item 6): a lease shrunk from 8 GPUs to 6 at t is billed 8 GPUs
before t and 6 after, to the cent, through the metering statement and the invoice."""

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
import time_machine

from billing import services as billing
from billing.choices import LineKind
from billing.models import AllocationUsage, Invoice
from broker import services
from broker.choices import LeaseState
from broker.models import Allocation, Lease, LeaseEvent
from broker.scheduler import Unit
from broker.services.cycle import ALLOCATION_FIELDS, _allocation_rows
from tenants.access import Actor
from tenants.audit import AuditEvent
from tenants.choices import Role
from tests.factories import make_quota, make_world

ROWS = {"fields": ALLOCATION_FIELDS, "rows": _allocation_rows}  # the cycle's row builder, as it passes it


def t(day, hour, minute=0, second=0, month=1):
    return datetime(2026, month, day, hour, minute, second, tzinfo=UTC)


@pytest.fixture
def world(db):
    world = make_world()
    token = services.enrollment_token_create()
    services.node_enroll(node_id="n1", token=token, address="http://127.0.0.1:9/n/n1", inventory={"gpus": [
        {"index": index, "uuid": f"GPU-h100-{index}", "model": "H100-80GB", "mode": "whole", "memory_mib": 81559}
        for index in range(8)]})
    make_quota(world.project, "H100-80GB", deserved=8000, limit=8000, tenant_deserved=8000, tenant_limit=8000)
    billing.price_book_create(name="list 2026", currency="USD", effective_from=datetime(2025, 1, 1, tzinfo=UTC),
                              rates=[{"tier": "H100-80GB", "per_hour": "4.00"}], over_quota_multiplier="0.5",
                              interactive_multiplier="1.5")
    return world


def test_a_lease_shrunk_from_8_to_6_gpus_is_billed_8_before_and_6_after_to_the_cent(world):
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    with time_machine.travel(t(1, 9, 59), tick=False):
        lease, _ = services.lease_request(actor=actor, project="vision", duration_seconds=7200,
                                          gpu={"kind": "whole", "model": "H100-80GB", "count": 8, "min_count": 6})
        services.schedule_cycle()
    for allocation in Allocation.objects.filter(lease=lease):
        with time_machine.travel(t(1, 10), tick=False):
            services.allocation_ready(allocation=allocation, instance={"device_uuid": "X"}, now=t(1, 10))
    lease = Lease.objects.get(pk=lease.pk)
    assert lease.state == LeaseState.ACTIVE and lease.min_count == 6
    # the cycle's shrink at 10:20: its last two allocations given back (the core names their GPUs)
    last = list(Allocation.objects.filter(lease=lease).order_by("-pk")[:2])
    units = tuple(Unit(f"g{a.gpu_id}", a.milli, a.memory_mib) for a in last)
    with time_machine.travel(t(1, 10, 20), tick=False):
        freed = services.lease_shrink(lease_id=lease.pk, units=units, claimant=lease.pk, now=t(1, 10, 20))
    assert freed == sorted(a.pk for a in last)
    assert Allocation.objects.filter(lease=lease, freed_at__isnull=True).count() == 6
    event = LeaseEvent.objects.filter(lease=lease).latest("pk")
    assert (event.from_state, event.to_state) == ("active", "active")
    assert event.reason.startswith("resized: 8 → 6 units")
    assert AuditEvent.objects.get(action="lease.resize").data["to_units"] == 6
    # never below its minimum: a second shrink of 1 more is refused, nothing written
    one = list(Allocation.objects.filter(lease=lease, freed_at__isnull=True).order_by("-pk")[:1])
    with time_machine.travel(t(1, 10, 30), tick=False):
        assert services.lease_shrink(lease_id=lease.pk, units=(Unit(f"g{one[0].gpu_id}", 1000, one[0].memory_mib),),
                                     claimant=lease.pk, now=t(1, 10, 30)) is None
    with time_machine.travel(t(1, 12), tick=False):
        services.lease_release(lease=lease, actor="user:max", now=t(1, 12))
        services.allocations_free(lease=Lease.objects.get(pk=lease.pk), now=t(1, 12), to=LeaseState.RELEASED,
                                  reason="released")
    billing.usage_meter_window(start=t(1, 10), end=t(1, 12), now=t(1, 13))
    rows = {row.hour_start.hour: row for row in AllocationUsage.objects.filter(lease=lease)}
    # 10:00-10:20 on 8 GPUs, 10:20-11:00 on 6: 8 x 1200 + 6 x 2400 GPU-seconds = 24,000, as 8 GPUs x 3000 s
    assert rows[10].seconds * rows[10].gpu_milli == Decimal(8 * 1200 + 6 * 2400) * 1000
    assert (rows[10].gpu_milli, rows[10].seconds) == (8000, Decimal("3000"))
    assert (rows[11].gpu_milli, rows[11].seconds) == (6000, Decimal("3600"))
    # invoiced: 24,000 + 21,600 GPU-seconds = 12.666667 GPU-hours at 4.00 = 50.67 USD (unshrunk: 16 h, 64.00)
    billing.invoice_run(period=date(2026, 1, 1), now=t(2, 12, month=2))
    [line] = Invoice.objects.get(tenant=world.acme).lines.filter(kind=LineKind.USAGE)
    assert line.gpu_hours == Decimal("12.666667") and line.unit_price == Decimal("4")
    assert line.amount_minor == 5067


def test_a_lease_shrunk_then_grown_back_is_billed_by_what_it_held_in_each_piece(world):
    """8 GPUs from 10:00, shrunk to 6 at 10:30, grown back to 8 at 11:15 (the cycle's ``lease_grow``), released at
    12:00: 8 x 1800 + 6 x 1800 GPU-seconds in hour 10, 6 x 900 + 8 x 2700 in hour 11 — the hour that began at 6
    GPUs is billed on 8 (the most it held), its seconds scaled (3375 s), not 4500 s cut to 3600."""
    from broker.scheduler import Allocation as CoreAllocation
    from broker.scheduler import Decision, DecisionMode
    from broker.selectors import scheduler_snapshot

    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    with time_machine.travel(t(1, 9, 59), tick=False):
        lease, _ = services.lease_request(actor=actor, project="vision", duration_seconds=7200,
                                          gpu={"kind": "whole", "model": "H100-80GB", "count": 8, "min_count": 6})
        services.schedule_cycle()
    for allocation in Allocation.objects.filter(lease=lease):
        with time_machine.travel(t(1, 10), tick=False):
            services.allocation_ready(allocation=allocation, instance={"device_uuid": "X"}, now=t(1, 10))
    last = list(Allocation.objects.filter(lease=lease).order_by("-pk")[:2])
    units = tuple(Unit(f"g{a.gpu_id}", a.milli, a.memory_mib) for a in last)
    with time_machine.travel(t(1, 10, 30), tick=False):
        assert services.lease_shrink(lease_id=lease.pk, units=units, claimant=lease.pk, now=t(1, 10, 30))
    gpus = {gpu.id: gpu for gpu in scheduler_snapshot(now=t(1, 11, 15)).gpus}
    grown = Decision(str(lease.pk), DecisionMode.GROW, "grown", grown=units, allocation=CoreAllocation(
        str(lease.pk), str(lease.project_id), str(lease.tenant_id), "H100-80GB", "n1", units, True))
    with time_machine.travel(t(1, 11, 15), tick=False):
        added = services.lease_grow(lease_id=lease.pk, decision=grown, gpus=gpus, now=t(1, 11, 15), **ROWS)
    assert len(added) == 2 and Allocation.objects.filter(lease=lease, freed_at__isnull=True).count() == 8
    assert LeaseEvent.objects.filter(lease=lease).latest("pk").reason.startswith("resized: 6 → 8 units")
    # never beyond its count: growing again is refused, nothing written
    with time_machine.travel(t(1, 11, 20), tick=False):
        assert services.lease_grow(lease_id=lease.pk, decision=grown, gpus=gpus, now=t(1, 11, 20), **ROWS) is None
    with time_machine.travel(t(1, 12), tick=False):
        services.lease_release(lease=Lease.objects.get(pk=lease.pk), actor="user:max", now=t(1, 12))
        services.allocations_free(lease=Lease.objects.get(pk=lease.pk), now=t(1, 12), to=LeaseState.RELEASED,
                                  reason="released")
    billing.usage_meter_window(start=t(1, 10), end=t(1, 12), now=t(1, 13))
    rows = {row.hour_start.hour: row for row in AllocationUsage.objects.filter(lease=lease)}
    assert (rows[10].gpu_milli, rows[10].seconds) == (8000, Decimal("3150"))  # 8 x 1800 + 6 x 1800 = 8 x 3150
    assert (rows[11].gpu_milli, rows[11].seconds) == (8000, Decimal("3375"))  # 6 x 900 + 8 x 2700 = 8 x 3375
    # the reference (lease_hours) agrees with the statement
    from billing.core.metering import HeldUnit, lease_hours

    events = list(LeaseEvent.objects.filter(lease=lease).order_by("at", "pk").values_list("at", "to_state", "reason"))
    held = [HeldUnit(a.pk, a.created_at, a.freed_at, a.tier, a.kind, a.mig_profile, a.milli, a.memory_mib,
                     a.preemptible) for a in Allocation.objects.filter(lease=lease).order_by("pk")]
    reference = lease_hours([(at, state, reason.startswith("resized:")) for at, state, reason in events], held,
                            start=t(1, 10), until=t(1, 12))
    assert [(r.hour_start.hour, r.gpu_milli, r.seconds) for r in reference] == [(10, 8000, Decimal("3150")),
                                                                                (11, 8000, Decimal("3375"))]
    # invoiced: 25,200 + 27,000 GPU-seconds = 14.5 GPU-hours at 4.00 = 58.00 USD
    billing.invoice_run(period=date(2026, 1, 1), now=t(2, 12, month=2))
    [line] = Invoice.objects.get(tenant=world.acme).lines.filter(kind=LineKind.USAGE)
    assert line.gpu_hours == Decimal("14.5") and line.amount_minor == 5800
