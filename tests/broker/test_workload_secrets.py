"""Issue 27, item 1: a viewer must not become owner. Secrets in a workload's environment are write-only
(``secret_env``: sealed at rest, sent to the node only to start the workload), the profiler gives its workload a
credential that posts that lease's samples and nothing else, and no answer or page that shows a lease, a
workload, a webhook, a token or an audit entry shows a secret value, to the owner or to a viewer.

The replayed attack: a viewer with a read-only token reads every lease of a profiling run and tries each
credential it finds on ``POST /api/v1/tokens``; before the fix the profiling lease's workload env held a write
token of the member who started the run (``PERF_TOKEN``), which minted a permanent read/write token."""

from __future__ import annotations

import re

import pytest
from django.core.management import call_command
from django.test import Client

from broker.models import Workload
from tests.factories import api_client, make_quota, make_world
from tiering.models import ProfilingLease, ProfilingRun

pytestmark = pytest.mark.django_db

BERT = {"name": "bert-int8", "architecture": "bert-base", "task": "inference", "precision": "int8",
        "batch_size": 32, "seq_len": 128, "target_throughput": 2000.0}
# any credential of this broker: an API token (gpub_<prefix>_<secret>) or a samples credential (gpubs_…)
CREDENTIAL = re.compile(r"gpubs?_[A-Za-z0-9_:.-]{10,}")
PLANTED = "planted-hf-token-value-7f3a9c"


@pytest.fixture
def world():
    world = make_world()
    for tier in ("A100-80GB", "L4"):
        make_quota(world.project, tier=tier)
    return world


def _profiling_run(world) -> dict:
    member = world.client("member")
    assert member.post("/api/v1/workloads", BERT, format="json").status_code == 201
    answer = member.post("/api/v1/workloads/bert-int8/profiling-runs",
                         {"project": "vision", "slices": ["A100-80GB", "L4"], "window_seconds": 10}, format="json")
    assert answer.status_code == 201, answer.content
    return answer.json()


def test_a_viewer_cannot_obtain_a_write_token_through_a_profiling_run(world):
    run = _profiling_run(world)
    viewer = world.client("viewer")
    seen = viewer.get("/api/v1/leases").content.decode()
    for item in run["leases"]:
        seen += viewer.get(f"/api/v1/leases/{item['lease']}").content.decode()
    seen += viewer.get("/api/v1/workloads/bert-int8/profiling-runs").content.decode()
    minted = []
    for found in set(CREDENTIAL.findall(seen)):
        answer = api_client(found).post("/api/v1/tokens", {"name": "mine now", "scopes": ["read", "write"]},
                                        format="json")
        if answer.status_code == 201:
            minted.append(found)
    assert not minted, f"the viewer minted a write token with a credential it read: {minted}"
    assert not CREDENTIAL.findall(seen), "a credential is shown to a viewer"


def _lease_with_secret(world, **extra) -> dict:
    answer = world.client("member").post("/api/v1/leases", {
        "project": "vision", "gpu": {"kind": "whole", "model": "A100-80GB"},
        "workload": {"command": ["python", "train.py"], "env": {"WANDB_MODE": "offline"},
                     "secret_env": {"HF_TOKEN": PLANTED}, **extra}}, format="json")
    assert answer.status_code == 201, answer.content
    return answer.json()


def _pages(world, who: str, lease_ids: list[int], webhook_id: int) -> dict[str, str]:
    """Every answer and page that shows a lease, a workload, a webhook, a token or an audit entry, as ``who``
    sees it: path → raw body."""
    api = world.client(who)
    paths = ["/api/v1/leases", "/api/v1/workloads", "/api/v1/workloads/bert-int8",
             "/api/v1/workloads/bert-int8/profiling-runs", "/api/v1/workloads/bert-int8/profiles",
             "/api/v1/webhooks", f"/api/v1/webhooks/{webhook_id}", f"/api/v1/webhooks/{webhook_id}/deliveries",
             "/api/v1/tokens", "/api/v1/tenant", "/api/schema/"]
    for lease_id in lease_ids:
        paths += [f"/api/v1/leases/{lease_id}", f"/api/v1/leases/{lease_id}/logs"]
    bodies = {}
    for path in paths:
        answer = api.get(path)
        assert answer.status_code == 200, (path, answer.status_code)
        bodies[path] = answer.content.decode()
    browser = Client()
    browser.force_login(getattr(world, {"owner": "owner", "viewer": "viewer"}[who]))
    pages = ["/", "/leases/", "/workloads/", "/workloads/bert-int8", "/settings/tokens", "/settings/notifications/",
             "/advice"]
    for lease_id in lease_ids:
        pages += [f"/leases/{lease_id}", f"/leases/{lease_id}/log"]
    for page in pages:
        answer = browser.get(page)
        assert answer.status_code == 200, (page, answer.status_code)
        bodies[page] = answer.content.decode()
    return bodies


