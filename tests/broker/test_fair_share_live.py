"""The live cycle's fair share with history, preemption back-off and estimated start times (docs/scheduling.md):
on a fleet in PostgreSQL, through ``schedule_cycle``, the lease API, the quote and the portal's lease page."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from django.test import Client
from django.utils import timezone

from broker import services
from broker.models import Gpu, Lease, LeaseEvent, Node, ProjectUsageHistory
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_project, make_quota, make_world

H100 = "H100-80GB"


@pytest.fixture
def world(db, settings):
    settings.LEASE_PREEMPTION_NOTICE_SECONDS = 30
    settings.LEASE_MIN_RUNTIME_SECONDS = 0
    return make_world()


def fleet(gpus: int) -> Node:
    node = Node.objects.create(node_id="node-a", address="http://127.0.0.1:1", secret="s", status="ready")
    for index in range(gpus):
        Gpu.objects.create(node=node, uuid=f"GPU-a-{index}", index=index, model=H100, mode="whole", memory_mib=81559)
    return node


def run(world, now, *, count: int = 1, duration: int = 3600, project: str = "vision") -> Lease:
    """A lease requested, placed by a cycle at ``now`` and ACTIVE (its agent's answer recorded) from then."""
    lease = ask(world, count=count, duration=duration, project=project)
    services.schedule_cycle(now=now)
    for allocation in lease.allocations.all():
        services.allocation_ready(allocation=allocation, instance={}, now=now)
    lease.refresh_from_db()
    assert lease.state == "active", lease.reason
    return lease


def ask(world, *, count: int = 1, duration: int = 3600, project: str = "vision") -> Lease:
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease, _ = services.lease_request(actor=actor, project=project, gpu={"kind": "whole", "model": H100,
                                                                         "count": count},
                                      duration_seconds=duration)
    return lease


def page(pk: int, username: str = "max") -> tuple[int, str]:
    client = Client()
    assert client.login(username=username, password=f"pw-{username}")
    response = client.get(f"/leases/{pk}")
    return response.status_code, " ".join(unescape(re.sub(r"<[^>]+>", " ", response.content.decode())).split())


def test_fair_share_live_estimated_start_from_expiries(world):
    # two GPUs held until +600 s and +1200 s; a third lease waits: it starts when the first expires; a quote for
    # one more waits behind it and starts when that third lease, placed at +600 s for 300 s, ends (+900 s)
    fleet(2)
    make_quota(world.project, H100, deserved=4000, limit=4000)
    start = timezone.now().replace(microsecond=0)
    first = run(world, start, duration=600)
    run(world, start, duration=1200)
    queued = ask(world, duration=300)
    services.schedule_cycle(now=start + timedelta(seconds=5))
    queued.refresh_from_db()
    assert queued.state == "queued" and queued.queue_position == 1
    assert queued.estimated_start == first.ends_at == start + timedelta(seconds=600)
    body = world.client("member").get(f"/api/v1/leases/{queued.pk}").json()
    assert body["estimated_start"] == (start + timedelta(seconds=600)).isoformat().replace("+00:00", "Z")
    assert world.client("member").get(f"/api/v1/leases/{first.pk}").json()["estimated_start"] is None  # running
    answer = world.client("member").post("/api/v1/quotes", {"project": "vision", "gpu": {"kind": "whole",
                                                                                        "model": H100}},
                                         format="json").json()
    assert (answer["outcome"], answer["queue_position"]) == ("waits", 2)
    assert answer["estimated_start"] == (start + timedelta(seconds=900)).isoformat().replace("+00:00", "Z")
    assert 880 <= answer["expected_wait_seconds"] <= 900
    status, text = page(queued.pk)
    assert status == 200
    shown = (start + timedelta(seconds=600)).strftime("%Y-%m-%d %H:%M")
    assert f"Estimated start {shown} UTC (if the running leases end at their expiry)" in text
    assert page(queued.pk, username="bob")[0] == 404  # another tenant's lease: not found


def test_fair_share_live_borrowed_use_remembered_and_named(world, settings):
    settings.LEASE_FAIR_SHARE_HALF_LIFE_SECONDS = 86400
    fleet(2)
    make_quota(world.project, H100, deserved=0, limit=4000, tenant_deserved=4000, tenant_limit=8000)
    start = timezone.now()
    borrowed = run(world, start, count=2)
    assert borrowed.over_quota
    waiting = ask(world)
    services.schedule_cycle(now=start + timedelta(hours=1))
    row = ProjectUsageHistory.objects.get(project=world.project, tier=H100)
    assert (row.decayed_milli_seconds, row.updated_at) == (0, start + timedelta(hours=1))  # remembered from here
    services.schedule_cycle(now=start + timedelta(hours=3))
    row.refresh_from_db()
    # two GPUs borrowed for two hours, decayed with a one-day half-life: 2000 x 86400 / ln 2 x (1 - 2^(-2/24))
    assert 13_900_000 < row.decayed_milli_seconds < 14_100_000
    waiting.refresh_from_db()
    assert ("fair share: project 'vision' borrowed 3.9 GPU-h of H100-80GB decayed over a half-life of 86400 s "
            "(weight 1)") in waiting.reason
    settings.LEASE_FAIR_SHARE_HALF_LIFE_SECONDS = 0  # off: nothing said, nothing moved on
    services.schedule_cycle(now=start + timedelta(hours=5))
    waiting.refresh_from_db()
    assert "fair share" not in waiting.reason
    assert ProjectUsageHistory.objects.get(pk=row.pk).updated_at == start + timedelta(hours=3)


def test_fair_share_live_back_off_protects_a_lease_preempted_again_and_again(world, settings):
    fleet(1)
    make_quota(world.project, H100, deserved=0, limit=1000, tenant_deserved=4000, tenant_limit=8000)
    nlp = make_project(world.acme, "nlp")
    make_quota(nlp, H100, deserved=1000, limit=1000, tenant_deserved=4000, tenant_limit=8000)
    start = timezone.now()
    borrowed = run(world, start)
    for minutes in (10, 20, 30):  # preempted three times in the hour before it last started
        LeaseEvent.objects.create(lease=borrowed, from_state="active", to_state="preempted", reason="test",
                                  actor="scheduler", at=borrowed.active_at - timedelta(minutes=minutes))
    claim = ask(world, project="nlp")
    services.schedule_cycle(now=start + timedelta(seconds=60))
    claim.refresh_from_db()
    assert claim.state == "queued"
    assert ("1 over-quota lease(s) on H100-80GB are protected from reclaim by the preemption back-off, the first "
            "until 1740 s from now") in claim.reason
    assert Lease.objects.get(pk=borrowed.pk).state == "active"
    # past the protection (30 min after its start) it is reclaimed as any borrowed work
    services.schedule_cycle(now=start + timedelta(seconds=1801))
    assert Lease.objects.get(pk=borrowed.pk).state == "preempted"


def test_fair_share_live_reservation_named_and_short_lease_backfills(world, settings):
    # node-a: four GPUs, two held until +600 s; a 4-GPU lease waits and reserves the node from then: a younger
    # 1-GPU lease of an hour waits, one of 300 s backfills (it ends first); the reservation shows in the lease's
    # reason (API and portal) and its estimated start is the reservation's time. Off: the hour lease takes a GPU.
    settings.LEASE_RESERVATIONS = True  # as shipped
    settings.LEASE_RESERVE_AFTER_SECONDS = 0  # reserve at once (600 s by default)
    fleet(4)
    make_quota(world.project, H100, deserved=8000, limit=8000)
    start = timezone.now().replace(microsecond=0)
    run(world, start, count=2, duration=600)
    gang = ask(world, count=4, duration=3600)
    long = ask(world, duration=3600)
    short = ask(world, duration=300)
    services.schedule_cycle(now=start + timedelta(seconds=5))
    for lease in (gang, long, short):
        lease.refresh_from_db()
    assert (gang.state, long.state, short.state) == ("queued", "queued", "provisioning"), (long.reason, short.reason)
    at = (start + timedelta(seconds=600)).strftime("%Y-%m-%d %H:%M:%S")
    assert f"reserved 4 {H100} GPUs on node node-a from {at} UTC (in 595 s" in gang.reason
    assert gang.estimated_start == start + timedelta(seconds=600)
    assert "backfilled: ends by the start of the reservation on node-a" in short.reason
    body = world.client("member").get(f"/api/v1/leases/{gang.pk}").json()
    assert f"reserved 4 {H100} GPUs on node node-a" in body["reason"]
    status, text = page(gang.pk)
    assert status == 200 and f"reserved 4 {H100} GPUs on node node-a from {at} UTC" in text
    settings.LEASE_RESERVATIONS = False
    services.schedule_cycle(now=start + timedelta(seconds=10))
    long.refresh_from_db()
    gang.refresh_from_db()
    assert long.state == "provisioning" and "reserved" not in gang.reason
