"""The alerting rules (infra/alerts/) pass promtool's checks and their unit tests (each alert fires when it
should, with its labels and annotations, and not before); the dashboards are valid Grafana JSON whose every
panel queries something. That each metric they use exists is checked against a real scrape in
test_live_metrics.py."""

from __future__ import annotations

import json
import subprocess

from tests.observability import promql
from tests.real_parts import PROMETHEUS_AND_PROMTOOL, promtool_binary


@PROMETHEUS_AND_PROMTOOL
def test_alert_rules_pass_promtool_check_and_unit_tests():
    promtool = promtool_binary()
    rules = [str(path) for path in promql.RULES]
    assert rules, "no rule files under infra/alerts"
    check = subprocess.run([promtool, "check", "rules", *rules], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = sorted(str(path) for path in (promql.ROOT / "infra" / "alerts").glob("*.rules.test.yml"))
    result = subprocess.run([promtool, "test", "rules", *tests], capture_output=True, text=True, timeout=120,
                            cwd=promql.ROOT / "infra" / "alerts")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_unit_test_and_a_runbook_section():
    import yaml

    alerts = {rule["alert"] for path in promql.RULES for group in yaml.safe_load(path.read_text())["groups"]
              for rule in group["rules"] if "alert" in rule}
    assert {"GpubrokerScheduleCycleStalled", "GpubrokerQueueWaitOverSlo", "GpubrokerNodeSilent",
            "GpubrokerMeteringBehind", "GpubrokerStripeFailing", "GpubrokerHighErrorRate"} <= alerts
    tested = set()
    for path in (promql.ROOT / "infra" / "alerts").glob("*.rules.test.yml"):
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                if check.get("exp_alerts"):
                    tested.add(check["alertname"])
    assert alerts - tested == set(), "alerts never seen firing in a unit test"
    operations = (promql.ROOT / "docs" / "operations.md").read_text().lower()
    for alert in alerts:
        assert f"### {alert.lower()}" in operations, f"docs/operations.md has no section for {alert}"


def test_dashboards_are_grafana_json_with_queries():
    titles = set()
    assert len(promql.DASHBOARDS) >= 4
    for path in promql.DASHBOARDS:
        dashboard = json.loads(path.read_text())
        assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
        titles.add(dashboard["title"])
        for panel in dashboard["panels"]:
            if panel["type"] == "row":
                continue
            assert panel["targets"], f"{path.name}: panel {panel['title']!r} queries nothing"
            assert panel["datasource"]["uid"] == "${datasource}"
            assert {"x", "y", "w", "h"} <= set(panel["gridPos"])
    assert {"GPU broker: fleet", "GPU broker: tenants", "GPU broker: health", "GPU broker: money"} <= titles


def test_metric_names_are_read_from_expressions():
    expr = ('sum by (tier) (rate(gpubroker_http_requests_total{status=~"5.."}[5m])) / on (tier) '
            'max(gpubroker_leases{state="active"}) offset 5m > bool 0.5 and up{job="x"} == 1e3 '
            'or histogram_quantile(0.95, sum by (le) (rate(gpubroker_x_bucket[$__rate_interval])))')
    assert promql.metric_names(expr) == {"gpubroker_http_requests_total", "gpubroker_leases", "up",
                                         "gpubroker_x_bucket"}


def test_dashboard_files_are_what_their_description_writes():
    from infra.grafana import dashboards

    for name, build in dashboards.DASHBOARDS.items():
        assert (dashboards.HERE / name).read_text() == dashboards.render(build), (
            f"{name} differs from infra/grafana/dashboards.py: run python -m infra.grafana.dashboards")
