from django.urls import path

from tenants.api import audit, offboarding, platform, ssh_keys, views

urlpatterns = [
    path("tenant", views.TenantApi.as_view(), name="api-tenant"),
    path("projects", views.ProjectListApi.as_view(), name="api-projects"),
    path("projects/<slug:slug>", views.ProjectDetailApi.as_view(), name="api-project"),
    path("quotas", views.QuotaListApi.as_view(), name="api-quotas"),
    path("members", views.MemberListApi.as_view(), name="api-members"),
    path("members/<int:pk>", views.MemberDetailApi.as_view(), name="api-member"),
    path("tenant/invitations", views.TenantInvitationListApi.as_view(), name="api-tenant-invitations"),
    path("tenant/invitations/<int:pk>", views.TenantInvitationDetailApi.as_view(http_method_names=["delete"]),
         name="api-tenant-invitation"),
    path("invitations", views.InvitationListApi.as_view(http_method_names=["get"]), name="api-invitations"),
    path("invitations/<int:pk>/accept", views.InvitationDecideApi.as_view(decision="accept"),
         name="api-invitation-accept"),
    path("invitations/<int:pk>/decline", views.InvitationDecideApi.as_view(decision="decline"),
         name="api-invitation-decline"),
    path("tokens", views.TokenListApi.as_view(), name="api-tokens"),
    path("tokens/<int:pk>", views.TokenDetailApi.as_view(), name="api-token"),
    path("ssh-keys", ssh_keys.SshKeyListApi.as_view(), name="api-ssh-keys"),
    path("ssh-keys/<int:pk>", ssh_keys.SshKeyDetailApi.as_view(), name="api-ssh-key"),
    path("slo-contracts", views.SloContractListApi.as_view(), name="api-slo-contracts"),
    path("audit-events", audit.AuditEventListApi.as_view(), name="api-audit-events"),
    path("tenant/exports", offboarding.TenantExportListApi.as_view(), name="api-tenant-exports"),
    path("tenant/exports/<int:pk>", offboarding.TenantExportDetailApi.as_view(), name="api-tenant-export"),
    path("tenant/exports/<int:pk>/archive", offboarding.TenantExportArchiveApi.as_view(),
         name="api-tenant-export-archive"),
    path("tenant/close", offboarding.TenantCloseApi.as_view(), name="api-tenant-close"),
]

# the staff API (tenants/api/platform.py): platform staff only
urlpatterns += [
    path("cohorts", platform.PlatformCohortListApi.as_view(), name="api-staff-cohorts"),
    path("tenants", platform.PlatformTenantListApi.as_view(), name="api-staff-tenants"),
    path("tenants/<slug:slug>", platform.PlatformTenantDetailApi.as_view(), name="api-staff-tenant"),
    path("tenants/<slug:slug>/status", platform.PlatformTenantStatusApi.as_view(), name="api-staff-tenant-status"),
    path("tenants/<slug:slug>/quotas", platform.PlatformQuotaListApi.as_view(), name="api-staff-quotas"),
    path("tenants/<slug:slug>/quotas/<str:tier>", platform.PlatformTenantQuotaApi.as_view(),
         name="api-staff-tenant-quota"),
    path("tenants/<slug:slug>/projects", platform.PlatformProjectListApi.as_view(), name="api-staff-projects"),
    path("tenants/<slug:slug>/projects/<slug:project>", platform.PlatformProjectDetailApi.as_view(),
         name="api-staff-project"),
    path("tenants/<slug:slug>/projects/<slug:project>/status", platform.PlatformProjectStatusApi.as_view(),
         name="api-staff-project-status"),
    path("tenants/<slug:slug>/projects/<slug:project>/quotas/<str:tier>", platform.PlatformProjectQuotaApi.as_view(),
         name="api-staff-project-quota"),
    path("tenants/<slug:slug>/slo-contracts", platform.PlatformSloContractListApi.as_view(),
         name="api-staff-slo-contracts"),
    path("tenants/<slug:slug>/slo-contracts/<int:pk>", platform.PlatformSloContractDetailApi.as_view(),
         name="api-staff-slo-contract"),
]

# sign-in settings: single sign-on and the second factor (tenants/api/sso.py; issue 34)
from tenants.api import sso as sso_api  # noqa: E402

urlpatterns += [
    path("tenant/sign-in", sso_api.TenantSignInApi.as_view(), name="api-tenant-sign-in"),
    path("tenants/<slug:slug>/sign-in", sso_api.PlatformTenantSignInApi.as_view(), name="api-staff-tenant-sign-in"),
]
