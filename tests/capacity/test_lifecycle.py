"""The loop's defaults and its proposals' lifecycle, on the real database: the built-in modes (auto where only
idle capacity is touched) under an operator's explicit settings; a proposal stays one open row while the
planner keeps making the same decision, whatever details it recomputes; the cold create time the planner
reads is the fleet's measured one; open rows of the old fingerprints are re-keyed by the migration."""

from __future__ import annotations

import importlib
from datetime import timedelta

import pytest
from django.apps import apps
from django.db.backends.postgresql.psycopg_any import NumericRange
from django.utils import timezone

from broker import services
from broker.choices import AllocationState
from broker.models import Allocation, Gpu
from capacity import services as capacity_services
from capacity.models import Adjustment
from capacity.planner import Adjustment as Proposal
from capacity.planner import AdjustmentKind, Change, Evidence, Gain, Mode, Slot
from capacity.selectors import create_latency, policies_in_force
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_user, make_world

H100 = "H100-80GB"
POOL = f"pool:{H100}/1g.10gb"


@pytest.fixture
def world(db):
    return make_world()


def a_gpu() -> Gpu:
    token = services.enrollment_token_create(uses=1)
    services.node_enroll(node_id="node-a", token=token, address="http://127.0.0.1:9/n/node-a", inventory={
        "gpus": [{"index": 0, "uuid": "GPU-0", "model": H100, "mode": "mig", "memory_mib": 81559}]})
    return Gpu.objects.get()


def warm_pool(size_before: int, size_after: int, slots: tuple[Slot, ...] = (), arrivals: int = 10) -> Proposal:
    return Proposal(
        kind=AdjustmentKind.WARM_POOL, target=POOL,
        change=Change(model=H100, profile="1g.10gb", size_before=size_before, size_after=size_after, slots=slots,
                      remove=tuple(f"w{i}" for i in range(max(0, size_before - size_after)))),
        evidence=Evidence(0.0, 3600.0, (("arrivals", arrivals),)), expected_gain=Gain(time_to_gpu_seconds=5),
        risk=(), mode=Mode.ADVISE, reason=f"{arrivals} arrivals")


# -- the default policy ----------------------------------------------------------------------------------------


def test_lifecycle_default_policy_is_auto_for_idle_capacity_and_advise_for_leases(world, settings):
    [default] = policies_in_force()
    assert (default.mode_switch, default.mig_layout, default.warm_pool) == ("auto", "auto", "auto")
    assert (default.idle_reclaim, default.right_size, default.quota_advice) == ("advise", "advise", "advise")
    assert default.cold_provision_seconds is None  # measured, unless an operator sets it
    # an operator's explicit settings stand over the new defaults
    capacity_services.policy_set(scope="", values={"warm_pool": "advise", "idle_reclaim": "auto"})
    [default] = policies_in_force()
    assert (default.warm_pool, default.idle_reclaim, default.mode_switch) == ("advise", "auto", "auto")
    # CAPACITY_DEFAULT_MODE set: every kind's built-in mode, still under the row's explicit fields
    settings.CAPACITY_DEFAULT_MODE = "off"
    [default] = policies_in_force()
    assert (default.warm_pool, default.idle_reclaim, default.mode_switch, default.right_size) == (
        "advise", "auto", "off", "off")


def test_lifecycle_staff_page_names_the_built_in_modes(world):
    from capacity.presenters import default_mode

    assert default_mode() == ("auto: Mode switch, MIG layout, Warm pool; "
                              "advise: Idle reclaim, Right-sizing advice, Quota advice")


# -- proposals persist while their evidence holds ----------------------------------------------------------------


def test_lifecycle_a_proposal_stays_open_while_the_planner_makes_the_same_decision(world):
    gpu = a_gpu()
    now = timezone.now()
    capacity_services.adjustments_record([warm_pool(0, 2, (Slot(f"g{gpu.pk}", 0, "1g.10gb"),))], now=now,
                                         currency="USD")
    row = Adjustment.objects.get()
    # a minute later the planner recomputes the details (one more arrival, another size and slot): same row
    later = now + timedelta(seconds=60)
    rows, counts = capacity_services.adjustments_record(
        [warm_pool(0, 3, (Slot(f"g{gpu.pk}", 1, "1g.10gb"),), arrivals=11)], now=later, currency="USD")
    assert counts == {"proposed": 1, "new": 0, "expired": 0} and [r.pk for r in rows] == [row.pk]
    row.refresh_from_db()
    assert row.state == "proposed" and row.proposed_at == now and row.last_seen_at == later
    assert row.change["size_after"] == 3 and row.change["slots"] == [{"gpu": f"g{gpu.pk}", "start": 1,
                                                                     "profile": "1g.10gb"}]
    assert row.reason == "11 arrivals" and row.evidence["figures"]["arrivals"] == 11
    # the decision turns (the pool is now to shrink): the grow is no longer proposed and expires; a new row
    _, counts = capacity_services.adjustments_record([warm_pool(2, 0)], now=later + timedelta(seconds=60),
                                                     currency="USD")
    assert counts == {"proposed": 1, "new": 1, "expired": 1}
    row.refresh_from_db()
    assert row.state == "expired" and "no longer proposed" in row.outcome
    assert Adjustment.objects.get(state="proposed").change["size_after"] == 0


