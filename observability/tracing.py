"""OpenTelemetry traces: Django (server spans), Celery (publish and run spans, the context carried in the
message headers), psycopg (one span per query) and urllib (the agent client's calls, with ``traceparent``
sent to the agent). One lease request is one trace: ``POST /api/v1/leases`` → publish of the schedule cycle
→ the cycle in a worker → publish of provisioning → the agent's ``PUT /v1/instances``.

Off by default. Configured by the standard variables only:

- ``OTEL_TRACES_EXPORTER``: ``otlp`` (OTLP over HTTP/protobuf; ``OTEL_EXPORTER_OTLP_ENDPOINT``,
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``OTEL_EXPORTER_OTLP_HEADERS``…), ``console`` (JSON per span on
  stdout), several separated by commas; unset or ``none``: no tracing, nothing instrumented.
- ``OTEL_SDK_DISABLED=true`` turns it off whatever the exporter says.
- ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` name the process (default ``gpubroker``),
  ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` sample (default: every trace, parent-based).
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

_provider = None


def _exporters_from_env() -> list:
    names = [n.strip().lower() for n in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    exporters = []
    for name in names:
        if name == "none":
            return []
        if name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter())
        elif name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        else:
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured(f"Environment variable OTEL_TRACES_EXPORTER={name!r} is invalid: expected "
                                       "otlp, console or none")
    return exporters


def enabled_by_env() -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(_exporters_from_env())


def configure(*, exporter=None) -> bool:
    """Set up the tracer provider and the instrumentations. With ``exporter`` (tests: an in-memory one) its
    spans are exported at once, whatever the environment says. Returns whether tracing is on."""
    global _provider
    from_env = [] if exporter is not None else (_exporters_from_env() if enabled_by_env() else [])
    if exporter is None and not from_env:
        return False
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    if _provider is None:
        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "gpubroker"})
        _provider = TracerProvider(resource=resource)
        trace.set_tracer_provider(_provider)
    if exporter is not None:
        _provider.add_span_processor(SimpleSpanProcessor(exporter))
    for each in from_env:
        _provider.add_span_processor(BatchSpanProcessor(each))
    instrument()
    return True


def instrument() -> None:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.urllib import URLLibInstrumentor

    for instrumentor, options in ((DjangoInstrumentor(), {"is_sql_commentor_enabled": False}),
                                  (CeleryInstrumentor(), {}), (PsycopgInstrumentor(), {}),
                                  (URLLibInstrumentor(), {})):
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(**options)
    logger.info("OpenTelemetry tracing on (Django, Celery, psycopg, urllib)")


def uninstrument() -> None:
    """Undo ``instrument`` (tests that traced leave the rest of the run untraced)."""
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.urllib import URLLibInstrumentor

    for instrumentor in (DjangoInstrumentor(), CeleryInstrumentor(), PsycopgInstrumentor(), URLLibInstrumentor()):
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()
