"""The broker's own metrics: counters and histograms of events, written by whichever process sees the event.

Multi-process safe: with ``PROMETHEUS_MULTIPROC_DIR`` set (before ``prometheus_client`` is imported; ``make
run``, the Dockerfile and the manifests set it), every gunicorn worker and Celery pool process writes its
values to files in that folder and ``/metrics`` (``observability.views``) adds them up. Without it (a single
process, the test client) they live in this process's default registry.

States of the database (leases by state, the queue, nodes, metering lag, invoices, deliveries, adjustments)
are not kept here: ``observability.collector`` reads them from PostgreSQL at scrape time, so every web
process reports the same truth and nothing drifts. Names and labels: docs/operations.md, "Metrics".
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

disable_created_metrics()  # the _created series say nothing an operator needs (and multi-process mode has none)

# Requests: per route (the URL pattern, never the raw path: bounded cardinality), method and status
HTTP_REQUESTS = Counter("gpubroker_http_requests", "HTTP requests answered, by route pattern, method and status.",
                        ["route", "method", "status"])
HTTP_DURATION = Histogram("gpubroker_http_request_duration_seconds", "Time to answer an HTTP request, by route.",
                          ["route", "method"],
                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))

# Celery tasks, every one
TASKS = Counter("gpubroker_celery_tasks", "Celery tasks finished, by task name and outcome.", ["task", "outcome"])
TASK_DURATION = Histogram("gpubroker_celery_task_duration_seconds", "Run time of Celery tasks.", ["task"],
                          buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0))

# The schedule cycle (broker.schedule_cycle)
CYCLES = Counter("gpubroker_schedule_cycles", "Schedule cycles: ran (read a non-empty queue), idle (empty queue), "
                 "skipped (another cycle held the lock), failed.", ["outcome"])
CYCLE_DURATION = Histogram("gpubroker_schedule_cycle_duration_seconds", "Duration of schedule cycles that ran.",
                           buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))
CYCLE_DECISIONS = Counter("gpubroker_schedule_decisions", "Decisions of schedule cycles: placed, preempt "
                          "(a reclaim started), waiting.", ["decision"])
CYCLE_LAST = Gauge("gpubroker_schedule_cycle_last_timestamp_seconds",
                   "Unix time the last schedule cycle finished (ran or idle).", multiprocess_mode="max")

# Agent calls (agent.protocol.AgentClient) and provisioning
AGENT_REQUESTS = Counter("gpubroker_agent_requests", "Calls to node agents, by node, operation and outcome "
                         "(ok, refused: 4xx, unreachable: no answer or 5xx after retries).",
                         ["node", "operation", "outcome"])
AGENT_DURATION = Histogram("gpubroker_agent_request_duration_seconds", "Time of calls to node agents (retries "
                           "included).", ["node", "operation"],
                           buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0))
PROVISIONING = Histogram("gpubroker_provisioning_duration_seconds", "From placement (allocation written) to "
                         "the instance ready on the node, per node.", ["node"],
                         buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0))
PROVISIONING_FAILURES = Counter("gpubroker_provisioning_failures", "Provisioning calls that failed, per node: "
                                "refused (the agent said no; the lease is requeued) or unreachable (retried).",
                                ["node", "reason"])

# Reconcile (broker.reconcile)
RECONCILE_RUNS = Counter("gpubroker_reconcile_runs", "Reconcile runs finished.")
RECONCILE_FOUND = Counter("gpubroker_reconcile_findings", "What reconcile runs found: orphans (instances "
                          "destroyed), vanished (leases lost), silent (nodes taken out), resumed (stuck leases), "
                          "unreachable (nodes that did not answer).", ["kind"])

# Billing
METERING_WINDOWS = Counter("gpubroker_metering_windows", "Metering windows handled by runs, by source and outcome "
                           "(closed, failed).", ["source", "outcome"])
INVOICE_RUNS = Counter("gpubroker_invoice_runs", "Invoice runs (billing.invoice_run_due), by outcome.", ["outcome"])
STRIPE_PUSHES = Counter("gpubroker_stripe_pushes", "Pushes of invoices to Stripe, by outcome (sent, failed, "
                        "disabled).", ["outcome"])

# Notifications and the capacity loop
WEBHOOK_DELIVERIES = Counter("gpubroker_notification_deliveries", "Delivery attempts of notifications, by channel "
                             "(webhook, email) and outcome (succeeded, retry, failed).", ["channel", "outcome"])
ADJUSTMENTS = Counter("gpubroker_adjustments_applied", "Capacity adjustments applied by the loop's runs, by outcome "
                      "(applied, failed).", ["outcome"])


def _initialise() -> None:
    """Known label values start at zero, so a rate over them exists before the first event."""
    for outcome in ("ran", "idle", "skipped", "failed"):
        CYCLES.labels(outcome)
    for decision in ("placed", "preempt", "waiting"):
        CYCLE_DECISIONS.labels(decision)
    for kind in ("orphans", "vanished", "silent", "resumed", "unreachable"):
        RECONCILE_FOUND.labels(kind)
    for source in ("allocation", "utilisation"):
        for outcome in ("closed", "failed"):
            METERING_WINDOWS.labels(source, outcome)
    for outcome in ("success", "failure"):
        INVOICE_RUNS.labels(outcome)
    for outcome in ("sent", "failed", "disabled"):
        STRIPE_PUSHES.labels(outcome)
    for channel in ("webhook", "email"):
        for outcome in ("succeeded", "retry", "failed"):
            WEBHOOK_DELIVERIES.labels(channel, outcome)
    for outcome in ("applied", "failed"):
        ADJUSTMENTS.labels(outcome)


_initialise()