def test_lifecycle_a_rejected_decision_is_not_proposed_again_with_other_details(world):
    now = timezone.now()
    capacity_services.adjustments_record([warm_pool(0, 2)], now=now, currency="USD")
    row = Adjustment.objects.get()
    staff = make_user("ops-lifecycle", is_staff=True)
    capacity_services.adjustment_reject(adjustment=row, user=staff, reason="not worth it", now=now)
    _, counts = capacity_services.adjustments_record([warm_pool(0, 4, arrivals=14)], now=now + timedelta(minutes=5),
                                                     currency="USD")
    assert counts["new"] == 0 and Adjustment.objects.count() == 1


# -- the measured cold create --------------------------------------------------------------------------------


def test_lifecycle_the_cold_create_time_is_the_fleets_measured_one(world):
    gpu = a_gpu()
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease, _ = services.lease_request(actor=actor, project="vision",
                                      gpu={"kind": "mig", "profile": "1g.10gb", "model": H100}, duration_seconds=600)
    now = timezone.now()
    made = now - timedelta(minutes=10)
    start = iter(range(7))

    def allocation(seconds: float, *, profile="1g.10gb", created=made, warm=False, bound=False, on_lease=True):
        slot = next(start)
        done = created + timedelta(seconds=seconds)
        return Allocation.objects.create(
            lease=lease if on_lease else None, gpu=gpu, tier=H100, kind="mig", mig_profile=profile, mig_start=slot,
            slots=NumericRange(slot, slot + 1), milli=142, memory_mib=9856, state=AllocationState.FREED,
            freed_at=now, created_at=created, ready_at=done + timedelta(seconds=300 if bound else 0),
            warm_at=done if warm else None, bound_at=done + timedelta(seconds=300) if bound else None)

    allocation(2.0)  # cold, for a lease
    allocation(3.0)
    allocation(4.0, warm=True, on_lease=False)  # a warm member: its create ends at warm_at
    allocation(1.0, warm=True, bound=True)  # bound 300 s later: the bind's wait is no create
    allocation(50.0, created=now - timedelta(hours=7))  # outside the history window
    allocation(9.0, profile="", on_lease=True)  # a whole GPU: no MIG create
    measured = {(c.model, c.profile): (c.p95_milliseconds, c.samples) for c in create_latency(now=now)}
    assert measured == {(H100, "1g.10gb"): (4000, 4), (H100, ""): (4000, 4)}

    # the planner reads it: the pool's evidence names it and the reason says it in seconds
    from capacity.selectors import capacity_snapshot

    snapshot, _ = capacity_snapshot(now=now)
    assert snapshot.create_latency == create_latency(now=now)


# -- the migration re-keys open rows ---------------------------------------------------------------------------


def test_lifecycle_migration_rekeys_open_rows_and_expires_duplicates(world):
    migration = importlib.import_module("capacity.migrations.0004_wave9_proposal_identity")
    now = timezone.now()
    base = {"kind": "warm_pool", "target": POOL, "mode": "advise", "reason": "old"}
    older = Adjustment.objects.create(fingerprint="old-1", change={"size_before": 0, "size_after": 2}, **base,
                                      last_seen_at=now - timedelta(minutes=2))
    newer = Adjustment.objects.create(fingerprint="old-2", change={"size_before": 0, "size_after": 3}, **base,
                                      last_seen_at=now - timedelta(minutes=1))
    shrink = Adjustment.objects.create(fingerprint="old-3", change={"size_before": 3, "size_after": 1}, **base)
    done = Adjustment.objects.create(fingerprint="old-4", change={"size_before": 0, "size_after": 2}, **base,
                                     state="rejected", finished_at=now)
    migration.rekey_open_rows(apps, None)
    for row in (older, newer, shrink, done):
        row.refresh_from_db()
    assert older.state == "expired" and "newer open proposal" in older.outcome and older.fingerprint == "old-1"
    grow = capacity_services.fingerprint(warm_pool(0, 5))
    assert newer.state == "proposed" and newer.fingerprint == grow
    assert shrink.fingerprint == capacity_services.fingerprint(warm_pool(3, 0))
    assert done.fingerprint == "old-4"  # decided rows keep theirs
