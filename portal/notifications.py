"""Portal pages under Settings → Notifications (``/settings/notifications/``, URL names ``notifications:*``): the
tenant's webhook endpoints (create with the secret shown once, rotate, disable/enable, delete, recent deliveries)
and the user's own lease mail switch. Thin like every portal view: tenant-scoped selectors, one service per write.
The pages of every feature live in ``portal/``; the app (``notifications/``) is their model, services and API."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect, render
from django.urls import path

from core.errors import ApplicationError
from notifications import selectors, services
from notifications.choices import EventKind
from notifications.models import Delivery
from portal import forms
from portal.views import TenantView
from tenants.access import restrict

RECENT_DELIVERIES = 20


def _secret_page(request, endpoint, secret: str, *, rotated: bool):
    # the secret is in this response only: never cached, not in a redirect
    response = render(request, "notifications/webhook_secret.html",
                      {"endpoint": endpoint, "secret": secret, "rotated": rotated, "tab": "notifications"},
                      status=200 if rotated else 201)
    response["Cache-Control"] = "no-store"
    return response


class NotificationSettingsView(TenantView):
    template_name = "notifications/settings.html"
    write_action = "manage"

    def render_page(self, request, *, errors=None, values=None, status=200):
        endpoints = list(selectors.webhook_endpoint_list(actor=self.actor))
        deliveries = (restrict(Delivery.objects.select_related("notification", "endpoint"), self.actor)
                      .filter(endpoint__in=endpoints).order_by("-created_at", "-id")[:RECENT_DELIVERIES])
        context = {
            "endpoints": endpoints,
            "deliveries": deliveries,
            "event_kinds": EventKind.choices,
            "chosen_kinds": values.getlist("event_types") if values else [EventKind.LEASE_NOTICE],
            "can_manage": self.actor.can("manage"),
            "email_on": selectors.email_lease_events_enabled(user=request.user),
            "user_email": request.user.email,
            "errors": errors or forms.FieldErrors(),
            "values": values,
            "tab": "notifications",
        }
        return render(request, self.template_name, context, status=status)

    def get(self, request):
        return self.render_page(request)

    def post(self, request):
        try:
            endpoint, secret = services.webhook_endpoint_create(
                actor=self.actor, url=request.POST.get("url", ""), event_types=request.POST.getlist("event_types"),
                description=request.POST.get("description", ""))
        except ApplicationError as error:
            return self.render_page(request, errors=forms.FieldErrors(error, shown={"url", "event_types"}),
                                    values=request.POST, status=error.status)
        return _secret_page(request, endpoint, secret, rotated=False)


class NotificationPreferenceView(TenantView):
    http_method_names = ["post"]
    write_action = "leave"  # one's own mail: any role, also while the tenant is suspended

    def post(self, request):
        enabled = request.POST.get("email_lease_events") == "on"
        services.notification_preference_set(user=request.user, email_lease_events=enabled, tenant=self.actor.tenant)
        messages.success(request, "Lease mail is on." if enabled else "Lease mail is off.")
        return redirect("notifications:settings")


class WebhookRotateView(TenantView):
    http_method_names = ["post"]
    write_action = "manage"

    def post(self, request, pk: int):
        endpoint = selectors.webhook_endpoint_get(actor=self.actor, pk=pk)
        endpoint, secret = services.webhook_endpoint_rotate(actor=self.actor, endpoint=endpoint)
        return _secret_page(request, endpoint, secret, rotated=True)


class WebhookToggleView(TenantView):
    http_method_names = ["post"]
    write_action = "manage"

    def post(self, request, pk: int):
        endpoint = selectors.webhook_endpoint_get(actor=self.actor, pk=pk)
        endpoint = services.webhook_endpoint_update(actor=self.actor, endpoint=endpoint,
                                                    is_active=not endpoint.is_active)
        messages.success(request, f"Endpoint {endpoint.url} {'enabled' if endpoint.is_active else 'disabled'}.")
        return redirect("notifications:settings")


class WebhookDeleteView(TenantView):
    http_method_names = ["post"]
    write_action = "manage"

    def post(self, request, pk: int):
        endpoint = selectors.webhook_endpoint_get(actor=self.actor, pk=pk)
        services.webhook_endpoint_delete(actor=self.actor, endpoint=endpoint)
        messages.success(request, f"Endpoint {endpoint.url} deleted.")
        return redirect("notifications:settings")


# included by config.urls under the namespace "notifications"
urlpatterns = [
    path("", NotificationSettingsView.as_view(), name="settings"),
    path("preference", NotificationPreferenceView.as_view(), name="preference"),
    path("webhooks/<int:pk>/rotate", WebhookRotateView.as_view(), name="webhook-rotate"),
    path("webhooks/<int:pk>/toggle", WebhookToggleView.as_view(), name="webhook-toggle"),
    path("webhooks/<int:pk>/delete", WebhookDeleteView.as_view(), name="webhook-delete"),
]
