"""Issue 13, item 12: a node that goes quiet for a while (a flaky network; here its agents stopped with
SIGSTOP, their instances intact) is taken out of scheduling at once, but its leases keep their capacity
for AGENT_LOST_AFTER_SECONDS: back within that grace, they run on and the reconcile destroys nothing;
past it, they fail, and their time stops counting at the node's last heartbeat."""

import signal
import time

import pytest
from django.utils import timezone

from broker import services
from broker.models import Allocation, Lease, Node
from broker.services import agent_client
from tenants.models import AuditEvent
from tests.support.processes import start_fleet, wait_until


@pytest.fixture
def chatty_fleet(live_server, tmp_path, transactional_db, settings):
    """Two simulated nodes that heartbeat every second (the broker tells them so at enrollment)."""
    settings.AGENT_HEARTBEAT_SECONDS = 1
    process = start_fleet(live_server.url, tmp_path / "fleet", 2, "h100-80gb:2:mig", "a100-80gb:2:whole")
    yield process
    process.send_signal(signal.SIGCONT)
    process.terminate()
    process.wait(30)


def _active_lease(api):
    status, lease = api("member").call("POST", "/leases", {"project": "vision", "gpu": {"kind": "mig",
                                                                                         "profile": "1g.10gb"}})
    assert status == 201
    wait_until(lambda: Lease.objects.get(pk=lease["id"]).state == "active", timeout=60)
    allocation = Allocation.objects.select_related("gpu__node").get(lease_id=lease["id"])
    return Lease.objects.get(pk=lease["id"]), allocation, allocation.gpu.node


def _silence(fleet, node):
    """The agents stop answering (the process is stopped, nothing is lost); the node's last heartbeat."""
    fleet.send_signal(signal.SIGSTOP)
    # a heartbeat sent just before the stop may still be in the broker's hands: let it land (not a clock
    # move: the silence itself is simulated by passing ``now``)
    time.sleep(1.0)
    node.refresh_from_db()
    return node.last_heartbeat_at


def test_silent_node_back_within_the_grace_keeps_its_leases_and_instances(worker, chatty_fleet, api, world,
                                                                         settings):
    settings.AGENT_LOST_AFTER_SECONDS = 120
    lease, allocation, node = _active_lease(api)
    last = _silence(chatty_fleet, node)
    assert services.nodes_check_heartbeats(now=last + timezone.timedelta(seconds=10)) >= 1
    assert Node.objects.get(pk=node.pk).status == "silent"  # out of scheduling at once
    held = Lease.objects.get(pk=lease.pk)
    assert held.state == "active" and "is silent" in held.reason  # the tenant sees why
    assert Allocation.objects.get(pk=allocation.pk).freed_at is None
    # still within the grace: nothing fails
    services.nodes_check_heartbeats(now=last + timezone.timedelta(seconds=100))
    assert Lease.objects.get(pk=lease.pk).state == "active"
    chatty_fleet.send_signal(signal.SIGCONT)  # the network is back: the agent's next heartbeat
    wait_until(lambda: Node.objects.get(pk=node.pk).status == "ready", timeout=30)
    assert "answers again" in Lease.objects.get(pk=lease.pk).reason
    assert services.node_reconcile(node=node) == {"orphans": 0, "vanished": 0}
    instances = {i["allocation_id"] for i in agent_client(node).inventory()["instances"]}
    assert allocation.instance_id in instances
    assert Lease.objects.get(pk=lease.pk).state == "active"
    assert AuditEvent.objects.filter(action="node.silent", target=node.node_id).exists()
    assert AuditEvent.objects.filter(action="node.back", target=node.node_id).exists()


def test_silent_node_past_the_grace_fails_its_leases_at_the_last_heartbeat(worker, chatty_fleet, api, world,
                                                                          settings):
    settings.AGENT_LOST_AFTER_SECONDS = 60
    lease, allocation, node = _active_lease(api)
    last = _silence(chatty_fleet, node)
    services.nodes_check_heartbeats(now=last + timezone.timedelta(seconds=10))
    services.nodes_check_heartbeats(now=last + timezone.timedelta(seconds=61))
    lost = Lease.objects.get(pk=lease.pk)
    assert lost.state == "failed" and "stopped answering" in lost.reason
    # billing and the SLO stop counting at the last sign of life (the last heartbeat, or the lease's own
    # last change when that came later), not at the end of the grace
    became_active = lost.events.get(to_state="active").at
    stop = max(last, became_active)
    assert lost.finished_at == stop and lost.events.last().at == stop
    assert Allocation.objects.get(pk=allocation.pk).freed_at == stop
    assert stop < last + timezone.timedelta(seconds=5)
    chatty_fleet.send_signal(signal.SIGCONT)
    wait_until(lambda: Node.objects.get(pk=node.pk).status == "ready", timeout=30)
    # the instance of the failed lease is an orphan now: the reconcile destroys it
    assert services.node_reconcile(node=node)["orphans"] == 1
    assert allocation.instance_id not in {i["allocation_id"] for i in agent_client(node).inventory()["instances"]}
