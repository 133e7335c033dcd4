from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Tenants, projects and quotas"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in, user_login_failed

        from tenants import (
            schema,  # noqa: F401 - registers the OpenAPI authentication scheme
            signins,
            tasks,  # noqa: F401 - registers the retention and export tasks by name (core.task_registry)
        )

        user_logged_in.connect(signins.on_user_logged_in, dispatch_uid="tenants-signin-audit")
        user_login_failed.connect(signins.on_user_login_failed, dispatch_uid="tenants-signin-failed-audit")
