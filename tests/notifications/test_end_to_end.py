"""End to end: the REST API on Django's live server, real Celery worker processes on the test broker, and a
real HTTP receiver on 127.0.0.1 that fails before it accepts. The outbox task is enqueued as beat would."""

from __future__ import annotations

import os
import time

import pytest

from notifications.models import Delivery
from notifications.tasks import deliveries_send_due_task, outbox_process_task
from tests.factories import make_world
from tests.support.api import Api
from tests.support.processes import start_workers, stop_workers, wait_until
from tests.support.webhooks import documented_verify

pytestmark = pytest.mark.slow
BACKOFF_BASE = 0.4


@pytest.fixture
def workers(transactional_db, settings, monkeypatch):
    """Two worker processes (prefork, 2 children each): four consumers racing for the same tasks."""
    for name, value in {"WEBHOOK_ALLOW_LOOPBACK": "1", "WEBHOOK_BACKOFF_BASE_SECONDS": str(BACKOFF_BASE),
                        "WEBHOOK_BACKOFF_MAX_SECONDS": "5", "WEBHOOK_TIMEOUT_SECONDS": "3"}.items():
        monkeypatch.setenv(name, value)
    settings.WEBHOOK_ALLOW_LOOPBACK = True
    processes = start_workers(2)
    yield processes
    stop_workers(processes)


def _released_lease(api_member) -> int:
    status, lease = api_member.call("POST", "/leases", {"project": "vision", "gpu": {"kind": "mig",
                                                                                    "profile": "1g.10gb"}})
    assert status == 201, lease
    status, body = api_member.call("DELETE", f"/leases/{lease['id']}")
    assert status in (200, 202) and body["state"] == "released", body
    return lease["id"]


def test_end_to_end_release_is_delivered_signed_after_retries(live_server, workers, receiver):
    world = make_world()
    receiver.script = [500, 500]
    status, endpoint = Api(live_server.url, world.tokens["admin"]).call(
        "POST", "/webhooks", {"url": receiver.url, "event_types": ["lease.released"]})
    assert status == 201, endpoint
    lease_id = _released_lease(Api(live_server.url, world.tokens["member"]))

    outbox_process_task.delay()  # what beat does every few seconds
    wait_until(lambda: receiver.accepted(), timeout=60)
    time.sleep(2 * BACKOFF_BASE * 4)  # room for a stray duplicate to show up
    assert [hit.answered for hit in receiver.hits] == [500, 500, 200]
    first, second, third = (hit.at for hit in receiver.hits)
    assert second - first >= BACKOFF_BASE / 2 and third - second >= BACKOFF_BASE  # back-off: 2^(n-1)·base·[0.5, 1]

    verify = documented_verify()
    for hit in receiver.hits:
        assert verify(hit.headers["gpub-signature"], hit.body, endpoint["secret"])
        assert not verify(hit.headers["gpub-signature"], hit.body, "whsec_not-the-secret")
    accepted = receiver.accepted()[0]
    import json

    event = json.loads(accepted.body)
    assert (event["type"], event["data"]["lease"]["id"], event["tenant"]) == ("lease.released", lease_id, "acme")
    assert accepted.headers["idempotency-key"] == event["id"]
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("succeeded", 3, 200)

    status, page = Api(live_server.url, world.tokens["viewer"]).call("GET", f"/webhooks/{endpoint['id']}/deliveries")
    assert status == 200 and page["results"][0]["attempts"] == 3
    status, _ = Api(live_server.url, world.tokens["outsider"]).call("GET", f"/webhooks/{endpoint['id']}/deliveries")
    assert status == 404


def test_end_to_end_two_workers_never_double_send(live_server, workers, receiver):
    world = make_world()
    status, _ = Api(live_server.url, world.tokens["owner"]).call(
        "POST", "/webhooks", {"url": receiver.url, "event_types": ["lease.released"]})
    assert status == 201
    member = Api(live_server.url, world.tokens["member"])
    leases = [_released_lease(member) for _ in range(8)]
    for _ in range(6):  # outbox runs and due sweeps racing on four consumers
        outbox_process_task.delay()
        deliveries_send_due_task.delay()
    wait_until(lambda: len(receiver.accepted()) >= len(leases), timeout=60)
    time.sleep(2)
    for _ in range(3):
        deliveries_send_due_task.delay()
        outbox_process_task.delay()
    time.sleep(2)
    keys = [hit.headers["idempotency-key"] for hit in receiver.hits]
    assert sorted(keys) == sorted(set(keys)) and len(keys) == len(leases)
    assert Delivery.objects.filter(status="succeeded").count() == len(leases)


