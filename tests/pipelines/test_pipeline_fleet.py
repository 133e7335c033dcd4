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
from broker.models import Allocation, Lease, LeaseEvent, Node
from broker.services import agent_client
from tests.factories import make_quota, make_world
from tests.support.api import Api
from tests.support.processes import start_fleet, wait_until

# one option per stage (a whole H100, batch 1, 5 ms): at 20 requests/s each stage is one instance of one GPU
STAGE = [{"tier": "H100-80GB", "kind": "whole", "batch": 1, "latency_ms": 5}]
PIPELINE = {"project": "vision", "name": "video", "slo_ms": 60.0, "rate_rps": 20.0, "tiers": ["H100-80GB"],
            "stages": [{"name": name, "profile": STAGE} for name in ("detect", "embed", "caption")],
            "edges": [["detect", "embed"], ["embed", "caption"]]}


@pytest.fixture
def setup(live_server, transactional_db, settings, celery_worker):
    world = make_world()
    make_quota(world.project, deserved=4000, limit=4000)  # three whole GPUs fit the project's quota
    billing.price_book_create(name="e2e", currency="USD", effective_from=datetime(2025, 1, 1, tzinfo=UTC),
                              rates=[{"tier": "H100-80GB", "per_hour": "7.00"}])
    settings.LEASE_MIN_DURATION_SECONDS = 1
    return world, Api(live_server.url, world.tokens["member"])


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


def _events(ids: list[int]) -> list[LeaseEvent]:
    return list(LeaseEvent.objects.filter(lease_id__in=ids).order_by("at", "id"))


@pytest.mark.slow
def test_a_member_refused_by_its_node_takes_the_whole_group_back_to_the_queue(setup, live_server, tmp_path):
    """The agent refuses the first instance the group asks for (409: retrying will not help): the two members
    whose instances were made do not run without it — their instances are destroyed and all three go back to
    the queue together, naming the member at fault; the next cycle places the group again, whole."""
    _world, api = setup
    fleet = start_fleet(live_server.url, tmp_path / "fleet", 1, "h100-80gb:3:whole")
    try:
        node = Node.objects.get()
        agent_client(node).faults(refuse_next_create="uncorrectable ECC error pending")
        _url, ids = _apply(api)
        wait_until(lambda: _states(api, ids) == ["active"] * 3, timeout=90)
        events = _events(ids)
        requeues = [e for e in events if e.from_state == "provisioning" and e.to_state == "queued"]
        assert sorted(e.lease_id for e in requeues) == sorted(ids)  # every member, once
        refused = [e for e in requeues if "refused" in e.reason and "requeued with" not in e.reason]
        assert len(refused) == 1 and "uncorrectable ECC error pending" in refused[0].reason
        for event in requeues:
            if event is not refused[0]:
                assert event.reason.startswith(f"requeued with lease {refused[0].lease_id} of its group 'pipeline-")
        # no member ran before the group was whole: every ACTIVE comes after the requeue, all at one instant
        actives = [e for e in events if e.to_state == "active"]
        assert len(actives) == 3 and len({e.at for e in actives}) == 1
        assert min(e.at for e in actives) > max(e.at for e in requeues)
        assert all("every member running" in e.reason for e in actives)
        # the agent holds exactly the three live instances: the first attempt's were destroyed
        held = {i["allocation_id"] for i in agent_client(node).inventory()["instances"]}
        live = {a.instance_id for a in Allocation.objects.filter(lease_id__in=ids, freed_at__isnull=True)}
        assert held == live and len(live) == 3
        assert Allocation.objects.filter(lease_id__in=ids, freed_at__isnull=False).count() == 3
    finally:
        fleet.terminate()
        fleet.wait(30)


@pytest.mark.slow
def test_members_on_two_nodes_become_active_together(setup, live_server, tmp_path):
    """Three whole GPUs over two nodes of two: one task per node. Each node's first create fails (503, retried
    after back-off); the members made first wait for the last: the three become ACTIVE in one transaction, at
    the instant the last instance is recorded."""
    _world, api = setup
    fleet = start_fleet(live_server.url, tmp_path / "fleet", 2, "h100-80gb:2:whole")
    try:
        for node in Node.objects.all():
            agent_client(node).faults(fail_next_create="GPU busy")
        _url, ids = _apply(api)
        wait_until(lambda: _states(api, ids) == ["active"] * 3, timeout=90)
        events = _events(ids)
        nodes = {a.gpu.node_id for a in Allocation.objects.filter(lease_id__in=ids, freed_at__isnull=True)
                 .select_related("gpu")}
        assert len(nodes) == 2
        actives = [e for e in events if e.to_state == "active"]
        assert len(actives) == 3 and len({e.at for e in actives}) == 1
        ready = Allocation.objects.filter(lease_id__in=ids, freed_at__isnull=True).values_list("ready_at", flat=True)
        # made at several moments (each node's first create fails, retried by its own task), run from the last
        assert len(set(ready)) >= 2 and actives[0].at == max(ready)
        assert not [e for e in events if e.to_state == "queued" and e.from_state == "provisioning"]
    finally:
        fleet.terminate()
        fleet.wait(30)


@pytest.mark.slow
def test_a_model_split_is_leased_as_a_gang_with_its_layers_in_the_access_details(setup, live_server, tmp_path):
    """Llama-2-13B split over two H100s (each with 16 GB free by the tenant's account): applied over HTTP, its two
    groups are one lease group placed in one cycle by the real worker on the simulated fleet; each lease's device
    access names its layer range; releasing the split releases both."""
    _world, api = setup
    fleet = start_fleet(live_server.url, tmp_path / "fleet", 1, "h100-80gb:2:whole")
    try:
        gpus = [{"id": f"h{i}", "node": "n1", "model": "H100-80GB", "free_mib": 16000} for i in range(2)]
        status, split = api.call("POST", "/model-splits", {"architecture": "llama-2-13b", "gpus": gpus})
        assert status == 201 and split["feasible"] and len(split["result"]["groups"]) == 2, split
        status, applied = api.call("POST", f"/model-splits/{split['id']}/apply",
                                   {"project": "vision", "duration_seconds": 600})
        assert status == 200 and applied["state"] == "applied", applied
        ids = [link["lease"] for link in applied["leases"]]
        assert {lease.group_key for lease in Lease.objects.filter(pk__in=ids)} == {f"model-split-{split['id']}"}
        wait_until(lambda: _states(api, ids) == ["active"] * 2, timeout=60)
        placed = LeaseEvent.objects.filter(lease_id__in=ids, to_state="provisioning")
        assert placed.count() == 2 and len({event.at for event in placed}) == 1
        ranges = []
        for index, pk in enumerate(ids):
            [device] = api.call("GET", f"/leases/{pk}")[1]["devices"]
            part = device["access"]["split"]
            assert part["group"] == index and part["groups"] == 2 and part["model_split"] == split["id"]
            assert "device_uuid" in device and device["access"]["CUDA_VISIBLE_DEVICES"]  # the agent's own details
            ranges.append((part["first_layer"], part["last_layer"]))
        assert ranges[0][0] == 0 and ranges[1][0] == ranges[0][1] + 1 and ranges[1][1] == 41  # all 42 layers, in order
        status, released = api.call("POST", f"/model-splits/{split['id']}/release", {})
        assert status == 200 and released["state"] == "released"
        wait_until(lambda: _states(api, ids) == ["released"] * 2, timeout=60)
    finally:
        fleet.terminate()
        fleet.wait(30)
