"""The only writers of notifications (docs/notifications.md).

- Endpoints: create (the secret returned once), update, delete, rotate — each one durable transaction
  with its ``AuditEvent``; a URL passes ``transport.url_check`` (SSRF guard) before it is stored.
- ``outbox_process``: lease events after the stored cursor become notifications and deliveries, in the
  transaction that advances the cursor; the cursor row is locked ``FOR UPDATE SKIP LOCKED``, so a second
  worker skips the run instead of doing it again, and ``Delivery``'s unique constraints stop a double row.
- ``notification_emit``: the same for what is not a lease event (the capacity loop's advice).
- ``leases_expiring_notify``: ``lease.expiring`` for every active lease within ``LEASE_EXPIRING_NOTICE_SECONDS``
  of its end, once per (lease, end time): a renewal's new end is told again, a second run tells nothing.
- ``delivery_send``: claims one due delivery (conditional update), sends it outside any transaction,
  records the outcome: success; a retry later with exponential back-off and jitter (5xx, 408, 429, no
  answer); or failure (other 4xx, a refused address, too many attempts, too old). An endpoint whose every
  delivery fails for long enough is disabled, audited.
"""

from __future__ import annotations

import json
import logging
import random
from datetime import datetime, timedelta

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from billing.core.pricing import format_money
from broker.choices import LeaseState
from broker.models import Lease, LeaseEvent
from core.errors import ValidationFailed
from core.task_registry import task
from notifications import signing, transport
from notifications.choices import EMAIL_KINDS, Channel, DeliveryStatus, EventKind
from notifications.models import Delivery, Notification, NotificationPreference, OutboxCursor, WebhookEndpoint
from tenants.access import Actor
from tenants.audit import audit_record
from tenants.models import Membership, Tenant

logger = logging.getLogger(__name__)

LEASE_STREAM = "lease_events"
OUTBOX_BATCH = 500
CLAIM_MARGIN_SECONDS = 30
USER_AGENT = "gpubroker-webhooks/1"


def _validate_event_types(event_types) -> list[str]:
    if not isinstance(event_types, list | tuple) or not event_types:
        raise ValidationFailed("event_types must list at least one event type.", field="event_types")
    unknown = [e for e in event_types if e not in EventKind.values]
    if unknown:
        raise ValidationFailed(f"event_types: unknown {', '.join(map(str, unknown))}; known: "
                               f"{', '.join(EventKind.values)}.", field="event_types")
    return sorted(set(event_types))


def _validate_url(url: str) -> str:
    url = (url or "").strip()
    if len(url) > 500:
        raise ValidationFailed("url must be at most 500 characters.", field="url")
    transport.url_check(url)
    return url


# -- endpoints -----------------------------------------------------------------------------------------
def webhook_endpoint_create(*, actor: Actor, url: str, event_types: list[str], description: str = "",
                            now: datetime | None = None) -> tuple[WebhookEndpoint, str]:
    """A new active endpoint and its signing secret (``whsec_…``), which is shown this once."""
    actor.require("manage")
    url = _validate_url(url)
    event_types = _validate_event_types(event_types)
    secret = signing.secret_generate()
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        endpoint = WebhookEndpoint.objects.create(tenant=actor.tenant, url=url, event_types=event_types,
                                                  description=description.strip()[:200], secret=secret,
                                                  created_by=actor.user, created_at=now)
        audit_record(tenant=actor.tenant, by=actor.user, action="webhook.create", target=f"webhook:{endpoint.pk}",
                     data={"url": url, "event_types": event_types})
    return endpoint, secret


def webhook_endpoint_update(*, actor: Actor, endpoint: WebhookEndpoint, url: str | None = None,
                            event_types: list[str] | None = None, description: str | None = None,
                            is_active: bool | None = None) -> WebhookEndpoint:
    """Change what an endpoint receives, or (de)activate it; re-activating clears its failure run."""
    actor.require("manage")
    changes: dict = {}
    if url is not None:
        changes["url"] = _validate_url(url)
    if event_types is not None:
        changes["event_types"] = _validate_event_types(event_types)
    if description is not None:
        changes["description"] = description.strip()[:200]
    if is_active is not None:
        changes["is_active"] = bool(is_active)
        if is_active:
            changes.update(disabled_reason="", failing_since=None, consecutive_failures=0)
        else:
            changes["disabled_reason"] = f"disabled by {actor.user.get_username()}"
    with transaction.atomic(durable=True):
        if changes:
            WebhookEndpoint.objects.filter(pk=endpoint.pk, deleted_at__isnull=True).update(**changes)
        audit_record(tenant=actor.tenant, by=actor.user, action="webhook.update", target=f"webhook:{endpoint.pk}",
                     data={k: v for k, v in changes.items() if k in ("url", "event_types", "description", "is_active")})
    endpoint.refresh_from_db()
    return endpoint


