"""Notifications: what happened to a tenant's leases (and advice), and its delivery to each webhook endpoint
and to the lease holder's mailbox (docs/notifications.md).

- ``Notification`` is one event to tell, made once per ``LeaseEvent`` (unique) by the outbox task, or by
  ``notification_emit``; its ``payload`` is the exact JSON body every endpoint receives.
- ``Delivery`` is one (notification, endpoint) or (notification, e-mail) pair: unique, so the outbox never
  creates two, and a send claims it with a conditional update, so two workers never send it twice at once.
- ``OutboxCursor`` is the last ``LeaseEvent`` id the outbox has read (one row per stream, locked with
  ``FOR UPDATE SKIP LOCKED`` while a run works).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q
from django.utils import timezone

from notifications.choices import Channel, DeliveryStatus, EventKind


class WebhookEndpoint(models.Model):
    """A tenant's receiver. ``secret`` signs every delivery (it must be readable to sign, like a node's
    secret; it is shown to the tenant once, at creation or rotation). After a rotation ``previous_secret``
    also signs until ``previous_secret_expires_at``, so a receiver can roll over without losing events."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="webhook_endpoints")
    url = models.URLField(max_length=500)
    description = models.CharField(max_length=200, blank=True)
    event_types = ArrayField(models.CharField(max_length=32, choices=EventKind.choices), default=list)
    is_active = models.BooleanField(default=True)
    secret = models.CharField(max_length=80)
    previous_secret = models.CharField(max_length=80, blank=True)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    # failing: the first failure of the current run of failures (None after any success)
    failing_since = models.DateTimeField(null=True, blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    disabled_reason = models.CharField(max_length=200, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tenant_id", "-created_at", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(event_types__contained_by=EventKind.values) & Q(event_types__len__gte=1),
                                   name="webhookendpoint_event_types_valid"),
            models.CheckConstraint(condition=Q(secret__startswith="whsec_"), name="webhookendpoint_secret_format"),
            models.CheckConstraint(condition=Q(url__startswith="https://") | Q(url__startswith="http://"),
                                   name="webhookendpoint_url_http"),
        ]

    def __str__(self) -> str:
        return f"webhook {self.pk} → {self.url}"


class Notification(models.Model):
    """One event to tell a tenant. ``event_id`` (``evt_…``) is the receivers' idempotency key."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="notifications")
    kind = models.CharField(max_length=32, choices=EventKind.choices)
    lease = models.ForeignKey("broker.Lease", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    lease_event = models.OneToOneField("broker.LeaseEvent", null=True, blank=True, on_delete=models.PROTECT,
                                       related_name="+")
    event_id = models.CharField(max_length=40, unique=True)
    payload = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.CheckConstraint(condition=Q(kind__in=EventKind.values), name="notification_kind_valid")]

    def __str__(self) -> str:
        return f"{self.event_id} {self.kind}"


class Delivery(models.Model):
    """One notification to one endpoint (or one mailbox). ``attempts`` counts sends started;
    ``claimed_until`` keeps a second worker off a send in flight."""

    tenant_lookup = "notification__tenant"

    notification = models.ForeignKey(Notification, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.CharField(max_length=8, choices=Channel.choices)
    endpoint = models.ForeignKey(WebhookEndpoint, null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="deliveries")
    recipient = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                                  related_name="+")
    status = models.CharField(max_length=12, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    claimed_until = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="delivery_due")]
        constraints = [
            models.UniqueConstraint(fields=["notification", "endpoint"], condition=Q(channel=Channel.WEBHOOK),
                                    name="delivery_unique_per_endpoint"),
            models.UniqueConstraint(fields=["notification", "recipient"], condition=Q(channel=Channel.EMAIL),
                                    name="delivery_unique_per_recipient"),
            models.CheckConstraint(
                condition=(Q(channel=Channel.WEBHOOK, endpoint__isnull=False)
                           | Q(channel=Channel.EMAIL, recipient__isnull=False)),
                name="delivery_target_matches_channel"),
            models.CheckConstraint(condition=Q(status__in=DeliveryStatus.values), name="delivery_status_valid"),
        ]

    def __str__(self) -> str:
        return f"delivery {self.pk} ({self.channel}, {self.status})"


class OutboxCursor(models.Model):
    """The last ``LeaseEvent`` id a stream has turned into notifications."""

    tenant_lookup = None  # platform data

    stream = models.CharField(max_length=32, primary_key=True)
    last_event_id = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.stream} @ {self.last_event_id}"


class NotificationPreference(models.Model):
    """A user's choice of mail (the default, with no row: lease mail on)."""

    tenant_lookup = None

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    email_lease_events = models.BooleanField(default=True)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"preferences of {self.user_id}"
