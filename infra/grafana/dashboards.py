"""The Grafana dashboards under infra/grafana/dashboards/, written from this one description so that they stay
alike (datasource variable, units, layout). ``python -m infra.grafana.dashboards`` rewrites the JSON files; a
test checks that the files are what this writes, and that every metric they query is in a real scrape.

Database states are reported by every web process alike: panels take ``max`` over instances before summing."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"


def _panel(title, exprs, *, kind="timeseries", unit="short", legend="", w=12, h=8, description=""):
    targets = [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": fmt, "datasource": DS}
               for i, (expr, fmt) in enumerate(exprs if isinstance(exprs, list) else [(exprs, legend)])]
    panel = {"type": kind, "title": title, "datasource": DS, "targets": targets,
             "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}, "options": {},
             "gridPos": {"w": w, "h": h}}
    if description:
        panel["description"] = description
    return panel


def _row(title):
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "gridPos": {"w": 24, "h": 1}}


def _layout(panels):
    x = y = row_h = 0
    for panel_id, panel in enumerate(panels, start=1):
        w, h = panel["gridPos"]["w"], panel["gridPos"]["h"]
        if x + w > 24 or panel["type"] == "row":
            x, y = 0, y + row_h
            row_h = 0
        panel["gridPos"].update(x=x, y=y)
        panel["id"] = panel_id
        x += w
        row_h = max(row_h, h)
        if panel["type"] == "row":
            x, y, row_h = 0, y + h, 0
    return panels


def _dashboard(uid, title, description, panels, variables=()):
    datasource = {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus",
                  "current": {}, "hide": 0}
    templating = [datasource]
    for name, query in variables:
        templating.append({"name": name, "type": "query", "datasource": DS, "query": query, "refresh": 2,
                           "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "hide": 0})
    return {"uid": uid, "title": title, "description": description, "tags": ["gpubroker"], "timezone": "utc",
            "schemaVersion": 39, "version": 1, "editable": True, "refresh": "30s",
            "time": {"from": "now-6h", "to": "now"}, "templating": {"list": templating},
            "annotations": {"list": []}, "panels": _layout(panels)}


def fleet():
    return _dashboard("gpubroker-fleet", "GPU broker: fleet", "Nodes, heartbeats, GPUs, allocation, utilisation "
                      "from the agents (DCGM names), provisioning and reconcile.", [
        _panel("Nodes by status", "max by (status) (gpubroker_nodes)", kind="stat", legend="{{status}}", w=6),
        _panel("Heartbeat age per node", "time() - max by (node) (gpubroker_node_last_heartbeat_timestamp_seconds)",
               unit="s", legend="{{node}}", w=18),
        _panel("GPUs in service by model and mode", "max by (model, mode) (gpubroker_gpus)", kind="bargauge",
               legend="{{model}} {{mode}}", w=8),
        _panel("Allocated GPUs by tier", "sum by (tier) (max without (instance, pod) (gpubroker_allocated_gpu_milli))"
               " / 1000", legend="{{tier}}", w=8),
        _panel("Live leases by state", "sum by (state) (max without (instance, pod) (gpubroker_leases))",
               legend="{{state}}", w=8),
        _panel("GPU engine activity by host (agents)", "avg by (Hostname) (DCGM_FI_PROF_GR_ENGINE_ACTIVE)",
               unit="percentunit", legend="{{Hostname}}"),
        _panel("GPU utilisation by host (agents)", "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", unit="percent",
               legend="{{Hostname}}"),
        _panel("Provisioning p95 (placement → ready) per node", "histogram_quantile(0.95, sum by (node, le) "
               f"(rate(gpubroker_provisioning_duration_seconds_bucket[{RATE}])))", unit="s", legend="{{node}}"),
        _panel("Agent calls failing per node", f"sum by (node, operation, outcome) (rate(gpubroker_agent_requests_total"
               f"{{outcome!=\"ok\"}}[{RATE}]))", unit="reqps", legend="{{node}} {{operation}} {{outcome}}"),
        _panel("Agent call p95 per operation", "histogram_quantile(0.95, sum by (operation, le) "
               f"(rate(gpubroker_agent_request_duration_seconds_bucket[{RATE}])))", unit="s", legend="{{operation}}"),
        _panel("Reconcile findings (per hour)", "sum by (kind) (increase(gpubroker_reconcile_findings_total[1h]))",
               legend="{{kind}}"),
    ])


def tenants():
    return _dashboard("gpubroker-tenants", "GPU broker: tenants", "What each tenant holds and waits for, against its "
                      "SLO's time-to-GPU target.", [
        _panel("Live leases by tenant and state", 'max by (tenant, state) (gpubroker_tenant_leases{tenant=~"$tenant"})',
               legend="{{tenant}} {{state}}"),
        _panel("Allocated GPUs by tenant", 'sum by (tenant) (max without (instance, pod) '
               '(gpubroker_allocated_gpu_milli{tenant=~"$tenant"})) / 1000', legend="{{tenant}}"),
        _panel("Over-quota GPUs by tenant", 'sum by (tenant) (max without (instance, pod) '
               '(gpubroker_allocated_gpu_milli{tenant=~"$tenant",over_quota="true"})) / 1000', legend="{{tenant}}"),
        _panel("Oldest wait vs. SLO time-to-GPU", [
            ('max by (tenant) (gpubroker_queue_oldest_wait_by_tenant_seconds{tenant=~"$tenant"})', "{{tenant}} wait"),
            ('max by (tenant) (gpubroker_slo_time_to_gpu_seconds{tenant=~"$tenant"})', "{{tenant}} target")],
            unit="s"),
        _panel("Queue length by tier asked", "max by (tier) (gpubroker_queue_length)", legend="{{tier}}"),
        _panel("Oldest wait by tier asked", "max by (tier) (gpubroker_queue_oldest_wait_seconds)", unit="s",
               legend="{{tier}}"),
        _panel("Held (suspended tenants)", "max(gpubroker_queue_held)", kind="stat", w=6),
    ], variables=[("tenant", "label_values(gpubroker_tenant_leases, tenant)")])


def health():
    return _dashboard("gpubroker-health", "GPU broker: health", "Requests, the schedule cycle, Celery tasks, the "
                      "scrape itself.", [
        _panel("Web processes up", 'sum(up{job="gpubroker"})', kind="stat", w=6),
        _panel("Seconds since the last schedule cycle", "time() - max(gpubroker_schedule_cycle_last_timestamp_seconds)",
               kind="stat", unit="s", w=6),
        _panel("Database state read (1 = ok)", "min(gpubroker_database_collector_up)", kind="stat", w=6),
        _panel("Scrape time reading the database", "max(gpubroker_database_collector_duration_seconds)", kind="stat",
               unit="s", w=6),
        _panel("Requests by route", f"sum by (route) (rate(gpubroker_http_requests_total[{RATE}]))", unit="reqps",
               legend="{{route}}"),
        _panel("Errors (5xx) ratio", f'sum(rate(gpubroker_http_requests_total{{status=~"5.."}}[{RATE}])) / '
               f"sum(rate(gpubroker_http_requests_total[{RATE}]))", unit="percentunit", legend="5xx"),
        _panel("p95 latency by route", "histogram_quantile(0.95, sum by (route, le) "
               f"(rate(gpubroker_http_request_duration_seconds_bucket[{RATE}])))", unit="s", legend="{{route}}"),
        _panel("4xx by route", f'sum by (route, status) (rate(gpubroker_http_requests_total{{status=~"4.."}}[{RATE}]))',
               unit="reqps", legend="{{route}} {{status}}"),
        _panel("Schedule cycles by outcome", f"sum by (outcome) (rate(gpubroker_schedule_cycles_total[{RATE}]))",
               unit="ops", legend="{{outcome}}"),
        _panel("Schedule cycle duration p50 / p95", [
            (f"histogram_quantile(0.5, sum by (le) (rate(gpubroker_schedule_cycle_duration_seconds_bucket[{RATE}])))",
             "p50"),
            (f"histogram_quantile(0.95, sum by (le) (rate(gpubroker_schedule_cycle_duration_seconds_bucket[{RATE}])))",
             "p95")], unit="s"),
        _panel("Scheduling decisions", f"sum by (decision) (rate(gpubroker_schedule_decisions_total[{RATE}]))",
               unit="ops", legend="{{decision}}"),
        _panel("Celery tasks by outcome", f"sum by (task, outcome) (rate(gpubroker_celery_tasks_total[{RATE}]))",
               unit="ops", legend="{{task}} {{outcome}}"),
        _panel("Celery task p95 by task", "histogram_quantile(0.95, sum by (task, le) "
               f"(rate(gpubroker_celery_task_duration_seconds_bucket[{RATE}])))", unit="s", legend="{{task}}"),
        _panel("Reconcile runs (per hour)", "sum(increase(gpubroker_reconcile_runs_total[1h]))", legend="runs"),
    ])


def money():
    return _dashboard("gpubroker-money", "GPU broker: money", "Metering, invoices, Stripe, notifications and the "
                      "capacity loop's adjustments.", [
        _panel("Metering lag by source", "max by (source) (gpubroker_metering_lag_seconds)", unit="s",
               legend="{{source}}"),
        _panel("Open metering windows", "max by (source) (gpubroker_metering_open_windows)", legend="{{source}}"),
        _panel("Metering windows handled (per hour)", "sum by (source, outcome) "
               "(increase(gpubroker_metering_windows_total[1h]))", legend="{{source}} {{outcome}}"),
        _panel("Invoices by status", "max by (status) (gpubroker_invoices)", kind="bargauge", legend="{{status}}"),
        _panel("Invoice totals by status (major units)", "max by (status, currency) (gpubroker_invoice_total_minor) "
               "/ 100", legend="{{status}} {{currency}}"),
        _panel("Invoice runs (per day)", "sum by (outcome) (increase(gpubroker_invoice_runs_total[1d]))",
               legend="{{outcome}}"),
        _panel("Stripe pushes (per hour)", "sum by (outcome) (increase(gpubroker_stripe_pushes_total[1h]))",
               legend="{{outcome}}"),
        _panel("Invoices failing to reach Stripe", "max(gpubroker_stripe_push_failing_invoices)", kind="stat", w=6),
        _panel("Notification deliveries (per hour)", "sum by (channel, outcome) "
               "(increase(gpubroker_notification_deliveries_total[1h]))", legend="{{channel}} {{outcome}}", w=18),
        _panel("Deliveries by status", "max by (channel, status) (gpubroker_deliveries)",
               legend="{{channel}} {{status}}"),
        _panel("Capacity adjustments by kind and state", "max by (kind, state) (gpubroker_adjustments)",
               legend="{{kind}} {{state}}"),
        _panel("Adjustments applied by the loop (per day)", "sum by (outcome) "
               "(increase(gpubroker_adjustments_applied_total[1d]))", legend="{{outcome}}"),
    ])


DASHBOARDS = {"fleet.json": fleet, "tenants.json": tenants, "health.json": health, "money.json": money}


def render(build) -> str:
    return json.dumps(build(), indent=2) + "\n"


def main() -> None:
    HERE.mkdir(parents=True, exist_ok=True)
    for name, build in DASHBOARDS.items():
        (HERE / name).write_text(render(build))
        print(f"wrote {HERE / name}")


if __name__ == "__main__":
    main()
