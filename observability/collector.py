"""Gauges that are states of the database, read from PostgreSQL when ``/metrics`` is scraped.

One aggregate query per family; every family is always emitted (with zeros for the known states), so an
alert or a dashboard never sees a metric vanish because nothing is in that state. Each web process reports
the same values; alerts and dashboards aggregate with ``max`` over instances.
"""

from __future__ import annotations

import logging
import time

from django.db import connection
from prometheus_client.core import GaugeMetricFamily

from broker.choices import NodeStatus

logger = logging.getLogger(__name__)

LIVE_STATES = ("requested", "queued", "provisioning", "active", "preempted", "releasing")


def _tables() -> dict[str, str]:
    """``{broker_lease}`` in the queries below → the model's quoted table (app labels may differ from packages)."""
    from billing.models import Invoice, MeterWindow
    from broker.models import Allocation, Gpu, Lease, Node
    from capacity.models import Adjustment
    from notifications.models import Delivery
    from tenants.models import SloContract, Tenant

    quote = connection.ops.quote_name
    return {name: quote(model._meta.db_table) for name, model in (
        ("broker_lease", Lease), ("broker_node", Node), ("broker_gpu", Gpu), ("broker_allocation", Allocation),
        ("tenants_tenant", Tenant), ("tenants_slocontract", SloContract),
        ("billing_meterwindow", MeterWindow), ("billing_invoice", Invoice),
        ("notifications_delivery", Delivery), ("capacity_adjustment", Adjustment))}


def _rows(sql: str, params: list | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql.format(**_tables()), params or [])
        return cursor.fetchall()


