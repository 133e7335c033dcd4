"""What billing has to tell a tenant, through the same outbox as lease events (docs/notifications.md, issue 33):

- ``spend_alerts_notify``: each ``billing.SpendAlert`` raised becomes one ``spend.alert`` notification, delivered to
  the webhooks subscribed to it and e-mailed to the tenant's owners and admins; once per alert (its
  ``event_id`` is ``evt_spend_alert_<id>``, unique).
- ``usage_events_notify``: every metered lease-hour becomes one CloudEvents 1.0 event (``usage.lease_hour``,
  structured mode: the webhook body is the event, ``Content-Type: application/cloudevents+json``) for each tenant
  with an active endpoint subscribed to it, hour by hour once the hour's allocation window is closed
  (``billing.MeterWindow``: the hour will not be metered again by the hourly run). The stream's cursor
  (``OutboxCursor`` ``usage_events``, the last hour told, as epoch seconds) is locked ``FOR UPDATE SKIP LOCKED`` and
  advanced in the transaction that makes the notifications, so an hour is told once; an endpoint gets the hours
  that start at or after the hour it was created in (no backfill of history).

Notifications sit above billing: billing records, this module tells; billing never imports it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from billing.core.metering import hour_floor
from billing.models import AllocationUsage, MeterWindow, SpendAlert
from notifications.choices import Channel, EventKind
from notifications.models import Delivery, Notification, OutboxCursor, WebhookEndpoint
from notifications.services import _enqueue_sends, _iso, _notify
from tenants.choices import Role
from tenants.models import Membership

SPEND_STREAM = "spend_alerts"
USAGE_STREAM = "usage_events"
USAGE_HOURS_PER_RUN = 24
CLOUDEVENTS_TYPE = "com.gpubroker.usage.lease_hour"
CLOUDEVENTS_CONTENT_TYPE = "application/cloudevents+json; charset=utf-8"
ALERT_LOOKBACK = timedelta(days=40)


def spend_alert_event_id(alert: SpendAlert) -> str:
    return f"evt_spend_alert_{alert.pk}"


def _admins(tenant_id: int) -> list:
    return [m.user for m in Membership.objects.filter(tenant_id=tenant_id, role__in=[Role.OWNER, Role.ADMIN],
                                                       user__is_active=True).exclude(user__email="")
            .select_related("user").order_by("user_id")]


def spend_alerts_notify(*, now: datetime | None = None) -> int:
    """Tell every spend alert raised (in the last 40 days) that has not been told yet; returns how many."""
    now = now or timezone.now()
    OutboxCursor.objects.bulk_create([OutboxCursor(stream=SPEND_STREAM)], ignore_conflicts=True)
    made = 0
    with transaction.atomic(durable=True):
        cursor = OutboxCursor.objects.select_for_update(skip_locked=True).filter(stream=SPEND_STREAM).first()
        if cursor is None:
            return 0  # another worker is on it
        alerts = list(SpendAlert.objects.filter(created_at__gte=now - ALERT_LOOKBACK)
                      .select_related("tenant", "project").order_by("pk"))
        told = set(Notification.objects.filter(event_id__in=[spend_alert_event_id(a) for a in alerts])
                   .values_list("event_id", flat=True))
        delivery_ids: list[int] = []
        for alert in alerts:
            event_id = spend_alert_event_id(alert)
            if event_id in told:
                continue
            payload = {"id": event_id, "type": EventKind.SPEND_ALERT, "created": _iso(alert.created_at),
                       "tenant": alert.tenant.slug,
                       "data": {"scope": "project" if alert.project_id else "tenant",
                                "project": alert.project.slug if alert.project_id else None,
                                "period": f"{alert.period:%Y-%m}", "basis": alert.basis,
                                "threshold_pct": alert.threshold_pct, "base_minor": alert.base_minor,
                                "amount_minor": alert.amount_minor, "currency": alert.currency,
                                "reason": alert.message}}
            delivery_ids += _notify(tenant=alert.tenant, kind=EventKind.SPEND_ALERT, payload=payload,
                                    event_id=event_id, lease=None, lease_event=None, now=now,
                                    recipients=_admins(alert.tenant_id))
            made += 1
        OutboxCursor.objects.filter(stream=SPEND_STREAM).update(
            last_event_id=max([cursor.last_event_id, *(a.pk for a in alerts)]), updated_at=now)
        _enqueue_sends(delivery_ids)
    return made


def usage_cloudevent(row: dict, *, tenant_slug: str, project_slug: str, event_id: str) -> dict:
    """One metered lease-hour as a CloudEvents 1.0 event (structured mode, JSON)."""
    hour = row["hour_start"].astimezone(UTC)
    seconds = row["seconds"]
    return {
        "specversion": "1.0",
        "id": event_id,
        "source": f"/gpubroker/tenants/{tenant_slug}",
        "type": CLOUDEVENTS_TYPE,
        "time": _iso(hour + timedelta(hours=1)),
        "subject": f"leases/{row['lease_id']}",
        "datacontenttype": "application/json",
        "data": {
            "tenant": tenant_slug, "project": project_slug, "lease": row["lease_id"],
            "hour_start": _iso(hour), "hour_end": _iso(hour + timedelta(hours=1)),
            "seconds": str(seconds), "gpu_milli": row["gpu_milli"],
            "gpu_hours": str((seconds * row["gpu_milli"] / 3_600_000).quantize(Decimal("0.000001"))),
            "memory_mib": row["memory_mib"], "model": row["tier"], "kind": row["kind"],
            "mig_profile": row["mig_profile"] or None, "workload_class": row["workload_class"],
            "over_quota": row["over_quota"], "profiling": row["profiling"], "labels": row["labels"] or {},
        },
    }


def usage_event_id(lease_id: int, hour_start: datetime) -> str:
    return f"evt_usage_{lease_id}_{int(hour_start.timestamp()) // 3600}"


def _subscribed() -> dict[int, list[WebhookEndpoint]]:
    endpoints: dict[int, list[WebhookEndpoint]] = {}
    for endpoint in (WebhookEndpoint.objects.filter(is_active=True, deleted_at__isnull=True,
                                                    event_types__contains=[EventKind.USAGE_LEASE_HOUR])
                     .select_related("tenant").order_by("pk")):
        endpoints.setdefault(endpoint.tenant_id, []).append(endpoint)
    return endpoints


def _usage_hour(hour: datetime, endpoints: dict[int, list[WebhookEndpoint]], now: datetime) -> tuple[int, list[int]]:
    """Inside the stream's transaction: the hour's events for the tenants whose endpoints take it: (how many
    events, the delivery ids)."""
    taking = {tenant_id: [e for e in found if hour_floor(e.created_at) <= hour]
              for tenant_id, found in endpoints.items()}
    taking = {tenant_id: found for tenant_id, found in taking.items() if found}
    if not taking:
        return 0, []
    rows = list(AllocationUsage.objects.filter(hour_start=hour, tenant_id__in=list(taking))
                .order_by("tenant_id", "lease_id")
                .values("tenant_id", "lease_id", "hour_start", "seconds", "gpu_milli", "memory_mib", "tier", "kind",
                        "mig_profile", "workload_class", "over_quota", "profiling", "labels", "project__slug"))
    if not rows:
        return 0, []
    tenants = {tenant_id: found[0].tenant for tenant_id, found in taking.items()}
    notifications = []
    for row in rows:
        tenant = tenants[row["tenant_id"]]
        event_id = usage_event_id(row["lease_id"], hour)
        notifications.append(Notification(
            tenant=tenant, kind=EventKind.USAGE_LEASE_HOUR, lease_id=row["lease_id"], event_id=event_id,
            payload=usage_cloudevent(row, tenant_slug=tenant.slug, project_slug=row["project__slug"],
                                     event_id=event_id), created_at=now))
    made = Notification.objects.bulk_create(notifications)
    deliveries = [Delivery(notification=notification, channel=Channel.WEBHOOK, endpoint=endpoint,
                           next_attempt_at=now, created_at=now)
                  for notification in made for endpoint in taking[notification.tenant_id]]
    return len(made), [d.pk for d in Delivery.objects.bulk_create(deliveries)]


def usage_events_notify(*, now: datetime | None = None) -> int:
    """Tell the closed hours after the stream's cursor (at most ``USAGE_HOURS_PER_RUN``, oldest first, stopping at
    the first hour still open); returns how many events were made."""
    now = now or timezone.now()
    OutboxCursor.objects.bulk_create([OutboxCursor(stream=USAGE_STREAM)], ignore_conflicts=True)
    made = 0
    with transaction.atomic(durable=True):
        cursor = OutboxCursor.objects.select_for_update(skip_locked=True).filter(stream=USAGE_STREAM).first()
        if cursor is None:
            return 0
        endpoints = _subscribed()
        after = datetime.fromtimestamp(cursor.last_event_id, tz=UTC)
        if endpoints:  # no hour before the oldest subscription is told: start there
            first = min(hour_floor(e.created_at) for found in endpoints.values() for e in found)
            after = max(after, first - timedelta(hours=1))
        windows = list(MeterWindow.objects.filter(source="allocation", hour_start__gt=after)
                       .order_by("hour_start").values_list("hour_start", "closed_at")[:USAGE_HOURS_PER_RUN])
        last = None
        delivery_ids: list[int] = []
        for hour, closed_at in windows:
            if closed_at is None:
                break  # an hour still open: it and the later ones wait
            if endpoints:
                events, ids = _usage_hour(hour, endpoints, now)
                made += events
                delivery_ids += ids
            last = hour
        if last is not None:
            OutboxCursor.objects.filter(stream=USAGE_STREAM).update(last_event_id=int(last.timestamp()),
                                                                    updated_at=now)
        _enqueue_sends(delivery_ids)
    return made
