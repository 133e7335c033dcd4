"""Workloads on leases end to end, on real parts: the REST API (live server), a real Celery worker, a fleet of
simulated agents over real HTTP that run the workload as a real process.

A Python training script that writes a checkpoint every step runs on an over-quota lease; an in-quota request
preempts it; it gets SIGTERM with the deadline, keeps training and is killed at the deadline; the lease is
requeued and, once capacity returns, placed on the other node, where the script resumes from its last
checkpoint with RESTART_COUNT=1 and finishes; the lease ends when it exits. The lease events show every
step and the metered allocation time is the time it ran."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from io import StringIO

from django.core.management import call_command
from django.utils import timezone

from billing import services as billing
from billing.core.metering import held_intervals
from billing.models import AllocationUsage, Invoice
from broker.models import Lease, Workload
from tests.factories import make_project, make_quota
from tests.support.api import Api
from tests.support.processes import wait_until

TRAIN = """
import json, os, signal, sys, time
ckpt = os.path.join(os.environ["CHECKPOINT_DIR"], "ckpt.json")
step = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0
print(f"resuming at step {step} RESTART_COUNT={os.environ['RESTART_COUNT']} "
      f"devices={os.environ['CUDA_VISIBLE_DEVICES']}", flush=True)
def term(signum, frame):
    print("SIGTERM; deadline", open(os.environ["GPUB_DEADLINE_FILE"]).read().strip(), flush=True)
signal.signal(signal.SIGTERM, term)  # keeps training until the deadline's SIGKILL
while step < int(sys.argv[1]):
    time.sleep(0.1)
    step += 1
    with open(ckpt + ".tmp", "w") as handle:
        json.dump({"step": step}, handle)
    os.replace(ckpt + ".tmp", ckpt)
    print("step", step, flush=True)
