"""Issue 27, item 4: a workload's paths are scoped to its tenant and project. Under each root of
``WORKLOAD_ALLOWED_ROOTS`` a workload names paths in ``<root>/<tenant>/<project>/`` only: never another
tenant's or project's directory, never a root or the tenant's own directory, never through ``..``. The same
request is refused the same way by ``POST /api/v1/leases`` and by the quote; the outsider (globex) gets the
same rules for its own directory. The node checks the same scope with symbolic links resolved
(tests/agent/test_workloads.py)."""

from __future__ import annotations

import json

import pytest

from broker.models import Workload
from tests.factories import make_project, make_quota, make_world

pytestmark = pytest.mark.django_db
ROOT = "/srv/gpubroker"


@pytest.fixture
def world(settings):
    settings.WORKLOAD_ALLOWED_ROOTS = [ROOT]
    world = make_world()
    make_quota(world.project, tier="A100-80GB")
    make_quota(make_project(world.acme, "nlp"), tier="A100-80GB")
    make_quota(world.other_project, tier="A100-80GB")
    return world


def _request(world, who: str, project: str, **paths) -> tuple[int, dict]:
    answer = world.client(who).post("/api/v1/leases", {
        "project": project, "gpu": {"kind": "whole", "model": "A100-80GB"},
        "workload": {"command": ["python", "train.py"], **paths}}, format="json")
    return answer.status_code, answer.json()


@pytest.mark.parametrize("path", [
    f"{ROOT}/globex/secret",             # another tenant's project
    f"{ROOT}/globex/secret/run-1",
    f"{ROOT}/globex",                    # another tenant
    ROOT,                                # the root itself
    f"{ROOT}/acme",                      # the tenant's own directory, not a project's
    f"{ROOT}/acme/nlp/run-1",            # another project of the same tenant
    f"{ROOT}/acme/vision/../../globex/secret",
    f"{ROOT}/acme/vision-2",             # a sibling whose name starts like the project's
    "/etc",
])
@pytest.mark.parametrize("field", ["workdir", "checkpoint_dir"])
def test_workload_paths_of_acme_cannot_leave_its_projects_directory(world, path, field):
    status, problem = _request(world, "member", "vision", **{field: path})
    assert status == 400 and problem["field"] == f"workload.{field}", problem
    assert f"{ROOT}/acme/vision" in problem["detail"] or "normalised" in problem["detail"], problem
    assert not Workload.objects.exists()
    quote = world.client("member").post("/api/v1/quotes", {
        "project": "vision", "gpu": {"kind": "whole", "model": "A100-80GB"},
        "workload": {"command": ["python"], field: path}}, format="json")
    assert quote.status_code == 400 and quote.json()["field"] == f"workload.{field}"


def test_a_workload_names_paths_in_its_projects_directory_and_the_broker_sends_its_scope(world):
    status, lease = _request(world, "member", "vision", workdir=f"{ROOT}/acme/vision",
                             checkpoint_dir=f"{ROOT}/acme/vision/run-1")
    assert status == 201, lease
    spec = Workload.objects.get(lease_id=lease["id"]).spec
    assert spec["scope"] == "acme/vision" and spec["checkpoint_dir"] == f"{ROOT}/acme/vision/run-1"
    # globex names its own directory; acme's is as closed to it as globex's is to acme
    assert _request(world, "outsider", "secret", workdir=f"{ROOT}/globex/secret/x")[0] == 201
    status, problem = _request(world, "outsider", "secret", workdir=f"{ROOT}/acme/vision")
    assert status == 400 and problem["field"] == "workload.workdir"


def test_the_scope_is_the_brokers_a_tenant_cannot_set_it(world):
    status, problem = _request(world, "member", "vision", scope="globex/secret", workdir=f"{ROOT}/globex/secret")
    assert status == 400 and problem["field"] == "workload.scope"


def test_the_documented_workload_request_is_accepted_as_written(world):
    """docs/leasing.md "Workloads": the request in its JSON block, sent as written (tenant acme, project vision),
    is a lease with its workload, and the answer names the secret without its value."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "leasing.md").read_text()
    block = text.split("```json\nPOST /api/v1/leases\n", 1)[1].split("```", 1)[0]
    body = json.loads(block)
    answer = world.client("member").post("/api/v1/leases", body, format="json")
    assert answer.status_code == 201, answer.json()
    secret = body["workload"]["secret_env"]["HF_TOKEN"]
    detail = world.client("member").get(f"/api/v1/leases/{answer.json()['id']}")
    assert secret not in answer.content.decode() + detail.content.decode()
    assert detail.json()["workload"]["spec"]["secret_env"] == ["HF_TOKEN"]  # its name, never its value
    spec = Workload.objects.get(lease_id=answer.json()["id"]).spec
    assert spec["scope"] == "acme/vision" and spec["workdir"] == body["workload"]["workdir"]
