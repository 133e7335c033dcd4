"""Faults converge: a worker killed mid-provisioning, an agent that hangs, an instance that vanishes, an
orphan instance, an agent restarted — no orphan left, no lease stuck in a transient state."""

import os
import signal

from django.utils import timezone

from broker import services
from broker.models import Allocation, Lease, Node
from broker.services import agent_client
from tests.support.processes import start_workers, stop_workers, wait_until


def _request(client, profile="1g.10gb"):
    status, lease = client.call("POST", "/leases", {"project": "vision", "gpu": {"kind": "mig", "profile": profile}})
    assert status == 201
    return lease["id"]


def _mig_node():
    return Node.objects.get(gpus__mode="mig", gpus__index=0)


def _instances(node):
    return {i["allocation_id"] for i in agent_client(node).inventory()["instances"]}


def test_faults_worker_killed_mid_provisioning_converges(fleet, api, world, settings):
    node = _mig_node()
    agent_client(node).faults(hang_seconds=4)  # the create will hang while we kill the worker
    workers = start_workers(1)
    try:
        lease_id = _request(api("member"))
        wait_until(lambda: Lease.objects.get(pk=lease_id).state == "provisioning")
        os.kill(workers[0].pid, signal.SIGKILL)  # the main process: its task message stays unacknowledged
        workers[0].wait(10)
    finally:
        stop_workers(workers)
    workers = start_workers(1)
    try:
        # the reconcile finds the lease stuck in provisioning and runs the (idempotent) provisioning again
        later = timezone.now() + services.STUCK_AFTER
        services.leases_resume_stuck(now=later)
        wait_until(lambda: Lease.objects.get(pk=lease_id).state == "active", timeout=60)
        live = Allocation.objects.filter(lease_id=lease_id, freed_at__isnull=True)
        assert _instances(node) == {a.instance_id for a in live}  # exactly one instance, no orphan
    finally:
        stop_workers(workers)


def test_faults_hanging_agent_converges_with_no_orphan(worker, fleet, api, world):
    node = _mig_node()
    agent_client(node).faults(hang_seconds=6)  # longer than the worker's 2 s timeout, twice
    lease_id = _request(api("member"))
    wait_until(lambda: Lease.objects.get(pk=lease_id).state in ("queued", "active"), timeout=90)
    # whatever happened, the reconcile leaves exactly the instances live allocations own
    wait_until(lambda: Lease.objects.get(pk=lease_id).state == "active", timeout=90)
    services.node_reconcile(node=node)
    live = {a.instance_id for a in Allocation.objects.filter(gpu__node=node, freed_at__isnull=True)}
    assert _instances(node) == live


def test_faults_orphan_instance_is_destroyed(worker, fleet, api, world):
    node = _mig_node()
    gpu = node.gpus.get(index=0)
    agent_client(node).create("alloc-999999", {"kind": "mig", "gpu": gpu.uuid, "profile": "7g.80gb", "start": 0})
    assert services.node_reconcile(node=node)["orphans"] == 1
    assert "alloc-999999" not in _instances(node)


def test_faults_vanished_instance_fails_its_lease(worker, fleet, api, world):
    lease_id = _request(api("member"))
    wait_until(lambda: Lease.objects.get(pk=lease_id).state == "active")
    allocation = Allocation.objects.get(lease_id=lease_id)
    node = allocation.gpu.node
    agent_client(node).faults(drop_gpu=allocation.gpu.uuid)  # the GPU falls off the bus
    assert services.node_reconcile(node=node)["vanished"] == 1
    lease = Lease.objects.get(pk=lease_id)
    assert lease.state == "failed" and "vanished" in lease.reason
    allocation.refresh_from_db()
    assert allocation.freed_at is not None and allocation.gpu.lost_at is not None


def test_faults_agent_killed_and_restarted_converges(worker, fleet, api, world):
    import subprocess

    from tests.support.processes import ROOT, wait_http

    lease_id = _request(api("member"))
    wait_until(lambda: Lease.objects.get(pk=lease_id).state == "active")
    node = Allocation.objects.get(lease_id=lease_id).gpu.node
    before = agent_client(node).inventory()
    fleet.send_signal(signal.SIGKILL)
    fleet.wait(10)
    restarted = subprocess.Popen(fleet.args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = node.address.rsplit("/n/", 1)[0]
        wait_http(base + "/healthz", restarted)
        after = agent_client(node).inventory()  # the same secret (kept on disk): no new enrollment
        assert (after["gpus"], after["instances"]) == (before["gpus"], before["instances"])
        assert services.node_reconcile(node=node) == {"orphans": 0, "vanished": 0}
        assert Lease.objects.get(pk=lease_id).state == "active"
    finally:
        restarted.terminate()
        restarted.wait(30)
