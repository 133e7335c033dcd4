"""The pipelines and model-splits API on PostgreSQL: planning, applying as leases through the normal leasing
path (all stages or none), releasing together, errors naming the field, tenant isolation, audit events."""

from __future__ import annotations

import pytest

from broker import extensions
from broker.models import Lease
from core.errors import Conflict
from pipelines.models import Pipeline, PipelinePlan, PlanLease
from tenants.models import AuditEvent
from tests.factories import make_world

PRICES = {"H100-80GB": 400, "A100-80GB": 250, "L4": 80}
THREE = {"project": "vision", "name": "video", "slo_ms": 60.0, "rate_rps": 20.0, "tiers": ["H100-80GB"],
         "stages": [{"name": "detect", "architecture": "resnet-50"}, {"name": "embed", "architecture": "vit-b-16"},
                    {"name": "caption", "architecture": "bert-base"}],
         "edges": [["detect", "embed"], ["embed", "caption"]]}


@pytest.fixture
def world(db):
    unregister = extensions.list_prices_register(lambda now: PRICES)
    yield make_world()
    unregister()


def _plan(client, body=THREE):
    created = client.post("/api/v1/pipelines", body, format="json")
    assert created.status_code == 201, created.content
    planned = client.post(f"/api/v1/pipelines/{created.json()['id']}/plans", {}, format="json")
    assert planned.status_code == 201, planned.content
    return created.json(), planned.json()


def test_a_pipeline_is_planned_by_esg_within_its_slo(world):
    _, plan = _plan(world.client("member"))
    assert plan["method"] == "esg" and plan["feasible"] and plan["latency_ms"] <= 60.0
    stages = plan["result"]["stages"]
    assert [s["stage"] for s in stages] == ["detect", "embed", "caption"]
    for stage in stages:
        assert stage["tier"] == "H100-80GB" and stage["instances"] >= 1 and stage["batch"] >= 1
        assert stage["cost_per_1k"] > 0 and stage["latency_ms"] > 0
    assert sum(g["used_ms"] for g in plan["result"]["split"]) == pytest.approx(plan["latency_ms"], rel=1e-3)
    assert "even_greedy" in plan["result"]["baselines"]
    assert AuditEvent.objects.filter(tenant=world.acme, action="pipeline.plan").count() == 1


@pytest.mark.parametrize(("change", "status", "field"), [
    # relations between well-formed parts: 422
    ({"edges": [["detect", "nowhere"]]}, 422, "edges[0]"),
    ({"edges": [["detect", "embed"], ["embed", "detect"]]}, 422, "edges"),
    ({"stages": [{"name": "a", "profile": [{"tier": "H100-80GB", "kind": "mig", "profile": "9g.1tb",
                                             "batch": 1, "latency_ms": 3}]}], "edges": []}, 422,
     "stages[0].profile[0]"),
    ({"stages": [{"name": "a", "profile": [{"tier": "L4", "kind": "share", "latency_ms": 3}]}], "edges": []}, 422,
     "stages[0].profile[0]"),
    ({"stages": [{"name": "a"}], "edges": []}, 422, "stages[0]"),
    ({"stages": [{"name": "a", "architecture": "llama-2-13b"}], "edges": [], "tiers": ["L4"]}, 422,
     "stages[0].architecture"),
    ({"stages": [{"name": "a", "architecture": "bert-base"}, {"name": "a", "architecture": "bert-base"}],
      "edges": []}, 422, "stages"),
    # what the OpenAPI document states: 400
    ({"stages": [{"name": "a", "architecture": "resnet9000"}], "edges": []}, 400, "stages[0].architecture"),
    ({"stages": [{"name": "a", "architecture": "bert-base", "colour": "red"}], "edges": []}, 400, "stages[0].colour"),
    ({"stages": [{"name": "a", "profile": [{"tier": "L4", "latency_ms": "3"}]}], "edges": []}, 400,
     "stages[0].profile[0].latency_ms"),
    ({"name": "   "}, 400, "name"),
    # separators and a byte-order mark are no name either, whichever regex engine reads the pattern: Python's \s
    # holds U+001C-U+001F and U+0085, ECMAScript's U+FEFF (a fuzzer sent "\u001f", which the schema's \S allowed)
    ({"name": "\u001f"}, 400, "name"),
    ({"name": "\ufeff\u0085"}, 400, "name"),
    ({"slo_ms": -1}, 400, "slo_ms"),
    ({"tiers": ["Z80"]}, 400, "tiers[0]"),
])
def test_bad_pipelines_are_refused_naming_the_field(world, change, status, field):
    answer = world.client("member").post("/api/v1/pipelines", THREE | change, format="json")
    assert answer.status_code == status and answer["Content-Type"].startswith("application/problem+json")
    assert answer.json()["field"] == field, answer.json()
    assert not Pipeline.objects.exists()


