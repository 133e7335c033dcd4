"""Billing routes under ``/api/v1/``: the tenants' usage and invoices, and Stripe's webhook."""

from django.urls import path, re_path

from billing import webhooks
from billing.api import views

urlpatterns = [
    path("usage", views.UsageApi.as_view(), name="api-usage"),
    path("invoices", views.InvoiceListApi.as_view(), name="api-invoices"),
    path("invoices/<int:pk>", views.InvoiceDetailApi.as_view(), name="api-invoice"),
    re_path(r"^invoices/(?P<pk>[0-9]+)\.(?P<fmt>pdf|csv)$", views.InvoiceDocumentApi.as_view(),
            name="api-invoice-document"),
    path("billing/stripe/webhook", webhooks.stripe_webhook, name="billing-stripe-webhook"),
]
