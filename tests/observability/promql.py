"""Metric names used by the alert rules (infra/alerts/*.rules.yml) and the Grafana dashboards
(infra/grafana/dashboards/*.json), for the test that finds each of them in a real scrape."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
RULES = sorted((ROOT / "infra" / "alerts").glob("*.rules.yml"))
DASHBOARDS = sorted((ROOT / "infra" / "grafana" / "dashboards").glob("*.json"))

# series Prometheus makes itself (never in a target's /metrics)
SYNTHETIC = {"up", "ALERTS", "ALERTS_FOR_STATE", "scrape_duration_seconds", "scrape_samples_scraped"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or", "unless",
            "inf", "nan", "atan2"}


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (functions, keywords, labels, durations left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', "", expr)  # strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers (and Grafana's ${var})
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges, subqueries, [$__rate_interval]
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\w+", " ", text)  # Grafana variables
    names = set()
    for match in re.finditer(r"(?<![\w.:$])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name in KEYWORDS:
            continue
        names.add(name)
    return names


def rule_expressions() -> list[tuple[str, str]]:
    found = []
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                found.append((f"{path.name}:{rule.get('alert') or rule.get('record')}", rule["expr"]))
    return found


def dashboard_expressions() -> list[tuple[str, str]]:
    found = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        panels = list(dashboard.get("panels", []))
        while panels:
            panel = panels.pop()
            panels.extend(panel.get("panels", []))
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((f"{path.name}:{panel.get('title')}", target["expr"]))
        for variable in dashboard.get("templating", {}).get("list", []):
            query = variable.get("query")
            if isinstance(query, dict):
                query = query.get("query")
            if variable.get("type") == "query" and query:
                inner = re.match(r"label_values\((.*),\s*\w+\)$", query)
                found.append((f"{path.name}:${variable['name']}", inner.group(1) if inner else query))
    return found


def names_used() -> set[str]:
    used = set()
    for _, expr in rule_expressions() + dashboard_expressions():
        used |= metric_names(expr)
    return used - SYNTHETIC


def names_in_scrape(found: dict) -> set[str]:
    return set(found)
