"""The OpenAPI document's groups (issue 29): every operation gets one tag, from its path, and the tags come in the
order a reader needs them: what a tenant's program does first (leases, billing, pipelines, auto-tiering, capacity
advice), the tenant's own settings, then the platform staff's routes, then the agents' ingress. The composition
root holds it because it is the one place that sees every app's routes; ``tests/api/test_openapi_tags.py`` checks
that every operation has a tag of this list."""

from __future__ import annotations

import re

# (tag, description, paths under /api/v1/ as regular expressions), in the document's order; the first match wins
GROUPS: list[tuple[str, str, tuple[str, ...]]] = [
    ("auto-tiering", "Workloads, their profiles per slice, predictions and advice; a lease's throughput samples",
     (r"workloads(/|$)", r"leases/\{[^}]+\}/samples$")),
    ("leases", "Request GPU capacity, follow it, renew it, read its workload's log and release it",
     (r"leases(/|$)",)),
    ("billing", "Quotes and offers, metered usage and its breakdowns by label or user, invoices and their FOCUS "
                "exports, credit notes, prepaid credit, monthly spend caps and spend alerts, the lease label keys",
     (r"usage$", r"usage/breakdown", r"quotes$", r"offers$", r"invoices(/|$)", r"credit-notes(/|$)", r"credits$",
      r"spend-caps(/|$)", r"spend-alert-rules(/|$)", r"spend-alerts$", r"label-keys$")),
    ("pipelines", "Inference pipelines and model splits: plan, apply (one lease group), release",
     (r"pipelines(/|$)", r"model-splits(/|$)")),
    ("capacity", "The capacity loop's advice to the tenant: accept or reject it; a project's opt-in to idle reclaim",
     (r"adjustments(/|$)", r"projects/\{[^}]+\}/idle-reclaim$")),
    ("tenancy", "The caller's tenant: projects, quotas, members and invitations, API tokens, SSH keys, SLO "
     "contracts, sign-in settings, its audit trail, exports and closure",
     (r"tenant$", r"tenant/", r"projects(/|$)", r"quotas$", r"members(/|$)", r"tokens(/|$)", r"ssh-keys(/|$)",
      r"slo-contracts$", r"audit-events$", r"invitations(/|$)")),
    ("notifications", "Signed webhooks: endpoints, secret rotation, deliveries", (r"webhooks(/|$)",)),
    ("staff: billing", "Platform staff: price books, billing terms, credit notes, voids, payments, refunds, "
                       "credit grants and taxes, every tenant's FOCUS export",
     (r"price-books(/|$)", r"tenants/\{[^}]+\}/billing-terms$", r"billing/(invoices|payments)/", r"billing/focus",
      r"tenants/\{[^}]+\}/credit-grants$", r"tenants/\{[^}]+\}/tax(/|$)")),
    ("staff: tenants", "Platform staff: create and change tenants, their status, quotas, projects, SLO contracts "
                       "and cohorts",
     (r"tenants(/|$)", r"cohorts$")),
    ("staff: capacity", "Platform staff: capacity policies, the fleet's figures and planner runs",
     (r"capacity/",)),
    ("agents", "The node agents' ingress (signed by each node, not by tenant tokens)", (r"agents/",)),
]
TAGS = [{"name": name, "description": description} for name, description, _ in GROUPS]
UNGROUPED = "other"
_PATTERNS = [(name, [re.compile(r"^/api/v1/" + pattern) for pattern in patterns]) for name, _, patterns in GROUPS]


def tag_of(path: str) -> str:
    for name, patterns in _PATTERNS:
        if any(pattern.match(path) for pattern in patterns):
            return name
    return UNGROUPED


def assign_tags(result, generator, request, public):
    """drf-spectacular post-processing hook: each operation's one tag by its path (GROUPS)."""
    for path, item in result.get("paths", {}).items():
        for operation in item.values():
            if isinstance(operation, dict) and "responses" in operation:
                operation["tags"] = [tag_of(path)]
    return result
