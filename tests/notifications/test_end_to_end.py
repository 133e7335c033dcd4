"""End to end: the REST API on Django's live server, real Celery worker processes on the test broker, and a
real HTTP receiver on 127.0.0.1 that fails before it accepts. The outbox task is enqueued as beat would."""

from __future__ import annotations

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
