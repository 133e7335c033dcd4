from django.apps import AppConfig


class CapacityConfig(AppConfig):
    """The capacity loop in the service: the planner's adjustments as rows, applied through the agents and
    the broker's services (docs/capacity.md)."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "capacity"
    verbose_name = "Capacity loop"

    def ready(self) -> None:
        """A schedule cycle that leaves requests waiting for a mode an idle GPU could be switched to tells the
        loop through leasing's seam (``broker.extensions.pool_wait_register``), and the planner runs soon
        (``services.plan_on_wait``); its task is sent by name (``core.task_registry``)."""
        from broker import extensions
        from capacity import tasks  # noqa: F401 (registered for sending by name)
        from capacity.services import plan_on_wait

        extensions.pool_wait_register(plan_on_wait)
        # reclaim across modes: where the loop switches GPUs on its own, a cycle may empty one of over-quota work for
        # an in-quota lease of another mode; the loop carries the switch out (``services.mode_switch_for``)
        from capacity.selectors import switch_modes_in_force
        from capacity.services import mode_switch_for

        extensions.mode_switch_register(switch_modes_in_force, mode_switch_for)