def webhook_endpoint_delete(*, actor: Actor, endpoint: WebhookEndpoint, now: datetime | None = None) -> None:
    """The endpoint stops receiving (its pending deliveries fail) and disappears; its history is kept."""
    actor.require("manage")
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(deleted_at=now, is_active=False,
                                                              disabled_reason="deleted")
        Delivery.objects.filter(endpoint=endpoint, status=DeliveryStatus.PENDING).update(
            status=DeliveryStatus.FAILED, last_error="endpoint deleted", completed_at=now)
        audit_record(tenant=actor.tenant, by=actor.user, action="webhook.delete", target=f"webhook:{endpoint.pk}",
                     data={"url": endpoint.url})


def webhook_endpoint_rotate(*, actor: Actor, endpoint: WebhookEndpoint,
                            now: datetime | None = None) -> tuple[WebhookEndpoint, str]:
    """A new signing secret (returned once). The old one keeps signing, next to the new, for
    ``WEBHOOK_SECRET_GRACE_SECONDS``, so receivers can switch without dropping events."""
    actor.require("manage")
    now = now or timezone.now()
    secret = signing.secret_generate()
    grace = timedelta(seconds=settings.WEBHOOK_SECRET_GRACE_SECONDS)
    with transaction.atomic(durable=True):
        locked = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
            secret=secret, previous_secret=locked.secret if grace else "",
            previous_secret_expires_at=now + grace if grace else None)
        audit_record(tenant=actor.tenant, by=actor.user, action="webhook.rotate", target=f"webhook:{endpoint.pk}",
                     data={"previous_valid_until": (now + grace).isoformat() if grace else None})
    endpoint.refresh_from_db()
    return endpoint, secret


def notification_preference_set(*, user, email_lease_events: bool, tenant: Tenant | None = None) -> None:
    """A user's opt-in/out of lease mail (audited in the tenant they changed it from)."""
    with transaction.atomic(durable=True):
        NotificationPreference.objects.update_or_create(
            user=user, defaults={"email_lease_events": bool(email_lease_events), "updated_at": timezone.now()})
        audit_record(tenant=tenant, by=user, action="notifications.preference", target=f"user:{user.pk}",
                     data={"email_lease_events": bool(email_lease_events)})


# -- making notifications ------------------------------------------------------------------------------
def lease_event_kind(event: LeaseEvent) -> str | None:
    """The notification a lease transition is, if any (a renewal, ``active → active``, is none)."""
    if event.from_state == event.to_state:
        return None
    if event.to_state == LeaseState.PREEMPTED:
        return EventKind.LEASE_NOTICE
    if event.to_state == LeaseState.QUEUED:
        if event.from_state == LeaseState.PREEMPTED:
            return EventKind.LEASE_PREEMPTED
        if event.from_state in (LeaseState.PROVISIONING, LeaseState.ACTIVE):
            return EventKind.LEASE_REQUEUED
        return None
    return {LeaseState.ACTIVE: EventKind.LEASE_ACTIVE, LeaseState.RELEASED: EventKind.LEASE_RELEASED,
            LeaseState.EXPIRED: EventKind.LEASE_EXPIRED, LeaseState.FAILED: EventKind.LEASE_FAILED,
            }.get(event.to_state)


# the same rule in SQL: the events that can be a notification
NOTIFIABLE = ~Q(from_state=F("to_state")) & (
    Q(to_state__in=[LeaseState.PREEMPTED, LeaseState.ACTIVE, LeaseState.RELEASED, LeaseState.EXPIRED,
                    LeaseState.FAILED])
    | Q(to_state=LeaseState.QUEUED, from_state__in=[LeaseState.PREEMPTED, LeaseState.PROVISIONING,
                                                      LeaseState.ACTIVE]))


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def _lease_payload(event: LeaseEvent, kind: str, event_id: str) -> dict:
    lease: Lease = event.lease
    return {
        "id": event_id,
        "type": kind,
        "created": _iso(event.at),
        "tenant": lease.tenant.slug,
        "data": {
            "lease": {"id": lease.pk, "project": lease.project.slug, "state": event.to_state,
                      "kind": lease.kind, "tier": lease.tier, "over_quota": lease.over_quota,
                      "ends_at": _iso(lease.ends_at),
                      "notice_deadline": _iso(lease.notice_deadline) if kind == EventKind.LEASE_NOTICE else None},
            "from_state": event.from_state,
            "to_state": event.to_state,
            "reason": event.reason,
        },
    }


