"""The Prometheus configuration ``make run`` writes: infra/prometheus.yml (the agents' DCGM-style metrics,
their targets from the fleet's file) plus the broker's own ``/metrics`` (bearer token from a file) and the
alerting rules under infra/alerts/. The Kubernetes equivalent is infra/k8s/base/prometheus-config.yaml."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "infra" / "alerts"


def render(*, targets_file: Path, broker: str | None = None, token_file: Path | None = None,
           scrape_interval: str | None = None) -> str:
    """``broker``: ``host:port`` of the web process; ``token_file``: a file holding METRICS_TOKEN."""
    config = yaml.safe_load((ROOT / "infra" / "prometheus.yml").read_text().replace("__TARGETS__",
                                                                                   str(targets_file)))
    if scrape_interval:
        config["global"]["scrape_interval"] = scrape_interval
        config["global"]["evaluation_interval"] = scrape_interval
        config["global"]["scrape_timeout"] = scrape_interval
    config["rule_files"] = [str(RULES / "*.rules.yml")]
    if broker:
        job = {"job_name": "gpubroker", "metrics_path": "/metrics", "static_configs": [{"targets": [broker]}]}
        if token_file:
            job["authorization"] = {"type": "Bearer", "credentials_file": str(token_file)}
        config["scrape_configs"].append(job)
    return yaml.safe_dump(config, sort_keys=False)
