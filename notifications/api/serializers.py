from rest_framework import serializers

from notifications.choices import EventKind
from notifications.models import Delivery, WebhookEndpoint
from tenants.api.serializers import StrictSerializer


class WebhookEndpointOutput(serializers.ModelSerializer):
    """Never the secret: it is shown once, in the answer to create and rotate."""

    event_types = serializers.ListField(child=serializers.ChoiceField(choices=EventKind.choices))
    previous_secret_valid_until = serializers.SerializerMethodField()

    class Meta:
        model = WebhookEndpoint
        fields = ["id", "url", "description", "event_types", "is_active", "disabled_reason", "created_at",
                  "failing_since", "consecutive_failures", "previous_secret_valid_until"]

    def get_previous_secret_valid_until(self, obj) -> str | None:
        if obj.previous_secret and obj.previous_secret_expires_at:
            return obj.previous_secret_expires_at.isoformat()
        return None


class WebhookEndpointSecretOutput(WebhookEndpointOutput):
    secret = serializers.CharField(help_text="whsec_…: the signing secret, shown this once")

    class Meta(WebhookEndpointOutput.Meta):
        fields = [*WebhookEndpointOutput.Meta.fields, "secret"]


class WebhookEndpointCreateInput(StrictSerializer):
    url = serializers.RegexField(r"^https?://", max_length=500)  # https, or http to loopback in development
    event_types = serializers.ListField(child=serializers.ChoiceField(choices=EventKind.choices), min_length=1,
                                        max_length=len(EventKind.values))
    description = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")


class WebhookEndpointUpdateInput(StrictSerializer):
    url = serializers.RegexField(r"^https?://", required=False, max_length=500)
    event_types = serializers.ListField(child=serializers.ChoiceField(choices=EventKind.choices), min_length=1,
                                        max_length=len(EventKind.values), required=False)
    description = serializers.CharField(required=False, allow_blank=True, max_length=200)
    is_active = serializers.BooleanField(required=False)


class DeliveryOutput(serializers.ModelSerializer):
    event_id = serializers.CharField(source="notification.event_id")
    event_type = serializers.CharField(source="notification.kind")

    class Meta:
        model = Delivery
        fields = ["id", "event_id", "event_type", "status", "attempts", "last_status_code", "last_error",
                  "next_attempt_at", "created_at", "completed_at"]