class DatabaseCollector:
    """A prometheus_client custom collector (``collect()`` yields metric families)."""

    def collect(self):
        started = time.perf_counter()
        try:
            yield from self._collect(time.time())
            ok = 1
        except Exception:
            logger.exception("metrics: reading the database failed")
            ok = 0
        up = GaugeMetricFamily("gpubroker_database_collector_up", "1 when the scrape read the database state.")
        up.add_metric([], ok)
        yield up
        seconds = GaugeMetricFamily("gpubroker_database_collector_duration_seconds",
                                    "Time the scrape spent reading the database state.")
        seconds.add_metric([], time.perf_counter() - started)
        yield seconds

    def _collect(self, now: float):
        # -- leases by state and tier (live states only: finished leases grow without bound) --------------
        leases = GaugeMetricFamily("gpubroker_leases", "Leases in each live state, by tier (the GPU model they "
                                   "run on; 'auto' or the models allowed while not placed).", labels=["state", "tier"])
        seen = set()
        for state, tier, count in _rows(
                "SELECT state, COALESCE(NULLIF(tier, ''), NULLIF(array_to_string(models_allowed, '|'), ''), 'auto'), "
                "count(*) FROM {broker_lease} WHERE state = ANY(%s) GROUP BY 1, 2", [list(LIVE_STATES)]):
            leases.add_metric([state, tier], count)
            seen.add(state)
        for state in LIVE_STATES:
            if state not in seen:
                leases.add_metric([state, ""], 0)
        yield leases

        # -- the queue: queued leases of active tenants (what the scheduler reads), per tier asked ---------
        length = GaugeMetricFamily("gpubroker_queue_length", "Leases waiting in the queue (active tenants), by the "
                                   "tier asked for.", labels=["tier"])
        oldest = GaugeMetricFamily("gpubroker_queue_oldest_wait_seconds", "How long the oldest lease in the queue "
                                   "has waited, by the tier asked for.", labels=["tier"])
        held = GaugeMetricFamily("gpubroker_queue_held", "Queued leases held because their tenant is suspended.")
        total_length = 0
        for tier, count, first in _rows(
                "SELECT COALESCE(NULLIF(array_to_string(l.models_allowed, '|'), ''), 'auto'), count(*), "
                "min(COALESCE(l.queued_at, l.requested_at)) FROM {broker_lease} l JOIN {tenants_tenant} t "
                "ON t.id = l.tenant_id WHERE l.state = 'queued' AND t.status = 'active' GROUP BY 1"):
            length.add_metric([tier], count)
            oldest.add_metric([tier], max(0.0, now - first.timestamp()))
            total_length += count
        if not total_length:
            length.add_metric(["all"], 0)
            oldest.add_metric(["all"], 0)
        [(held_count,)] = _rows(
            "SELECT count(*) FROM {broker_lease} l JOIN {tenants_tenant} t ON t.id = l.tenant_id "
            "WHERE l.state = 'queued' AND t.status <> 'active'")
        held.add_metric([], held_count)
        yield from (length, oldest, held)

        # -- per tenant: the oldest wait against the time-to-GPU target of its SLO contract in force --------
        tenant_wait = GaugeMetricFamily("gpubroker_queue_oldest_wait_by_tenant_seconds", "How long the oldest "
                                        "queued lease of each tenant (with one queued) has waited.",
                                        labels=["tenant"])
        for tenant, first in _rows(
                "SELECT t.slug, min(COALESCE(l.queued_at, l.requested_at)) FROM {broker_lease} l JOIN "
                "{tenants_tenant} t ON t.id = l.tenant_id WHERE l.state = 'queued' AND t.status = 'active' "
                "GROUP BY 1"):
            tenant_wait.add_metric([tenant], max(0.0, now - first.timestamp()))
        target = GaugeMetricFamily("gpubroker_slo_time_to_gpu_seconds", "The p95 time-to-GPU target (request → "
                                   "active, in quota) of each tenant's SLO contract in force.", labels=["tenant"])
        for tenant, seconds in _rows(
                "SELECT DISTINCT ON (t.id) t.slug, c.time_to_gpu_p95_seconds FROM {tenants_slocontract} c "
                "JOIN {tenants_tenant} t ON t.id = c.tenant_id WHERE c.effective_from <= now() AND "
                "(c.effective_to IS NULL OR c.effective_to > now()) ORDER BY t.id, c.effective_from DESC"):
            target.add_metric([tenant], seconds)
        yield from (tenant_wait, target)

        # -- nodes and GPUs -------------------------------------------------------------------------------
        nodes = GaugeMetricFamily("gpubroker_nodes", "Enrolled nodes by status and whether cordoned.",
                                  labels=["status", "cordoned"])
        heartbeat = GaugeMetricFamily("gpubroker_node_last_heartbeat_timestamp_seconds",
                                      "Unix time of each node's last heartbeat.", labels=["node", "status"])
        counts: dict[tuple[str, str], int] = {(s, c): 0 for s in NodeStatus.values for c in ("false", "true")}
        for node_id, status, cordoned, last in _rows(
                "SELECT node_id, status, cordoned, COALESCE(last_heartbeat_at, enrolled_at) FROM {broker_node}"):
            key = (status, "true" if cordoned else "false")
            counts[key] = counts.get(key, 0) + 1
            heartbeat.add_metric([node_id, status], last.timestamp())
        for (status, cordoned), count in sorted(counts.items()):
            nodes.add_metric([status, cordoned], count)
        yield from (nodes, heartbeat)

        gpus = GaugeMetricFamily("gpubroker_gpus", "GPUs in service (not lost or released), by model and mode.",
                                 labels=["model", "mode"])
        for model, mode, count in _rows("SELECT model, mode, count(*) FROM {broker_gpu} WHERE lost_at IS NULL "
                                        "AND released_at IS NULL GROUP BY 1, 2"):
            gpus.add_metric([model, mode], count)
        yield gpus

        allocated = GaugeMetricFamily("gpubroker_allocated_gpu_milli", "Capacity held by live allocations in "
                                      "milli-GPU, by tier, tenant and whether over quota ('' tenant: warm pool).",
                                      labels=["tier", "tenant", "over_quota"])
        for tier, tenant, over_quota, milli in _rows(
                "SELECT a.tier, COALESCE(t.slug, ''), COALESCE(a.preemptible, false), sum(a.milli) "
                "FROM {broker_allocation} a LEFT JOIN {broker_lease} l ON l.id = a.lease_id "
                "LEFT JOIN {tenants_tenant} t ON t.id = l.tenant_id WHERE a.freed_at IS NULL GROUP BY 1, 2, 3"):
            allocated.add_metric([tier, tenant, "true" if over_quota else "false"], int(milli))
        yield allocated

        tenants = GaugeMetricFamily("gpubroker_tenant_leases", "Live leases per tenant and state.",
                                    labels=["tenant", "state"])
        for tenant, state, count in _rows(
                "SELECT t.slug, l.state, count(*) FROM {broker_lease} l JOIN {tenants_tenant} t ON t.id = l.tenant_id "
                "WHERE l.state = ANY(%s) GROUP BY 1, 2", [list(LIVE_STATES)]):
            tenants.add_metric([tenant, state], count)
        yield tenants

        # -- metering: how far behind is the oldest hour not metered yet -----------------------------------
        lag = GaugeMetricFamily("gpubroker_metering_lag_seconds", "Age of the end of the oldest complete hour not "
                                "metered yet, per source (0: up to date).", labels=["source"])
        open_windows = GaugeMetricFamily("gpubroker_metering_open_windows", "Metering windows still open "
                                         "(a source did not answer for them yet).", labels=["source"])
        by_source = {row[0]: row[1:] for row in _rows(
            "SELECT source, min(hour_start) FILTER (WHERE closed_at IS NULL), "
            "max(hour_start) FILTER (WHERE closed_at IS NOT NULL), count(*) FILTER (WHERE closed_at IS NULL) "
            "FROM {billing_meterwindow} GROUP BY source")}
        for source in ("allocation", "utilisation"):
            first_open, last_closed, open_count = by_source.get(source, (None, None, 0))
            if first_open is not None:
                behind_since = first_open.timestamp() + 3600
            elif last_closed is not None:
                behind_since = last_closed.timestamp() + 7200  # the end of the hour after the last one metered
            else:
                behind_since = now
            lag.add_metric([source], max(0.0, now - behind_since))
            open_windows.add_metric([source], open_count)
        yield from (lag, open_windows)

        # -- money -----------------------------------------------------------------------------------------
        invoices = GaugeMetricFamily("gpubroker_invoices", "Invoices by status and Stripe state "
                                     "('' = not sent).", labels=["status", "stripe_state"])
        amounts = GaugeMetricFamily("gpubroker_invoice_total_minor", "Sum of invoice totals in minor units, by "
                                    "status and currency.", labels=["status", "currency"])
        seen_status = set()
        for status, stripe_state, currency, count, total in _rows(
                "SELECT status, stripe_state, currency, count(*), sum(total_minor) FROM {billing_invoice} "
                "GROUP BY 1, 2, 3"):
            invoices.add_metric([status, stripe_state], count)
            amounts.add_metric([status, currency], int(total or 0))
            seen_status.add(status)
        for status in ("draft", "finalized", "paid", "void"):
            if status not in seen_status:
                invoices.add_metric([status, ""], 0)
                amounts.add_metric([status, ""], 0)
        failing = GaugeMetricFamily("gpubroker_stripe_push_failing_invoices", "Finalized invoices whose last "
                                    "Stripe push failed (retried by the periodic push).")
        [(failing_count,)] = _rows("SELECT count(*) FROM {billing_invoice} WHERE status = 'finalized' "
                                   "AND stripe_state = 'failed'")
        failing.add_metric([], failing_count)
        yield from (invoices, amounts, failing)

        deliveries = GaugeMetricFamily("gpubroker_deliveries", "Notification deliveries by channel and status.",
                                       labels=["channel", "status"])
        seen_delivery = set()
        for channel, status, count in _rows("SELECT channel, status, count(*) FROM {notifications_delivery} "
                                            "GROUP BY 1, 2"):
            deliveries.add_metric([channel, status], count)
            seen_delivery.add((channel, status))
        for status in ("pending", "succeeded", "failed"):
            if ("webhook", status) not in seen_delivery:
                deliveries.add_metric(["webhook", status], 0)
        yield deliveries

        adjustments = GaugeMetricFamily("gpubroker_adjustments", "Capacity adjustments by kind and state.",
                                        labels=["kind", "state"])
        seen_adjustment = set()
        for kind, state, count in _rows("SELECT kind, state, count(*) FROM {capacity_adjustment} GROUP BY 1, 2"):
            adjustments.add_metric([kind, state], count)
            seen_adjustment.add(state)
        for state in ("proposed", "applied", "failed"):
            if state not in seen_adjustment:
                adjustments.add_metric(["", state], 0)
        yield adjustments
