"""Suspension of idle training end to end (issue 30), on real parts: the live API, a real Celery worker, a
simulated H100 node whose agent runs the workload as a real process over HTTP, a real Prometheus scraping the
agent's DCGM metrics, and the planner run as the periodic task runs it.

A training script that checkpoints at SIGTERM holds the node's only GPU at 1 % engine activity while another
request of its project waits. Its project opted in to idle reclaim (so suspension is automatic), with the
resumable-training rule shortened to seconds. The loop gives the usual notice (deadline, ``lease.notice``, no
SIGTERM yet), then suspends it: SIGTERM, the script writes its checkpoint and exits, the lease is requeued
("suspended while idle: resumes when capacity frees") and the waiting lease gets the GPU. When that one is
released the training lease is placed again and its workload resumes from the checkpoint (``RESTART_COUNT=1``).
Metering bills the two placements and not the time it waited in the queue."""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from agent.protocol import AgentClient
from billing import services as billing
from billing.models import AllocationUsage
from broker.choices import LeaseState
from broker.models import Allocation, Lease, Node
from capacity import services as capacity_services
from capacity.models import Adjustment
from notifications.models import Notification
from tests.support.processes import wait_until
from tests.support.prometheus import needs_prometheus

pytestmark = [pytest.mark.slow]

TRAIN = """
import json, os, signal, sys, time
ckpt = os.path.join(os.environ["CHECKPOINT_DIR"], "ckpt.json")
step = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0
restarts = int(os.environ["RESTART_COUNT"])
print(f"resuming at step {step} RESTART_COUNT={restarts}", flush=True)
def term(signum, frame):
    with open(ckpt + ".tmp", "w") as handle:
        json.dump({"step": step}, handle)
    os.replace(ckpt + ".tmp", ckpt)
    print(f"SIGTERM: checkpoint at step {step}", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
stop = step + 5 if restarts else None  # the first run trains until it is suspended; the resumed one finishes
while stop is None or step < stop:
    time.sleep(0.1)
    step += 1
print(f"done at step {step}", flush=True)
"""


def agent_of(node: Node) -> AgentClient:
    return AgentClient(node.address, node.node_id, node.secret)


def lease_of(pk: int) -> Lease:
    return Lease.objects.get(pk=pk)


@pytest.fixture
def shared(tmp_path, settings):
    root = tmp_path / "shared"
    root.mkdir()
    settings.WORKLOAD_ALLOWED_ROOTS = [str(root)]
    return root