def test_no_answer_page_record_or_log_shows_a_secret_to_the_owner_or_a_viewer(world, caplog):
    caplog.set_level("DEBUG")
    owner = world.client("owner")
    hook = owner.post("/api/v1/webhooks", {"url": "https://93.184.215.14/gpub", "event_types": ["lease.active"]},
                      format="json")
    assert hook.status_code == 201, hook.content
    webhook_secret = hook.json()["secret"]
    lease = _lease_with_secret(world)
    run = _profiling_run(world)
    lease_ids = [lease["id"], *(item["lease"] for item in run["leases"])]
    # the secret is kept (sealed) and the spec shows its name only
    workload = Workload.objects.get(lease_id=lease["id"])
    assert workload.spec["secret_env"] == ["HF_TOKEN"] and workload.spec["env"] == {"WANDB_MODE": "offline"}
    assert PLANTED not in workload.secret_env_sealed
    from broker.workload_secrets import secret_env_open

    assert secret_env_open(workload.secret_env_sealed) == {"HF_TOKEN": PLANTED}
    credentials = [secret_env_open(Workload.objects.get(lease_id=item["lease"]).secret_env_sealed)["PERF_TOKEN"]
                   for item in run["leases"]]
    assert all(c.startswith("gpubs_") for c in credentials)
    secrets = [PLANTED, webhook_secret, *credentials, *world.tokens.values()]
    for who in ("owner", "viewer"):
        for where, body in _pages(world, who, lease_ids, hook.json()["id"]).items():
            shown = [secret for secret in secrets if secret in body]
            assert not shown, f"{where} shows a secret to the {who}"
            assert not CREDENTIAL.findall(body), f"{where} shows a credential to the {who}"
        detail = world.client(who).get(f"/api/v1/leases/{lease['id']}").json()
        assert detail["workload"]["spec"]["secret_env"] == ["HF_TOKEN"]  # what is set, never its value
    # nor any row of the database (events, audit entries, webhook deliveries, the idempotency hash …) in clear,
    # nor any log line
    dump = _dump()
    assert not [secret for secret in (PLANTED, *credentials) if secret in dump]
    assert PLANTED not in caplog.text and not [c for c in credentials if c in caplog.text]


def _dump() -> str:
    from io import StringIO

    out = StringIO()
    call_command("dumpdata", "broker", "tenants", "tiering", "notifications", "billing", stdout=out)
    return out.getvalue()


def test_a_profiling_run_mints_no_api_token_and_its_credential_posts_only_its_own_leases_samples(world):
    from broker.models import Lease
    from broker.workload_secrets import secret_env_open
    from tenants.models import ApiToken

    tokens_before = ApiToken.objects.count()
    run = _profiling_run(world)
    assert ApiToken.objects.count() == tokens_before  # no token of the member minted for the run
    own, sibling = (item["lease"] for item in run["leases"])
    Lease.objects.filter(pk__in=[own, sibling]).update(state="active")
    credential = secret_env_open(Workload.objects.get(lease_id=own).secret_env_sealed)["PERF_TOKEN"]
    assert not re.search(r"gpub_[a-z0-9]{10}_", credential)  # not an API token, nor holding one
    holder = api_client(credential)
    answer = holder.post(f"/api/v1/leases/{own}/samples", {"throughput": 123.0, "workload": "bert-int8"},
                         format="json")
    assert answer.status_code == 201, answer.content
    # its own lease only: not the run's other lease, not another tenant's, not under another workload's name
    assert holder.post(f"/api/v1/leases/{sibling}/samples", {"throughput": 1.0}, format="json").status_code == 403
    other = _lease_of_globex(world)
    assert holder.post(f"/api/v1/leases/{other}/samples", {"throughput": 1.0}, format="json").status_code == 403
    assert holder.post(f"/api/v1/leases/{own}/samples", {"throughput": 1.0, "workload": "other"},
                       format="json").status_code == 403
    # refused on every other route: reads, writes, minting a token
    for method, path, body in [("get", "/api/v1/leases", None), ("get", f"/api/v1/leases/{own}", None),
                               ("get", "/api/v1/tokens", None), ("post", "/api/v1/tokens",
                                                                 {"name": "x", "scopes": ["read"]}),
                               ("delete", f"/api/v1/leases/{own}", None), ("get", "/api/v1/workloads", None),
                               ("post", "/api/v1/workloads/bert-int8/profiling-runs", {"project": "vision"}),
                               ("get", "/api/v1/tenant", None), ("get", "/api/v1/webhooks", None),
                               ("post", "/api/v1/leases", {"project": "vision", "gpu": {"kind": "whole"}})]:
        answer = getattr(holder, method)(path, body, format="json") if body else getattr(holder, method)(path)
        assert answer.status_code == 401, (method, path, answer.status_code)
    # a forged or altered credential is refused; once the run is over, so is the real one
    assert api_client(credential[:-2] + "xx").post(f"/api/v1/leases/{own}/samples", {"throughput": 1.0},
                                                   format="json").status_code == 401
    ProfilingRun.objects.filter(pk=run["id"]).update(state="done")
    assert holder.post(f"/api/v1/leases/{own}/samples", {"throughput": 1.0}, format="json").status_code == 403
    assert ProfilingLease.objects.filter(run_id=run["id"]).count() == 2


