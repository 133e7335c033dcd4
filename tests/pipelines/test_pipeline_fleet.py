"""A pipeline on the simulated fleet, end to end: planned and applied over the REST API (the live server, real
HTTP), its three stages leased as one lease group, placed by a real Celery worker's schedule cycle on simulated
agents enrolled over HTTP — all ACTIVE together, released together, metered by billing. And a fleet that can
hold only two of the three stages: none is placed, and every stage's reason says which one does not fit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from billing import services as billing
from billing.core.metering import HOUR, hour_floor
from billing.models import AllocationUsage
from leasing.models import Lease, LeaseEvent
from tests.factories import make_quota, make_world
from tests.leasing.conftest import Api, start_fleet, start_workers, stop_workers, wait_until

# one option per stage (a whole H100, batch 1, 5 ms): at 20 requests/s each stage is one instance of one GPU
STAGE = [{"tier": "H100-80GB", "kind": "whole", "batch": 1, "latency_ms": 5}]
PIPELINE = {"project": "vision", "name": "video", "slo_ms": 60.0, "rate_rps": 20.0, "tiers": ["H100-80GB"],
            "stages": [{"name": name, "profile": STAGE} for name in ("detect", "embed", "caption")],
            "edges": [["detect", "embed"], ["embed", "caption"]]}


@pytest.fixture
def setup(live_server, transactional_db, settings):
    world = make_world()
    make_quota(world.project, deserved=4000, limit=4000)  # three whole GPUs fit the project's quota
    billing.price_book_create(name="e2e", currency="USD", effective_from=datetime(2025, 1, 1, tzinfo=UTC),
                              rates=[{"tier": "H100-80GB", "per_hour": "7.00"}])
    settings.LEASE_MIN_DURATION_SECONDS = 1
    workers = start_workers(1)
    yield world, Api(live_server.url, world.tokens["member"])
    stop_workers(workers)


def _apply(api: Api) -> tuple[str, list[int]]:
    status, pipeline = api.call("POST", "/pipelines", PIPELINE)
    assert status == 201, pipeline
    status, plan = api.call("POST", f"/pipelines/{pipeline['id']}/plans", {})
    assert status == 201 and plan["feasible"], plan
    assert [(s["kind"], s["instances"]) for s in plan["result"]["stages"]] == [("whole", 1)] * 3
    url = f"/pipelines/{pipeline['id']}/plans/{plan['id']}"
    status, applied = api.call("POST", f"{url}/apply", {"duration_seconds": 600})
    assert status == 200, applied
    return url, [link["lease"] for link in applied["leases"]]


def _states(api: Api, ids: list[int]) -> list[str]:
    return [api.call("GET", f"/leases/{pk}")[1]["state"] for pk in ids]


@pytest.mark.slow
def test_a_three_stage_pipeline_runs_together_is_released_together_and_is_metered(setup, live_server, tmp_path):
    _world, api = setup
    fleet = start_fleet(live_server.url, tmp_path / "fleet", 1, "h100-80gb:3:whole")
    try:
        url, ids = _apply(api)
        group = {lease.group_key for lease in Lease.objects.filter(pk__in=ids)}
        assert len(group) == 1 and group.pop().startswith("pipeline-plan-")
        wait_until(lambda: _states(api, ids) == ["active"] * 3, timeout=60)
        # placed in one decision: one cycle moved all three out of the queue at the same instant
        placed = LeaseEvent.objects.filter(lease_id__in=ids, to_state="provisioning")
        assert placed.count() == 3 and len({event.at for event in placed}) == 1
        assert all("members placed together" in event.reason for event in placed)
        status, released = api.call("POST", f"{url}/release", {})
        assert status == 200 and released["state"] == "released"
        wait_until(lambda: _states(api, ids) == ["released"] * 3, timeout=60)
    finally:
        fleet.terminate()
        fleet.wait(30)
    # metering: each stage's lease has its allocation usage rows for the time it held its GPU
    events = LeaseEvent.objects.filter(lease_id__in=ids)
    first = min(e.at for e in events if e.to_state == "active")
    last = max(e.at for e in events if e.to_state == "releasing")
    now = datetime.now(UTC) + timedelta(seconds=1)
    hour = hour_floor(first)
    while hour <= last:
        billing.usage_meter_window(start=hour, end=hour + HOUR, now=now)
        hour += HOUR
    for pk in ids:
        rows = AllocationUsage.objects.filter(lease_id=pk)
        assert rows.exists(), f"lease {pk} not metered"
        assert all(row.tier == "H100-80GB" and row.gpu_milli == 1000 and row.seconds > 0 for row in rows)


@pytest.mark.slow
def test_a_fleet_that_holds_two_of_three_stages_places_none(setup, live_server, tmp_path):
    _world, api = setup
    fleet = start_fleet(live_server.url, tmp_path / "fleet", 1, "h100-80gb:2:whole")
    try:
        url, ids = _apply(api)
        key = Lease.objects.get(pk=ids[0]).group_key

        def all_say_why():
            leases = [api.call("GET", f"/leases/{pk}")[1] for pk in ids]
            return leases if all("does not fit" in (lease.get("reason") or "") for lease in leases) else None

        leases = wait_until(all_say_why, timeout=60)
        assert [lease["state"] for lease in leases] == ["queued"] * 3
        for lease in leases:
            # in the tenant's terms: its group's key, its own lease, the reason in words
            assert lease["reason"].startswith(f"waiting: group '{key}': lease {ids[2]} (1 x whole GPU) does not fit: ")
            assert "no node has 1 free H100-80GB GPU" in lease["reason"]
            assert lease["reason"].endswith("no member is placed until all 3 fit")
        assert not LeaseEvent.objects.filter(lease_id__in=ids, to_state="provisioning").exists()
        assert api.call("POST", f"{url}/release", {})[0] == 200
        wait_until(lambda: _states(api, ids) == ["released"] * 3, timeout=30)
    finally:
        fleet.terminate()
        fleet.wait(30)
