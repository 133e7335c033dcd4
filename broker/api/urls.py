from django.urls import path

from broker.api import views

urlpatterns = [
    path("leases", views.LeaseListApi.as_view(), name="api-leases"),
    path("leases/<int:pk>", views.LeaseDetailApi.as_view(), name="api-lease"),
    path("leases/<int:pk>/renew", views.LeaseRenewApi.as_view(), name="api-lease-renew"),
    path("leases/<int:pk>/logs", views.LeaseLogsApi.as_view(), name="api-lease-logs"),
    path("agents/<str:node_id>/workloads", views.AgentWorkloadsApi.as_view(), name="api-agent-workloads"),
    path("agents/enroll", views.AgentEnrollApi.as_view(), name="api-agent-enroll"),
    path("agents/<str:node_id>/heartbeat", views.AgentHeartbeatApi.as_view(), name="api-agent-heartbeat"),
]
