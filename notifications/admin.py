"""Read-only admin: staff look at endpoints, notifications and deliveries; changes go through the services
(the API and the portal), which audit them."""

from django.contrib import admin

from core.admin import ReadOnlyAdmin
from notifications.models import Delivery, Notification, OutboxCursor, WebhookEndpoint


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(ReadOnlyAdmin):
    list_display = ["id", "tenant", "url", "is_active", "consecutive_failures", "created_at", "deleted_at"]
    list_filter = ["is_active"]
    exclude = ["secret", "previous_secret"]  # staff never need the signing secrets


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    list_display = ["event_id", "tenant", "kind", "lease_id", "created_at"]
    list_filter = ["kind"]


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = ["id", "notification", "channel", "endpoint_id", "status", "attempts", "last_status_code",
                    "next_attempt_at"]
    list_filter = ["status", "channel"]


@admin.register(OutboxCursor)
class OutboxCursorAdmin(ReadOnlyAdmin):
    list_display = ["stream", "last_event_id", "updated_at"]
