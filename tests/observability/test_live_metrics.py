"""/metrics of a live server after real lease traffic: gunicorn with 2 workers and a Celery worker process
share PROMETHEUS_MULTIPROC_DIR; simulated agents enroll and heartbeat over HTTP; leases are requested,
provisioned on the agents, released; a reconcile runs. The web server's one scrape shows the events of
every process (requests per route, cycles, agent calls, provisioning per node, tasks) and the database's
states (leases by state and tier, queue, nodes, heartbeats), and every metric an alert rule or a dashboard
uses (tests/observability/promql.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from tests.api.server import api_server
from tests.api.server import test_database_url as database_url
from tests.observability import live, promql
from tests.support.api import Api
from tests.support.processes import start_fleet, start_workers, stop_workers, wait_until


@pytest.fixture
def broker(transactional_db, tmp_path, monkeypatch, settings, world):
    """(base URL, API client of the member) of a live broker; everything stopped afterwards."""
    from datetime import timedelta
    from decimal import Decimal

    from django.utils import timezone

    from tenants import services as tenant_services
    from tests.factories import make_quota

    settings.LEASE_MIN_DURATION_SECONDS = 1
    make_quota(world.project, tier="A100-80GB")
    tenant_services.slo_contract_create(
        tenant=world.acme, name="gold", effective_from=timezone.now() - timedelta(days=1), effective_to=None,
        time_to_gpu_p95_seconds=600, availability_target_pct=Decimal("99.5"), preemption_notice_seconds=30,
        credit_steps=[])
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    # the worker processes inherit it (this process's prometheus_client was imported without it)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
    monkeypatch.setenv("METRICS_TOKEN", live.TOKEN)
    workers = start_workers(1)
    try:
        with api_server(database_url(), PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
                        METRICS_TOKEN=live.TOKEN, CELERY_TASK_DEFAULT_QUEUE=_queue()) as url:
            fleet = start_fleet(url, tmp_path / "fleet", 2, "h100-80gb:2:mig", "a100-80gb:2:whole")
            try:
                yield url, Api(url, world.tokens["member"]), metrics_dir
            finally:
                fleet.terminate()
                fleet.wait(30)
    finally:
        stop_workers(workers)


def _queue() -> str:
    from config.celery import app

    return app.conf.task_default_queue


def test_live_metrics_after_lease_traffic(broker):
    from broker.models import Node
    from broker.services import agent_client
    from broker.tasks import reconcile

    url, api, metrics_dir = broker
    a100 = Node.objects.get(gpus__model="A100-80GB", gpus__index=0)
    agent_client(a100).faults(fail_next_create="metrics test")  # its first create fails (5xx): retried
    leases = []
    for gpu in ({"kind": "mig", "profile": "1g.10gb"}, {"kind": "mig", "profile": "3g.40gb"},
                {"kind": "whole", "model": "A100-80GB"}):
        status, lease = api.call("POST", "/leases", {"project": "vision", "gpu": gpu, "duration_seconds": 600})
        assert status == 201, lease
        leases.append(lease["id"])
    for lease_id in leases:
        wait_until(lambda lease_id=lease_id: api.call("GET", f"/leases/{lease_id}")[1]["state"] == "active", 60)
    status, _ = api.call("DELETE", f"/leases/{leases[0]}")
    assert status == 202
    wait_until(lambda: api.call("GET", f"/leases/{leases[0]}")[1]["state"] == "released", 60)
    assert api.call("GET", "/leases/999999")[0] == 404
    # the fleet's H100s are in MIG mode: a whole H100 waits in the queue
    status, waiting = api.call("POST", "/leases", {"project": "vision", "gpu": {"kind": "whole", "model": "H100-80GB"},
                                                   "duration_seconds": 600})
    assert status == 201
    wait_until(lambda: api.call("GET", f"/leases/{waiting['id']}")[1]["reason"].startswith("waiting:"), 60)
    reconcile.delay()
    time.sleep(0.5)

    def scraped_after_reconcile():
        found = live.samples(live.scrape(url))
        return found if live.value(found, "gpubroker_reconcile_runs_total") >= 1 else None

    found = wait_until(scraped_after_reconcile, 60, 0.5)

    # requests per route pattern, method and status, from both gunicorn workers' files
    assert live.value(found, "gpubroker_http_requests_total", route="/api/v1/leases", method="POST",
                      status="201") == 4
    assert live.value(found, "gpubroker_http_requests_total", route="/api/v1/leases/<int:pk>", method="GET",
                      status="404") == 1
    assert live.value(found, "gpubroker_http_requests_total",
                      route="/api/v1/agents/<str:node_id>/heartbeat", method="POST", status="200") >= 2
    assert live.value(found, "gpubroker_http_request_duration_seconds_count", route="/api/v1/leases",
                      method="POST") == 4
    # events of the Celery worker's processes, read through the web server
    assert live.value(found, "gpubroker_schedule_cycles_total", outcome="ran") >= 1
    assert live.value(found, "gpubroker_schedule_decisions_total", decision="placed") == 3
    assert live.value(found, "gpubroker_schedule_decisions_total", decision="waiting") >= 1
    assert live.value(found, "gpubroker_schedule_cycle_duration_seconds_count") >= 1
    assert live.value(found, "gpubroker_schedule_cycle_last_timestamp_seconds") > time.time() - 120
    nodes = {s.labels["node"] for s in found["gpubroker_node_last_heartbeat_timestamp_seconds"]}
    assert len(nodes) == 2
    for node in nodes:
        assert live.value(found, "gpubroker_agent_requests_total", node=node, outcome="ok") >= 1
    assert sum(live.value(found, "gpubroker_provisioning_duration_seconds_count", node=n) for n in nodes) == 3
    assert live.value(found, "gpubroker_agent_requests_total", operation="destroy", outcome="ok") >= 1
    assert live.value(found, "gpubroker_celery_tasks_total", task="broker.leases_provision_run",
                      outcome="success") >= 1
    # states of the database at scrape time
    assert live.value(found, "gpubroker_leases", state="active", tier="H100-80GB") == 1
    assert live.value(found, "gpubroker_leases", state="active", tier="A100-80GB") == 1
    assert live.value(found, "gpubroker_nodes", status="ready") == 2
    assert live.value(found, "gpubroker_queue_length", tier="H100-80GB") == 1
    assert live.value(found, "gpubroker_queue_oldest_wait_seconds", tier="H100-80GB") > 0
    assert live.value(found, "gpubroker_queue_oldest_wait_by_tenant_seconds", tenant="acme") > 0
    assert live.value(found, "gpubroker_slo_time_to_gpu_seconds", tenant="acme") == 600
    assert live.value(found, "gpubroker_provisioning_failures_total", node=a100.node_id, reason="unreachable") >= 1
    assert live.value(found, "gpubroker_celery_tasks_total", task="broker.leases_provision_run", outcome="retry") >= 1
    assert live.value(found, "gpubroker_database_collector_up") == 1
    for sample in found["gpubroker_node_last_heartbeat_timestamp_seconds"]:
        assert sample.value > time.time() - 60
    # more than one process wrote metrics (gunicorn's 2 workers, the worker's pool)
    pids = {path.name.rsplit("_", 1)[-1] for path in metrics_dir.glob("*.db")}
    assert len(pids) >= 3, sorted(path.name for path in metrics_dir.iterdir())

    # every metric named by an alert rule or a dashboard panel is in this scrape
    # (the fleet dashboard's GPU panels read the agents' DCGM series, scraped from the agents themselves)
    agent_found = live.samples(agent_client(a100).metrics())
    missing = promql.names_used() - promql.names_in_scrape(found) - promql.names_in_scrape(agent_found)
    assert not missing, f"used by alerts or dashboards but not in /metrics: {sorted(missing)}"

    # make run's Prometheus configuration: the broker scraped with its token, the agents, the alert rules loaded
    if shutil.which("prometheus"):
        _prometheus_scrapes_the_broker(url, metrics_dir.parent)


def _prometheus_scrapes_the_broker(url: str, tmp_path) -> None:
    from infra.prometheus_config import render
    from tests.support.processes import free_port, wait_http

    token_file = tmp_path / "metrics-token"
    token_file.write_text(live.TOKEN)
    (tmp_path / "prometheus.yml").write_text(render(
        targets_file=tmp_path / "fleet" / "prometheus-targets.json", broker=url.removeprefix("http://"),
        token_file=token_file, scrape_interval="1s"))
    port = free_port()
    prometheus = subprocess.Popen(
        [shutil.which("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", prometheus, timeout=30)

        def api(path: str, **query) -> dict:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(query)}",
                                        timeout=5) as response:
                return json.loads(response.read())["data"]

        result = wait_until(lambda: api("query", query='max(gpubroker_nodes{status="ready"})')["result"], 30, 0.5)
        assert result[0]["value"][1] == "2"
        [target] = [t for t in api("targets")["activeTargets"] if t["labels"]["job"] == "gpubroker"]
        assert target["health"] == "up", target
        rules = {rule["name"] for group in api("rules")["groups"] for rule in group["rules"]}
        assert {"GpubrokerScheduleCycleStalled", "GpubrokerNodeSilent", "GpubrokerStripeFailing"} <= rules
        assert wait_until(lambda: api("query", query="count(DCGM_FI_DEV_GPU_UTIL)")["result"], 30, 0.5)
    finally:
        prometheus.terminate()
        prometheus.wait(20)
