from django.urls import path

from notifications.api import views

urlpatterns = [
    path("webhooks", views.WebhookListApi.as_view(), name="api-webhooks"),
    path("webhooks/<int:pk>", views.WebhookDetailApi.as_view(), name="api-webhook"),
    path("webhooks/<int:pk>/rotate", views.WebhookRotateApi.as_view(), name="api-webhook-rotate"),
    path("webhooks/<int:pk>/deliveries", views.WebhookDeliveryListApi.as_view(), name="api-webhook-deliveries"),
]
