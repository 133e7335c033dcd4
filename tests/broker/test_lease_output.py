"""The lease answer is written out by hand for speed (``LeaseOutput.to_representation``): it must say
exactly what DRF's generic rendering of the declared fields says, in every state a lease can be in."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework import serializers

from broker import services
from broker.api.serializers import LeaseDetailOutput, LeaseOutput
from broker.models import Lease
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_world


@pytest.fixture
def world(db):
    return make_world()


def _generic(lease) -> dict:
    return serializers.ModelSerializer.to_representation(LeaseOutput(), lease)


def test_lease_output_matches_drf_rendering_in_every_state(world):
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    shapes = [{"kind": "mig", "profile": "1g.10gb"}, {"kind": "whole", "count": 2, "model": "H100-80GB"},
              {"kind": "share", "milli": 250, "memory_mib": 8192}]
    leases = [services.lease_request(actor=actor, project="vision", gpu=gpu, priority=3, idempotency_key=str(n))[0]
              for n, gpu in enumerate(shapes)]
    now = timezone.now().replace(microsecond=123456)
    Lease.objects.filter(pk=leases[1].pk).update(
        state="preempted", tier="H100-80GB", over_quota=True, queue_position=None, active_at=now,
        ends_at=now + timedelta(hours=1), notice_deadline=now + timedelta(seconds=30), reason="preempted for x")
    Lease.objects.filter(pk=leases[2].pk).update(state="released", queue_position=4, finished_at=now)
    fresh = list(Lease.objects.select_related("project").order_by("pk"))
    for lease in [*leases, *fresh]:  # as the service returns it (enum state) and as read back
        assert LeaseOutput(lease).data == _generic(lease)
    assert LeaseOutput(fresh, many=True).data == [_generic(lease) for lease in fresh]
    assert LeaseOutput(fresh[1]).data["notice_deadline"].endswith("Z")


def test_lease_detail_output_still_has_devices_and_events(world):
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease, _ = services.lease_request(actor=actor, project="vision", gpu={"kind": "whole"})
    data = LeaseDetailOutput(Lease.objects.get(pk=lease.pk)).data
    assert data["devices"] == [] and [e["to_state"] for e in data["events"]] == ["requested", "queued"]
    assert data["workload"] is None  # a bare lease (docs/leasing.md, "Workloads")
    assert data["share_enforcement"] is None  # no share: nothing to say of MPS (docs/leasing.md)
    assert data["access"] == []  # holds no GPU: nothing to reach yet (docs/leasing.md, "Using a lease")
    assert {k: v for k, v in data.items()
            if k not in ("devices", "events", "workload", "share_enforcement", "access")} == LeaseOutput(lease).data