def _email_recipient(tenant: Tenant, lease: Lease | None):
    user = lease.created_by if lease is not None else None
    if user is None or not user.email or not user.is_active:
        return None
    if not Membership.objects.filter(tenant=tenant, user=user).exists():
        return None  # no longer in the tenant: told nothing more about it
    preference = NotificationPreference.objects.filter(user=user).first()
    if preference is not None and not preference.email_lease_events:
        return None
    return user


def _notify(*, tenant: Tenant, kind: str, payload: dict, event_id: str, lease: Lease | None,
            lease_event: LeaseEvent | None, now: datetime, recipients: list | None = None) -> list[int]:
    """Inside a transaction: the notification and its deliveries; returns the delivery ids. ``recipients``:
    the users to e-mail instead of the lease holder (a spend alert's: the tenant's admins)."""
    notification = Notification.objects.create(tenant=tenant, kind=kind, lease=lease, lease_event=lease_event,
                                               event_id=event_id, payload=payload, created_at=now)
    endpoints = WebhookEndpoint.objects.filter(tenant=tenant, is_active=True, deleted_at__isnull=True,
                                               event_types__contains=[kind]).order_by("pk")
    deliveries = [Delivery(notification=notification, channel=Channel.WEBHOOK, endpoint=endpoint,
                           next_attempt_at=now, created_at=now) for endpoint in endpoints]
    if recipients is None:
        recipient = _email_recipient(tenant, lease) if kind in EMAIL_KINDS else None
        recipients = [recipient] if recipient is not None else []
    deliveries += [Delivery(notification=notification, channel=Channel.EMAIL, recipient=recipient,
                            next_attempt_at=now, created_at=now) for recipient in recipients]
    return [d.pk for d in Delivery.objects.bulk_create(deliveries)]


def _enqueue_sends(delivery_ids: list[int]) -> None:
    if not delivery_ids:
        return

    def enqueue():
        sending = task("notifications", "delivery_send_task")
        for delivery_id in delivery_ids:
            sending.delay(delivery_id)

    transaction.on_commit(enqueue)


def outbox_process(*, now: datetime | None = None) -> int:
    """Turn lease events after the cursor into notifications; returns how many were made.

    Events are re-read ``NOTIFICATIONS_OUTBOX_LOOKBACK_EVENTS`` ids behind the cursor: a transaction that
    took its event id before another's but committed after it is not skipped (a notification exists at
    most once per event: ``Notification.lease_event`` is unique and checked under the cursor's lock)."""
    now = now or timezone.now()
    OutboxCursor.objects.bulk_create([OutboxCursor(stream=LEASE_STREAM)], ignore_conflicts=True)
    made = 0
    with transaction.atomic(durable=True):
        cursor = OutboxCursor.objects.select_for_update(skip_locked=True).filter(stream=LEASE_STREAM).first()
        if cursor is None:
            return 0  # another worker is on it
        already = Notification.objects.filter(lease_event=OuterRef("pk"))
        events = LeaseEvent.objects.select_related("lease__tenant", "lease__project", "lease__created_by")
        lookback = max(0, cursor.last_event_id - settings.NOTIFICATIONS_OUTBOX_LOOKBACK_EVENTS)
        late = list(events.filter(NOTIFIABLE, pk__gt=lookback, pk__lte=cursor.last_event_id)
                    .filter(~Exists(already)).order_by("pk")[:OUTBOX_BATCH])
        fresh = list(events.filter(pk__gt=cursor.last_event_id).order_by("pk")[:OUTBOX_BATCH])
        delivery_ids: list[int] = []
        for event in late + fresh:
            kind = lease_event_kind(event)
            if kind is None:
                continue
            event_id = f"evt_lease_{event.pk}"
            delivery_ids += _notify(tenant=event.lease.tenant, kind=kind,
                                    payload=_lease_payload(event, kind, event_id), event_id=event_id,
                                    lease=event.lease, lease_event=event, now=now)
            made += 1
        if fresh:
            OutboxCursor.objects.filter(stream=LEASE_STREAM).update(last_event_id=fresh[-1].pk, updated_at=now)
        _enqueue_sends(delivery_ids)
    if len(fresh) == OUTBOX_BATCH:
        _enqueue_outbox()  # more waiting
    return made