@needs_prometheus
def test_an_idle_resumable_training_lease_is_suspended_requeued_and_resumes_from_its_checkpoint_unbilled_while_queued(
        loop, api, world, settings, prometheus_server, shared):
    _, state = loop(("h100-80gb:1:whole",), "--workload-root", str(shared), "--restart-backoff", "0.2")
    prometheus = prometheus_server(file_sd=state / "prometheus-targets.json").start()
    settings.PROMETHEUS_URL = prometheus.url
    settings.CAPACITY_SERIES_STEP_SECONDS = 1
    settings.LEASE_PREEMPTION_NOTICE_SECONDS = 20  # the grace to checkpoint; the script takes far less
    # the default policy, with the resumable-training rule in seconds; idle reclaim stays advice by default...
    capacity_services.policy_set(scope="", values={
        "mode_switch": "off", "mig_layout": "off", "warm_pool": "off", "right_size": "off", "quota_advice": "off",
        "idle_rules": {"resumable-training": {"window_seconds": 4, "notice_seconds": 3}}})
    # ...and the project's admin opts in, which makes the suspension of its idle training automatic
    status, body = api("admin").call("PUT", "/projects/vision/idle-reclaim", {"opt_in": True})
    assert status == 200 and body["suspend"] == {
        "opt_out": False, "mode": "auto", "notice": body["suspend"]["notice"],
        "rule": {"enabled": True, "threshold_permille": 50, "window_seconds": 4, "notice_seconds": 3}}

    checkpoint = shared / "acme" / "vision" / "run-1"
    checkpoint.mkdir(parents=True)
    status, train = api().call("POST", "/leases", {
        "project": "vision", "gpu": {"kind": "whole", "model": "H100-80GB"}, "duration_seconds": 3600,
        "workload": {"command": [sys.executable, "-c", TRAIN], "checkpoint_dir": str(checkpoint),
                     "workdir": str(shared / "acme" / "vision"), "restart_policy": "on-preemption"}})
    assert status == 201, train
    train_id = train["id"]
    wait_until(lambda: api().call("GET", f"/leases/{train_id}")[1]["workload"]["state"] == "running", timeout=30)
    node = Node.objects.get()
    first_instance = Allocation.objects.get(lease_id=train_id).instance_id
    agent_of(node).faults(pin_activity={"instance": first_instance, "engine_active": 0.01})
    # another request of the project waits for the node's only GPU (a higher priority: it is served first)
    status, waiting = api().call("POST", "/leases", {"project": "vision", "priority": 5, "duration_seconds": 3600,
                                                     "gpu": {"kind": "whole", "model": "H100-80GB"}})
    assert status == 201, waiting
    wait_until(lambda: lease_of(waiting["id"]).state == LeaseState.QUEUED and lease_of(waiting["id"]).reason,
               timeout=30)
    prometheus.wait_for(f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{allocation_id="{first_instance}"}} < 0.05', timeout=30)
    time.sleep(5)  # the window (4 s) of pinned samples

    # 1. the notice: the tenant is told, the workload is not signalled yet
    capacity_services.plan_run()
    notice = Adjustment.objects.get(kind="idle_reclaim", lease_id=train_id)
    assert notice.step == "notice" and notice.state == "applied" and notice.mode == "auto", notice.outcome
    assert notice.evidence["figures"]["class"] == "resumable-training"
    assert notice.evidence["figures"]["queued units on the model"] == 1
    lease = lease_of(train_id)
    assert lease.state == LeaseState.ACTIVE and lease.notice_deadline is not None
    assert "it will be suspended" in lease.reason and "resumes from the checkpoint" in lease.reason
    assert Notification.objects.filter(lease=lease, kind="lease.notice").exists()
    time.sleep(1)
    assert agent_of(node).instance(first_instance)["notice"] is None  # no SIGTERM at the idle notice
    assert "SIGTERM" not in api().call("GET", f"/leases/{train_id}/logs")[1]["data"]

    # 2. still idle when the notice runs out: suspended — SIGTERM, checkpoint, back to the queue
    time.sleep(3.5)
    capacity_services.plan_run()
    suspend = Adjustment.objects.get(kind="idle_reclaim", lease_id=train_id, change__step="suspend")
    assert suspend.state == "applied" and suspend.outcome.startswith("suspended: 20 s to checkpoint"), suspend.outcome
    assert suspend.effect is None  # what it frees is known once the lease is placed again, not promised now
    wait_until(lambda: lease_of(train_id).state == LeaseState.QUEUED, timeout=30)
    # the requeue's event says why (the next schedule cycle replaces the lease's reason with its waiting reason)
    assert lease_of(train_id).events.get(to_state=LeaseState.QUEUED, from_state=LeaseState.PREEMPTED).reason == \
        "suspended while idle: resumes when capacity frees"
    step_at_suspension = json.loads((checkpoint / "ckpt.json").read_text())["step"]
    assert step_at_suspension > 0
    # the GPU went to the waiting lease, well before the grace ran out (the workload stopped at its checkpoint)
    wait_until(lambda: lease_of(waiting["id"]).state == LeaseState.ACTIVE, timeout=30)
    assert lease_of(train_id).state == LeaseState.QUEUED

    # 3. capacity frees: the suspended lease is placed again and resumes from its checkpoint
    time.sleep(2)  # a visible stretch in the queue, which must not be billed
    api().call("DELETE", f"/leases/{waiting['id']}")
    done = wait_until(lambda: (body := api().call("GET", f"/leases/{train_id}")[1])["state"]
                      in ("released", "failed") and body, timeout=60)
    assert done["state"] == "released", done["reason"]
    assert done["workload"]["restart_count"] == 1 and done["workload"]["placements"] == 2
    log = api().call("GET", f"/leases/{train_id}/logs?tail=100000")[1]["data"]
    assert f"resuming at step {step_at_suspension} RESTART_COUNT=1" in log
    assert f"done at step {step_at_suspension + 5}" in log
    text = "\n".join(f"{e['to_state']}: {e['reason']}" for e in done["events"])
    position = 0
    for part in ("active: running on", "preempted: suspended while idle (idle",
                 "preempted: workload notified: SIGTERM now", "preempted: workload preempted",
                 "queued: suspended while idle: resumes when capacity frees", "provisioning:", "active: running on",
                 "RESTART_COUNT=1", "releasing: the workload succeeded"):
        found = text.find(part, position)
        assert found >= 0, f"{part!r} not after position {position} in:\n{text}"
        position = found + len(part)

    # 4. billing: the lease is metered while it held the GPU (ACTIVE and the checkpoint grace while PREEMPTED),
    # never while it waited in the queue
    rows = list(Lease.objects.get(pk=train_id).events.order_by("at", "pk"))
    placed = [e.at for e in rows if e.to_state == LeaseState.ACTIVE and e.reason.startswith("running on")]
    requeued = [e.at for e in rows if e.to_state == LeaseState.QUEUED and e.reason.startswith("suspended")]
    ended = [e.at for e in rows if e.to_state == LeaseState.RELEASING]
    assert len(placed) == 2 and len(requeued) == 1 and len(ended) == 1
    held = (requeued[0] - placed[0]) + (ended[0] - placed[1])
    queued = (placed[1] - requeued[0]).total_seconds()
    assert queued > 2.0
    now = timezone.now()
    start = placed[0].replace(minute=0, second=0, microsecond=0)
    billing.usage_meter_window(start=start, end=now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1),
                               now=now)
    metered = sum(u.seconds for u in AllocationUsage.objects.filter(lease_id=train_id))
    assert abs(metered - Decimal(str(held.total_seconds()))) < Decimal("0.01"), (metered, held, queued)
    span = (ended[0] - placed[0]).total_seconds()
    assert metered < Decimal(str(span - queued + 0.01))  # the queued stretch is not in it
    # 5. the suspension's effect: the GPU-seconds freed while the lease waited, measured once it was placed again
    # (not counted to the lease's end, as a release's are: the lease came back)
    from capacity.services.effects import effects_measure

    assert effects_measure(now=timezone.now()) >= 1
    suspend.refresh_from_db()
    milli = suspend.evidence["figures"]["milli held"]
    back = next(e.at for e in rows if e.to_state == LeaseState.PROVISIONING and e.at > requeued[0])
    assert suspend.effect["milli"] == milli == 1000
    assert suspend.effect["seconds_in_queue"] == int((back - requeued[0]).total_seconds())
    assert suspend.effect["gpu_seconds_freed"] == milli * suspend.effect["seconds_in_queue"] // 1000
    assert suspend.effect["back_as"] == LeaseState.PROVISIONING
    print(f"\nsuspension: checkpoint at step {step_at_suspension}; {queued:.2f} s queued, unbilled; "
          f"{float(metered):.2f} s metered of a {span:.2f} s span")
