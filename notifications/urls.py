from django.urls import path

from notifications import views

app_name = "notifications"

urlpatterns = [
    path("", views.NotificationSettingsView.as_view(), name="settings"),
    path("preference", views.NotificationPreferenceView.as_view(), name="preference"),
    path("webhooks/<int:pk>/rotate", views.WebhookRotateView.as_view(), name="webhook-rotate"),
    path("webhooks/<int:pk>/toggle", views.WebhookToggleView.as_view(), name="webhook-toggle"),
    path("webhooks/<int:pk>/delete", views.WebhookDeleteView.as_view(), name="webhook-delete"),
]
