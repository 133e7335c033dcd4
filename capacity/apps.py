from django.apps import AppConfig


class CapacityConfig(AppConfig):
    """The capacity loop in the service: the planner's adjustments as rows, applied through the agents and
    the broker's services (docs/capacity.md)."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "capacity"
    verbose_name = "Capacity loop"