def _enqueue_outbox() -> None:
    transaction.on_commit(task("notifications", "outbox_process_task").delay)


def notification_emit(*, tenant: Tenant, kind: str, data: dict, lease: Lease | None = None,
                      key: str, now: datetime | None = None) -> Notification:
    """Tell a tenant something that is not a lease transition (the capacity loop's ``advice``). ``key`` is
    the caller's stable id of the event: emitting the same key twice tells once. Joins the caller's
    transaction when there is one (the change and its notification commit together)."""
    if kind not in EventKind.values:
        raise ValidationFailed(f"kind must be one of {', '.join(EventKind.values)}.", field="kind")
    now = now or timezone.now()
    event_id = f"evt_{kind.replace('.', '_')}_{key}"[:40]
    with transaction.atomic():
        existing = Notification.objects.filter(event_id=event_id).first()
        if existing is not None:
            return existing
        payload = {"id": event_id, "type": kind, "created": _iso(now), "tenant": tenant.slug,
                   "data": {**data, **({"lease": {"id": lease.pk}} if lease is not None else {})}}
        delivery_ids = _notify(tenant=tenant, kind=kind, payload=payload, event_id=event_id, lease=lease,
                               lease_event=None, now=now)
        _enqueue_sends(delivery_ids)
        return Notification.objects.get(event_id=event_id)


def expiring_event_id(lease: Lease) -> str:
    """The notification id of "``lease`` ends soon" for its current end: one per (lease, end time)."""
    return f"evt_lease_expiring_{lease.pk}_{int(lease.ends_at.timestamp())}"


def leases_expiring_notify(*, now: datetime | None = None) -> int:
    """Tell the tenant (webhooks subscribed to ``lease.expiring``, the lease holder's mail, the lease page) that
    an active lease ends within ``LEASE_EXPIRING_NOTICE_SECONDS`` (0: never), before the expiry task ends it.
    Once per lease and end time (``Notification.event_id`` is unique; a renewal moves the end and is told
    again); a lease whose whole length is within the lead time is not told (it knew from its start). One
    transaction per lease, deliveries sent after commit; returns how many were made."""
    now = now or timezone.now()
    lead = settings.LEASE_EXPIRING_NOTICE_SECONDS
    if lead <= 0:
        return 0
    due = (Lease.objects.filter(state=LeaseState.ACTIVE, ends_at__gt=now, ends_at__lte=now + timedelta(seconds=lead),
                                duration_seconds__gt=lead)
           .select_related("tenant", "project", "created_by").order_by("ends_at", "pk")[:OUTBOX_BATCH])
    made = 0
    for lease in due:
        event_id = expiring_event_id(lease)
        if Notification.objects.filter(event_id=event_id).exists():
            continue
        left = round((lease.ends_at - now).total_seconds())
        payload = {"id": event_id, "type": EventKind.LEASE_EXPIRING, "created": _iso(now), "tenant": lease.tenant.slug,
                   "data": {"lease": {"id": lease.pk, "project": lease.project.slug, "state": lease.state,
                                      "kind": lease.kind, "tier": lease.tier, "over_quota": lease.over_quota,
                                      "ends_at": _iso(lease.ends_at), "notice_deadline": None},
                            "from_state": lease.state, "to_state": lease.state, "ends_in_seconds": left,
                            "reason": f"the lease ends at {lease.ends_at:%Y-%m-%d %H:%M:%S} UTC, in {left} s: renew "
                                      f"it to keep the GPU"}}
        try:
            with transaction.atomic(durable=True):
                delivery_ids = _notify(tenant=lease.tenant, kind=EventKind.LEASE_EXPIRING, payload=payload,
                                       event_id=event_id, lease=lease, lease_event=None, now=now)
                _enqueue_sends(delivery_ids)
        except IntegrityError:
            continue  # another run made it first: told once
        made += 1
    return made


