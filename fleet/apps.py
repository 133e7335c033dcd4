from django.apps import AppConfig


class FleetConfig(AppConfig):
    """The capacity loop in the service: the planner's adjustments as rows, applied through the agents and
    the leasing services (docs/capacity.md)."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "fleet"
    verbose_name = "Capacity loop"
