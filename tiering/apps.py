from django.apps import AppConfig


class TieringConfig(AppConfig):
    name = "tiering"
    verbose_name = "Auto-tiering"
    default_auto_field = "django.db.models.BigAutoField"
