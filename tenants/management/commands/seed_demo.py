"""Seed a demo: two tenants with projects, quotas, SLO contracts, members and a platform admin.

Idempotent: a second run changes nothing and prints the same credentials. Passwords are generated on
the first run and kept in ``var/demo-credentials.json`` (mode 0600) so later runs can print them.
"""

import json
import secrets
from datetime import UTC, datetime
from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from tenants import services
from tenants.demo import DEMO
from tenants.models import Membership, Project, Quota, SloContract, Tenant, TenantQuota

# The docs' workload example (docs/leasing.md: ``python train.py --epochs 3`` in /srv/gpubroker/acme/vision) runs
# this in each demo project's directory: epochs of a pretend training that resume from CHECKPOINT_DIR.
DEMO_TRAIN = """\
import argparse, json, os, time

parser = argparse.ArgumentParser(description="the demo's training script (manage.py seed_demo --workload-root)")
parser.add_argument("--epochs", type=int, default=3)
epochs = parser.parse_args().epochs
checkpoint = os.path.join(os.environ.get("CHECKPOINT_DIR") or ".", "checkpoint.json")
os.makedirs(os.path.dirname(checkpoint), exist_ok=True)
done = json.load(open(checkpoint))["epoch"] if os.path.exists(checkpoint) else 0
print(f"devices {os.environ.get('CUDA_VISIBLE_DEVICES', '-')}; restart {os.environ.get('RESTART_COUNT', '0')}; "
      f"resuming after epoch {done} of {epochs}", flush=True)
for epoch in range(done + 1, epochs + 1):
    time.sleep(1)
    with open(checkpoint + ".tmp", "w") as handle:
        json.dump({"epoch": epoch}, handle)
    os.replace(checkpoint + ".tmp", checkpoint)
    print(f"epoch {epoch}/{epochs} done", flush=True)
print("training finished", flush=True)
"""


class Command(BaseCommand):
    help = "Create the demo tenants, projects, quotas, SLO contracts and users (idempotent)."

    def add_arguments(self, parser):
        parser.add_argument("--workload-root", default="",
                            help="also create each demo project's workload directory, <root>/<tenant>/<project> "
                                 "(make run: the simulated nodes' root, so the docs' workload examples run)")
        parser.add_argument("--sso-issuer", default="",
                            help="make globex sign in through this OpenID provider (make run: its local one, "
                                 "infra/oidc_provider; the client secret is kept in var/demo-credentials.json)")

    def handle(self, *args, **opts):
        credentials = self._credentials()
        User = get_user_model()
        admin = User.objects.filter(username="admin").first()
        if admin is None:
            admin = User.objects.create_superuser("admin", "admin@gpubroker.example", credentials["admin"])
        for slug, spec in DEMO.items():
            tenant = Tenant.objects.filter(slug=slug).first() or services.tenant_create(
                name=spec["name"], slug=slug, billing_email=f"billing@{slug}.example", currency=spec["currency"],
                by_user=admin,
            )
            for tier, (deserved, limit) in spec["quotas"].items():
                if not TenantQuota.objects.filter(tenant=tenant, tier=tier).exists():
                    services.tenant_quota_set(tenant=tenant, tier=tier, deserved_gpu_milli=deserved,
                                              limit_gpu_milli=limit, by_user=admin)
            for project_slug, (name, quotas) in spec["projects"].items():
                project = Project.objects.filter(tenant=tenant, slug=project_slug).first()
                if project is None:
                    project = Project.objects.create(tenant=tenant, slug=project_slug, name=name)
                for tier, (deserved, limit, weight) in quotas.items():
                    if not Quota.objects.filter(project=project, tier=tier).exists():
                        services.quota_set(project=project, tier=tier, deserved_gpu_milli=deserved,
                                           limit_gpu_milli=limit, over_quota_weight=weight, by_user=admin)
            for username, role in spec["members"].items():
                user, _created = services.user_get_or_create(username=username, email=f"{username}@{slug}.example",
                                                            password=credentials["users"])
                if not Membership.objects.filter(user=user, tenant=tenant).exists():
                    services.membership_add(tenant=tenant, user=user, role=role, by_user=admin)
            if not SloContract.objects.filter(tenant=tenant).exists():
                services.slo_contract_create(
                    tenant=tenant, name="Standard", effective_from=datetime(2026, 1, 1, tzinfo=UTC),
                    effective_to=None, time_to_gpu_p95_seconds=60, availability_target_pct=Decimal("99.5"),
                    preemption_notice_seconds=120,
                    credit_steps=[
                        {"metric": "availability", "threshold": "99.5", "credit_pct": "10"},
                        {"metric": "availability", "threshold": "99.0", "credit_pct": "25"},
                        {"metric": "time_to_gpu_p95", "threshold": "60", "credit_pct": "10"},
                        {"metric": "time_to_gpu_p95", "threshold": "300", "credit_pct": "25"},
                    ],
                    by_user=admin,
                )
        if opts["workload_root"]:
            from pathlib import Path

            for slug, spec in DEMO.items():
                for project_slug in spec["projects"]:
                    directory = Path(opts["workload_root"]) / slug / project_slug
                    directory.mkdir(parents=True, exist_ok=True)
                    script = directory / "train.py"  # what the docs' workload example runs (docs/leasing.md)
                    if not script.exists():
                        script.write_text(DEMO_TRAIN)
        if opts["sso_issuer"]:
            self._sso(opts["sso_issuer"], credentials)
        self.stdout.write("Demo data ready:")
        self.stdout.write(f"  platform admin: admin / {credentials['admin']}")
        for slug, spec in DEMO.items():
            people = ", ".join(f"{u} ({r})" for u, r in spec["members"].items())
            self.stdout.write(f"  {slug}: {people}; password {credentials['users']}")

    def _sso(self, issuer: str, credentials: dict) -> None:
        from tenants.demo import SSO_DEMO
        from tenants.sealing import secret_open
        from tenants.sso import sign_in_get, sign_in_update

        tenant = Tenant.objects.get(slug=SSO_DEMO["tenant"])
        current = sign_in_get(tenant=tenant)
        wanted = {"sso_enabled": True, "provider_name": SSO_DEMO["provider_name"], "issuer": issuer,
                  "client_id": SSO_DEMO["client_id"], "allowed_email_domains": [SSO_DEMO["domain"]],
                  "group_roles": SSO_DEMO["group_roles"]}
        if all(getattr(current, k) == v for k, v in wanted.items()) and secret_open(
                current.client_secret_sealed) == credentials["sso_client_secret"]:
            return  # idempotent: no audit row for a change that changes nothing
        sign_in_update(tenant=tenant, by=None, changes={**wanted, "client_secret": credentials["sso_client_secret"]})

    def _credentials(self) -> dict:
        path = settings.VAR_DIR / "demo-credentials.json"
        if path.exists():
            data = json.loads(path.read_text())
            if "sso_client_secret" not in data:  # credentials of a demo seeded before single sign-on
                data["sso_client_secret"] = secrets.token_urlsafe(24)
                path.write_text(json.dumps(data))
            return data
        settings.VAR_DIR.mkdir(exist_ok=True)
        data = {"admin": secrets.token_urlsafe(12), "users": secrets.token_urlsafe(9),
                "sso_client_secret": secrets.token_urlsafe(24)}
        path.write_text(json.dumps(data))
        path.chmod(0o600)
        return data
