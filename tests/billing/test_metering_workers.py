"""Metering on several connections at once (``workers``) writes exactly the rows one connection writes, and
refuses to run inside a transaction (its workers could not see uncommitted leases)."""

from datetime import timedelta

import pytest
from django.db import transaction

from billing.models import AllocationUsage
from billing.services import usage_meter_window
from broker import services
from core.errors import ValidationFailed
from tests.billing.test_metering_sql import T0, expected_rows, write
from tests.factories import make_world


@pytest.fixture
def committed_world(transactional_db):
    world = make_world()
    token = services.enrollment_token_create()
    services.node_enroll(node_id="n1", token=token, address="http://127.0.0.1:9/n/n1", inventory={"gpus": [
        {"index": 0, "uuid": "GPU-h100-0", "model": "H100-80GB", "mode": "mig", "memory_mib": 81559}]})
    return world


def test_metering_workers_write_what_one_connection_writes(committed_world):
    at = T0 + timedelta(minutes=7)
    leases = [{"events": [(at + timedelta(minutes=3 * i), "active"), (at + timedelta(hours=2 + i % 3, seconds=i),
                                                                       "released")],
               "units": [{"created_at": at, "freed_at": None, "milli": 1000, "memory_mib": 81559, "kind": "whole",
                          "mig_profile": "", "preemptible": i % 2 == 0}],
               "finished_at": None, "workload_class": "training"} for i in range(9)]
    stored = write(committed_world, leases)
    start, end = T0, T0 + timedelta(hours=6)
    expected = {key: row.seconds for key, row in expected_rows(stored, start=start, end=end, now=end).items()}
    written = usage_meter_window(start=start, end=end, now=end, chunk=2, workers=3)
    assert written == len(expected) > 9
    assert {(u.lease_id, u.hour_start): u.seconds for u in AllocationUsage.objects.all()} == expected
    assert usage_meter_window(start=start, end=end, now=end, chunk=2, workers=3) == 0
    with pytest.raises(ValidationFailed), transaction.atomic():
        usage_meter_window(start=start, end=end, now=end, chunk=2, workers=3)
