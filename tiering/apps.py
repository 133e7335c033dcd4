from django.apps import AppConfig


class TieringConfig(AppConfig):
    name = "tiering"
    verbose_name = "Auto-tiering"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # gpu: {"kind": "auto", "workload": ...} is resolved here (leasing imports nothing of tiering)
        # the services send their follow-up tasks by name: importing the tasks registers them (core.task_registry)
        from broker.extensions import gpu_resolver_register
        from tiering import tasks  # noqa: F401
        from tiering.admission import auto_resolve

        gpu_resolver_register("auto", auto_resolve)
