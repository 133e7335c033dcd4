"""Every URL pattern of the project, route by route and method by method: who may do what.

``get_resolver()`` is walked for every pattern; each must be in ``ROUTES`` (with a case for every HTTP
method its view answers) or on ``ALLOWED`` (with the reason it needs none). A new route, or a new method
on a view, without its cases fails ``test_routes_every_pattern_and_method_has_cases``.

For each case, with two tenants (acme is "ours", globex the outsider's):
- anonymous: 401 problem+json on the API, a redirect to the login page on the portal;
- the outsider (globex's owner, a write token / a session) on acme's object: 404 for every method;
- a read-only token (acme's owner, ``read`` scope): reads answer, every write method 403 on the API;
  the portal does not take tokens at all (a redirect to the login page);
- a viewer: 403 on every write (API: viewers hold read-only tokens; portal: the viewer's session);
- platform pages (``staff``) and the platform API (``staff-api``): a tenant member who is not staff gets
  403 (the API: a read-only token's writes are refused for its scope, its reads for not being staff);
- agent routes: unsigned → 401 (they authenticate by the node's signature, not by tenant).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from billing.models import Invoice
from broker import services as broker
from notifications.models import WebhookEndpoint
from tenants.access import Actor
from tenants.choices import Role
from tenants.models import ApiToken, Membership, Project
from tests.factories import api_client

WRITE_METHODS = {"post", "put", "patch", "delete"}


@dataclass(frozen=True)
class Route:
    """``kind``: api (tenant REST API), portal (a tenant's pages), staff (platform pages), staff-api
    (platform REST API), agent (signed by a node). ``path`` has ``{id}`` where the object of ``obj`` goes
    (None: the route names no object). ``methods``: every method the view answers → the body sent with it.
    ``viewer``: a method a viewer may do there, with the status it gets (only where the role rules allow
    it, each with its reason). ``reads``: write verbs that write nothing (a quote posts its body), held to
    the rules of a read: a read-only token may call them."""

    kind: str
    path: str
    methods: dict[str, dict | None]
    obj: str | None = None
    viewer: dict[str, int] = field(default_factory=dict)
    reads: frozenset[str] = frozenset()


READ = {"get": None}
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOVu2HP5gqSmrbc7HaZvHvBBZFTEb02rjcHuCtDEMwo3 routes"
PIPELINE = {"project": "vision", "name": "r", "slo_ms": 200.0, "rate_rps": 5.0, "tiers": ["H100-80GB"],
            "stages": [{"name": "a", "architecture": "resnet-50"}], "edges": []}
ROUTES: dict[str, Route] = {
    # -- tenant API (tenants/api) ---------------------------------------------------------------------
    "api-tenant": Route("api", "/api/v1/tenant", {"get": None, "patch": {"name": "x"}}),
    "api-projects": Route("api", "/api/v1/projects", {"get": None, "post": {"slug": "p2", "name": "P2"}}),
    "api-project": Route("api", "/api/v1/projects/{id}", {"get": None, "patch": {"name": "x"}, "delete": None},
                         obj="project"),
    "api-project-idle-reclaim": Route("api", "/api/v1/projects/{id}/idle-reclaim",
                                      {"get": None, "put": {"opt_in": True}}, obj="project"),
    "api-quotas": Route("api", "/api/v1/quotas?project={id}", READ, obj="project"),
    "api-members": Route("api", "/api/v1/members", READ),
    "api-member": Route("api", "/api/v1/members/{id}", {"get": None, "patch": {"role": "viewer"}, "delete": None},
                        obj="member"),
    # invitations: the tenant's admins invite and revoke; the named user alone accepts or declines (its own, any
    # tenant's: another user's invitation is not found, whatever their role)
    "api-tenant-invitations": Route("api", "/api/v1/tenant/invitations",
                                    {"get": None, "post": {"username": "zoe", "role": "viewer"}}),
    "api-tenant-invitation": Route("api", "/api/v1/tenant/invitations/{id}", {"delete": None}, obj="invitation"),
    "api-invitations": Route("api", "/api/v1/invitations", READ),
    "api-invitation-accept": Route("api", "/api/v1/invitations/{id}/accept", {"post": None}, obj="invitation"),
    "api-invitation-decline": Route("api", "/api/v1/invitations/{id}/decline", {"post": None}, obj="invitation"),
    "api-tokens": Route("api", "/api/v1/tokens", {"get": None, "post": {"name": "t", "scopes": ["read"]}}),
    "api-token": Route("api", "/api/v1/tokens/{id}", {"get": None, "delete": None}, obj="token"),
    "api-ssh-keys": Route("api", "/api/v1/ssh-keys", {"get": None, "post": {"name": "k", "public_key": SSH_KEY}}),
    "api-ssh-key": Route("api", "/api/v1/ssh-keys/{id}", {"get": None, "delete": None}, obj="ssh_key"),
    "api-slo-contracts": Route("api", "/api/v1/slo-contracts", READ),
    # the audit trail: admins and owners read it (a member's or viewer's read is 403: test_audit_api.py)
    "api-audit-events": Route("api", "/api/v1/audit-events", READ),
    # exports and closure: the tenant's owners (others, 403: test_offboarding.py)
    "api-tenant-exports": Route("api", "/api/v1/tenant/exports", {"get": None, "post": None}),
    "api-tenant-export": Route("api", "/api/v1/tenant/exports/{id}", READ, obj="export"),
    "api-tenant-export-archive": Route("api", "/api/v1/tenant/exports/{id}/archive", READ, obj="export"),
    "api-tenant-close": Route("api", "/api/v1/tenant/close", {"post": {"confirm": "acme"}}),
    # -- leasing API (broker/api) ---------------------------------------------------------------------
    "api-leases": Route("api", "/api/v1/leases", {
        "get": None, "post": {"project": "vision", "gpu": {"kind": "mig", "profile": "1g.10gb"}}}),
    "api-lease": Route("api", "/api/v1/leases/{id}", {"get": None, "delete": None}, obj="lease"),
    "api-lease-renew": Route("api", "/api/v1/leases/{id}/renew", {"post": {"duration_seconds": 600}}, obj="lease"),
    "api-offers": Route("api", "/api/v1/offers", READ),
    # a quote writes nothing (broker.api.permissions): a viewer and a read-only token may ask for one
    "api-quotes": Route("api", "/api/v1/quotes", {"post": {"project": "vision", "gpu": {"kind": "whole"}}},
                        viewer={"post": 200}, reads=frozenset({"post"})),
    "api-agent-enroll": Route("agent", "/api/v1/agents/enroll", {
        "post": {"node_id": "n-x", "token": "gpub-enroll-forged", "address": "http://127.0.0.1:1", "inventory": []}}),
    "api-agent-heartbeat": Route("agent", "/api/v1/agents/node-1/heartbeat", {"post": {}}),
    # -- billing API (billing/api) --------------------------------------------------------------------
    "api-usage": Route("api", "/api/v1/usage", READ),
    "api-invoices": Route("api", "/api/v1/invoices", READ),
    "api-invoice": Route("api", "/api/v1/invoices/{id}", READ, obj="invoice"),
    "api-invoice-document": Route("api", "/api/v1/invoices/{id}.csv", READ, obj="invoice"),
    # corrections and prepaid credit (billing/api/corrections.py): tenants read, platform staff write
    "api-credit-notes": Route("api", "/api/v1/credit-notes", READ),
    "api-credit-note": Route("api", "/api/v1/credit-notes/{id}", READ, obj="credit_note"),
    "api-credit-note-document": Route("api", "/api/v1/credit-notes/{id}.csv", READ, obj="credit_note"),
    "api-credits": Route("api", "/api/v1/credits", READ),
    "api-staff-invoice": Route("staff-api", "/api/v1/billing/invoices/1", READ),
    "api-staff-credit-notes": Route("staff-api", "/api/v1/billing/invoices/1/credit-notes", {
        "post": {"reason": "duplicate", "memo": "x", "amount_minor": 1}}),
    "api-staff-invoice-void": Route("staff-api", "/api/v1/billing/invoices/1/void", {"post": {"memo": "x"}}),
    "api-staff-payments": Route("staff-api", "/api/v1/billing/invoices/1/payments", {"post": {"amount_minor": 1}}),
    "api-staff-refunds": Route("staff-api", "/api/v1/billing/payments/1/refunds", {
        "post": {"amount_minor": 1, "reason": "x"}}),
    "api-staff-tax": Route("staff-api", "/api/v1/tenants/acme/tax", {
        "get": None, "put": {"tax_id": "DE1"}, "post": {"jurisdiction": "DE", "name": "VAT", "percentage": "19"}}),
    "api-staff-tax-rate": Route("staff-api", "/api/v1/tenants/acme/tax/rates/1", {"delete": None}),
    "api-credit-grants": Route("staff-api", "/api/v1/tenants/acme/credit-grants", {
        "get": None, "post": {"amount_minor": 100, "reason": "x"}}),
    # spend caps: admins write, everyone in the tenant reads; price books and terms: platform staff
    "api-spend-caps": Route("api", "/api/v1/spend-caps", {"get": None, "post": {"project": "vision",
                                                                                 "monthly_minor": 1000}}),
    "api-spend-cap": Route("api", "/api/v1/spend-caps/{id}", {"get": None, "patch": {"monthly_minor": 1},
                                                              "delete": None}, obj="spend_cap"),
    # cost allocation, spend alerts and FOCUS exports (issue 33): admins write, everyone in the tenant reads
    "api-label-keys": Route("api", "/api/v1/label-keys", {"get": None, "put": {"keys": ["team"]}}),
    "api-usage-breakdown": Route("api", "/api/v1/usage/breakdown", READ),
    "api-usage-breakdown-csv": Route("api", "/api/v1/usage/breakdown.csv", READ),
    "api-invoice-breakdown": Route("api", "/api/v1/invoices/{id}/breakdown", READ, obj="invoice"),
    "api-invoice-breakdown-csv": Route("api", "/api/v1/invoices/{id}/breakdown.csv", READ, obj="invoice"),
    "api-invoice-focus": Route("api", "/api/v1/invoices/{id}/focus.parquet", READ, obj="invoice"),
    "api-staff-focus": Route("staff-api", "/api/v1/billing/focus.csv?period=2026-01", READ),
    "api-spend-alert-rules": Route("api", "/api/v1/spend-alert-rules", {"get": None, "put": {"budget_minor": 1000}}),
    "api-spend-alert-rule": Route("api", "/api/v1/spend-alert-rules/{id}", {"get": None, "delete": None},
                                  obj="spend_alert_rule"),
    "api-spend-alerts": Route("api", "/api/v1/spend-alerts", READ),
    "api-price-books": Route("staff-api", "/api/v1/price-books", {
        "get": None, "post": {"name": "x", "currency": "USD", "effective_from": "2099-01-01T00:00:00Z",
                              "rates": [{"tier": "H100-80GB", "per_hour": "1"}]}}),
    "api-price-book": Route("staff-api", "/api/v1/price-books/1", {"get": None, "patch": {"name": "x"},
                                                                   "delete": None}),
    "api-billing-terms": Route("staff-api", "/api/v1/tenants/acme/billing-terms", {
        "get": None, "put": {"discount_pct": "50", "monthly_commit_minor": 0}}),
    # -- the staff API for tenants (tenants/api/platform.py): platform staff only, through tenants.services
    "api-staff-cohorts": Route("staff-api", "/api/v1/cohorts", {"get": None, "post": {"name": "pool-share"}}),
    "api-staff-tenants": Route("staff-api", "/api/v1/tenants", {
        "get": None, "post": {"slug": "initech", "name": "Initech", "billing_email": "ap@initech.example"}}),
    "api-staff-tenant": Route("staff-api", "/api/v1/tenants/acme", {"get": None, "patch": {"name": "x"}}),
    "api-staff-tenant-sign-in": Route("staff-api", "/api/v1/tenants/acme/sign-in",
                                      {"get": None, "patch": {"provider_name": "x"}}),
    "api-tenant-sign-in": Route("api", "/api/v1/tenant/sign-in", {"get": None, "patch": {"provider_name": "x"}}),
    "api-staff-tenant-status": Route("staff-api", "/api/v1/tenants/acme/status", {"put": {"status": "suspended"}}),
    "api-staff-quotas": Route("staff-api", "/api/v1/tenants/acme/quotas", READ),
    "api-staff-tenant-quota": Route("staff-api", "/api/v1/tenants/acme/quotas/H100-80GB", {
        "put": {"deserved_gpu_milli": 8000, "limit_gpu_milli": 16000}}),
    "api-staff-projects": Route("staff-api", "/api/v1/tenants/acme/projects", {
        "get": None, "post": {"slug": "p3", "name": "P3"}}),
    "api-staff-project": Route("staff-api", "/api/v1/tenants/acme/projects/vision", {
        "get": None, "patch": {"name": "x"}}),
    "api-staff-project-status": Route("staff-api", "/api/v1/tenants/acme/projects/vision/status", {
        "put": {"status": "suspended"}}),
    "api-staff-project-quota": Route("staff-api", "/api/v1/tenants/acme/projects/vision/quotas/H100-80GB", {
        "put": {"deserved_gpu_milli": 0, "limit_gpu_milli": 0}}),
    "api-staff-slo-contracts": Route("staff-api", "/api/v1/tenants/acme/slo-contracts", {
        "get": None, "post": {"name": "x"}}),
    "api-staff-slo-contract": Route("staff-api", "/api/v1/tenants/acme/slo-contracts/1", {
        "get": None, "put": {"name": "x"}}),
    # -- webhooks (notifications/api): admins manage, everyone in the tenant reads ------------------------
    "api-webhooks": Route("api", "/api/v1/webhooks", {
        "get": None, "post": {"url": "https://93.184.215.14/hook", "event_types": ["lease.released"]}}),
    "api-webhook": Route("api", "/api/v1/webhooks/{id}", {"get": None, "patch": {"description": "x"},
                                                          "delete": None}, obj="webhook"),
    "api-webhook-rotate": Route("api", "/api/v1/webhooks/{id}/rotate", {"post": None}, obj="webhook"),
    "api-webhook-deliveries": Route("api", "/api/v1/webhooks/{id}/deliveries", READ, obj="webhook"),
    # -- capacity loop (capacity/api): a tenant's adjustments; the platform's policies, fleet and planner run --
    "api-adjustments": Route("api", "/api/v1/adjustments", READ),
    "api-adjustment": Route("api", "/api/v1/adjustments/{id}", READ, obj="adjustment"),
    "api-adjustment-accept": Route("api", "/api/v1/adjustments/{id}/accept", {"post": None}, obj="adjustment"),
    "api-adjustment-reject": Route("api", "/api/v1/adjustments/{id}/reject", {"post": {"reason": "no"}},
                                   obj="adjustment"),
    "api-capacity-policies": Route("staff-api", "/api/v1/capacity/policies", {
        "get": None, "post": {"scope": "", "modes": {"warm_pool": "off"}}}),
    "api-capacity-policy": Route("staff-api", "/api/v1/capacity/policies/1", {
        "get": None, "patch": {"modes": {"warm_pool": "off"}}, "delete": None}),
    "api-capacity-fleet": Route("staff-api", "/api/v1/capacity/fleet", READ),
    "api-capacity-run": Route("staff-api", "/api/v1/capacity/run", {"post": None}),
    # -- workloads on leases (broker/api), pipelines and splits (pipelines/api), auto-tiering (tiering/api) --
    "api-lease-logs": Route("api", "/api/v1/leases/{id}/logs", READ, obj="workload_lease"),
    "api-agent-workloads": Route("agent", "/api/v1/agents/node-1/workloads", {"post": {}}),
    "api-pipelines": Route("api", "/api/v1/pipelines", {"get": None, "post": PIPELINE}),
    "api-pipeline": Route("api", "/api/v1/pipelines/{id}", READ, obj="pipeline"),
    "api-pipeline-plans": Route("api", "/api/v1/pipelines/{id}/plans", {"post": {}}, obj="pipeline"),
    # a plan's path names its pipeline and itself: the object is "<pipeline>/plans/<plan>"
    "api-pipeline-plan": Route("api", "/api/v1/pipelines/{id}", READ, obj="plan"),
    "api-pipeline-apply": Route("api", "/api/v1/pipelines/{id}/apply", {"post": {}}, obj="plan"),
    "api-pipeline-release": Route("api", "/api/v1/pipelines/{id}/release", {"post": None}, obj="plan"),
    "api-model-splits": Route("api", "/api/v1/model-splits", {"post": {
        "architecture": "bert-base", "gpus": [{"model": "H100-80GB", "node": "n1"}]}}),
    "api-model-split": Route("api", "/api/v1/model-splits/{id}", READ, obj="split"),
    "api-model-split-apply": Route("api", "/api/v1/model-splits/{id}/apply", {"post": {"project": "vision"}},
                                   obj="split"),
    "api-model-split-release": Route("api", "/api/v1/model-splits/{id}/release", {"post": None}, obj="split"),
    "api-workloads": Route("api", "/api/v1/workloads", {"get": None,
                                                         "post": {"name": "w2", "architecture": "bert-base",
                                                                  "target_throughput": 100.0}}),
    "api-workload": Route("api", "/api/v1/workloads/{id}", {"get": None, "patch": {"regime": "eager"}},
                          obj="workload"),
    "api-workload-profiles": Route("api", "/api/v1/workloads/{id}/profiles", READ, obj="workload"),
    # a prediction stores its figures as predicted profiles of the workload (and audits it): a write
    "api-workload-prediction": Route("api", "/api/v1/workloads/{id}/prediction", {"post": None}, obj="workload"),
    "api-workload-profiling": Route("api", "/api/v1/workloads/{id}/profiling-runs", {
        "get": None, "post": {"project": "vision", "slices": ["A100-80GB"], "window_seconds": 10}}, obj="workload"),
    "api-workload-advice": Route("api", "/api/v1/workloads/{id}/advice", READ, obj="workload"),
    "api-lease-samples": Route("api", "/api/v1/leases/{id}/samples", {"post": {"throughput": 10.0}}, obj="lease"),
    # -- tenant portal (portal/views.py, portal/billing.py) --------------------------------------------
    "portal:dashboard": Route("portal", "/", READ),
    # switching to another of one's own tenants changes the session only (a foreign slug is refused:
    # test_isolation_portal_cannot_switch_to_foreign_tenant); a viewer may, like anyone signed in
    "portal:tenant-switch": Route("portal", "/tenant/switch", {"post": {"tenant": "acme"}}, viewer={"post": 302}),
    "portal:leases": Route("portal", "/leases/", READ),
    "portal:lease-new": Route("portal", "/leases/new", {
        "get": None, "post": {"project": "vision", "gpu.kind": "mig", "gpu.profile": "1g.10gb",
                              "duration_seconds": "600"}}),
    "portal:lease-preview": Route("portal", "/leases/preview?project=vision&gpu.kind=mig&gpu.profile=1g.10gb", READ),
    "portal:lease": Route("portal", "/leases/{id}", READ, obj="lease"),
    "portal:workloads": Route("portal", "/workloads/", READ),
    "portal:workload": Route("portal", "/workloads/{id}", READ, obj="workload"),
    "portal:workload-profile": Route("portal", "/workloads/{id}/profile", {"post": {"project": "vision"}},
                                     obj="workload"),
    "portal:workload-regime": Route("portal", "/workloads/{id}/regime", {"post": {"regime": "eager"}},
                                    obj="workload"),
    # the workload log's partial: another tenant's lease is 404 before the node is asked for a byte
    "portal:lease-log": Route("portal", "/leases/{id}/log", READ, obj="workload_lease"),
    "portal:lease-release": Route("portal", "/leases/{id}/release", {"post": {}}, obj="lease"),
    "portal:lease-renew": Route("portal", "/leases/{id}/renew", {"post": {"duration_seconds": "600"}}, obj="lease"),
    "portal:usage": Route("portal", "/usage", READ),
    "portal:audit": Route("portal", "/settings/audit", READ),
    "portal:exports": Route("portal", "/settings/exports", {"get": None, "post": {}}),
    "portal:tenant-close": Route("portal", "/settings/close", {"post": {"confirm": "acme"}}),
    "portal:invoices": Route("portal", "/invoices/", READ),
    "portal:invoice": Route("portal", "/invoices/{id}", READ, obj="invoice"),
    "portal:invoice-document": Route("portal", "/invoices/{id}.csv", READ, obj="invoice"),
    # cost allocation, spend alerts and FOCUS exports (issue 33)
    "portal:usage-breakdown": Route("portal", "/usage/breakdown", {"get": None, "post": {"label_keys": "team"}}),
    "portal:invoice-focus": Route("portal", "/invoices/{id}/focus.csv", READ, obj="invoice"),
    "portal:invoice-breakdown": Route("portal", "/invoices/{id}/breakdown.csv", READ, obj="invoice"),
    "portal:spend-alerts": Route("portal", "/settings/spend-alerts", {"get": None, "post": {"budget": "10"}}),
    "portal:advice": Route("portal", "/advice", READ),
    # pipelines and model splits (portal/pipelines.py): plan, apply and release through pipelines.services
    "portal:pipelines": Route("portal", "/pipelines/", READ),
    "portal:pipeline": Route("portal", "/pipelines/{id}", READ, obj="pipeline"),
    "portal:pipeline-plan": Route("portal", "/pipelines/{id}/plan", {"post": {"method": "esg"}}, obj="pipeline"),
    "portal:pipeline-apply": Route("portal", "/pipelines/{id}/apply", {"post": {}}, obj="plan"),
    "portal:pipeline-release": Route("portal", "/pipelines/{id}/release", {"post": {}}, obj="plan"),
    "portal:model-split-new": Route("portal", "/model-splits/new", {"post": {
        "architecture": "bert-base", "source": "tier", "tier": "H100-80GB", "count": "2"}}),
    "portal:model-split": Route("portal", "/model-splits/{id}", READ, obj="split"),
    "portal:model-split-apply": Route("portal", "/model-splits/{id}/apply", {"post": {"project": "vision"}},
                                      obj="split"),
    "portal:model-split-release": Route("portal", "/model-splits/{id}/release", {"post": {}}, obj="split"),
    "portal:advice-accept": Route("portal", "/advice/{id}/accept", {"post": {}}, obj="adjustment"),
    "portal:advice-reject": Route("portal", "/advice/{id}/reject", {"post": {}}, obj="adjustment"),
    "portal:members": Route("portal", "/settings/members", READ),
    "portal-sign-in": Route("portal", "/settings/sign-in", {"get": None, "post": {"totp_required": "on"}}),
    "portal:member-invite": Route("portal", "/settings/members/invite",
                                  {"post": {"username": "bob", "role": "viewer"}}),
    "portal:member-role": Route("portal", "/settings/members/{id}/role", {"post": {"role": "viewer"}}, obj="member"),
    "portal:invitation-revoke": Route("portal", "/settings/members/invitations/{id}/revoke", {"post": {}},
                                      obj="invitation"),
    "portal:invitations": Route("portal", "/invitations", READ),
    # a user's own invitations: the viewer's session finds another user's not found (404), as everyone does
    "portal:invitation-accept": Route("portal", "/invitations/{id}/accept", {"post": {}}, obj="invitation",
                                      viewer={"post": 404}),
    "portal:invitation-decline": Route("portal", "/invitations/{id}/decline", {"post": {}}, obj="invitation",
                                       viewer={"post": 404}),
    "portal:member-projects": Route("portal", "/settings/members/{id}/projects", {"post": {"scope": "all"}},
                                    obj="member"),
    "portal:member-remove": Route("portal", "/settings/members/{id}/remove", {"post": {}}, obj="member"),
    # a user's own SSH keys: a viewer may add one (their own credential) and finds another user's key not found
    "portal:ssh-keys": Route("portal", "/settings/ssh-keys", {"get": None, "post": {"name": "k",
                                                                                  "public_key": SSH_KEY}},
                             viewer={"post": 302}),
    "portal:ssh-key-remove": Route("portal", "/settings/ssh-keys/{id}/remove", {"post": {}}, obj="ssh_key",
                                   viewer={"post": 404}),
    # a write token: viewers may create read tokens only (the read case is in test_tokens.py)
    "portal:tokens": Route("portal", "/settings/tokens", {"get": None, "post": {"name": "t", "scopes": "write"}}),
    # another member's token is not even visible to a viewer (non-admins see their own tokens only): 404
    "portal:budgets": Route("portal", "/settings/budgets", {"get": None, "post": {"project": "", "monthly": "1",
                                                                                  "action": "refuse"}}),
    "portal:budget-delete": Route("portal", "/settings/budgets/{id}/delete", {"post": {}}, obj="spend_cap"),
    "portal:idle-reclaim": Route("portal", "/settings/idle-reclaim", {"get": None, "post": {"project": "vision",
                                                                                         "opt_in": "true"}}),
    "portal:pools": Route("portal", "/settings/pools", {"get": None, "post": {"project": "vision", "pools": []}}),
    "portal:token-revoke": Route("portal", "/settings/tokens/{id}/revoke", {"post": {}}, obj="token",
                                 viewer={"post": 404}),
    "notifications:settings": Route("portal", "/settings/notifications/", {
        "get": None, "post": {"url": "https://93.184.215.14/hook", "event_types": "lease.released"}}),
    # a viewer may turn their own lease mail off (their own preference, nothing of the tenant's)
    "notifications:preference": Route("portal", "/settings/notifications/preference",
                                            {"post": {"email_lease_events": ""}}, viewer={"post": 302}),
    "notifications:webhook-rotate": Route("portal", "/settings/notifications/webhooks/{id}/rotate", {"post": {}},
                                   obj="webhook"),
    "notifications:webhook-toggle": Route("portal", "/settings/notifications/webhooks/{id}/toggle", {"post": {}},
                                   obj="webhook"),
    "notifications:webhook-delete": Route("portal", "/settings/notifications/webhooks/{id}/delete", {"post": {}},
                                   obj="webhook"),
    # -- platform staff pages (portal/ops.py, portal/billing.py): staff act across tenants by design, so
    #    there is no "other tenant" case; a tenant member who is not staff gets 403
    "portal:fleet": Route("staff", "/ops/fleet", READ),
    "portal:node-cordon": Route("staff", "/ops/nodes/node-1/cordon", {"post": {"action": "cordon"}}),
    "portal:queue": Route("staff", "/ops/queue", READ),
    "portal:ops-billing": Route("staff", "/ops/billing", READ),
    "portal:ops-invoice": Route("staff", "/ops/billing/invoices/1", {"get": None, "post": {"scope": "whole"}}),
    "portal:ops-price-books": Route("staff", "/ops/price-books", {"get": None, "post": {"name": "x"}}),
    "portal:ops-price-book": Route("staff", "/ops/price-books/1", {"get": None, "post": {"name": "x"}}),
    "portal:ops-price-book-delete": Route("staff", "/ops/price-books/1/delete", {"post": {}}),
    "portal:ops-billing-terms": Route("staff", "/ops/tenants/acme/billing-terms", {"post": {"discount_pct": "50"}}),
    "portal:ops-tenants": Route("staff", "/ops/tenants", READ),
    "portal:ops-tenant-new": Route("staff", "/ops/new-tenant", {
        "get": None, "post": {"name": "Initech", "slug": "initech", "billing_email": "ap@initech.example"}}),
    "portal:ops-tenant": Route("staff", "/ops/tenants/acme", READ),
    "portal:ops-tenant-status": Route("staff", "/ops/tenants/acme/status", {"post": {"status": "suspended"}}),
    "portal:ops-tenant-quota": Route("staff", "/ops/tenants/acme/tenant-quota", {"post": {"tier": "H100-80GB"}}),
    "portal:ops-project-status": Route("staff", "/ops/tenants/acme/projects/vision/status", {
        "post": {"status": "suspended"}}),
    "portal:ops-project-quota": Route("staff", "/ops/tenants/acme/project-quota", {"post": {"project": "vision"}}),
    "portal:ops-slo-new": Route("staff", "/ops/tenants/acme/slo-contracts", {"post": {"name": "x"}}),
    "portal:ops-slo": Route("staff", "/ops/tenants/acme/slo-contracts/1", {"post": {"name": "x"}}),
    "portal:ops-capacity": Route("staff", "/ops/capacity", READ),
    "portal:ops-adjustment-accept": Route("staff", "/ops/capacity/adjustments/1/accept", {"post": {}}),
    "portal:ops-adjustment-reject": Route("staff", "/ops/capacity/adjustments/1/reject", {"post": {}}),
    "portal:ops-policy-new": Route("staff", "/ops/capacity/policies", {"post": {"scope": ""}}),
    "portal:ops-policy": Route("staff", "/ops/capacity/policies/1", {"post": {"warm_pool": "off"}}),
    "portal:ops-policy-delete": Route("staff", "/ops/capacity/policies/1/delete", {"post": {}}),
    "portal:ops-capacity-run": Route("staff", "/ops/capacity/run", {"post": {}}),
}

# Patterns that need no tenant or permission case, each with the reason.
ALLOWED = {
    "healthz": "liveness probe: public by design, reveals nothing",
    "readyz": "readiness probe: public by design, reveals only up/down",
    "login": "the login form itself (throttled by tenants/throttling.py)",
    "logout": "ends the caller's own session",
    "login-unlock-request": "mails an account's own address an unlock link; the same answer for any username, "
                            "one mail per account a minute (tests/test_throttling.py)",
    "login-unlock": "a signed, single-use, expiring link; only lets its browser reach the password check "
                    "(tests/test_throttling.py)",
    "sso-start": "starts single sign-on at the provider of the tenant named in ?org=: public by design, writes "
                 "only the caller's own session (tests/tenants/test_sso.py)",
    "sso-callback": "the provider's answer: a state this browser's session holds, else refused; the ID token "
                    "is checked before anything is written (tests/tenants/test_sso.py)",
    "sso-logout": "ends the caller's own session",
    "2fa-verify": "the signed-in user's own second factor (login required; tests/tenants/test_second_factor.py)",
    "2fa-recovery-codes": "replaces the signed-in user's own recovery codes (a session that has passed the second "
                          "factor; tests/tenants/test_second_factor.py, tests/test_write_attacks.py)",
    "2fa-setup": "sets up the signed-in user's own authenticator (login required; "
                 "tests/tenants/test_second_factor.py)",
    "api-schema": "the OpenAPI document: public, describes routes, holds no data",
    "api-docs": "Swagger UI over the public schema",
    "api-redoc": "ReDoc over the public schema",
    "portal:ops": "a redirect to /ops/fleet for everyone; the fleet page refuses non-staff (portal:fleet's cases)",
    "metrics": "the broker's Prometheus metrics: 404 unless METRICS_TOKEN is set, then its bearer token only "
               "(tests/observability/test_metrics_endpoint.py); tenant-free by design (figures, no tenant data)",
    "billing-stripe-webhook": "Stripe's callback: authenticated by the Stripe-Signature HMAC "
                              "(tests/billing/test_stripe_sync.py refuses unsigned and forged events)",
}
ALLOWED_PREFIXES = {
    "admin/": "the Django admin: staff only, by Django's own AdminSite.has_permission",
    "static/": "static files",
}


def _patterns(patterns=None, prefix="", namespace=""):
    """(route text, name, callback) of every URL pattern of the project."""
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(pattern, URLResolver):
            inner = ":".join(n for n in (namespace, pattern.namespace or "") if n)
            yield from _patterns(pattern.url_patterns, prefix + str(pattern.pattern), inner)
        elif isinstance(pattern, URLPattern):
            name = f"{namespace}:{pattern.name}" if namespace and pattern.name else pattern.name
            yield prefix + str(pattern.pattern), name, pattern.callback


def _methods(callback) -> set[str]:
    """The HTTP methods a view answers (HEAD and OPTIONS aside: they follow GET and are never writes)."""
    view_class = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    if view_class is None:
        return {"get", "post"}  # a plain function view: whatever it accepts must be on the table or allowed
    names = getattr(callback, "view_initkwargs", {}).get("http_method_names", view_class.http_method_names)
    return {m for m in names if m not in ("head", "options") and hasattr(view_class, m)}


def test_routes_every_pattern_and_method_has_cases():
    missing, methods_wrong = [], []
    for route, name, callback in _patterns():
        if name in ALLOWED or any(route.startswith(p) for p in ALLOWED_PREFIXES):
            continue
        if name not in ROUTES:
            missing.append(f"{name or '(unnamed)'} {route}")
            continue
        declared = set(ROUTES[name].methods)
        if declared != _methods(callback):
            methods_wrong.append(f"{name}: view answers {sorted(_methods(callback))}, cases for {sorted(declared)}")
    assert not missing, f"URL patterns with no permission/isolation cases and not on ALLOWED: {missing}"
    assert not methods_wrong, methods_wrong
    stale = set(ROUTES) - {name for _, name, _ in _patterns()}
    assert not stale, f"cases for routes that no longer exist: {stale}"


# -- the world: two tenants with an object of each kind ----------------------------------------------------
@pytest.fixture
def objects(world, settings, tmp_path):
    """An object of each kind per tenant: ``own`` (acme's, not the viewer's), ``mine`` (acme's, the
    owner's own token and membership where a rule differs for one's own) and ``other`` (globex's)."""

    def lease(tenant, user, project):
        role = Membership.objects.get(tenant=tenant, user=user).role
        return broker.lease_request(actor=Actor(user=user, tenant=tenant, role=Role(role)), project=project.slug,
                                     gpu={"kind": "mig", "profile": "1g.10gb"})[0]

    def invoice(tenant):
        return Invoice.objects.create(tenant=tenant, period=date(2026, 1, 1), currency="USD",
                                      computed_at=datetime(2026, 2, 1, tzinfo=UTC))

    def webhook(tenant):
        return WebhookEndpoint.objects.create(tenant=tenant, url="https://93.184.215.14/hook",
                                              event_types=["lease.released"], secret="whsec_test").pk

    def adjustment(tenant, lease_id):
        from capacity.models import Adjustment

        return Adjustment.objects.create(kind="right_size", target=f"lease:{lease_id}", fingerprint=f"routes{lease_id}",
                                         mode="advise", reason="routes", tenant=tenant, tenant_ids=[tenant.pk]).pk

    def planned(tenant, user, project):
        """A pipeline with a plan, a model split and a registered workload of the tenant."""
        from pipelines import services as pipelines
        from tiering import services as tiering

        actor = Actor(user=user, tenant=tenant, role=Role(Membership.objects.get(tenant=tenant, user=user).role))
        pipeline = pipelines.pipeline_create(actor=actor, **{**PIPELINE, "project": project.slug})
        plan = pipelines.plan_create(actor=actor, pipeline=pipeline)
        split = pipelines.model_split_create(actor=actor, architecture_name="bert-base",
                                             gpus=[{"model": "H100-80GB", "node": "n1"}])
        workload = tiering.workload_register(actor=actor, data={
            "name": f"w-{tenant.slug}", "architecture": "bert-base", "target_throughput": 100.0})
        running = broker.lease_request(actor=actor, project=project.slug, gpu={"kind": "mig", "profile": "1g.10gb"},
                                        workload={"command": ["python", "train.py"]})[0]
        return {"pipeline": pipeline.pk, "plan": f"{pipeline.pk}/plans/{plan.pk}", "split": split.pk,
                "workload": workload.name, "workload_lease": running.pk}

    def spend_cap(tenant):
        from billing.services import spend_cap_create

        return spend_cap_create(tenant=tenant, monthly_minor=10**9, action="warn").pk

    def credit_note(tenant):
        from billing.models import InvoiceLine
        from billing.services import invoice_finalize
        from billing.services.credit_notes import credit_note_issue

        invoice = Invoice.objects.create(tenant=tenant, period=date(2025, 12, 1), currency="USD", subtotal_minor=100,
                                         total_minor=100, computed_at=datetime(2026, 1, 1, tzinfo=UTC))
        InvoiceLine.objects.create(invoice=invoice, position=1, kind="usage", description="u", unit="h", quantity=1,
                                   unit_price=1, amount_minor=100)
        invoice = invoice_finalize(invoice=invoice)
        return credit_note_issue(invoice=invoice, reason="duplicate", memo="routes", amount_minor=10).pk

    def spend_alert_rule(tenant):
        from billing.models import SpendAlertRule

        return SpendAlertRule.objects.create(tenant=tenant, budget_minor=10**6, thresholds_pct=[50],
                                             created_at=datetime(2026, 1, 1, tzinfo=UTC)).pk

    def export(tenant):  # a ready export with its zip (under this test's folder)
        from django.utils import timezone

        from tenants.models import TenantExport
        from tenants.offboarding import export_path

        settings.EXPORT_DIR = tmp_path / "exports"
        made = TenantExport.objects.create(tenant=tenant, state="ready", finished_at=timezone.now(), size_bytes=4,
                                           sha256="0" * 64)
        export_path(made).parent.mkdir(parents=True, exist_ok=True)
        export_path(made).write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip
        return made.pk

    from billing.services import price_book_create

    price_book_create(name="list", currency="USD", effective_from=datetime(2025, 1, 1, tzinfo=UTC),
                      rates=[{"tier": "H100-80GB", "per_hour": "4.00"}])  # the pipeline planner prices with it
    own = {"webhook": webhook(world.acme), "spend_cap": spend_cap(world.acme),
           "spend_alert_rule": spend_alert_rule(world.acme),
           "project": world.project.slug, "member": Membership.objects.get(user=world.member).pk,
                "token": ApiToken.objects.filter(user=world.admin).first().pk,
                "lease": lease(world.acme, world.member, world.project).pk, "invoice": invoice(world.acme).pk,
                "credit_note": credit_note(world.acme)}
    def ssh_key(user):
        import asyncssh

        from tenants.models import SshKey

        key = asyncssh.generate_private_key("ssh-ed25519")
        return SshKey.objects.create(user=user, name="laptop", public_key=key.export_public_key().decode().strip(),
                                     fingerprint=key.get_fingerprint("sha256")).pk

    def invitation(tenant, username):
        from tenants.models import Invitation

        return Invitation.objects.create(tenant=tenant, username=username, role="viewer").pk

    own["ssh_key"] = ssh_key(world.admin)
    own["invitation"] = invitation(world.acme, "zed")
    own["adjustment"] = adjustment(world.acme, own["lease"])
    own["export"] = export(world.acme)
    own.update(planned(world.acme, world.member, world.project))
    mine = {**own, "member": Membership.objects.get(user=world.owner).pk,
            "token": ApiToken.objects.filter(user=world.owner, scopes__contains=["write"]).first().pk,
            "ssh_key": ssh_key(world.owner)}
    other_lease = lease(world.globex, world.outsider, world.other_project).pk
    return {
        "own": own,
        "mine": mine,
        "other": {"project": world.other_project.slug, "member": Membership.objects.get(user=world.outsider).pk,
                  "token": ApiToken.objects.filter(user=world.outsider).first().pk,
                  "lease": other_lease, "invoice": invoice(world.globex).pk, "webhook": webhook(world.globex),
                  "adjustment": adjustment(world.globex, other_lease), "spend_cap": spend_cap(world.globex),
                  "credit_note": credit_note(world.globex),
                  "spend_alert_rule": spend_alert_rule(world.globex),
                  "export": export(world.globex), "ssh_key": ssh_key(world.outsider),
                  "invitation": invitation(world.globex, "zed"),
                  **planned(world.globex, world.outsider, world.other_project)},
    }


def _url(route: Route, objects: dict, whose: str) -> str:
    return route.path.format(id=objects[whose][route.obj]) if route.obj else route.path


def _call(client, kind: str, method: str, url: str, body):
    if kind in ("api", "agent", "staff-api"):
        return getattr(client, method)(url, body, format="json")
    return getattr(client, method)(url, body or {})


def _portal(username: str | None) -> Client:
    client = Client()
    if username:
        client.login(username=username, password=f"pw-{username}")
    return client


CASES = [(name, method) for name, route in ROUTES.items() for method in route.methods]


def _is_login_redirect(response) -> bool:
    return response.status_code == 302 and response["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize(("name", "method"), CASES)
def test_routes_anonymous_is_refused(world, objects, name, method):
    route = ROUTES[name]
    url, body = _url(route, objects, "own"), route.methods[method]
    if route.kind in ("api", "agent", "staff-api"):
        response = _call(api_client(), route.kind, method, url, body)
        # agent routes: unsigned (or, for enrollment, a forged token) is 401 like every unauthenticated call
        assert response.status_code == 401, (url, response.content)
        assert response["Content-Type"] == "application/problem+json"
    else:
        assert _is_login_redirect(_call(_portal(None), route.kind, method, url, body)), url


@pytest.mark.parametrize(("name", "method"), [c for c in CASES if ROUTES[c[0]].obj])
def test_routes_outsider_gets_404_on_other_tenants_object(world, objects, name, method):
    route = ROUTES[name]
    url, body = _url(route, objects, "own"), route.methods[method]  # acme's object, globex's caller
    client = world.client("outsider") if route.kind == "api" else _portal("bob")
    response = _call(client, route.kind, method, url, body)
    assert response.status_code == 404, (url, method, response.status_code, response.content[:300])


@pytest.mark.parametrize(("name", "method"), [c for c in CASES if ROUTES[c[0]].kind != "agent"])
def test_routes_read_only_token_cannot_write(world, objects, name, method):
    """The owner's read-only token: not even on the owner's own things (its write token, its membership)."""
    route = ROUTES[name]
    url, body = _url(route, objects, "mine"), route.methods[method]
    response = _call(world.client("owner_read"), "api", method, url, body)
    if route.kind not in ("api", "staff-api"):  # the portal takes sessions, never tokens
        assert _is_login_redirect(response), (url, response.status_code)
    elif method in WRITE_METHODS - route.reads:
        assert response.status_code == 403, (url, method, response.status_code, response.content[:300])
        assert response.json()["detail"] == "This API token has read scope only."
    elif route.kind == "staff-api":  # the owner is no platform staff
        assert response.status_code == 403, (url, response.status_code, response.content[:300])
    else:
        assert response.status_code < 400, (url, response.status_code, response.content[:300])


@pytest.mark.parametrize(("name", "method"), [c for c in CASES if c[1] in WRITE_METHODS
                                              and ROUTES[c[0]].kind != "agent"])
def test_routes_viewer_cannot_write(world, objects, name, method):
    route = ROUTES[name]
    url, body = _url(route, objects, "own"), route.methods[method]
    if route.kind in ("api", "staff-api"):
        response = _call(world.client("viewer"), "api", method, url, body)
    else:
        response = _call(_portal("vic"), route.kind, method, url, body)
    expected = route.viewer.get(method, 403)
    assert response.status_code == expected, (url, method, response.status_code, response.content[:300])


@pytest.mark.parametrize(("name", "method"), [c for c in CASES if ROUTES[c[0]].kind in ("staff", "staff-api")])
def test_routes_staff_pages_refuse_tenant_members(world, objects, name, method):
    route = ROUTES[name]
    client = world.client("owner") if route.kind == "staff-api" else _portal("alice")  # acme's owner
    response = _call(client, route.kind, method, route.path, route.methods[method])
    assert response.status_code == 403, (route.path, response.status_code)


def test_routes_nothing_changed_for_the_other_tenant(world, objects):
    """After every outsider case: globex's caller changed nothing of acme."""
    for name, method in [c for c in CASES if ROUTES[c[0]].obj and c[1] in WRITE_METHODS]:
        route = ROUTES[name]
        client = world.client("outsider") if route.kind == "api" else _portal("bob")
        _call(client, route.kind, method, _url(route, objects, "own"), route.methods[method])
    assert Membership.objects.get(user=world.member).role == Role.MEMBER
    assert ApiToken.objects.get(pk=objects["own"]["token"]).revoked_at is None
    from tenants.models import SshKey

    assert SshKey.objects.filter(pk=objects["own"]["ssh_key"]).exists()
    from tenants.models import Invitation

    assert Invitation.objects.get(pk=objects["own"]["invitation"]).state == "pending"
    from broker.models import Lease

    assert Lease.objects.get(pk=objects["own"]["lease"]).state == "queued"
    assert Project.objects.get(pk=world.project.pk).name == "Vision"
    webhook = WebhookEndpoint.objects.get(pk=objects["own"]["webhook"])
    assert (webhook.secret, webhook.is_active, webhook.deleted_at, webhook.description) == \
        ("whsec_test", True, None, "")
    from capacity.models import Adjustment

    assert Adjustment.objects.get(pk=objects["own"]["adjustment"]).state == "proposed"
    from billing.models import SpendCap

    assert SpendCap.objects.filter(pk=objects["own"]["spend_cap"], monthly_minor=10**9).exists()
    from billing.models import SpendAlertRule

    assert SpendAlertRule.objects.filter(pk=objects["own"]["spend_alert_rule"], budget_minor=10**6).exists()
