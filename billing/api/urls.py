"""Billing routes under ``/api/v1/``: quotes and offers with their prices, the tenants' usage, invoices and spend
caps, the platform staff's price books and billing terms, and Stripe's webhook."""

from django.urls import path, re_path

from billing.api import allocation, corrections, views, webhooks

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
    # cost allocation, spend alerts and standard exports (issue 33)
    path("label-keys", allocation.LabelKeysApi.as_view(), name="api-label-keys"),
    path("usage/breakdown", allocation.UsageBreakdownApi.as_view(), name="api-usage-breakdown"),
    re_path(r"^usage/breakdown\.(?P<fmt>[a-z]+)$", allocation.UsageBreakdownDocumentApi.as_view(),
            name="api-usage-breakdown-csv"),
    path("invoices/<int:pk>/breakdown", allocation.InvoiceBreakdownApi.as_view(), name="api-invoice-breakdown"),
    re_path(r"^invoices/(?P<pk>[0-9]+)/breakdown\.(?P<fmt>[a-z]+)$", allocation.InvoiceBreakdownDocumentApi.as_view(),
            name="api-invoice-breakdown-csv"),
    re_path(r"^invoices/(?P<pk>[0-9]+)/focus\.(?P<fmt>[a-z]+)$", allocation.InvoiceFocusApi.as_view(),
            name="api-invoice-focus"),
    re_path(r"^billing/focus\.(?P<fmt>[a-z]+)$", allocation.StaffFocusApi.as_view(), name="api-staff-focus"),
    path("spend-alert-rules", allocation.SpendAlertRuleListApi.as_view(), name="api-spend-alert-rules"),
    path("spend-alert-rules/<int:pk>", allocation.SpendAlertRuleDetailApi.as_view(), name="api-spend-alert-rule"),
    path("spend-alerts", allocation.SpendAlertListApi.as_view(), name="api-spend-alerts"),
]
