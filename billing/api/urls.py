"""Billing routes under ``/api/v1/``: quotes and offers with their prices, the tenants' usage, invoices and spend
caps, the platform staff's price books and billing terms, and Stripe's webhook."""

from django.urls import path, re_path

from billing.api import corrections, views, webhooks

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
    # corrections and prepaid credits (billing.api.corrections)
    path("credit-notes", corrections.CreditNoteListApi.as_view(), name="api-credit-notes"),
    path("credit-notes/<int:pk>", corrections.CreditNoteDetailApi.as_view(), name="api-credit-note"),
    re_path(r"^credit-notes/(?P<pk>[0-9]+)\.(?P<fmt>pdf|csv)$", corrections.CreditNoteDocumentApi.as_view(),
            name="api-credit-note-document"),
    path("credits", corrections.CreditBalanceApi.as_view(), name="api-credits"),
    path("billing/invoices/<int:pk>", corrections.StaffInvoiceBalanceApi.as_view(), name="api-staff-invoice"),
    path("billing/invoices/<int:pk>/credit-notes", corrections.StaffCreditNoteApi.as_view(),
         name="api-staff-credit-notes"),
    path("billing/invoices/<int:pk>/void", corrections.StaffInvoiceVoidApi.as_view(), name="api-staff-invoice-void"),
    path("billing/invoices/<int:pk>/payments", corrections.StaffPaymentApi.as_view(), name="api-staff-payments"),
    path("billing/payments/<int:pk>/refunds", corrections.StaffRefundApi.as_view(), name="api-staff-refunds"),
    path("tenants/<slug:slug>/tax", corrections.StaffTaxApi.as_view(), name="api-staff-tax"),
    path("tenants/<slug:slug>/tax/rates/<int:pk>", corrections.StaffTaxRateApi.as_view(), name="api-staff-tax-rate"),
    path("tenants/<slug:slug>/credit-grants", corrections.StaffCreditGrantApi.as_view(), name="api-credit-grants"),
    path("billing/stripe/webhook", webhooks.stripe_webhook, name="billing-stripe-webhook"),
]
