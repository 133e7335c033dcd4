"""Live topology and host resources (issue 32 item 4; docs/scheduling.md "Topology, host resources and the demand
mix"): the agent reports each GPU's NVLink domain and its host's CPU and memory, the broker keeps them and the
schedule cycle places with them; a request may ask host CPU and memory per GPU unit; the cycle feeds the placement
policy the recent demand mix. The end-to-end tests run real simulated agents over HTTP and a real Celery worker."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta

import pytest

from agent.sim import SimBackend, parse_gpu_specs
from broker import services
from broker.choices import LeaseState
from broker.models import Allocation, Gpu, Lease, Node, Workload
from broker.selectors import scheduler_demand, scheduler_snapshot
from core.errors import ValidationFailed
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import api_client, make_quota
from tests.support.processes import start_fleet, stop_fleet, wait_until

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
A100 = "A100-80GB"


def _enroll(tmp_path, node_id: str, gpus: str, **sim) -> SimBackend:
    backend = SimBackend(tmp_path / node_id, node_id, parse_gpu_specs(gpus), **sim)
    inventory = {**backend.inventory(), "host_cpu_milli": backend.host()["cpu_milli"],
                 "host_memory_mib": backend.host()["memory_mib"]}
    services.node_enroll(node_id=node_id, token=services.enrollment_token_create(),
                         address=f"http://127.0.0.1:9/n/{node_id}", inventory=inventory, hostname=node_id)
    return backend


def _member(world) -> Actor:
    return Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)


def test_topology_node_keeps_what_its_agent_reports(world, tmp_path):
    _enroll(tmp_path, "hgx-1", "a100-80gb:8:whole", nvlink_domain_size=4, host_cpu_milli=64_000,
            host_memory_mib=524_288)
    node = Node.objects.get(node_id="hgx-1")
    assert (node.host_cpu_milli, node.host_memory_mib) == (64_000, 524_288)
    domains = list(Gpu.objects.filter(node=node).order_by("index").values_list("nvlink_domain", flat=True))
    assert domains == ["nvl0"] * 4 + ["nvl1"] * 4
    # the scheduler's snapshot carries them into the core
    snapshot = scheduler_snapshot(now=NOW)
    (core_node,) = snapshot.nodes
    assert (core_node.cpu_milli, core_node.memory_mib) == (64_000, 524_288)
    assert sorted({gpu.nvlink_domain for gpu in snapshot.gpus}) == ["nvl0", "nvl1"]


def test_topology_an_older_agent_is_not_tracked_and_a_bad_report_is_refused(world, tmp_path):
    backend = SimBackend(tmp_path / "old", "old-1", parse_gpu_specs("l4:2"))
    inventory = backend.inventory()
    for gpu in inventory["gpus"]:
        del gpu["nvlink_domain"]  # an agent from before topology was reported
    node = services.node_enroll(node_id="old-1", token=services.enrollment_token_create(),
                                address="http://127.0.0.1:9/n/old-1", inventory=inventory, hostname="old-1")
    node.refresh_from_db()
    assert (node.host_cpu_milli, node.host_memory_mib) == (0, 0)
    assert set(Gpu.objects.filter(node=node).values_list("nvlink_domain", flat=True)) == {""}
    for bad, field in (({"host_cpu_milli": -1}, "inventory.host_cpu_milli"),
                       ({"host_memory_mib": "lots"}, "inventory.host_memory_mib")):
        with pytest.raises(ValidationFailed) as refused:
            services.node_inventory_sync(node=node, inventory={**inventory, **bad}, now=NOW)
        assert refused.value.field == field
    inventory["gpus"][1]["nvlink_domain"] = "x" * 64
    with pytest.raises(ValidationFailed) as refused:
        services.node_inventory_sync(node=node, inventory=inventory, now=NOW)
    assert refused.value.field == "inventory.gpus[1].nvlink_domain"


def test_topology_request_asks_host_cpu_and_memory_per_unit(world, tmp_path):
    make_quota(world.project, A100, deserved=8000, limit=8000)
    api = api_client(world.tokens["member"])

    def call(path: str, body: dict) -> tuple[int, dict]:
        response = api.post(f"/api/v1{path}", body, format="json")
        return response.status_code, response.json()

    gpu = {"kind": "whole", "model": A100, "count": 2, "cpu_milli_per_unit": 8000, "host_memory_mib_per_unit": 65_536}
    status, body = call("/leases", {"project": "vision", "gpu": gpu, "duration_seconds": 600})
    assert status == 201, body
    assert body["gpu"]["cpu_milli_per_unit"] == 8000 and body["gpu"]["host_memory_mib_per_unit"] == 65_536
    lease = Lease.objects.get(pk=body["id"])
    assert (lease.cpu_milli_per_unit, lease.host_memory_mib_per_unit) == (8000, 65_536)
    # the quote takes them too, and answers them back
    status, quote = call("/quotes", {"project": "vision", "gpu": gpu, "duration_seconds": 600})
    assert status == 200, quote
    assert quote["gpu"]["cpu_milli_per_unit"] == 8000
    # refused, naming the field: out of range, not an integer, spread over nodes (gang off)
    for wrong, field in (({"cpu_milli_per_unit": -1}, "gpu.cpu_milli_per_unit"),
                         ({"host_memory_mib_per_unit": 1.5}, "gpu.host_memory_mib_per_unit"),
                         ({"cpu_milli_per_unit": 1_024_001}, "gpu.cpu_milli_per_unit"),
                         ({"gang": False, "cpu_milli_per_unit": 1000}, "gpu.cpu_milli_per_unit")):
        status, problem = call("/leases", {"project": "vision", "gpu": {**gpu, **wrong}, "duration_seconds": 600})
        assert status == 400 and problem["field"] == field, (wrong, problem)


def test_topology_cycle_holds_the_host_cpu_running_leases_asked_for(world, tmp_path):
    """One node of 8 A100s and 32 cores: a lease of 2 GPUs x 12 cores runs; one of 1 GPU x 10 cores waits (8 cores
    left, though 6 GPUs are free) until the first is released; a request of 1 GPU x 8 cores fits beside it."""
    _enroll(tmp_path, "hgx-1", "a100-80gb:8:whole", host_cpu_milli=32_000)
    make_quota(world.project, A100, deserved=8000, limit=8000)
    actor = _member(world)

    def ask(count: int, cpu: int) -> Lease:
        return services.lease_request(actor=actor, project="vision", now=NOW, duration_seconds=3600, gpu={
            "kind": "whole", "model": A100, "count": count, "cpu_milli_per_unit": cpu})[0]

    first = ask(2, 12_000)
    services.schedule_cycle(now=NOW)
    assert Allocation.objects.filter(lease=first).count() == 2
    too_big = ask(1, 10_000)
    services.schedule_cycle(now=NOW + timedelta(seconds=1))
    too_big.refresh_from_db()
    assert too_big.state == LeaseState.QUEUED and not Allocation.objects.filter(lease=too_big).exists()
    fits = ask(1, 8_000)
    services.schedule_cycle(now=NOW + timedelta(seconds=2))
    assert Allocation.objects.filter(lease=fits).count() == 1
    too_big.refresh_from_db()
    assert too_big.state == LeaseState.QUEUED


def test_topology_demand_mix_is_the_recent_requests_shapes(world, tmp_path, settings):
    """The cycle's policy is fed the shapes of the leases requested in the window: 3 of 1 whole A100 and 1 of 4,
    resolved on the model they asked for; older ones and 'auto' ones not yet placed say nothing."""
    settings.LEASE_DEMAND_WINDOW_SECONDS = 3600
    make_quota(world.project, A100, deserved=8000, limit=8000)
    actor = _member(world)
    for count, at in ((1, NOW), (1, NOW), (1, NOW), (4, NOW), (2, NOW - timedelta(hours=2))):
        services.lease_request(actor=actor, project="vision", now=at, duration_seconds=3600,
                               gpu={"kind": "whole", "model": A100, "count": count})
    services.lease_request(actor=actor, project="vision", now=NOW, duration_seconds=3600, gpu={"kind": "whole"})
    workload = scheduler_demand(now=NOW)
    assert [(need.count, need.models, probability) for need, probability in workload] == [
        (1, (A100,), 0.75), (4, (A100,), 0.25)]
    settings.LEASE_DEMAND_WINDOW_SECONDS = 0
    assert scheduler_demand(now=NOW) == []


@pytest.mark.parametrize(("window", "expected"), [(3600, "n-b"), (0, "n-a")])
def test_topology_cycle_keeps_room_for_the_recent_demand(world, tmp_path, settings, window, expected):
    """Two nodes of 4 A100s, the second running one GPU; three 4-GPU gangs were asked in the last hour (given back
    since). Fed that demand, the cycle places a 1-GPU lease on the second node and keeps the first whole for the next
    gang; without it (the window 0: no history, as before) every placement strands nothing the policy knows of, and
    the lease goes to the lowest node id, leaving no node a 4-GPU gang could run on."""
    settings.LEASE_DEMAND_WINDOW_SECONDS = window
    for node_id in ("n-a", "n-b"):
        _enroll(tmp_path, node_id, "a100-80gb:4:whole")
    make_quota(world.project, A100, deserved=16_000, limit=16_000)
    actor = _member(world)
    whole = {"kind": "whole", "model": A100}
    running = services.lease_request(actor=actor, project="vision", gpu=whole, avoid_nodes=["n-a"],
                                     now=NOW - timedelta(minutes=40))[0]
    services.schedule_cycle(now=NOW - timedelta(minutes=40))
    assert {n for n, _ in _domains(running.pk)} == {"n-b"}
    for minutes in (30, 20, 10):
        gang = services.lease_request(actor=actor, project="vision", gpu={**whole, "count": 4},
                                      now=NOW - timedelta(minutes=minutes))[0]
        services.lease_release(lease=gang, actor="test", now=NOW - timedelta(minutes=minutes))
    lease = services.lease_request(actor=actor, project="vision", gpu=whole, now=NOW)[0]
    services.schedule_cycle(now=NOW)
    assert {n for n, _ in _domains(lease.pk)} == {expected}


# -- end to end: real agents over HTTP -------------------------------------------------------------------


@pytest.fixture
def hgx_fleet(live_server, tmp_path, transactional_db):
    """Two simulated nodes of 8 A100s each in two NVLink domains of 4, 64 cores per host, enrolled over HTTP."""
    process = start_fleet(live_server.url, tmp_path / "fleet", 2, "a100-80gb:8:whole",
                          extra=("--nvlink-domain-size", "4", "--host-cpu-milli", "64000"))
    yield process
    stop_fleet(process)


def _domains(lease_id: int) -> set[tuple[str, str]]:
    return set(Allocation.objects.filter(lease_id=lease_id).values_list("gpu__node__node_id", "gpu__nvlink_domain"))


def test_topology_gangs_land_inside_one_nvlink_domain_on_the_simulated_fleet(worker, hgx_fleet, api, world):
    """Gangs of 3, 4, 3 and 4 A100s on two nodes of two NVLink domains of 4: each runs inside one domain (a
    domain-blind placement puts the second gang on the first node's 1 + 3 free). Then the host CPU: the nodes' 64
    cores hold 7 GPUs x 8 cores each; a lease of 1 GPU x 12 cores waits though a GPU is free on each node, and runs
    once a gang of the first node is released."""
    make_quota(world.project, A100, deserved=16_000, limit=16_000, tenant_deserved=16_000, tenant_limit=16_000)
    wait_until(lambda: Gpu.objects.filter(model=A100, nvlink_domain__in=["nvl0", "nvl1"]).count() == 16, timeout=60)
    assert set(Node.objects.values_list("host_cpu_milli", flat=True)) == {64_000}
    client = api("member")

    def lease(count: int, cpu: int) -> dict:
        status, body = client.call("POST", "/leases", {"project": "vision", "duration_seconds": 600, "gpu": {
            "kind": "whole", "model": A100, "count": count, "cpu_milli_per_unit": cpu}})
        assert status == 201, body
        return body

    def active(body: dict) -> dict:
        return wait_until(lambda: (b := client.call("GET", f"/leases/{body['id']}")[1])["state"] == "active" and b,
                          timeout=60)

    gangs = []
    for count in (3, 4, 3, 4):
        body = active(lease(count, 8000))
        assert len(body["devices"]) == count
        (where,) = _domains(body["id"])  # one node, one domain
        gangs.append((body["id"], where))
    assert len({where for _, where in gangs}) == 4  # the four domains of the fleet, one gang each

    hungry = lease(1, 12_000)
    body = wait_until(lambda: (b := client.call("GET", f"/leases/{hungry['id']}")[1])["reason"].startswith("waiting")
                      and b, timeout=30)
    assert body["state"] == "queued"
    first_node = gangs[0][1][0]
    for lease_id, (node_id, _) in gangs:
        if node_id == first_node:
            assert client.call("DELETE", f"/leases/{lease_id}")[0] == 202
    body = active(hungry)
    assert {node for node, _ in _domains(body["id"])} == {first_node}


# the workload reads its own cgroup's limits (v1: its cpu and memory groups; v2: its one group) and prints them
CGROUP_LIMITS = r"""
import os, time
lines = open("/proc/self/cgroup").read().splitlines()
groups = dict((names, path) for _, names, path in (line.split(":", 2) for line in lines))
def read(path):
    try:
        return open(path).read().strip()
    except OSError:
        return ""
cpu = next((p for n, p in groups.items() if "cpu" in n.split(",")), None)
memory = groups.get("memory")
if cpu is not None and memory is not None:
    print("quota", read(f"/sys/fs/cgroup/cpu{cpu}/cpu.cfs_quota_us"),
          read(f"/sys/fs/cgroup/cpu{cpu}/cpu.cfs_period_us"), "memory",
          read(f"/sys/fs/cgroup/memory{memory}/memory.limit_in_bytes"), flush=True)
else:
    print("cpu.max", read(f"/sys/fs/cgroup{groups.get('', '/')}/cpu.max"), "memory.max",
          read(f"/sys/fs/cgroup{groups.get('', '/')}/memory.max"), flush=True)
time.sleep(60)
"""


def test_topology_the_host_ask_reaches_the_workload_on_its_node(worker, workload_fleet, api, world):
    """A lease of one A100 with half a CPU and 256 MiB of host memory per unit: the broker sends the ask to
    the node with the workload (``cpu_milli``, ``memory_mib``), the agent's copy of the spec carries it, and
    where the agent isolates its runs (root, cgroup v1 here) the run's cgroup holds it. A tenant cannot set
    the workload's own fields: they come from the lease's ask."""
    from agent.isolation import Cgroups
    from broker.services import agent_client

    make_quota(world.project, A100, deserved=2000, limit=2000, tenant_deserved=2000, tenant_limit=2000)
    wait_until(lambda: Gpu.objects.filter(model=A100).count() == 2, timeout=60)
    client = api("member")
    gpu = {"kind": "whole", "model": A100, "cpu_milli_per_unit": 500, "host_memory_mib_per_unit": 256}
    for name in ("cpu_milli", "memory_mib"):
        status, problem = client.call("POST", "/leases", {"project": "vision", "gpu": gpu, "workload": {
            "command": ["true"], name: 500}})
        assert status == 400 and problem["field"] == f"workload.{name}", problem
    status, body = client.call("POST", "/leases", {"project": "vision", "gpu": gpu, "duration_seconds": 600,
                                                   "workload": {"command": [sys.executable, "-c", CGROUP_LIMITS]}})
    assert status == 201, body
    wait_until(lambda: client.call("GET", f"/leases/{body['id']}")[1]["workload"]["state"] == "running", timeout=60)
    log = wait_until(lambda: next((line for line in client.call("GET", f"/leases/{body['id']}/logs")[1]["data"]
                                   .splitlines() if line.startswith(("quota", "cpu.max"))), None), timeout=30)
    workload = Workload.objects.select_related("node").get(lease_id=body["id"])
    on_node = agent_client(workload.node).workload(workload.agent_workload_id)
    assert (on_node["spec"]["cpu_milli"], on_node["spec"]["memory_mib"]) == (500, 256)
    assert on_node["limits"] == {"cpu_milli": 500, "memory_bytes": 256 << 20}
    isolation = agent_client(workload.node).inventory()["isolation"]
    if os.geteuid() == 0 and Cgroups().version == "v1":  # a root agent isolates its runs in v1 cgroups here
        assert (isolation["mode"], isolation["cgroup"]) == ("uid", "v1"), isolation
    if isolation.get("mode") == "uid" and isolation.get("cgroup") == "v1":  # this machine's agents (root)
        assert log.split() == ["quota", "50000", "100000", "memory", str(256 << 20)], log
    elif isolation.get("mode") == "uid" and isolation.get("cgroup") == "v2":
        assert log.split() == ["cpu.max", "50000", "100000", "memory.max", str(256 << 20)], log
    assert client.call("DELETE", f"/leases/{body['id']}")[0] == 202
