from django.urls import path, re_path

from portal import billing, ops, views

app_name = "portal"

urlpatterns = [
    path("", views.DashboardView.as_view(), name="dashboard"),
    path("tenant/switch", views.TenantSwitchView.as_view(), name="tenant-switch"),
    path("leases/", views.LeaseListView.as_view(), name="leases"),
    path("leases/new", views.LeaseRequestView.as_view(), name="lease-new"),
    path("leases/preview", views.LeasePreviewView.as_view(), name="lease-preview"),
    path("leases/<int:pk>", views.LeaseDetailView.as_view(), name="lease"),
    path("leases/<int:pk>/release", views.LeaseReleaseView.as_view(), name="lease-release"),
    path("leases/<int:pk>/renew", views.LeaseRenewView.as_view(), name="lease-renew"),
    path("usage", billing.UsageView.as_view(), name="usage"),
    path("invoices/", billing.InvoiceListView.as_view(), name="invoices"),
    path("invoices/<int:pk>", billing.InvoiceDetailView.as_view(), name="invoice"),
    re_path(r"^invoices/(?P<pk>[0-9]+)\.(?P<fmt>pdf|csv)$", billing.InvoiceDocumentView.as_view(),
            name="invoice-document"),
    path("settings/members", views.MembersView.as_view(), name="members"),
    path("settings/members/invite", views.MemberInviteView.as_view(http_method_names=["post"]),
         name="member-invite"),
    path("settings/members/<int:pk>/role", views.MemberRoleView.as_view(http_method_names=["post"]),
         name="member-role"),
    path("settings/members/<int:pk>/remove", views.MemberRemoveView.as_view(http_method_names=["post"]),
         name="member-remove"),
    path("settings/tokens", views.TokensView.as_view(), name="tokens"),
    path("settings/tokens/<int:pk>/revoke", views.TokenRevokeView.as_view(), name="token-revoke"),
    # platform staff
    path("ops/fleet", ops.FleetView.as_view(), name="fleet"),
    path("ops/nodes/<str:node_id>/cordon", ops.NodeCordonView.as_view(), name="node-cordon"),
    path("ops/queue", ops.QueueView.as_view(), name="queue"),
    path("ops/billing", billing.BillingReportView.as_view(), name="ops-billing"),
    path("ops/tenants", ops.TenantListView.as_view(), name="ops-tenants"),
    path("ops/tenants/<slug:slug>", ops.TenantDetailView.as_view(), name="ops-tenant"),
    path("ops/tenants/<slug:slug>/status", ops.TenantStatusView.as_view(http_method_names=["post"]),
         name="ops-tenant-status"),
    path("ops/tenants/<slug:slug>/tenant-quota", ops.TenantQuotaSetView.as_view(http_method_names=["post"]),
         name="ops-tenant-quota"),
    path("ops/tenants/<slug:slug>/project-quota", ops.ProjectQuotaSetView.as_view(http_method_names=["post"]),
         name="ops-project-quota"),
    path("ops/tenants/<slug:slug>/slo-contracts", ops.SloContractSaveView.as_view(http_method_names=["post"]),
         name="ops-slo-new"),
    path("ops/tenants/<slug:slug>/slo-contracts/<int:pk>", ops.SloContractSaveView.as_view(http_method_names=["post"]),
         name="ops-slo"),
]