# -- sending -------------------------------------------------------------------------------------------
def backoff_seconds(attempts: int) -> float:
    """Before attempt ``attempts + 1``: base · 2^(attempts-1), capped, times a jitter in [0.5, 1]."""
    base = settings.WEBHOOK_BACKOFF_BASE_SECONDS
    delay = min(settings.WEBHOOK_BACKOFF_MAX_SECONDS, base * 2 ** max(0, attempts - 1))
    return delay * (0.5 + random.random() / 2)  # jitter, not a secret


def _retryable(status: int | None) -> bool:
    return status is None or status >= 500 or status in (408, 429)


def _signing_secrets(endpoint: WebhookEndpoint, now: datetime) -> list[str]:
    live = [endpoint.secret]
    if endpoint.previous_secret and endpoint.previous_secret_expires_at and endpoint.previous_secret_expires_at > now:
        live.append(endpoint.previous_secret)
    return live


def webhook_body(notification: Notification) -> bytes:
    return json.dumps(notification.payload, separators=(",", ":"), sort_keys=True).encode()


def _send_webhook(delivery: Delivery, now: datetime) -> tuple[int | None, str, bool]:
    """(status, error, retry?)"""
    endpoint = delivery.endpoint
    if not endpoint.is_active or endpoint.deleted_at is not None:
        return None, "endpoint disabled", False
    body = webhook_body(delivery.notification)
    cloudevent = delivery.notification.kind == EventKind.USAGE_LEASE_HOUR  # structured mode: the body is the event
    headers = {
        "Content-Type": "application/cloudevents+json; charset=utf-8" if cloudevent else "application/json",
        "User-Agent": USER_AGENT,
        signing.SIGNATURE_HEADER: signing.signature_header(_signing_secrets(endpoint, now), int(now.timestamp()), body),
        "Idempotency-Key": delivery.notification.event_id,
        "Gpub-Event-Id": delivery.notification.event_id,
        "Gpub-Event-Type": delivery.notification.kind,
        "Gpub-Delivery-Attempt": str(delivery.attempts),
    }
    try:
        response = transport.post(endpoint.url, body, headers, timeout_seconds=settings.WEBHOOK_TIMEOUT_SECONDS,
                                  max_response_bytes=settings.WEBHOOK_RESPONSE_MAX_BYTES)
    except transport.UnsafeUrl as error:
        return None, error.message[:300], False
    if response.status is not None and 200 <= response.status < 300:
        return response.status, "", False
    error = response.error or f"HTTP {response.status}"
    return response.status, error, _retryable(response.status)


def spend_alert_email(notification: Notification) -> tuple[str, str]:
    """(subject, body) of a spend alert's mail."""
    data = notification.payload.get("data", {})
    subject = (f"Spend alert: {data.get('scope')} {data.get('project') or notification.payload.get('tenant')} "
               f"reached {data.get('threshold_pct')}% ({data.get('basis')}) in {data.get('period')}")
    amount = format_money(int(data.get("amount_minor") or 0), data.get("currency") or "USD")
    body = (f"{data.get('reason')}\n\nTenant: {notification.payload.get('tenant')}\nAmount: {amount}\n"
            f"Event: {notification.event_id}\n\nYou get this mail as an owner or admin of the tenant; the alert "
            f"thresholds are under Budgets in the portal.\n")
    return subject, body


def _send_email(delivery: Delivery) -> tuple[int | None, str, bool]:
    notification = delivery.notification
    if notification.kind == EventKind.SPEND_ALERT:
        subject, body = spend_alert_email(notification)
        return _mail(delivery, subject, body)
    data = notification.payload.get("data", {})
    lease = data.get("lease") or {}
    subject = {
        EventKind.LEASE_NOTICE: f"Notice: lease {lease.get('id')} will be taken back at {lease.get('notice_deadline')}",
        EventKind.LEASE_PREEMPTED: f"Lease {lease.get('id')} was preempted and is queued again",
        EventKind.LEASE_FAILED: f"Lease {lease.get('id')} failed",
        EventKind.LEASE_EXPIRING: f"Lease {lease.get('id')} ends at {lease.get('ends_at')}: renew it to keep it",
    }.get(notification.kind, f"GPU broker: {notification.kind}")
    body = (f"{subject}.\n\nTenant: {notification.payload.get('tenant')}\nProject: {lease.get('project')}\n"
            f"Reason: {data.get('reason') or '-'}\nEvent: {notification.event_id}\n\n"
            f"You get this mail because you requested the lease; turn lease mail off under Settings → "
            f"Notifications in the portal.\n")
    return _mail(delivery, subject, body)


