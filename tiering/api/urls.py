from django.urls import path

from tiering.api import views

urlpatterns = [
    path("workloads", views.WorkloadListApi.as_view(), name="api-workloads"),
    path("workloads/<str:name>", views.WorkloadDetailApi.as_view(), name="api-workload"),
    path("workloads/<str:name>/profiles", views.WorkloadProfileApi.as_view(), name="api-workload-profiles"),
    path("workloads/<str:name>/prediction", views.WorkloadPredictionApi.as_view(), name="api-workload-prediction"),
    path("workloads/<str:name>/profiling-runs", views.WorkloadProfilingApi.as_view(),
         name="api-workload-profiling"),
    path("workloads/<str:name>/advice", views.WorkloadAdviceApi.as_view(), name="api-workload-advice"),
    path("leases/<int:pk>/samples", views.LeaseSampleApi.as_view(), name="api-lease-samples"),
]
