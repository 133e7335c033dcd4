"""``lease.expiring``: the tenant is told an active lease ends soon, LEASE_EXPIRING_NOTICE_SECONDS before its end,
once per end time — by webhook (a real receiver on 127.0.0.1), by mail to the lease holder, and on the lease page
(issue 29)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core import mail
from django.test import Client
from django.utils import timezone

from broker import services as broker
from broker.choices import LeaseState
from broker.models import Lease
from notifications import services
from notifications.choices import EventKind
from notifications.models import Delivery, Notification
from tenants.access import Actor
from tenants.choices import Role
from tests.portal.test_pages import text


def _active_lease(world, *, ends_in: timedelta, duration_seconds: int = 7200) -> Lease:
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease = broker.lease_request(actor=actor, project=world.project.slug, gpu={"kind": "mig", "profile": "1g.10gb"},
                                 duration_seconds=duration_seconds)[0]
    now = timezone.now()
    Lease.objects.filter(pk=lease.pk).update(state=LeaseState.ACTIVE, active_at=now + ends_in - timedelta(
        seconds=duration_seconds), ends_at=now + ends_in)
    lease.refresh_from_db()
    return lease


@pytest.fixture
def loopback(settings):
    settings.WEBHOOK_ALLOW_LOOPBACK = True


def test_expiring_lease_is_told_once_by_webhook_mail_and_page(world, loopback, receiver, settings):
    settings.LEASE_EXPIRING_NOTICE_SECONDS = 900
    world.member.email = "max@acme.example"
    world.member.save()
    owner = Actor(user=world.owner, tenant=world.acme, role=Role.OWNER)
    services.webhook_endpoint_create(actor=owner, url=receiver.url, event_types=["lease.expiring"])
    soon = _active_lease(world, ends_in=timedelta(minutes=10))
    later = _active_lease(world, ends_in=timedelta(minutes=20))  # outside the lead time: not yet
    # a lease whose whole length is within the lead time knew its end from the start
    short = _active_lease(world, ends_in=timedelta(minutes=5), duration_seconds=600)

    assert services.leases_expiring_notify() == 1
    assert services.leases_expiring_notify() == 0  # told once
    [notification] = Notification.objects.all()
    assert notification.kind == EventKind.LEASE_EXPIRING and notification.lease_id == soon.pk
    data = notification.payload["data"]
    assert data["lease"]["id"] == soon.pk and data["lease"]["ends_at"] == soon.ends_at.isoformat().replace(
        "+00:00", "Z")
    assert 590 <= data["ends_in_seconds"] <= 600
    for delivery in Delivery.objects.order_by("pk"):
        services.delivery_send(delivery_id=delivery.pk)
    [hit] = receiver.hits
    body = json.loads(hit.body)
    assert body["type"] == "lease.expiring" and body["data"]["lease"]["id"] == soon.pk
    [message] = mail.outbox
    assert message.to == ["max@acme.example"]
    assert message.subject.startswith(f"Lease {soon.pk} ends at ") and "renew it to keep it" in message.subject

    # the lease page says so too
    client = Client()
    assert client.login(username="max", password="pw-max")
    page = client.get(f"/leases/{soon.pk}")
    assert "data-expiring" in page.content.decode() and "Ends soon. Ends in 9 min" in text(page)
    assert "data-expiring" not in client.get(f"/leases/{later.pk}").content.decode()
    assert short.pk not in Notification.objects.values_list("lease_id", flat=True)

    # renewed: a new end time is told again when it comes near
    Lease.objects.filter(pk=soon.pk).update(ends_at=soon.ends_at + timedelta(hours=1))
    assert services.leases_expiring_notify() == 0
    assert services.leases_expiring_notify(now=timezone.now() + timedelta(hours=1)) == 1  # its new end, near now
    assert Notification.objects.filter(lease=soon).count() == 2


def test_expiring_notice_off_with_zero(world, settings):
    settings.LEASE_EXPIRING_NOTICE_SECONDS = 0
    _active_lease(world, ends_in=timedelta(minutes=1))
    assert services.leases_expiring_notify() == 0 and not Notification.objects.exists()


def test_expiring_kind_can_be_subscribed_through_the_api(world):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {world.tokens['owner']}")
    answer = client.post("/api/v1/webhooks", {"url": "https://93.184.215.14/hook", "event_types": ["lease.expiring"]},
                         format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["event_types"] == ["lease.expiring"]
