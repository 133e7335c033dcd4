from django.urls import path

from portal import views

app_name = "portal"

urlpatterns = [
    path("", views.DashboardView.as_view(), name="dashboard"),
    path("tenant/switch", views.TenantSwitchView.as_view(), name="tenant-switch"),
]
