"""Readers of notifications; every tenant-facing query goes through ``tenants.access.restrict``."""

from __future__ import annotations

from django.db.models import QuerySet

from core.errors import NotFound
from notifications.models import Delivery, NotificationPreference, WebhookEndpoint
from tenants.access import Actor, restrict


def webhook_endpoint_list(*, actor: Actor) -> QuerySet[WebhookEndpoint]:
    return restrict(WebhookEndpoint.objects.filter(deleted_at__isnull=True), actor).order_by("-created_at", "-id")


def webhook_endpoint_get(*, actor: Actor, pk: int) -> WebhookEndpoint:
    endpoint = webhook_endpoint_list(actor=actor).filter(pk=pk).first()
    if endpoint is None:
        raise NotFound("No such webhook endpoint.")
    return endpoint


def delivery_list(*, actor: Actor, endpoint: WebhookEndpoint) -> QuerySet[Delivery]:
    return (restrict(Delivery.objects.select_related("notification"), actor).filter(endpoint=endpoint)
            .order_by("-created_at", "-id"))


def email_lease_events_enabled(*, user) -> bool:
    preference = NotificationPreference.objects.filter(user=user).first()
    return preference is None or preference.email_lease_events
