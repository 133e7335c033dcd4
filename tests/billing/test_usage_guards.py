"""The usage table's guards that replaced its foreign key to the lease (migration 0005, checked once per
statement): a usage row must name an existing lease, and a lease with usage cannot be deleted or renumbered."""

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction

from billing.models import AllocationUsage
from broker.models import Lease
from tests.factories import make_world

HOUR = datetime(2026, 1, 5, 10, tzinfo=UTC)


@pytest.fixture
def lease(db):
    world = make_world()
    project = world.acme.projects.get(slug="vision")
    return Lease.objects.create(tenant=world.acme, project=project, kind="whole", duration_seconds=3600,
                                state="released", tier="H100-80GB", requested_at=HOUR)


def usage(lease, *, lease_id=None, hour=HOUR) -> AllocationUsage:
    return AllocationUsage(tenant_id=lease.tenant_id, project_id=lease.project_id, lease_id=lease_id or lease.pk,
                           hour_start=hour, seconds=Decimal(1800), tier="H100-80GB", kind="whole", mig_profile="",
                           gpu_milli=1000, memory_mib=81559, workload_class="training", over_quota=False,
                           metered_at=HOUR)


def test_usage_naming_a_lease_that_does_not_exist_is_refused(lease):
    with pytest.raises(IntegrityError, match=f"lease {lease.pk + 1000}, which does not exist"), transaction.atomic():
        AllocationUsage.objects.bulk_create([usage(lease), usage(lease, lease_id=lease.pk + 1000)])
    assert not AllocationUsage.objects.exists()  # the whole statement, the good row with it
    row = usage(lease)
    row.save()
    with pytest.raises(IntegrityError, match="does not exist"), transaction.atomic():
        AllocationUsage.objects.filter(pk=row.pk).update(lease_id=lease.pk + 1000)
    assert AllocationUsage.objects.get().lease_id == lease.pk


def test_a_lease_with_usage_cannot_be_deleted_or_renumbered(lease):
    usage(lease).save()
    with pytest.raises(IntegrityError, match="has metered usage"), transaction.atomic():
        Lease.objects.filter(pk=lease.pk)._raw_delete(Lease.objects.db)  # past Django's PROTECT: the database's
    with pytest.raises(IntegrityError, match="has metered usage"), transaction.atomic():
        Lease.objects.filter(pk=lease.pk).update(id=lease.pk + 1000)
    assert Lease.objects.filter(pk=lease.pk).exists()
    AllocationUsage.objects.all().delete()
    Lease.objects.filter(pk=lease.pk)._raw_delete(Lease.objects.db)  # without usage: allowed
    assert not Lease.objects.filter(pk=lease.pk).exists()