def test_end_to_end_deliveries_held_by_a_slow_receiver_never_hold_back_a_lease(live_server, transactional_db,
                                                                                tmp_path, drip, settings):
    """Workers as make run and the manifests start them: a default worker (one slot: lease work) and a
    notifications worker (one slot) on ``CELERY_NOTIFICATIONS_QUEUE``. Three deliveries to a receiver that drips
    its answer hold the notifications worker for three deadlines (3 x 3 s); a lease requested after them is
    placed and provisioned meanwhile (on one shared worker it would wait behind all three)."""
    import subprocess
    import sys

    from broker.services import cycle_flag_clear
    from config.celery import app
    from notifications import services
    from tests.support.processes import ROOT, start_fleet, test_database_url

    queue = f"e2e-{time.monotonic_ns()}"
    notifications_queue = f"{queue}-notifications"
    routes, default_queue = app.conf.task_routes, app.conf.task_default_queue
    app.conf.task_default_queue = queue
    app.conf.task_routes = {"notifications.*": {"queue": notifications_queue}}
    app.amqp.flush_routes()
    del app.amqp.router  # the router is built once per process, holding the routes of then
    env = {**os.environ, "DATABASE_URL": test_database_url(), "CELERY_TASK_DEFAULT_QUEUE": queue,
           "CELERY_NOTIFICATIONS_QUEUE": notifications_queue, "WEBHOOK_ALLOW_LOOPBACK": "1",
           "WEBHOOK_TIMEOUT_SECONDS": "3", "AGENT_TIMEOUT_SECONDS": "2"}
    workers = [subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool", "prefork", "--concurrency", "1",
         "--queues", name, "--hostname", f"{role}-{queue}@%h", "--loglevel", "WARNING", "--without-gossip",
         "--without-mingle", "--without-heartbeat"], cwd=ROOT, env=env)
        for role, name in (("default", queue), ("notifications", notifications_queue))]
    fleet = start_fleet(live_server.url, tmp_path / "fleet", 1, "h100-80gb:1:mig")
    try:
        settings.WEBHOOK_ALLOW_LOOPBACK = True
        world = make_world()
        receiver = drip(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        member = Api(live_server.url, world.tokens["member"])
        status, _ = Api(live_server.url, world.tokens["owner"]).call(
            "POST", "/webhooks", {"url": receiver.url, "event_types": ["advice"]})
        assert status == 201
        for number in range(3):  # three sends enqueued on commit, to the notifications queue
            services.notification_emit(tenant=world.acme, kind="advice", data={"n": number}, key=f"held-{number}")
        wait_until(lambda: receiver.opened, timeout=30)
        cycle_flag_clear()  # no cycle left pending by an earlier test on a queue no one reads now
        status, lease = member.call("POST", "/leases", {"project": "vision",
                                                        "gpu": {"kind": "mig", "profile": "1g.10gb"}})
        assert status == 201, lease
        wait_until(lambda: member.call("GET", f"/leases/{lease['id']}")[1]["state"] == "active", timeout=60)
        active_at = time.monotonic()
        wait_until(lambda: len(receiver.opened) == 3, timeout=60)
        # active while the notifications worker was still on its first or second delivery
        assert active_at < receiver.opened[2], (active_at - receiver.opened[0], receiver.opened)
        wait_until(lambda: Delivery.objects.filter(attempts__gte=1, claimed_until=None).count() == 3, timeout=30)
        assert all("deadline" in d.last_error for d in Delivery.objects.all())
        print(f"\nlease active {active_at - receiver.opened[0]:.1f} s after the first held delivery began; the "
              f"deliveries began at +{receiver.opened[1] - receiver.opened[0]:.1f} s and "
              f"+{receiver.opened[2] - receiver.opened[0]:.1f} s")
    finally:
        fleet.terminate()
        fleet.wait(30)
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(30)
        app.conf.task_routes, app.conf.task_default_queue = routes, default_queue
        app.amqp.flush_routes()
        del app.amqp.router