def _lease_of_globex(world) -> int:
    make_quota(world.other_project, tier="A100-80GB")
    answer = world.client("outsider").post("/api/v1/leases", {"project": "secret", "gpu": {"kind": "whole",
                                                                                         "model": "A100-80GB"}},
                                           format="json")
    assert answer.status_code == 201, answer.content
    return answer.json()["id"]


@pytest.mark.parametrize(("workload", "field"), [
    ({"env": {"HF_TOKEN": "x"}}, "workload.env.HF_TOKEN"),
    ({"env": {"DB_PASSWORD": "x"}}, "workload.env.DB_PASSWORD"),
    ({"env": {"AWS_SECRET_ACCESS_KEY": "x"}}, "workload.env.AWS_SECRET_ACCESS_KEY"),
    ({"env": {"OPENAI_API_KEY": "x"}}, "workload.env.OPENAI_API_KEY"),
    ({"env": {"A": "1"}, "secret_env": {"A": "2"}}, "workload.secret_env.A"),
    ({"secret_env": {"GPUB_RUN_TOKEN": "x"}}, "workload.secret_env.GPUB_RUN_TOKEN"),
    ({"secret_env": {"T": 1}}, "workload.secret_env.T"),
    ({"secret_env": ["T"]}, "workload.secret_env"),
])
def test_secret_looking_env_and_bad_secret_env_are_refused_naming_the_field(world, workload, field):
    answer = world.client("member").post("/api/v1/leases", {
        "project": "vision", "gpu": {"kind": "whole", "model": "A100-80GB"},
        "workload": {"command": ["python", "train.py"], **workload}}, format="json")
    assert answer.status_code == 400, answer.content
    problem = answer.json()
    assert problem["field"] == field, problem
    if field.startswith("workload.env."):
        assert "secret_env" in problem["detail"]  # where it belongs
    assert "x" not in {value for value in problem.values() if isinstance(value, str)}


def test_the_same_secrets_replay_a_request_other_secrets_conflict(world):
    member = world.client("member")
    body = {"project": "vision", "gpu": {"kind": "whole", "model": "A100-80GB"},
            "workload": {"command": ["python"], "secret_env": {"HF_TOKEN": PLANTED}}}
    first = member.post("/api/v1/leases", body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    again = member.post("/api/v1/leases", body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == 201 and again.status_code == 200 and again.json()["id"] == first.json()["id"]
    other = {**body, "workload": {"command": ["python"], "secret_env": {"HF_TOKEN": "another"}}}
    assert member.post("/api/v1/leases", other, format="json", HTTP_IDEMPOTENCY_KEY="k-1").status_code == 409
    assert PLANTED not in _dump()


def test_secrets_sealed_with_an_old_key_still_open_after_rotation(world, settings):
    from cryptography.fernet import Fernet

    from broker.workload_secrets import secret_env_open, secret_env_seal

    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.WORKLOAD_SECRET_KEYS = [old]
    sealed = secret_env_seal({"HF_TOKEN": PLANTED})
    settings.WORKLOAD_SECRET_KEYS = [new, old]
    assert secret_env_open(sealed) == {"HF_TOKEN": PLANTED}
    assert secret_env_open(secret_env_seal({"A": "b"})) == {"A": "b"}


def test_migration_moves_secret_looking_env_of_earlier_workloads_into_the_sealed_field(world):
    """Workloads stored before secret_env (migration broker 0012): the profiler's PERF_TOKEN and any env name
    that says it holds a credential leave the shown spec for the sealed column; the rest stays."""
    import importlib

    from django.apps import apps

    from broker.models import Lease
    from broker.workload_secrets import secret_env_open

    lease_id = _lease_with_secret(world)["id"]
    Workload.objects.filter(lease_id=lease_id).update(
        spec={"command": ["python"], "env": {"PERF_TOKEN": world.tokens["member"], "WANDB_MODE": "offline",
                                             "DB_PASSWORD": PLANTED}}, secret_env_sealed="")
    assert not Lease.objects.exclude(pk=lease_id).exists()  # one workload: the one rewritten above
    migration = importlib.import_module("broker.migrations.0012_workload_secret_env")
    migration.seal_secret_looking_env(apps, None)
    workload = Workload.objects.get(lease_id=lease_id)
    assert workload.spec == {"command": ["python"], "env": {"WANDB_MODE": "offline"},
                             "secret_env": ["DB_PASSWORD", "PERF_TOKEN"]}
    assert secret_env_open(workload.secret_env_sealed) == {"PERF_TOKEN": world.tokens["member"],
                                                           "DB_PASSWORD": PLANTED}
    assert world.client("viewer").get(f"/api/v1/leases/{lease_id}").content.decode().count("gpub_") == 0
