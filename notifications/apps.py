from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"
    verbose_name = "Notifications"

    def ready(self) -> None:
        # the services send their follow-up tasks by name: importing the tasks registers them (core.task_registry)
        from notifications import tasks  # noqa: F401
