"""What billing tells a tenant through the outbox (issue 33): spend alerts (thresholds of a cap or a budget, on the
spend and the forecast, once per month; the month-boundary check of carried-over leases against the new month's
cap) by webhook and mail to the admins, and one CloudEvents 1.0 event per metered lease-hour to the endpoints
subscribed to ``usage.lease_hour`` — delivered to a real receiver on 127.0.0.1."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import time_machine
from django.core import mail

from billing import services as billing
from billing.choices import AlertBasis
from billing.models import AllocationUsage, MeterWindow, SpendAlert
from billing.services import alerts
from billing.services.metering_run import meter_pending
from broker import services as broker
from broker.models import Allocation
from notifications import billing_events, services
from notifications.choices import Channel, EventKind
from notifications.models import Delivery, Notification, WebhookEndpoint
from tenants.access import Actor
from tenants.choices import Role
from tests.billing.test_allocation import three_leases
from tests.billing.test_invoicing import t
from tests.billing.test_invoicing import world as world  # the fixture, shared (a node, a price book)


@pytest.fixture
def loopback(settings):
    settings.WEBHOOK_ALLOW_LOOPBACK = True
    settings.PROMETHEUS_URL = "http://127.0.0.1:9"  # no Prometheus: utilisation windows stay open, allocation closes


def _send_all(now):
    for delivery_id in Delivery.objects.order_by("pk").values_list("pk", flat=True):
        services.delivery_send(delivery_id=delivery_id, now=now)


def test_spend_alerts_raised_once_per_month_and_told_by_webhook_and_mail(world, loopback, receiver):
    world.owner.email, world.admin.email = "alice@acme.example", "ann@acme.example"
    world.owner.save()
    world.admin.save()
    owner = Actor(user=world.owner, tenant=world.acme, role=Role.OWNER)
    services.webhook_endpoint_create(actor=owner, url=receiver.url, event_types=["spend.alert"])
    three_leases(world)  # about 1.24 USD of 1g.10gb time on 1 January
    billing.usage_meter_window(start=t(1, 0), end=t(2, 0), now=t(20, 0))
    billing.spend_cap_create(tenant=world.acme, monthly_minor=200, actor=owner)  # 62 %: the 50 % alerts
    alerts.spend_alert_rule_set(actor=owner, project=world.project, budget_minor=100, thresholds_pct=[80, 100],
                                forecast=False)

    raised = alerts.spend_alerts_evaluate(now=t(20, 0))
    assert sorted((a.project_id is not None, a.basis, a.threshold_pct) for a in raised) == [
        (False, AlertBasis.FORECAST, 50), (False, AlertBasis.SPENT, 50),
        (True, AlertBasis.SPENT, 80), (True, AlertBasis.SPENT, 100)]
    assert alerts.spend_alerts_evaluate(now=t(25, 0)) == []  # once per (scope, month, basis, threshold)

    assert billing_events.spend_alerts_notify(now=t(20, 0, 1)) == 4
    assert billing_events.spend_alerts_notify(now=t(20, 0, 2)) == 0
    by_channel = {channel: Delivery.objects.filter(channel=channel).count() for channel in Channel.values}
    assert by_channel == {Channel.WEBHOOK: 4, Channel.EMAIL: 8}  # the owner's and the admin's mailboxes
    with time_machine.travel(t(20, 0, 3), tick=False):
        _send_all(t(20, 0, 3))
    bodies = [json.loads(hit.body) for hit in receiver.accepted()]
    assert len(bodies) == 4 and {b["type"] for b in bodies} == {"spend.alert"}
    project_100 = next(b for b in bodies if b["data"]["project"] == "vision" and b["data"]["threshold_pct"] == 100)
    assert project_100["data"]["basis"] == "spent" and project_100["data"]["base_minor"] == 100
    assert "reached 100% of its budget of 1.00 USD" in project_100["data"]["reason"]
    assert len(mail.outbox) == 8 and all(m.subject.startswith("Spend alert:") for m in mail.outbox)


def test_spend_alert_rules_api_refuses_bad_input_and_members(world):
    admin, member = world.client("admin"), world.client("member")
    assert member.put("/api/v1/spend-alert-rules", {"thresholds_pct": [50]}, format="json").status_code == 403
    no_base = admin.put("/api/v1/spend-alert-rules", {"thresholds_pct": [50]}, format="json")
    assert no_base.status_code == 400 and no_base.json()["field"] == "budget_minor"
    bad = admin.put("/api/v1/spend-alert-rules", {"thresholds_pct": [0], "budget_minor": 100}, format="json")
    assert bad.status_code == 400 and bad.json()["field"].startswith("thresholds_pct")
    made = admin.put("/api/v1/spend-alert-rules", {"project": "vision", "budget_minor": 5000}, format="json")
    assert made.status_code == 200, made.content
    assert made.json()["thresholds_pct"] == [50, 80, 100] and made.json()["project"] == "vision"
    assert world.client("outsider").get(f"/api/v1/spend-alert-rules/{made.json()['id']}").status_code == 404
    assert not world.client("outsider").get("/api/v1/spend-alerts").json()["results"]
    assert admin.delete(f"/api/v1/spend-alert-rules/{made.json()['id']}").status_code == 204


def test_month_boundary_checks_carried_over_leases_against_the_new_cap(world):
    owner = Actor(user=world.owner, tenant=world.acme, role=Role.OWNER)
    member = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    with time_machine.travel(t(31, 22, 50), tick=False):
        lease, _ = broker.lease_request(actor=member, project="vision", gpu={"kind": "mig", "profile": "1g.10gb"},
                                        duration_seconds=48 * 3600)
        broker.schedule_cycle()
    for allocation in Allocation.objects.filter(lease=lease):
        with time_machine.travel(t(31, 23), tick=False):
            broker.allocation_ready(allocation=allocation, instance={"device_uuid": "X"}, now=t(31, 23))
    # admitted in January, where 1 h was left: a February cap of 10 USD is passed by its 47 h in February
    billing.spend_cap_create(tenant=world.acme, monthly_minor=1000, actor=owner)
    assert alerts.spend_caps_boundary_check(now=t(31, 23, 30)) == []  # still January: nothing carried over
    february = t(1, 0, 5, month=2)
    [alert] = alerts.spend_caps_boundary_check(now=february)
    assert alert.basis == AlertBasis.BOUNDARY and alert.period == february.date().replace(day=1)
    assert alert.amount_minor > 1000 and "carried into February 2026" in alert.message
    assert alerts.spend_caps_boundary_check(now=february + timedelta(hours=1)) == []  # once per month
    assert SpendAlert.objects.filter(basis=AlertBasis.BOUNDARY).count() == 1


def test_usage_events_are_cloudevents_one_per_metered_lease_hour(world, loopback, receiver):
    owner = Actor(user=world.owner, tenant=world.acme, role=Role.OWNER)
    endpoint, _secret = services.webhook_endpoint_create(actor=owner, url=receiver.url,
                                                         event_types=["usage.lease_hour"])
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(created_at=t(1, 9, 30))
    outsider = Actor(user=world.outsider, tenant=world.globex, role=Role.OWNER)
    services.webhook_endpoint_create(actor=outsider, url=receiver.url, event_types=["usage.lease_hour"])
    three_leases(world)
    meter_pending(now=t(1, 14))
    assert MeterWindow.objects.filter(source="allocation", closed_at__isnull=True).count() == 0
    rows = AllocationUsage.objects.filter(tenant=world.acme).count()
    assert rows == 4  # lease a: 10:00 and 11:00; b and c: 10:00

    assert billing_events.usage_events_notify(now=t(1, 14, 1)) == rows
    assert billing_events.usage_events_notify(now=t(1, 14, 2)) == 0  # each hour told once
    assert Notification.objects.filter(kind=EventKind.USAGE_LEASE_HOUR, tenant=world.globex).count() == 0
    with time_machine.travel(t(1, 14, 3), tick=False):
        _send_all(t(1, 14, 3))
    hits = receiver.accepted()
    assert len(hits) == rows
    assert {hit.headers["content-type"] for hit in hits} == {"application/cloudevents+json; charset=utf-8"}
    events = [json.loads(hit.body) for hit in hits]
    for event in events:
        assert {"specversion", "id", "source", "type", "time", "subject", "datacontenttype", "data"} <= set(event)
        assert event["specversion"] == "1.0" and event["type"] == "com.gpubroker.usage.lease_hour"
        assert event["source"] == "/gpubroker/tenants/acme" and event["datacontenttype"] == "application/json"
    labelled = [e for e in events if e["data"]["labels"] == {"cost-center": "cc-1", "team": "vision"}]
    assert sorted(e["data"]["hour_start"] for e in labelled) == ["2026-01-01T10:00:00Z", "2026-01-01T11:00:00Z"]
    assert labelled[1]["data"]["seconds"] == "1267.000000"  # 11:00 to 11:21:07
    assert len({e["id"] for e in events}) == rows
