"""Commands of the first hour (issue 29): ``tenant_bootstrap`` for a viewer works without ``--scopes`` (the scopes
default by the member's role), and ``seed_demo --workload-root`` makes the demo projects' workload directories
(``make run``: the docs' example ``/srv/gpubroker/acme/vision`` runs as written)."""

from io import StringIO

from django.core.management import call_command

from tenants.demo import DEMO
from tenants.models import ApiToken
from tests.factories import api_client


def bootstrap(*args: str) -> str:
    out = StringIO()
    call_command("tenant_bootstrap", *args, stdout=out, stderr=StringIO())
    return out.getvalue().strip()


def test_tenant_bootstrap_for_a_viewer_gives_a_read_token_without_scopes(db):
    token = bootstrap("--tenant", "initech", "--user", "milton", "--role", "viewer")
    assert ApiToken.objects.get(user__username="milton").scopes == ["read"]
    client = api_client(token)
    assert client.get("/api/v1/tenant").json()["role"] == "viewer"
    refused = client.post("/api/v1/leases", {"project": "x", "gpu": {"kind": "whole"}}, format="json")
    assert refused.status_code == 403
    # an existing viewer membership decides, whatever --role says now; an owner gets read and write
    bootstrap("--tenant", "initech", "--user", "milton")
    assert sorted(ApiToken.objects.filter(user__username="milton").values_list("scopes", flat=True)) == [
        ["read"], ["read"]]
    bootstrap("--tenant", "initech", "--user", "bill", "--role", "owner")
    assert ApiToken.objects.get(user__username="bill").scopes == ["read", "write"]


def test_seed_demo_makes_the_demo_projects_workload_directories(db, settings, tmp_path):
    settings.VAR_DIR = tmp_path / "var"
    root = tmp_path / "srv"
    call_command("seed_demo", "--workload-root", str(root), stdout=StringIO())
    made = sorted(str(p.relative_to(root)) for p in root.glob("*/*") if p.is_dir())
    assert made == sorted(f"{tenant}/{project}" for tenant, spec in DEMO.items() for project in spec["projects"])
    assert "acme/vision" in made