print("done", flush=True)
"""
STEPS = 60  # 6 s of training in all


def events_of(client: Api, lease_id: int) -> list[dict]:
    return client.call("GET", f"/leases/{lease_id}")[1]["events"]


def test_a_training_workload_is_preempted_and_resumes_on_another_node_from_its_checkpoint(
        worker, workload_fleet, api, world, shared):
    make_quota(world.project, "A100-80GB", deserved=0, limit=2000, tenant_deserved=1000, tenant_limit=4000)
    batch = make_project(world.acme, "batch")  # the holder's project: the training lease's line is its own
    make_quota(batch, "A100-80GB", deserved=0, limit=2000, tenant_deserved=1000, tenant_limit=4000)
    nlp = make_project(world.acme, "nlp")
    make_quota(nlp, "A100-80GB", deserved=1000, limit=1000, tenant_deserved=1000, tenant_limit=4000)
    # 3,600.00 a GPU-hour (over quota too): one dollar, 100 cents, a second held, easy to check by hand
    billing.price_book_create(name="workloads", currency="USD", effective_from=datetime(2025, 1, 1, tzinfo=UTC),
                              over_quota_multiplier="1", rates=[{"tier": "A100-80GB", "per_hour": "3600.00"}])
    client = api("member")

    def lease(lease_id: int) -> dict:
        return client.call("GET", f"/leases/{lease_id}")[1]

    # a bare over-quota lease holds one node; the training lease takes the other
    _, holder = client.call("POST", "/leases", {"project": "batch", "gpu": {"kind": "whole", "model": "A100-80GB"}})
    wait_until(lambda: lease(holder["id"])["state"] == "active")
    own = shared / "acme" / "vision"  # the project's own directory: paths live under <root>/<tenant>/<project>
    checkpoint = own / "run-1"
    checkpoint.mkdir(parents=True)
    status, train = client.call("POST", "/leases", {
        "project": "vision", "gpu": {"kind": "whole", "model": "A100-80GB"}, "duration_seconds": 3600,
        "workload": {"command": [sys.executable, "-c", TRAIN], "args": [str(STEPS)],
                     "checkpoint_dir": str(checkpoint), "workdir": str(own), "restart_policy": "on-preemption"}})
    assert status == 201, train
    first = wait_until(lambda: (body := lease(train["id"]))["workload"]["state"] == "running" and body)
    first_node = first["devices"][0]["node"]
    wait_until(lambda: "step 5\n" in client.call("GET", f"/leases/{train['id']}/logs")[1]["data"])

    # an in-quota request reclaims the youngest over-quota lease: the training one
    _, claim = client.call("POST", "/leases", {"project": "nlp", "gpu": {"kind": "whole", "model": "A100-80GB"}})
    wait_until(lambda: lease(train["id"])["state"] == "preempted")
    # SIGKILL at the deadline (2 s), then the lease is requeued at once and the claim runs on that GPU
    wait_until(lambda: lease(train["id"])["state"] == "queued", timeout=30)
    wait_until(lambda: lease(claim["id"])["state"] == "active", timeout=30)
    assert lease(claim["id"])["devices"][0]["node"] == first_node
    step_at_kill = json.loads((checkpoint / "ckpt.json").read_text())["step"]
    assert 0 < step_at_kill < STEPS

    # capacity returns on the other node: the workload restarts there from its checkpoint and finishes
    client.call("DELETE", f"/leases/{holder['id']}")
    done = wait_until(lambda: (body := lease(train["id"]))["state"] in ("released", "failed") and body, timeout=60)
    assert done["state"] == "released", done["reason"]
    assert done["workload"]["state"] == "succeeded" and done["workload"]["exit_code"] == 0
    assert done["workload"]["restart_count"] == 1 and done["workload"]["placements"] == 2
    second_node = Workload.objects.get(lease_id=train["id"]).node.node_id
    assert second_node != first_node
    log = client.call("GET", f"/leases/{train['id']}/logs")[1]["data"]
    assert f"resuming at step {step_at_kill} RESTART_COUNT=1" in log and log.rstrip().endswith("done")

    # the first placement's log outlives it: the broker kept its tail when it ended (read by placement)
    def kept_history():
        history = lease(train["id"])["workload"]["history"]
        return all(h["log_kept"] for h in history) and history

    history = wait_until(kept_history, timeout=30)
    assert [(h["placement"], h["node"], h["state"]) for h in history] == [
        (1, first_node, "preempted"), (2, second_node, "succeeded")]
    status, earlier = client.call("GET", f"/leases/{train['id']}/logs?placement=1&tail=100000")
    assert status == 200 and earlier["kept"] and earlier["placement"] == 1 and earlier["node"] == first_node
    assert "resuming at step 0 RESTART_COUNT=0" in earlier["data"] and "SIGTERM; deadline" in earlier["data"]
    assert f"step {step_at_kill}\n" in earlier["data"] and "done" not in earlier["data"]
    status, later = client.call("GET", f"/leases/{train['id']}/logs?placement=2&tail=100000")
    assert status == 200 and later["data"].rstrip().endswith("done") and "RESTART_COUNT=1" in later["data"]
    assert client.call("GET", f"/leases/{train['id']}/logs?placement=3")[1]["field"] == "placement"
    status, body = api("outsider").call("GET", f"/leases/{train['id']}/logs?placement=1")
    assert status == 404 and "resuming" not in str(body)

    reasons = [(e["to_state"], e["reason"]) for e in done["events"]]
    text = "\n".join(f"{state}: {reason}" for state, reason in reasons)
    expected = ["active: running on", "active: workload started (run 1", "RESTART_COUNT=0",
                "preempted: preempted for in-quota work", "preempted: workload notified: SIGTERM now, SIGKILL at",
                "preempted: workload sent SIGTERM", "preempted: workload killed with SIGKILL at the deadline",
                "preempted: workload exited killed by signal 9", "preempted: workload preempted",
                "queued: preempted: the workload stopped; requeued", "provisioning:", "active: running on",
                "active: workload started (run 1", "RESTART_COUNT=1", "active: workload exited with status 0",
                "active: workload succeeded", "releasing: the workload succeeded (exit status 0); the lease ends",
                "released:"]
    position = 0
    for part in expected:  # every step, in this order
        found = text.find(part, position)
        assert found >= 0, f"{part!r} not after position {position} in:\n{text}"
        position = found + len(part)

    # billing: the lease held a GPU from each placement's ACTIVE to that placement's workload exit (the
    # agent's time: the SIGKILL at the deadline, then the script's own exit), never to the lease's end
    rows = list(Lease.objects.get(pk=train["id"]).events.order_by("at", "pk"))
    placed = [e.at for e in rows if e.to_state == "active" and e.reason.startswith("running on")]
    exits = [e.at for e in rows if e.reason.startswith("workload exited")]
    assert len(placed) == 2 and len(exits) == 2 and placed[0] < exits[0] < placed[1] < exits[1]
    workload = Workload.objects.get(lease_id=train["id"])
    assert workload.ended_at == exits[1]
    seconds = sum(((end - start) for start, end in zip(placed, exits, strict=True)), timedelta()).total_seconds()

    out = StringIO()  # the operator's monthly run (the hour in progress metered up to now, as a draft)
    period = timezone.now().date().replace(day=1)
    call_command("invoice_run", period=f"{period:%Y-%m}", tenant="acme", draft=True, through_now=True, stdout=out)
    invoice = Invoice.objects.get(tenant=world.acme, period=period)
    lines = [line for line in invoice.lines.all() if line.project_id == world.project.pk]
    assert lines and all(line.unit_price == Decimal("3600") for line in lines), out.getvalue()
    billed_hours = sum(line.quantity for line in lines)
    assert abs(billed_hours - Decimal(seconds) / 3600) <= Decimal("0.000002"), (billed_hours, seconds)
    cents = int((Decimal(seconds) * 100).quantize(Decimal(1), rounding=ROUND_HALF_UP))
    assert abs(sum(line.amount_minor for line in lines) - cents) <= 1, (lines, seconds)
    intervals = held_intervals([(e.at, e.to_state) for e in rows], until=timezone.now())
    assert [end for _start, end in intervals] == exits  # the meter's intervals end at the exits
    metered = sum(u.seconds for u in AllocationUsage.objects.filter(lease_id=train["id"]))
    assert abs(metered - Decimal(str(seconds))) < Decimal("0.01")
    # had billing run to the lease's end (an hour from its start), it would have billed about 3,600 s
    to_lease_end = (Lease.objects.get(pk=train["id"]).ends_at - placed[0]).total_seconds()
    assert to_lease_end > 3000 and 5.0 < seconds < 25.0  # about the 6 s of training plus the notice
    print(f"\nworkload flow: killed at step {step_at_kill}, resumed on {second_node}; held {seconds:.2f} s in "
          f"two placements; invoiced {billed_hours} GPU-h = {sum(line.amount_minor for line in lines)} cents")


def test_a_tenant_cannot_read_another_tenants_workload_logs_and_bad_definitions_name_the_field(
        worker, workload_fleet, api, world, shared):
    make_quota(world.project, "A100-80GB", deserved=1000, limit=2000, tenant_deserved=1000, tenant_limit=4000)
    client = api("member")
    _, mine = client.call("POST", "/leases", {
        "project": "vision", "gpu": {"kind": "whole", "model": "A100-80GB"},
        "workload": {"command": [sys.executable, "-c",
                                 "print('secret-of-acme', flush=True); import time; time.sleep(30)"]}})
    wait_until(lambda: "secret-of-acme" in client.call("GET", f"/leases/{mine['id']}/logs")[1].get("data", ""))
    stranger = api("outsider")  # globex's owner
    status, body = stranger.call("GET", f"/leases/{mine['id']}/logs?tail=100")
    assert status == 404 and "secret-of-acme" not in str(body)
    status, body = stranger.call("DELETE", f"/leases/{mine['id']}")
    assert status == 404

    for workload, field in (({"args": ["x"]}, "workload.command"),
                            ({"command": ["python"], "checkpoint_dir": "/etc"}, "workload.checkpoint_dir"),
                            ({"command": ["python"], "workdir": str(shared) + "/acme/vision/../x"},
                             "workload.workdir"),
                            # another tenant's directory, the root, the tenant's own root (not a project's)
                            ({"command": ["python"], "workdir": str(shared) + "/globex/secret"}, "workload.workdir"),
                            ({"command": ["python"], "workdir": str(shared)}, "workload.workdir"),
                            ({"command": ["python"], "checkpoint_dir": str(shared) + "/acme"},
                             "workload.checkpoint_dir"),
                            ({"command": ["python"], "env": {"A": "x" * 40000}}, "workload.env"),
                            ({"command": ["python"], "restart_policy": "sometimes"}, "workload.restart_policy"),
                            ("python train.py", "workload")):
        status, problem = client.call("POST", "/leases", {"project": "vision",
                                                          "gpu": {"kind": "whole", "model": "A100-80GB"},
                                                          "workload": workload})
        assert status == 400 and problem["field"] == field, (workload, problem)
    assert Lease.objects.count() == 1  # nothing half-written
    # follow: waits (bounded) for bytes after the offset, answers when the workload ends
    client.call("DELETE", f"/leases/{mine['id']}")
    wait_until(lambda: client.call("GET", f"/leases/{mine['id']}")[1]["state"] == "released", timeout=40)
    _, tail = client.call("GET", f"/leases/{mine['id']}/logs?follow=5&offset=0")
    assert "secret-of-acme" in tail["data"] and tail["state"] == "stopped"
    assert datetime.fromisoformat(client.call("GET", f"/leases/{mine['id']}")[1]["workload"]["ended_at"]
                                  .replace("Z", "+00:00"))
