from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from config import health
from observability import views as observability_views
from portal import account as account_pages
from portal import notifications as notification_pages
from portal import otp as otp_pages
from portal import sso as sso_pages

handler400 = "core.problems.handler400"
handler404 = "core.problems.handler404"
handler500 = "core.problems.handler500"

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", observability_views.metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("accounts/login/", sso_pages.SignInView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/unlock/", account_pages.LoginUnlockRequestView.as_view(), name="login-unlock-request"),
    path("accounts/unlock/<str:token>", account_pages.LoginUnlockView.as_view(), name="login-unlock"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="api-schema"), name="api-redoc"),
    path("api/v1/", include("tenants.api.urls")),
    path("api/v1/", include("broker.api.urls")),
    path("api/v1/", include("billing.api.urls")),
    path("api/v1/", include("notifications.api.urls")),
    path("api/v1/", include("capacity.api.urls")),
    path("api/v1/", include("pipelines.api.urls")),
    path("api/v1/", include("tiering.api.urls")),
    path("settings/notifications/", include((notification_pages.urlpatterns, "notifications"))),
    path("", include("portal.urls")),
]
urlpatterns[-1:-1] = [  # single sign-on and the second factor (issue 34)
    path("accounts/sso/start", sso_pages.SsoStartView.as_view(), name="sso-start"),
    path("accounts/sso/callback", sso_pages.SsoCallbackView.as_view(), name="sso-callback"),
    path("accounts/sso/logout", sso_pages.SsoLogoutView.as_view(), name="sso-logout"),
    path("accounts/2fa/", otp_pages.SecondFactorVerifyView.as_view(), name="2fa-verify"),
    path("accounts/2fa/setup", otp_pages.SecondFactorSetupView.as_view(), name="2fa-setup"),
    path("accounts/2fa/recovery-codes", otp_pages.RecoveryCodesView.as_view(), name="2fa-recovery-codes"),
    path("settings/sign-in", sso_pages.SignInSettingsView.as_view(), name="portal-sign-in"),
]
