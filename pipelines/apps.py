from django.apps import AppConfig


class PipelinesConfig(AppConfig):
    """Inference pipelines planned by ESG and models split over GPUs, stored and leased (docs/pipelines.md)."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "pipelines"
    verbose_name = "Pipelines and model splits"
