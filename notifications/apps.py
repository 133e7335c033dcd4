from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"
    verbose_name = "Notifications"

    def ready(self) -> None:
        # the services send their follow-up tasks by name: importing the tasks registers them (core.task_registry)
        # billing's events (credit expiry, dunning) reach the outbox through a teller: billing sits below us
        from billing.events import teller_register
        from notifications import tasks  # noqa: F401
        from notifications.services import notification_emit

        teller_register(notification_emit)