def test_the_name_pattern_the_document_states_is_the_one_the_validator_applies(world):
    from pipelines.api.serializers import VISIBLE

    document = world.client("member").get("/api/schema/", {"format": "json"}).json()
    body = document["paths"]["/api/v1/pipelines"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    pipeline = document["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]
    stage = document["components"]["schemas"][pipeline["properties"]["stages"]["items"]["$ref"].rsplit("/", 1)[1]]
    assert pipeline["properties"]["name"]["pattern"] == stage["properties"]["name"]["pattern"] == VISIBLE


def test_a_blank_edge_end_is_refused_as_the_document_says(world):
    answer = world.client("member").post("/api/v1/pipelines", THREE | {"edges": [["detect", " "]]}, format="json")
    assert answer.status_code == 400 and answer.json()["field"] == "edges[0][1]", answer.json()


def test_planning_tiers_today_s_price_list_has_no_price_for_is_a_conflict(world):
    """The pipeline is well formed; the price list holds nothing for its tiers now: 409 naming tiers, no plan."""
    client = world.client("member")
    created = client.post("/api/v1/pipelines", THREE | {"tiers": ["T4"]}, format="json")
    assert created.status_code == 201, created.content
    answer = client.post(f"/api/v1/pipelines/{created.json()['id']}/plans", {}, format="json")
    assert answer.status_code == 409 and answer.json()["field"] == "tiers", answer.json()
    assert not PipelinePlan.objects.exists()


@pytest.mark.parametrize(("body", "status", "field"), [
    ({"gpus": [{"model": "L4", "free_mib": 30000}]}, 422, "gpus[0].free_mib"),
    ({"gpus": [{"id": "x", "model": "L4"}, {"id": "x", "model": "L4"}]}, 422, "gpus[1]"),
    ({"architecture": "", "gpus": [{"model": "L4"}]}, 422, "layers"),
    ({"architecture": "mobilenet-v2", "gpus": [{"model": "L4"}]}, 400, "architecture"),  # no layer table
    ({"gpus": [{"model": "Z80"}]}, 400, "gpus[0].model"),
    ({"layers": [{"params": 1, "flops": 1.0}], "gpus": [{"model": "L4"}]}, 400, "layers[0].out_bytes"),
    # an integer one past the bound: as a float it rounds to the bound (Schemathesis' coverage phase found it)
    ({"architecture": "", "layers": [{"name": "0", "params": 0, "flops": 10**18 + 1, "out_bytes": 0}],
      "gpus": [{"model": "L4"}]}, 400, "layers[0].flops"),
])
def test_bad_model_splits_are_refused_naming_the_field(world, body, status, field):
    answer = world.client("member").post("/api/v1/model-splits", {"architecture": "bert-base"} | body, format="json")
    assert answer.status_code == status, answer.content
    assert answer.json()["field"] == field, answer.json()


def test_an_unreachable_slo_gives_an_infeasible_plan_that_cannot_be_applied(world):
    client = world.client("member")
    pipeline, plan = _plan(client, THREE | {"slo_ms": 0.5})
    assert not plan["feasible"]
    answer = client.post(f"/api/v1/pipelines/{pipeline['id']}/plans/{plan['id']}/apply", {}, format="json")
    assert answer.status_code == 409 and answer.json()["field"] == "feasible"
    assert not Lease.objects.exists()


def test_apply_leases_every_stage_and_release_gives_them_all_back(world):
    client = world.client("member")
    pipeline, plan = _plan(client)
    url = f"/api/v1/pipelines/{pipeline['id']}/plans/{plan['id']}"
    applied = client.post(f"{url}/apply", {"duration_seconds": 600}, format="json")
    assert applied.status_code == 200, applied.content
    body = applied.json()
    assert body["state"] == "applied" and [x["stage"] for x in body["leases"]] == ["detect", "embed", "caption"]
    leases = Lease.objects.filter(pk__in=[x["lease"] for x in body["leases"]])
    assert leases.count() == 3
    for lease, stage in zip(leases.order_by("id"), plan["result"]["stages"], strict=True):
        assert lease.workload_class == "inference" and lease.count == stage["instances"]
        assert lease.models_allowed == ["H100-80GB"] and lease.state == "queued"
    # applying again is a no-op, not three more leases
    assert client.post(f"{url}/apply", {}, format="json").status_code == 200
    assert Lease.objects.count() == 3
    released = client.post(f"{url}/release", {}, format="json")
    assert released.status_code == 200 and released.json()["state"] == "released"
    assert set(Lease.objects.values_list("state", flat=True)) == {"released"}
    actions = set(AuditEvent.objects.filter(tenant=world.acme).values_list("action", flat=True))
    assert {"pipeline.create", "pipeline.plan", "pipeline.apply", "pipeline.release"} <= actions


def test_apply_is_all_or_nothing_when_a_stage_is_refused(world):
    """The third stage's request is refused by an admission check (the seam billing's spend caps use): the
    first two stages' leases, already written in the same transaction, are not kept."""
    client = world.client("member")
    pipeline, plan = _plan(client)
    seen = []

    def refuse_third(admission):
        seen.append(admission.gpu)
        if len(seen) == 3:
            raise Conflict("refused by the test's admission check", field="gpu")
        return ""

    unregister = extensions.request_check_register(refuse_third)
    try:
        answer = client.post(f"/api/v1/pipelines/{pipeline['id']}/plans/{plan['id']}/apply", {}, format="json")
    finally:
        unregister()
    assert answer.status_code == 409, answer.content
    assert len(seen) == 3
    assert not Lease.objects.exists() and not PlanLease.objects.exists()
    assert PipelinePlan.objects.get(pk=plan["id"]).state == "planned"


def test_another_tenant_sees_no_pipeline_nor_plan(world):
    pipeline, plan = _plan(world.client("member"))
    outsider = world.client("outsider")
    assert outsider.get(f"/api/v1/pipelines/{pipeline['id']}").status_code == 404
    assert outsider.post(f"/api/v1/pipelines/{pipeline['id']}/plans", {}, format="json").status_code == 404
    assert outsider.post(f"/api/v1/pipelines/{pipeline['id']}/plans/{plan['id']}/apply", {},
                         format="json").status_code == 404
    assert outsider.get("/api/v1/pipelines").json()["results"] == []  # a page (core.api.paginate)
    assert world.client("viewer").post("/api/v1/pipelines", THREE, format="json").status_code == 403


def test_model_split_of_a_named_architecture(world):
    client = world.client("member")
    # Llama-2-13B holds 26 GB of FP16 weights: more than any one of these GPUs has free
    gpus = [{"id": "h0", "node": "n1", "model": "H100-80GB", "free_mib": 16000},
            {"id": "h1", "node": "n1", "model": "H100-80GB", "free_mib": 15000},
            {"id": "a0", "node": "n2", "model": "A100-40GB", "free_mib": 20000}]
    answer = client.post("/api/v1/model-splits", {"architecture": "llama-2-13b", "batch": 1, "gpus": gpus},
                         format="json")
    assert answer.status_code == 201, answer.content
    result = answer.json()["result"]
    assert result["feasible"]
    covered = [i for g in result["groups"] for i in range(g["first"], g["last"] + 1)]
    assert covered == list(range(42)) and len(result["groups"]) >= 2  # embedding, 40 blocks, head
    assert all(g["memory_mib"] <= g["free_mib"] for g in result["groups"])
    assert result["objective"] >= result["baselines"]["optimal"]["objective"] - 1e-6
    other = world.client("outsider").get(f"/api/v1/model-splits/{answer.json()['id']}")
    assert other.status_code == 404
    bad = client.post("/api/v1/model-splits", {"architecture": "resnet-50", "gpus": [{"model": "Z80"}]},
                      format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "gpus[0].model"


def _split(client, **change):
    gpus = [{"id": f"h{i}", "node": "n1", "model": "H100-80GB", "free_mib": 16000} for i in range(2)]
    answer = client.post("/api/v1/model-splits", {"architecture": "llama-2-13b", "gpus": gpus} | change,
                         format="json")
    assert answer.status_code == 201, answer.content
    return answer.json()


def test_a_split_is_applied_as_one_lease_group_with_its_layers_and_released_together(world):
    client = world.client("member")
    split = _split(client)
    url = f"/api/v1/model-splits/{split['id']}"
    missing = client.post(f"{url}/apply", {"project": "nowhere"}, format="json")
    assert missing.status_code == 404 and missing.json()["field"] == "project"
    applied = client.post(f"{url}/apply", {"project": "vision", "duration_seconds": 600}, format="json")
    assert applied.status_code == 200, applied.content
    body = applied.json()
    assert body["state"] == "applied" and body["project"] == "vision" and [x["group"] for x in body["leases"]] == [0, 1]
    leases = list(Lease.objects.filter(pk__in=[x["lease"] for x in body["leases"]]).order_by("id"))
    assert {lease.group_key for lease in leases} == {f"model-split-{split['id']}"}
    for index, (lease, group) in enumerate(zip(leases, split["result"]["groups"], strict=True)):
        assert lease.kind == "whole" and lease.models_allowed == ["H100-80GB"] and lease.workload_class == "inference"
        part = lease.access_extra["split"]
        assert (part["group"], part["first_layer"], part["last_layer"]) == (index, group["first"], group["last"])
    assert client.post(f"{url}/apply", {"project": "vision"}, format="json").status_code == 200  # no-op
    assert Lease.objects.count() == 2
    assert client.post(f"{url}/release", {}, format="json").json()["state"] == "released"
    assert set(Lease.objects.values_list("state", flat=True)) == {"released"}
    again = client.post(f"{url}/release", {}, format="json")
    assert again.status_code == 409 and again.json()["field"] == "state"
    actions = set(AuditEvent.objects.filter(tenant=world.acme).values_list("action", flat=True))
    assert {"model_split.create", "model_split.apply", "model_split.release"} <= actions


def test_a_split_that_fits_nowhere_is_not_applied_and_others_cannot_apply(world):
    client = world.client("member")
    tight = _split(client, gpus=[{"id": "l4", "node": "n1", "model": "L4", "free_mib": 2000}])
    assert not tight["feasible"]
    refused = client.post(f"/api/v1/model-splits/{tight['id']}/apply", {"project": "vision"}, format="json")
    assert refused.status_code == 409 and refused.json()["field"] == "feasible"
    split = _split(client)
    outsider = world.client("outsider").post(f"/api/v1/model-splits/{split['id']}/apply", {"project": "vision"},
                                             format="json")
    assert outsider.status_code == 404
    viewer = world.client("viewer").post(f"/api/v1/model-splits/{split['id']}/apply", {"project": "vision"},
                                         format="json")
    assert viewer.status_code == 403
    assert not Lease.objects.exists()


def _enroll(node_id: str, model: str, count: int, memory_mib: int) -> None:
    from broker import services as broker

    token = broker.enrollment_token_create(uses=1)
    broker.node_enroll(node_id=node_id, token=token, address=f"http://127.0.0.1:9/n/{node_id}", inventory={
        "gpus": [{"index": i, "uuid": f"GPU-{node_id}-{i}", "model": model, "mode": "whole", "memory_mib": memory_mib}
                 for i in range(count)]})


def test_a_split_over_the_gpus_free_now_takes_what_the_tenants_quotas_allow(world):
    from broker import services as broker
    from tenants.access import Actor
    from tenants.choices import Role
    from tests.factories import make_quota

    _enroll("node-a", "H100-80GB", 4, 81559)
    _enroll("node-b", "A100-80GB", 2, 81920)
    client = world.client("member")
    body = {"architecture": "llama-2-13b", "candidates": {"free": True}}
    # vision may hold 2 H100s (limit 2000 milli) and has no A100 quota: two H100s of node-a, nothing of node-b
    answer = client.post("/api/v1/model-splits", body, format="json")
    assert answer.status_code == 201, answer.content
    split = answer.json()
    assert [(g["node"], g["model"]) for g in split["gpus"]] == [("node-a", "H100-80GB")] * 2
    assert split["result"]["candidates"] == {"source": "free", "gpus": 2}
    assert split["result"]["feasible"]
    # one H100 leased (and placed) in vision: one left in its quota
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    broker.lease_request(actor=actor, project="vision", gpu={"kind": "whole", "model": "H100-80GB"})
    broker.schedule_cycle()
    answer = client.post("/api/v1/model-splits", body, format="json")
    assert [g["model"] for g in answer.json()["gpus"]] == ["H100-80GB"]
    # only A100s asked for, and the tenant has no A100 quota: a documented 409 naming candidates
    answer = client.post("/api/v1/model-splits", {**body, "candidates": {"free": True, "models": ["A100-80GB"]}},
                         format="json")
    assert answer.status_code == 409 and answer.json()["field"] == "candidates", answer.content
    # with an A100 quota, node-b's two A100s are candidates too; at most one node: the one with the most free GPUs
    make_quota(world.project, tier="A100-80GB", deserved=2000, limit=2000)
    answer = client.post("/api/v1/model-splits", {**body, "candidates": {"free": True, "project": "vision"}},
                         format="json")
    assert sorted(g["model"] for g in answer.json()["gpus"]) == ["A100-80GB"] * 2 + ["H100-80GB"]
    answer = client.post("/api/v1/model-splits", {**body, "candidates": {"free": True, "nodes": 1}}, format="json")
    # node-a has 3 free H100s but vision may take one more; node-b's two A100s are more
    assert {g["node"] for g in answer.json()["gpus"]} == {"node-b"}
    # another tenant counts its own quotas: globex may hold two H100s (acme's lease does not use its quota), and
    # has no A100 quota
    answer = world.client("outsider").post("/api/v1/model-splits", body, format="json")
    assert [(g["node"], g["model"]) for g in answer.json()["gpus"]] == [("node-a", "H100-80GB")] * 2


def test_a_split_on_a_tier_plans_hypothetical_gpus_packed_as_the_tiers_nodes_are(world):
    _enroll("node-a", "H100-80GB", 4, 81559)
    client = world.client("member")
    body = {"architecture": "llama-2-13b"}
    answer = client.post("/api/v1/model-splits", {**body, "candidates": {"tier": "H100-80GB", "count": 6}},
                         format="json")
    assert answer.status_code == 201, answer.content
    split = answer.json()
    assert split["result"]["candidates"] == {"source": "tier", "tier": "H100-80GB", "count": 6, "per_node": 4}
    assert [g["node"] for g in split["gpus"]] == ["H100-80GB-node-0"] * 4 + ["H100-80GB-node-1"] * 2
    assert all(g["free_mib"] == 81559 for g in split["gpus"])
    assert not Lease.objects.exists()  # planned, nothing reserved
    # a model the fleet has none of: 8 to a node; per_node given: as given
    answer = client.post("/api/v1/model-splits", {**body, "candidates": {"tier": "L4", "count": 3}}, format="json")
    assert answer.json()["result"]["candidates"]["per_node"] == 8
    answer = client.post("/api/v1/model-splits", {**body, "candidates": {"tier": "L4", "count": 3, "per_node": 1}},
                         format="json")
    assert len({g["node"] for g in answer.json()["gpus"]}) == 3


@pytest.mark.parametrize(("change", "status", "field"), [
    ({}, 422, "candidates"),  # neither gpus nor candidates
    ({"gpus": [{"model": "L4"}], "candidates": {"tier": "L4", "count": 2}}, 422, "candidates"),
    ({"candidates": {"free": True, "tier": "L4", "count": 2}}, 422, "candidates"),
    ({"candidates": {"free": False}}, 422, "candidates"),
    ({"candidates": {"tier": "L4"}}, 422, "candidates.count"),  # well formed (each field optional), the pair is not
    ({"candidates": {"tier": "Z80", "count": 2}}, 400, "candidates.tier"),
    ({"candidates": {"tier": "L4", "count": 65}}, 400, "candidates.count"),
    ({"candidates": {"free": True, "project": "nowhere"}}, 404, "candidates.project"),
    ({"candidates": {"free": True, "colour": "red"}}, 400, "candidates.colour"),
])
def test_bad_split_candidates_are_refused_naming_the_field(world, change, status, field):
    answer = world.client("member").post("/api/v1/model-splits", {"architecture": "bert-base"} | change,
                                         format="json")
    assert answer.status_code == status, answer.content
    assert answer.json()["field"] == field, answer.json()


def test_a_stage_naming_a_workload_takes_its_latency_from_the_auto_tiering_profiles(world):
    from tenants.access import Actor
    from tenants.choices import Role
    from tiering import services as tiering
    from tiering.models import Profile

    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    workload = tiering.workload_register(actor=actor, data={
        "name": "bert-serve", "architecture": "bert-base", "task": "inference", "precision": "fp16", "batch_size": 8,
        "seq_len": 128, "target_latency_ms": 50.0})
    # the engine's predictions on two slices (stand-ins for workload_predict's stored rows) ...
    for key, step in (("H100-80GB", 4.0), ("H100-80GB/mig/3g.40gb", 9.0)):
        Profile.objects.create(workload=workload, slice_key=key, tier="H100-80GB", provenance="predicted",
                               throughput=8 / step * 1000, memory_mib=4000, step_ms=step)
    # ... and a profiling lease's measurement of the whole GPU, which beats the prediction
    measured = tiering.profile_record(workload=workload, slice_key="H100-80GB", provenance="profiled",
                                      throughput=8 / 5.0 * 1000, memory_mib=4000)  # 5 ms a batch
    client = world.client("member")
    body = {"project": "vision", "name": "served", "slo_ms": 80.0, "rate_rps": 400.0, "tiers": ["H100-80GB"],
            "stages": [{"name": "embed", "workload": "bert-serve",
                        "profile": [{"tier": "H100-80GB", "kind": "share", "milli": 500, "batch": 8,
                                     "latency_ms": 30.0},
                                    {"tier": "H100-80GB", "batch": 8, "latency_ms": 99.0}]}]}
    _, plan = _plan(client, body)
    rows = {(row["slice"], row["batch"]): row["source"] for row in plan["result"]["profiles"]["embed"]}
    # measured first, else predicted; the given rows fill only the slice the workload has no profile for
    assert rows == {("H100-80GB", 8): "profiled", ("H100-80GB/mig/3g.40gb", 8): "predicted",
                    ("H100-80GB/share/500", 8): "given"}
    [stage] = plan["result"]["stages"]
    assert stage["profile_source"] == rows[(stage["slice"], stage["batch"])]
    if stage["slice"] == "H100-80GB":
        assert stage["exec_ms"] == pytest.approx(measured.step_ms) == 5.0  # not the given 99 ms nor the 4 predicted
    # a workload without profiles on the tiers, and nothing given: 422 naming the stage's workload
    tiering.workload_register(actor=actor, data={"name": "unprofiled", "architecture": "bert-base",
                                                 "task": "inference", "precision": "fp16", "batch_size": 8,
                                                 "target_latency_ms": 50.0})
    for name, field in (("unprofiled", "stages[0].workload"), ("nowhere", "stages[0].workload")):
        answer = client.post("/api/v1/pipelines", {**body, "stages": [{"name": "embed", "workload": name}]},
                             format="json")
        assert answer.status_code == 422 and answer.json()["field"] == field, answer.content
    # another tenant's workload of that name is not found
    answer = world.client("outsider").post("/api/v1/pipelines", {**body, "project": "secret"}, format="json")
    assert answer.status_code == 422 and answer.json()["field"] == "stages[0].workload"


def test_a_split_planned_on_the_gpus_free_now_is_leased_on_its_planned_node(world):
    """Its latency counts the transfers between the planned nodes: the leases are kept off every other node holding
    the model (``avoid_nodes``), so the group is placed where it was planned — here node-b, where the scheduler by
    itself puts the group on node-a, which it fills exactly — and a planned node gone since planning is a 409
    asking to plan again."""
    from django.utils import timezone

    from broker import services as broker
    from broker.models import Allocation, Gpu
    from tests.factories import make_quota

    _enroll("node-a", "H100-80GB", 2, 81559)
    _enroll("node-b", "H100-80GB", 4, 81559)
    make_quota(world.project, tier="H100-80GB", deserved=4000, limit=4000)
    client = world.client("member")
    body = {"architecture": "llama-2-13b", "candidates": {"free": True, "nodes": 1}}
    split = client.post("/api/v1/model-splits", body, format="json").json()
    assert {g["node"] for g in split["gpus"]} == {"node-b"}  # the node that can give the most
    assert split["result"]["feasible"] and {g["node"] for g in split["result"]["groups"]} == {"node-b"}
    answer = client.post(f"/api/v1/model-splits/{split['id']}/apply", {"project": "vision"}, format="json")
    assert answer.status_code in (200, 201), answer.content
    leases = Lease.objects.filter(group_key=f"model-split-{split['id']}")
    assert leases.count() == len(split["result"]["groups"])
    assert all(lease.avoid_nodes == ["node-a"] for lease in leases)
    broker.schedule_cycle()
    nodes = set(Allocation.objects.filter(lease__in=leases, freed_at__isnull=True)
                .values_list("gpu__node__node_id", flat=True))
    assert nodes == {"node-b"}
    # planned again, then the planned node loses its GPUs: applying is a 409 naming the groups, nothing leased
    split = client.post("/api/v1/model-splits", body, format="json").json()
    assert split["result"]["feasible"], split["result"]
    planned = {g["node"] for g in split["result"]["groups"]}
    Gpu.objects.filter(node__node_id__in=planned).update(lost_at=timezone.now())
    answer = client.post(f"/api/v1/model-splits/{split['id']}/apply", {"project": "vision"}, format="json")
    assert answer.status_code == 409 and answer.json()["field"] == "groups", answer.content
    assert not Lease.objects.filter(group_key=f"model-split-{split['id']}").exists()
