from django.urls import path

from capacity.api import views

urlpatterns = [
    path("adjustments", views.AdjustmentListApi.as_view(), name="api-adjustments"),
    path("adjustments/<int:pk>", views.AdjustmentDetailApi.as_view(), name="api-adjustment"),
    path("adjustments/<int:pk>/accept", views.AdjustmentAcceptApi.as_view(), name="api-adjustment-accept"),
    path("adjustments/<int:pk>/reject", views.AdjustmentRejectApi.as_view(), name="api-adjustment-reject"),
    path("projects/<slug:slug>/idle-reclaim", views.ProjectIdleReclaimApi.as_view(), name="api-project-idle-reclaim"),
    path("capacity/policies", views.PolicyListApi.as_view(), name="api-capacity-policies"),
    path("capacity/policies/<int:pk>", views.PolicyDetailApi.as_view(), name="api-capacity-policy"),
    path("capacity/fleet", views.FleetApi.as_view(), name="api-capacity-fleet"),
    path("capacity/run", views.PlanRunApi.as_view(), name="api-capacity-run"),
]
