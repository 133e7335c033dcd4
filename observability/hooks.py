"""Where events become metrics without the services knowing: Celery's task signals (every task's outcome and
duration; the schedule cycle's, the reconcile's, metering's, invoicing's, Stripe's, deliveries' and the
capacity loop's results read from what their task returned) and the agent client's observer (each call to a
node agent). Connected once per process by ``ObservabilityConfig.ready``. A hook never fails a task: an
error here is logged and the task's result stands."""

from __future__ import annotations

import logging
import re
import time
from datetime import UTC, datetime

from observability import metrics

logger = logging.getLogger(__name__)

_started: dict[str, tuple[float, datetime]] = {}


# -- agent calls ------------------------------------------------------------------------------------------
_OPERATIONS = (
    ("PUT", re.compile(r"^/v1/instances$"), "create_many"),
    ("PUT", re.compile(r"^/v1/instances/[^/]+$"), "create"),
    ("DELETE", re.compile(r"^/v1/instances/[^/]+$"), "destroy"),
    ("GET", re.compile(r"^/v1/instances/[^/]+$"), "instance"),
    ("POST", re.compile(r"^/v1/instances/[^/]+/notice$"), "notice"),
    ("GET", re.compile(r"^/v1/inventory$"), "inventory"),
    ("PUT", re.compile(r"^/v1/gpus/[^/]+/mode$"), "set_mode"),
)


def agent_operation(method: str, path: str) -> str:
    for verb, pattern, name in _OPERATIONS:
        if method == verb and pattern.match(path):
            return name
    return "other"


def agent_call_observed(node_id: str, method: str, path: str, outcome: str, seconds: float) -> None:
    try:
        operation = agent_operation(method, path)
        metrics.AGENT_REQUESTS.labels(node_id, operation, outcome).inc()
        metrics.AGENT_DURATION.labels(node_id, operation).observe(seconds)
    except Exception:
        logger.exception("metrics: agent call not recorded")


# -- Celery tasks -----------------------------------------------------------------------------------------
def task_started(task_id=None, task=None, **_):
    _started[task_id] = (time.perf_counter(), datetime.now(UTC))


def task_finished(task_id=None, task=None, args=None, retval=None, state=None, **_):
    began = _started.pop(task_id, None)
    name = getattr(task, "name", "unknown")
    try:
        outcome = {"SUCCESS": "success", "RETRY": "retry"}.get(state or "", "failure")
        seconds = time.perf_counter() - began[0] if began else 0.0
        metrics.TASKS.labels(name, outcome).inc()
        metrics.TASK_DURATION.labels(name).observe(seconds)
        handler = _RESULTS.get(name)
        if handler is not None:
            handler(outcome=outcome, retval=retval, args=args or (), seconds=seconds,
                    began_at=began[1] if began else None)
    except Exception:
        logger.exception("metrics: task %s not recorded", name)


def _cycle(*, outcome, retval, seconds, **_):
    if outcome != "success" or not isinstance(retval, dict):
        metrics.CYCLES.labels("failed").inc()
        return
    if retval.get("skipped"):
        metrics.CYCLES.labels("skipped").inc()
        return
    metrics.CYCLES.labels("ran" if retval.get("seen") else "idle").inc()
    metrics.CYCLE_DURATION.observe(seconds)
    metrics.CYCLE_LAST.set(time.time())
    for decision in ("placed", "preempt", "waiting"):
        if retval.get(decision):
            metrics.CYCLE_DECISIONS.labels(decision).inc(retval[decision])


