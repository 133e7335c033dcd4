"""One lease request is one trace: the HTTP call (Django), the schedule cycle it asks for (published and run
through Celery, its context carried in the message), the provisioning task the cycle enqueues, and the agent
client's PUT to the node agent (urllib, traceparent sent), with psycopg's queries inside. Read from an
in-memory exporter: the API call (Django's test client), a real Celery worker on the test broker (in this
process, so its spans land in the same exporter) and real simulated agents over HTTP."""

from __future__ import annotations

import os
import time

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from broker.models import Lease
from broker.services.triggers import cycle_flag_clear
from observability import tracing
from tests.support.processes import start_fleet, wait_until


@pytest.fixture
def exporter():
    memory = InMemorySpanExporter()
    assert tracing.configure(exporter=memory)
    yield memory
    tracing.uninstrument()
    memory.clear()


@pytest.fixture
def in_process_worker(transactional_db, settings):
    from celery.contrib.testing.worker import start_worker

    from config.celery import app

    settings.LEASE_MIN_DURATION_SECONDS = 1
    queue = f"trace-test-{os.getpid()}-{time.monotonic_ns()}"
    previous = app.conf.task_default_queue
    app.conf.task_default_queue = queue
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, queues=[queue], loglevel="WARNING"):
            yield
    finally:
        app.conf.task_default_queue = previous


def test_one_lease_request_is_one_trace_from_http_to_the_agent(exporter, in_process_worker, live_server, world,
                                                                tmp_path):
    from django.test import Client

    fleet = start_fleet(live_server.url, tmp_path / "fleet", 1, "h100-80gb:2:mig")
    try:
        time.sleep(1)  # cycles the enrollment asked for have run
        cycle_flag_clear()  # so this request sends its own cycle (not coalesced into an earlier one)
        exporter.clear()
        response = Client().post("/api/v1/leases", {"project": "vision", "gpu": {"kind": "mig", "profile": "1g.10gb"},
                                                    "duration_seconds": 600}, content_type="application/json",
                                 HTTP_AUTHORIZATION=f"Bearer {world.tokens['member']}")
        assert response.status_code == 201, response.content
        lease_id = response.json()["id"]
        wait_until(lambda: Lease.objects.get(pk=lease_id).state == "active", 60)
    finally:
        fleet.terminate()
        fleet.wait(30)

    spans = exporter.get_finished_spans()
    [request] = [s for s in spans if s.kind == SpanKind.SERVER and s.attributes.get("http.route") == "api/v1/leases"
                 and (s.attributes.get("http.request.method") or s.attributes.get("http.method")) == "POST"]
    trace = [s for s in spans if s.context.trace_id == request.context.trace_id]
    by_id = {s.context.span_id: s for s in trace}

    def named(prefix: str, task: str):
        return [s for s in trace if s.name == f"{prefix}/{task}"]

    [cycle_sent] = named("apply_async", "broker.schedule_cycle")
    cycle_runs = named("run", "broker.schedule_cycle")
    [provision_sent] = named("apply_async", "broker.leases_provision_run")
    [provision_run] = named("run", "broker.leases_provision_run")
    agent_puts = [s for s in trace if s.kind == SpanKind.CLIENT
                  and (s.attributes.get("http.request.method") or s.attributes.get("http.method")) == "PUT"]
    assert agent_puts, [s.name for s in trace]
    # the chain, parent by parent: HTTP → publish → cycle → publish → provisioning → the agent's PUT
    assert cycle_sent.parent.span_id == request.context.span_id or _ancestor(cycle_sent, request, by_id)
    cycle = next(run for run in cycle_runs if run.parent.span_id == cycle_sent.context.span_id)
    assert _ancestor(provision_sent, cycle, by_id)
    assert provision_run.parent.span_id == provision_sent.context.span_id
    [put] = [s for s in agent_puts if _ancestor(s, provision_run, by_id)]
    url = put.attributes.get("url.full") or put.attributes.get("http.url")
    assert "/v1/instances" in url
    # the queries of the request and of the cycle are in the trace too (psycopg)
    queries = [s for s in trace if s.attributes.get("db.system") == "postgresql"
               or s.attributes.get("db.system.name") == "postgresql"]
    assert any(_ancestor(q, request, by_id) for q in queries)
    assert any(_ancestor(q, cycle, by_id) for q in queries)


def _ancestor(span, ancestor, by_id) -> bool:
    while span.parent is not None:
        if span.parent.span_id == ancestor.context.span_id:
            return True
        span = by_id.get(span.parent.span_id)
        if span is None:
            return False
    return False


def test_tracing_is_off_unless_the_standard_variables_ask(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    assert not tracing.enabled_by_env()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert not tracing.enabled_by_env()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp,console")
    assert tracing.enabled_by_env()
    assert [type(e).__name__ for e in tracing._exporters_from_env()] == ["OTLPSpanExporter", "ConsoleSpanExporter"]
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not tracing.enabled_by_env()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "jaeger")
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    with pytest.raises(ImproperlyConfigured, match="OTEL_TRACES_EXPORTER"):
        tracing.enabled_by_env()
