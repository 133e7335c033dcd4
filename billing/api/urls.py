"""Billing routes under ``/api/v1/``: quotes and offers with their prices, the tenants' usage, invoices and spend
caps, the platform staff's price books and billing terms, and Stripe's webhook."""

from django.urls import path, re_path

from billing.api import views, webhooks

urlpatterns = [
    path("usage", views.UsageApi.as_view(), name="api-usage"),
    path("quotes", views.QuoteApi.as_view(), name="api-quotes"),
    path("offers", views.OfferListApi.as_view(), name="api-offers"),
    path("invoices", views.InvoiceListApi.as_view(), name="api-invoices"),
    path("invoices/<int:pk>", views.InvoiceDetailApi.as_view(), name="api-invoice"),
    re_path(r"^invoices/(?P<pk>[0-9]+)\.(?P<fmt>pdf|csv)$", views.InvoiceDocumentApi.as_view(),
            name="api-invoice-document"),
    path("spend-caps", views.SpendCapListApi.as_view(), name="api-spend-caps"),
    path("spend-caps/<int:pk>", views.SpendCapDetailApi.as_view(), name="api-spend-cap"),
    path("price-books", views.PriceBookListApi.as_view(), name="api-price-books"),
    path("price-books/<int:pk>", views.PriceBookDetailApi.as_view(), name="api-price-book"),
    path("tenants/<slug:slug>/billing-terms", views.BillingTermsApi.as_view(), name="api-billing-terms"),
    path("billing/stripe/webhook", webhooks.stripe_webhook, name="billing-stripe-webhook"),
]