def _provisioned(*, outcome, args, retval, began_at, **_):
    """Per node (read back from the database): placement → ready for the allocations this run made ready;
    failures: leases the agent refused (requeued) and, when the run failed or will be retried, the nodes
    whose instances are still pending (no answer, or 5xx)."""
    if not args or began_at is None:
        return
    lease_ids = args[0] if isinstance(args[0], list) else [args[0]]
    from broker.choices import AllocationState
    from broker.models import Allocation

    if outcome != "success":
        for node_id in set(Allocation.objects.filter(lease_id__in=lease_ids, state=AllocationState.PENDING,
                                                     freed_at__isnull=True)
                           .values_list("gpu__node__node_id", flat=True)):
            metrics.PROVISIONING_FAILURES.labels(node_id, "unreachable").inc()
        return

    for node_id, created_at, ready_at in (Allocation.objects.filter(lease_id__in=lease_ids, ready_at__gte=began_at)
                                          .values_list("gpu__node__node_id", "created_at", "ready_at")):
        metrics.PROVISIONING.labels(node_id).observe(max(0.0, (ready_at - created_at).total_seconds()))
    if isinstance(retval, dict) and retval.get("requeued"):
        refused = (Allocation.objects.filter(lease_id__in=lease_ids, freed_at__gte=began_at, ready_at__isnull=True)
                   .values_list("lease_id", "gpu__node__node_id").distinct())
        for node_id in {node_id: None for _, node_id in refused}:
            metrics.PROVISIONING_FAILURES.labels(node_id, "refused").inc(
                sum(1 for _, each in refused if each == node_id))


def _reconciled(*, outcome, retval, **_):
    if outcome != "success" or not isinstance(retval, dict):
        return
    metrics.RECONCILE_RUNS.inc()
    for kind in ("orphans", "vanished", "silent", "resumed", "unreachable"):
        if retval.get(kind):
            metrics.RECONCILE_FOUND.labels(kind).inc(retval[kind])


def _metered(*, outcome, retval, **_):
    if outcome != "success" or not isinstance(retval, dict):
        return
    for key, label in (("closed", "closed"), ("failed", "failed")):
        for source, count in (retval.get(key) or {}).items():
            if count:
                metrics.METERING_WINDOWS.labels(source, label).inc(count)


def _invoiced(*, outcome, **_):
    metrics.INVOICE_RUNS.labels("success" if outcome == "success" else "failure").inc()


def _pushed(*, outcome, retval, **_):
    if outcome == "success":
        metrics.STRIPE_PUSHES.labels("sent" if retval else "disabled").inc()
    else:
        metrics.STRIPE_PUSHES.labels("failed").inc()


def _delivered(*, args, **_):
    from notifications.models import Delivery

    row = Delivery.objects.filter(pk=args[0]).values_list("channel", "status").first() if args else None
    if row is None:
        return
    channel, status = row
    outcome = {"succeeded": "succeeded", "failed": "failed"}.get(status, "retry")  # pending again: a retry
    metrics.WEBHOOK_DELIVERIES.labels(channel, outcome).inc()


def _planned(*, outcome, retval, **_):
    if outcome != "success" or not isinstance(retval, dict):
        return
    for key in ("applied", "failed"):
        if retval.get(key):
            metrics.ADJUSTMENTS.labels(key).inc(retval[key])


_RESULTS = {
    "broker.schedule_cycle": _cycle,
    "broker.leases_provision_run": _provisioned,
    "broker.lease_provision_run": _provisioned,
    "broker.reconcile": _reconciled,
    "billing.meter_pending": _metered,
    "billing.invoice_run_due": _invoiced,
    "billing.services.stripe_sync.invoice_push_task": _pushed,
    "notifications.delivery_send": _delivered,
    "capacity.plan_run": _planned,
}


def worker_ready(**_):
    """A Celery worker in its own pod (no web process beside it) serves its metrics on ``METRICS_PORT``."""
    import os

    port = os.environ.get("METRICS_PORT")
    if not port:
        return
    from prometheus_client import start_http_server

    from observability.views import event_registry

    start_http_server(int(port), registry=event_registry())
    logger.info("worker metrics on :%s/metrics", port)


def connect() -> None:
    from celery.signals import task_postrun, task_prerun
    from celery.signals import worker_ready as worker_ready_signal

    from agent import protocol

    task_prerun.connect(task_started, weak=False, dispatch_uid="observability.task_started")
    task_postrun.connect(task_finished, weak=False, dispatch_uid="observability.task_finished")
    worker_ready_signal.connect(worker_ready, weak=False, dispatch_uid="observability.worker_ready")
    if agent_call_observed not in protocol.OBSERVERS:
        protocol.OBSERVERS.append(agent_call_observed)
