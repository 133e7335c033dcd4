from django.urls import path

from tenants.api import views

urlpatterns = [
    path("tenant", views.TenantApi.as_view(), name="api-tenant"),
    path("projects", views.ProjectListApi.as_view(), name="api-projects"),
    path("projects/<slug:slug>", views.ProjectDetailApi.as_view(), name="api-project"),
    path("quotas", views.QuotaListApi.as_view(), name="api-quotas"),
    path("members", views.MemberListApi.as_view(), name="api-members"),
    path("members/<int:pk>", views.MemberDetailApi.as_view(), name="api-member"),
    path("tokens", views.TokenListApi.as_view(), name="api-tokens"),
    path("tokens/<int:pk>", views.TokenDetailApi.as_view(), name="api-token"),
    path("slo-contracts", views.SloContractListApi.as_view(), name="api-slo-contracts"),
]
