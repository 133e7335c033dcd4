"""A client generated from the OpenAPI document (openapi-python-client, at test time, from the live
server's ``/api/schema/``) drives a session against a live gunicorn and reads every answer: each body parses
into the generated model, keeps no key the document does not name, and gives back exactly what the server
sent (``to_dict()`` equals the JSON, so no field was dropped or read as ``None``). Fails, never skips, when
the generator is missing."""

from __future__ import annotations

import datetime as dt
import importlib
import importlib.util
import json
import pkgutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from agent.protocol import sign
from tests.api.scenario import INVENTORY, call, place, seed
from tests.api.server import api_server
from tests.api.server import test_database_url as database_url  # not collected as a test
from tests.factories import make_world

pytestmark = pytest.mark.slow
PACKAGE = "gpub_contract_client"


@pytest.fixture
def world(transactional_db):
    return make_world()


@pytest.fixture
def generated(tmp_path):
    """Yields a function url -> the imported client package generated from that server's document."""
    generator = Path(sys.executable).parent / "openapi-python-client"
    assert generator.exists(), "openapi-python-client is not installed (pip install -r requirements-dev.txt)"

    def generate(url: str, token: str):
        status, _, content = call(url, "get", "/api/schema/?format=json", token=token)
        assert status == 200
        (tmp_path / "openapi.json").write_bytes(content)
        # a tenant export's archive is application/zip, which the generator does not know as binary: read as bytes
        (tmp_path / "config.yaml").write_text(f"post_hooks: []\npackage_name_override: {PACKAGE}\n"
                                              "content_type_overrides:\n  application/zip: application/octet-stream\n")
        run = subprocess.run([str(generator), "generate", "--path", "openapi.json", "--meta", "none",
                              "--output-path", PACKAGE, "--config", "config.yaml"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and "Warning" not in run.stdout + run.stderr, run.stdout + run.stderr
        sys.path.insert(0, str(tmp_path))
        return importlib.import_module(PACKAGE)

    yield generate
    sys.path.remove(str(tmp_path)) if str(tmp_path) in sys.path else None
    for name in [name for name in sys.modules if name == PACKAGE or name.startswith(PACKAGE + ".")]:
        del sys.modules[name]


def _normal(value):
    """JSON as the server writes it and as the generated models write it back, in one spelling: moments
    as aware datetimes (``Z`` and ``+00:00`` are the same instant), numbers as Decimal."""
    if isinstance(value, dict):
        return {key: _normal(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_normal(item) for item in value]
    if isinstance(value, str) and len(value) >= 20 and value[4:5] == "-" and value[10:11] == "T":
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Decimal(str(value))
    return value


def _declared_only(model, where: str) -> None:
    """No key of the answer landed in ``additional_properties`` of a model that declares fields (a
    free-form object, such as an event's evidence, declares none)."""
    if isinstance(model, list):
        for index, item in enumerate(model):
            _declared_only(item, f"{where}[{index}]")
        return
    if not hasattr(model, "additional_properties"):
        return
    declared = [name for name in getattr(type(model), "__attrs_attrs__", ()) if name.name != "additional_properties"]
    if declared:
        assert not model.additional_properties, f"{where}: undocumented keys {sorted(model.additional_properties)}"
    for attribute in declared:
        _declared_only(getattr(model, attribute.name), f"{where}.{attribute.name}")


def read(response, status: int, model_name: str):
    """The generated client's answer: the documented status, parsed into ``model_name``, losing nothing."""
    assert response.status_code == status, (response.status_code, response.content[:400])
    parsed = response.parsed
    assert type(parsed).__name__ == model_name, (type(parsed).__name__, response.content[:400])
    raw = json.loads(response.content)
    _declared_only(parsed, model_name)
    assert _normal(parsed.to_dict()) == _normal(raw), (parsed.to_dict(), raw)
    return parsed


def test_generated_client_reads_every_answer(world, generated):
    contract = seed(world)
    owner = world.tokens["owner"]
    with api_server(database_url()) as url:
        client_package = generated(url, owner)
        api = importlib.import_module(f"{PACKAGE}.api")
        models = importlib.import_module(f"{PACKAGE}.models")
        groups = [group.name for group in pkgutil.iter_modules(api.__path__)]  # one module per tag (config/openapi.py)
        assert {"leases", "billing", "tenancy", "staff_tenants"} <= set(groups), groups

        def op(name: str):
            (group,) = [g for g in groups if importlib.util.find_spec(f"{api.__name__}.{g}.{name}") is not None]
            return importlib.import_module(f"{api.__name__}.{group}.{name}").sync_detailed

        client = client_package.AuthenticatedClient(base_url=url, token=owner, raise_on_unexpected_status=True)

        read(op("v1_tenant_retrieve")(client=client), 200, "TenantOutput")
        read(op("v1_tenant_partial_update")(client=client, body=models.PatchedTenantUpdateInputRequest(
            name="Acme Corp")), 200, "TenantOutput")
        read(op("v1_projects_create")(client=client, body=models.ProjectCreateInputRequest(
            slug="client", name="Client", description="made by the generated client")), 201, "ProjectOutput")
        read(op("v1_projects_list")(client=client, limit=10), 200, "PaginatedProjectList")
        read(op("v1_projects_retrieve")("client", client=client), 200, "ProjectOutput")
        read(op("v1_quotas_retrieve")(client=client), 200, "QuotasOutput")
        read(op("v1_offers_retrieve")(client=client), 200, "OfferListOutput")

        # enrolled node with one GPU (its secret signs the heartbeat, through an httpx hook)
        enrolled = read(op("v1_agents_enroll_create")(
            client=client_package.Client(base_url=url, raise_on_unexpected_status=True),
            body=models.EnrollInputRequest.from_dict({"node_id": "client-node", "token": contract.enrollment_token,
                                                      "address": "http://127.0.0.1:9/", "inventory": INVENTORY})),
            201, "EnrolledOutput")

        def signed(request):
            request.headers.update(sign(enrolled.secret, "client-node", request.method, request.url.path,
                                        request.read(), request.url.query.decode()))

        agent = client_package.Client(base_url=url, raise_on_unexpected_status=True,
                                      httpx_args={"event_hooks": {"request": [signed]}})
        read(op("v1_agents_heartbeat_create")("client-node", client=agent,
                                              body=models.V1AgentsHeartbeatCreateBody.from_dict(
                                                  {"inventory": INVENTORY})), 200, "HeartbeatOutput")

        request = models.LeaseCreateInputRequest.from_dict(
            {"project": world.project.slug, "gpu": {"kind": "whole", "model": "H100-80GB"}, "duration_seconds": 3600})
        lease = read(op("v1_leases_create")(client=client, body=request, idempotency_key="client-1"),
                     201, "LeaseOutput")
        read(op("v1_leases_create")(client=client, body=request, idempotency_key="client-1"), 200, "LeaseOutput")
        page = read(op("v1_leases_list")(client=client, limit=5, offset=0), 200, "PaginatedLeaseList")
        assert [item.id for item in page.results] == [lease.id]
        place(lease.id)
        detail = read(op("v1_leases_retrieve")(lease.id, client=client), 200, "LeaseDetailOutput")
        assert detail.state.value == "active" and detail.devices[0].gpu_uuid == "GPU-contract-0"
        renewed = read(op("v1_leases_renew_create")(lease.id, client=client, body=models.LeaseRenewInputRequest(
            duration_seconds=7200)), 200, "LeaseOutput")
        assert renewed.ends_at > detail.ends_at  # (its duration_seconds still reads 3600: see the report)
        released = read(op("v1_leases_destroy")(lease.id, client=client), 202, "LeaseOutput")
        assert released.state.value == "releasing"

        # problem+json, parsed into the Problem model: not found (404) and invalid (400), each naming the field
        problem = read(op("v1_leases_create")(client=client, body=models.LeaseCreateInputRequest.from_dict(
            {"project": "no-such-project", "gpu": {"kind": "whole"}})), 404, "Problem")
        assert problem.field == "project" and problem.status == 404
        invalid = read(op("v1_projects_create")(client=client, body=models.ProjectCreateInputRequest(
            slug="Bad Slug", name="x")), 400, "Problem")
        assert invalid.field == "slug" and invalid.errors[0].field == "slug"

        created = read(op("v1_tokens_create")(client=client, body=models.ApiTokenCreateInputRequest.from_dict(
            {"name": "ci", "scopes": ["read"]})), 201, "ApiTokenCreatedOutput")
        tokens = read(op("v1_tokens_list")(client=client), 200, "PaginatedApiTokenList")
        assert created.id in [token.id for token in tokens.results]
        read(op("v1_tokens_retrieve")(created.id, client=client), 200, "ApiTokenOutput")
        revoked = read(op("v1_tokens_destroy")(created.id, client=client), 200, "ApiTokenOutput")
        assert revoked.revoked_at is not None

        members = read(op("v1_members_list")(client=client), 200, "PaginatedMembershipList")
        read(op("v1_members_retrieve")(members.results[0].id, client=client), 200, "MembershipOutput")
        read(op("v1_slo_contracts_list")(client=client), 200, "PaginatedSloContractList")
        usage = read(op("v1_usage_retrieve")(client=client, group_by=models.V1UsageRetrieveGroupBy("model")),
                     200, "UsageOutput")
        assert usage.group_by == "model"
        invoices = read(op("v1_invoices_list")(client=client), 200, "PaginatedInvoiceList")
        assert [invoice.id for invoice in invoices.results] == [contract.invoice_id]
        invoice = read(op("v1_invoices_retrieve")(contract.invoice_id, client=client), 200, "InvoiceDetailOutput")
        assert invoice.lines[0].amount_minor == 400
        document = op("v1_invoices_document")(str(contract.invoice_id), "csv", client=client)
        assert document.status_code == 200 and b"H100-80GB" in document.content

        # a project's idle reclaim opt-in: the nested rule, the nullable estimate and staff mode, the enums
        shown = read(op("v1_projects_idle_reclaim_retrieve")(world.project.slug, client=client), 200, "IdleOptInOutput")
        assert shown.opt_in is False and shown.rule.notice_seconds == 900
        changed = read(op("v1_projects_idle_reclaim_update")(world.project.slug, client=client,
                                                             body=models.IdleOptInInputRequest(opt_in=True)),
                       200, "IdleOptInOutput")
        assert changed.opt_in is True and changed.mode.value == "auto"
