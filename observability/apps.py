from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    """The broker's own telemetry: metrics at /metrics (events from Celery signals, the agent client and a
    request middleware; states read from PostgreSQL at scrape time) and OpenTelemetry traces (off unless the
    OTEL_* variables ask for them). docs/operations.md, "Metrics", "Traces"."""

    name = "observability"
    verbose_name = "Observability"

    def ready(self):
        from observability import hooks, tracing

        hooks.connect()
        tracing.configure()
