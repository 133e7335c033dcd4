"""Workload placements on real parts (live server, a real Celery worker, simulated agents over HTTP running
real processes): interactive workloads get host ports of their node that no other live workload there holds,
and an on-failure workload that keeps failing on one node is placed again on another, within its limit."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from broker.models import Lease, Node, Workload, WorkloadPlacement
from broker.services import workloads as workload_services
from tests.factories import make_project, make_quota
from tests.support.processes import start_fleet, wait_until

SERVE = """
import os, socket, time
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(os.environ["PORT"])))
server.listen()
print("listening on", os.environ["PORT"], flush=True)
while True:
    connection, _ = server.accept()
    connection.sendall(os.environ["GPUB_WORKLOAD_ID"].encode())
    connection.close()
"""

FAIL = """
import os, sys
with open(os.path.join(os.environ["CHECKPOINT_DIR"], "runs"), "a") as handle:
    handle.write(os.environ["CUDA_VISIBLE_DEVICES"] + "\\n")
sys.exit(3)
"""


def free_range(size: int) -> int:
    """The first of ``size`` consecutive ports nothing listens on now."""
    for _attempt in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + size > 65535:
            continue
        try:
            for port in range(base, base + size):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise AssertionError("no free port range")


@pytest.fixture
def host_ports(monkeypatch, settings):
    base = free_range(3)
    monkeypatch.setenv("WORKLOAD_HOST_PORTS", f"{base}-{base + 2}")  # the worker process reads it at start
    settings.WORKLOAD_HOST_PORTS = (base, base + 2)
    return base


@pytest.fixture
def shared(tmp_path, settings, monkeypatch):
    root = tmp_path / "shared"
    root.mkdir()
    settings.WORKLOAD_ALLOWED_ROOTS = [str(root)]
    monkeypatch.setenv("WORKLOAD_ALLOWED_ROOTS", str(root))
    return root


def serve_request(project: str) -> dict:
    return {"project": project, "gpu": {"kind": "whole", "model": "A100-80GB"}, "workload_class": "interactive",
            "workload": {"command": [sys.executable, "-c", SERVE], "port": 8888}}


def test_two_interactive_workloads_on_one_node_get_different_host_ports(host_ports, shared, worker, live_server,
                                                                         tmp_path, api, world):
    fleet = start_fleet(live_server.url, tmp_path / "fleet", 1, "a100-80gb:3:whole",
                        extra=("--workload-root", str(shared)))
    client = api("member")
    started: list[int] = []
    try:
        make_quota(world.project, "A100-80GB", deserved=3000, limit=3000, tenant_deserved=3000, tenant_limit=3000)
        leases = [client.call("POST", "/leases", serve_request("vision"))[1] for _ in range(2)]
        started += [lease["id"] for lease in leases]

        def endpoint(lease_id: int):
            return client.call("GET", f"/leases/{lease_id}")[1]["workload"]["endpoint"]

        ends = [wait_until(lambda lease=lease: endpoint(lease["id"]), timeout=30) for lease in leases]
        assert sorted(ends) == [f"127.0.0.1:{host_ports}", f"127.0.0.1:{host_ports + 1}"]
        for lease, end in zip(leases, ends, strict=True):  # each workload listens on its own host port
            host, port = end.split(":")

            def answer(host=host, port=port):
                try:
                    with socket.create_connection((host, int(port)), timeout=2) as sock:
                        return sock.recv(200).decode()
                except OSError:
                    return ""

            assert wait_until(answer, timeout=20).startswith(f"lease-{lease['id']}-")
        # the first one ends: its port is free again, and the next interactive lease on the node takes it
        client.call("DELETE", f"/leases/{leases[0]['id']}")
        wait_until(lambda: client.call("GET", f"/leases/{leases[0]['id']}")[1]["state"] == "released", timeout=40)
        wait_until(lambda: WorkloadPlacement.objects.get(workload__lease_id=leases[0]["id"]).ended_at, timeout=20)
        _, third = client.call("POST", "/leases", serve_request("vision"))
        started.append(third["id"])
        assert wait_until(lambda: endpoint(third["id"]), timeout=30) == ends[0]
        assert endpoint(leases[1]["id"]) == ends[1]
        other = client.call("GET", f"/leases/{leases[1]['id']}")[1]["workload"]
        assert other["history"][0]["host_port"] == int(ends[1].split(":")[1])
    finally:
        # a workload outlives its agent by design (a restarted agent finds it): release the leases so the agent
        # stops the servers, or they would listen on after the test
        for lease_id in started:
            with contextlib.suppress(Exception):
                client.call("DELETE", f"/leases/{lease_id}")
        for lease_id in started:
            with contextlib.suppress(Exception):
                wait_until(lambda lease_id=lease_id: not WorkloadPlacement.objects.filter(
                    workload__lease_id=lease_id, ended_at__isnull=True).exists(), timeout=30)
        fleet.terminate()
        fleet.wait(30)


def test_racing_starts_on_one_node_never_share_a_host_port(transactional_db, world, settings):
    """Eight starts at once on one node (each in its own transaction and connection): eight distinct ports;
    a ninth start with the range spent is refused, and nothing is left half-written."""
    settings.WORKLOAD_HOST_PORTS = (30000, 30007)
    node = Node.objects.create(node_id="race-1", address="http://10.0.0.5:9400", status="ready")
    workloads = []
    for _ in range(9):
        lease = Lease.objects.create(tenant=world.acme, project=world.project, kind="whole", count=1, milli=1000,
                                     memory_mib=81920, duration_seconds=3600, state="active",
                                     ends_at=timezone.now() + timedelta(hours=1))
        workloads.append(Workload.objects.create(lease=lease, spec={"command": ["x"], "port": 8888}))
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def start(workload: Workload) -> None:
        try:
            barrier.wait(10)
            workload_services._placement_claim(workload=workload, node=node, agent_id=f"lease-{workload.lease_id}-a1")
        except BaseException as error:
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=start, args=(w,)) for w in workloads[:8]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    ports = sorted(WorkloadPlacement.objects.filter(node=node).values_list("host_port", flat=True))
    assert ports == list(range(30000, 30008))
    with pytest.raises(workload_services.PortsExhausted):
        workload_services._placement_claim(workload=workloads[8], node=node, agent_id="lease-x-a1")
    assert not WorkloadPlacement.objects.filter(workload=workloads[8]).exists()
    assert Workload.objects.get(pk=workloads[8].pk).placements == 0  # the claim was rolled back with it


def test_a_workload_failing_on_one_node_is_placed_on_another_within_its_limit(shared, monkeypatch, settings,
                                                                               live_server, tmp_path, api, world,
                                                                               request):
    monkeypatch.setenv("WORKLOAD_FAILED_RUNS_BEFORE_REPLACE", "2")
    settings.WORKLOAD_FAILED_RUNS_BEFORE_REPLACE = 2
    request.getfixturevalue("worker")  # started after the environment says K = 2
    fleet = start_fleet(live_server.url, tmp_path / "fleet", 2, "a100-80gb:1:whole",
                        extra=("--workload-root", str(shared), "--restart-backoff", "0.2"))
    try:
        batch = make_project(world.acme, "batch")
        make_quota(batch, "A100-80GB", deserved=1000, limit=1000, tenant_deserved=2000, tenant_limit=2000)
        own = shared / "acme" / "batch"  # the project's own directory (<root>/<tenant>/<project>)
        own.mkdir(parents=True)
        client = api("member")
        status, lease = client.call("POST", "/leases", {
            "project": "batch", "gpu": {"kind": "whole", "model": "A100-80GB"},
            "workload": {"command": [sys.executable, "-c", FAIL], "checkpoint_dir": str(own),
                         "restart_policy": "on-failure", "max_restarts": 3}})
        assert status == 201, lease
        done = wait_until(lambda: (body := client.call("GET", f"/leases/{lease['id']}")[1])["state"] == "failed"
                          and body, timeout=90)
        # 4 runs in all (max_restarts 3): 2 on the first node, then 2 on the other one
        runs = (own / "runs").read_text().split()
        assert len(runs) == 4 and runs[0] == runs[1] and runs[2] == runs[3] and runs[0] != runs[2]
        history = done["workload"]["history"]
        assert [(h["placement"], h["state"], h["failed_runs"]) for h in history] == [
            (1, "failed", 2), (2, "failed", 2)]
        assert history[0]["node"] != history[1]["node"]
        assert done["workload"]["failed_runs"] == 4 and done["workload"]["avoid_nodes"] == [history[0]["node"]]
        text = "\n".join(f"{e['to_state']}: {e['reason']}" for e in done["events"])
        expected = [f"active: running on {history[0]['node']}", "workload exited with status 3 (run 1)",
                    "workload restarts in", "workload exited with status 3 (run 2)",
                    f"queued: the workload failed 2 times in a row on {history[0]['node']}; requeued to be placed "
                    "on another node (failed runs 2 of 4 allowed)",
                    f"active: running on {history[1]['node']}", "workload exited with status 3 (run 2)",
                    "the workload failed (exit status 3); 4 failed run(s), restart limit 3 reached; the lease ends",
                    "failed:"]
        position = 0
        for part in expected:
            found = text.find(part, position)
            assert found >= 0, f"{part!r} not after position {position} in:\n{text}"
            position = found + len(part)
    finally:
        fleet.terminate()
        fleet.wait(30)
