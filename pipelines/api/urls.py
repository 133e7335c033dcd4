from django.urls import path

from pipelines.api import views

urlpatterns = [
    path("pipelines", views.PipelineListApi.as_view(), name="api-pipelines"),
    path("pipelines/<int:pk>", views.PipelineDetailApi.as_view(), name="api-pipeline"),
    path("pipelines/<int:pk>/plans", views.PlanCreateApi.as_view(), name="api-pipeline-plans"),
    path("pipelines/<int:pk>/plans/<int:plan_id>", views.PlanDetailApi.as_view(), name="api-pipeline-plan"),
    path("pipelines/<int:pk>/plans/<int:plan_id>/apply", views.PlanApplyApi.as_view(), name="api-pipeline-apply"),
    path("pipelines/<int:pk>/plans/<int:plan_id>/release", views.PlanReleaseApi.as_view(),
         name="api-pipeline-release"),
    path("model-splits", views.ModelSplitCreateApi.as_view(), name="api-model-splits"),
    path("model-splits/<int:pk>", views.ModelSplitDetailApi.as_view(), name="api-model-split"),
    path("model-splits/<int:pk>/apply", views.ModelSplitApplyApi.as_view(), name="api-model-split-apply"),
    path("model-splits/<int:pk>/release", views.ModelSplitReleaseApi.as_view(), name="api-model-split-release"),
]