def _mail(delivery: Delivery, subject: str, body: str) -> tuple[int | None, str, bool]:
    try:
        send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [delivery.recipient.email], fail_silently=False)
    except OSError as error:  # smtplib.SMTPException is an OSError
        return None, f"{type(error).__name__}: {error}"[:300], True
    return None, "", False


def delivery_send(*, delivery_id: int, now: datetime | None = None) -> float | None:
    """Send one due delivery if no one else is; returns the seconds until its next attempt when it must be
    retried (None: done, failed for good, or not ours to send now)."""
    now = now or timezone.now()
    claim = now + timedelta(seconds=settings.WEBHOOK_TIMEOUT_SECONDS + CLAIM_MARGIN_SECONDS)
    claimed = Delivery.objects.filter(
        Q(claimed_until__isnull=True) | Q(claimed_until__lt=now),
        pk=delivery_id, status=DeliveryStatus.PENDING, next_attempt_at__lte=now,
    ).update(claimed_until=claim, attempts=F("attempts") + 1)
    if claimed != 1:
        return None
    delivery = Delivery.objects.select_related("notification", "endpoint", "recipient").get(pk=delivery_id)
    if delivery.channel == Channel.WEBHOOK:
        status, error, retry = _send_webhook(delivery, now)
    else:
        status, error, retry = _send_email(delivery)
    done_at = timezone.now()
    too_old = done_at - delivery.notification.created_at >= timedelta(seconds=settings.WEBHOOK_MAX_AGE_SECONDS)
    if retry and (delivery.attempts >= settings.WEBHOOK_MAX_ATTEMPTS or too_old):
        retry = False
        error = f"{error}; gave up after {delivery.attempts} attempts"[:300]
    delay = backoff_seconds(delivery.attempts) if retry else None
    with transaction.atomic(durable=True):
        if not error:
            outcome = {"status": DeliveryStatus.SUCCEEDED, "completed_at": done_at, "last_error": ""}
        elif retry:
            outcome = {"status": DeliveryStatus.PENDING, "next_attempt_at": done_at + timedelta(seconds=delay),
                       "last_error": error}
        else:
            outcome = {"status": DeliveryStatus.FAILED, "completed_at": done_at, "last_error": error}
        Delivery.objects.filter(pk=delivery.pk, claimed_until=claim).update(
            last_status_code=status, claimed_until=None, **outcome)
        if delivery.endpoint_id is not None and error != "endpoint disabled":
            _endpoint_record(delivery.endpoint, succeeded=not error, now=done_at)
    logger.info("delivery %s (%s) attempt %s: %s", delivery.pk, delivery.channel, delivery.attempts,
                error or f"delivered ({status})")
    return delay


def _endpoint_record(endpoint: WebhookEndpoint, *, succeeded: bool, now: datetime) -> None:
    """Inside a transaction: the endpoint's run of failures; disabled (audited) when it lasted too long."""
    if succeeded:
        WebhookEndpoint.objects.filter(pk=endpoint.pk).exclude(consecutive_failures=0, failing_since=None).update(
            consecutive_failures=0, failing_since=None)
        return
    locked = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
    failing_since = locked.failing_since or now
    failures = locked.consecutive_failures + 1
    disable = (locked.is_active and failures >= settings.WEBHOOK_DISABLE_AFTER_FAILURES
               and now - failing_since >= timedelta(seconds=settings.WEBHOOK_DISABLE_AFTER_SECONDS))
    changes = {"consecutive_failures": failures, "failing_since": failing_since}
    if disable:
        reason = f"disabled automatically: every delivery failed since {failing_since:%Y-%m-%d %H:%M} UTC"
        changes.update(is_active=False, disabled_reason=reason)
        audit_record(tenant=locked.tenant, by=None, action="webhook.disable", target=f"webhook:{locked.pk}",
                     data={"reason": reason, "consecutive_failures": failures})
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(**changes)


def deliveries_due(*, now: datetime | None = None, limit: int = 500) -> list[int]:
    """Ids of pending deliveries whose time has come and that no one holds."""
    now = now or timezone.now()
    return list(Delivery.objects.filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now),
                                        status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
                .order_by("next_attempt_at", "pk").values_list("pk", flat=True)[:limit])
