"""A workload's regime and measured beats modelled in the tier decision, against PostgreSQL (docs/tiering.md §3, §8):
the regime registered, set and inferred (API and portal, errors naming the field, the outsider 404); a slice the
workload was not measured on is decided from ``gpus.measured.fill`` (the nearest measurement scaled in the workload's
regime), each slice saying what it rests on; a host-bound workload is not promoted to a bigger GPU."""

from dataclasses import replace
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from billing import services as billing
from gpus.measured import fill
from gpus.performance import estimate, slice_from_key, whole
from tenants.access import Actor
from tenants.choices import Role
from tenants.models import AuditEvent
from tests.factories import make_world
from tiering import services
from tiering.models import Profile, Provenance, Workload

pytestmark = pytest.mark.django_db

BERT = {"name": "bert-serving", "architecture": "bert-base", "task": "inference", "precision": "int8",
        "batch_size": 8, "seq_len": 128, "target_throughput": 400.0}
# tinyllama decoding one sequence eagerly: the host dispatching its operations is the step on an A100 or an H100
LLAMA = {"name": "llama-chat", "architecture": "tinyllama-1.1b", "task": "generation", "precision": "bf16",
         "batch_size": 1, "seq_len": 512, "target_throughput": 62.0}


@pytest.fixture
def world():
    return make_world()


@pytest.fixture
def trained():
    billing.price_book_create(name="list", currency="USD", effective_from=timezone.now() - timedelta(days=1),
                              rates=[{"tier": "H100-80GB", "per_hour": "3.00"},
                                     {"tier": "A100-80GB", "per_hour": "1.80"}, {"tier": "L4", "per_hour": "0.70"}])
    services.reference_set_seed(count=40, seed=1)
    assert services.model_retrain() is not None


def _measure(workload, slice_key: str, spec) -> Profile:
    """A profiling lease's figures on ``slice_key``: the performance model's in ``spec``'s regime."""
    truth = estimate(spec, slice_from_key(slice_key))
    return services.profile_record(workload=workload, slice_key=slice_key, provenance="profiled",
                                   throughput=truth.throughput, memory_mib=truth.memory_mib,
                                   engine_active=truth.engine_active)


def test_regime_registered_set_and_inferred(world):
    client = world.client("member")
    answer = client.post("/api/v1/workloads", {**LLAMA, "regime": "sideways"}, format="json")
    assert answer.status_code == 400 and answer["Content-Type"].startswith("application/problem+json")
    assert answer.json()["field"] == "regime"
    answer = client.post("/api/v1/workloads", LLAMA, format="json")
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["regime"] == "" and body["regime_in_use"] == "engine" and "no measured" in body["regime_source"]

    # measured on an A100 with the engine idle 69 % of the step: the eager regime's activity, not the engine's
    workload = Workload.objects.get(name="llama-chat")
    eager = replace(services.spec_of(workload), regime="eager")
    _measure(workload, "A100-80GB", eager)
    body = client.get("/api/v1/workloads/llama-chat").json()
    assert body["regime_in_use"] == "eager" and "A100-80GB" in body["regime_source"], body

    answer = client.patch("/api/v1/workloads/llama-chat", {"regime": "engine"}, format="json")
    assert answer.status_code == 200 and answer.json()["regime_in_use"] == "engine", answer.content
    assert answer.json()["regime_source"] == "registered"
    assert AuditEvent.objects.filter(action="tiering.workload_regime_set", target="llama-chat").exists()
    unchanged = client.patch("/api/v1/workloads/llama-chat", {}, format="json")
    assert unchanged.status_code == 200 and unchanged.json()["regime"] == "engine"
    bad = client.patch("/api/v1/workloads/llama-chat", {"regime": "turbo"}, format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "regime"
    assert world.client("outsider").patch("/api/v1/workloads/llama-chat", {"regime": "eager"},
                                          format="json").status_code == 404
    assert world.client("viewer").patch("/api/v1/workloads/llama-chat", {"regime": "eager"},
                                        format="json").status_code == 403
    assert Workload.objects.get(name="llama-chat").regime == "engine"

    # the portal's form sets it back to inferred, and the page says which regime is in use and how it is known
    portal = Client()
    portal.force_login(world.member)
    page = portal.post("/workloads/llama-chat/regime", {"regime": "eager"})
    assert page.status_code == 302 and Workload.objects.get(name="llama-chat").regime == "eager"
    page = portal.post("/workloads/llama-chat/regime", {"regime": ""})
    assert page.status_code == 302, page.content[:500]
    assert Workload.objects.get(name="llama-chat").regime == ""
    html = portal.get("/workloads/llama-chat").content.decode()
    assert 'data-regime="eager"' in html and "inferred from the engine activity measured on A100-80GB" in html
    # null through the API infers it as well
    client.patch("/api/v1/workloads/llama-chat", {"regime": "engine"}, format="json")
    again = client.patch("/api/v1/workloads/llama-chat", {"regime": None}, format="json").json()
    assert again["regime"] == "" and again["regime_in_use"] == "eager", again


def test_unmeasured_slices_are_decided_from_the_nearest_measurement_scaled(world, trained):
    client = world.client("member")
    client.post("/api/v1/workloads", BERT, format="json")
    workload = Workload.objects.get(name="bert-serving")
    spec = services.spec_of(workload)
    _measure(workload, "A100-80GB", spec)
    # the L4 measured too, 20 % slower than the model says: slices nearer the L4 than the A100 scale from it
    truth = estimate(spec, whole("L4"))
    services.profile_record(workload=workload, slice_key="L4", provenance="profiled",
                            throughput=truth.throughput * 0.8, memory_mib=truth.memory_mib,
                            engine_active=truth.engine_active)

    answer = client.post("/api/v1/workloads/bert-serving/prediction").json()
    assert answer["regime"] == "engine"
    slices = {row["slice"]: row for row in answer["slices"]}
    assert slices["A100-80GB"]["basis"] == "measured" and slices["L4"]["basis"] == "measured"
    measured = {p.slice_key: (p.throughput, p.memory_mib, p.engine_active)
                for p in Profile.objects.filter(workload=workload).exclude(provenance=Provenance.PREDICTED)}
    scaled_from = set()
    for key, row in slices.items():
        if key in measured:
            continue
        expected = fill(services.spec_run(workload), slice_from_key(key), measured)
        assert row["basis"] == f"{expected.source} measurement", row
        assert row["throughput"] == pytest.approx(expected.throughput), row
        scaled_from.add(expected.source)
    assert scaled_from == {"scaled from A100-80GB", "scaled from L4"}
    # a share of the L4 is the L4's measurement scaled (0.8 of the model's), not the model's own figure
    half = slices["L4/share/500"]
    assert half["basis"] == "scaled from L4 measurement"
    assert half["throughput"] == pytest.approx(0.8 * estimate(spec, slice_from_key("L4/share/500")).throughput,
                                               rel=1e-6)
    chosen = answer["chosen"]
    assert chosen is not None and chosen["basis"] in (slices[chosen["slice"]]["basis"],)
    assert chosen["basis"] in answer["reason"], answer["reason"]
    # the stored predictions say what each rests on, and the workload's page lists them
    stored = {p.slice_key: p.basis for p in Profile.objects.filter(workload=workload, provenance=Provenance.PREDICTED)}
    assert stored["L4/share/500"] == "scaled from L4 measurement" and stored["A100-80GB"] == "measured"
    assert world.client("outsider").post("/api/v1/workloads/bert-serving/prediction").status_code == 404


def test_a_host_bound_workload_is_not_promoted_to_a_bigger_gpu(world, trained):
    client = world.client("member")
    client.post("/api/v1/workloads", LLAMA, format="json")
    workload = Workload.objects.get(name="llama-chat")
    eager = replace(services.spec_of(workload), regime="eager")
    seen = _measure(workload, "A100-80GB", eager)  # host-bound there: 61 tokens/s for 62 needed
    assert estimate(eager, whole("A100-80GB")).bound == "host" and seen.throughput < 62

    # its regime inferred from the measured engine activity: eager; a whole H100 is no faster
    decision = services.workload_predict(workload=workload, store=False)
    h100 = next(o for o in decision.options if o.slice.key == "H100-80GB")
    assert h100.basis == "scaled from A100-80GB measurement"
    assert h100.throughput == pytest.approx(seen.throughput, rel=0.02)
    threshold = services.model_threshold(services.model_current()[0])
    assert h100.confidence < threshold
    assert decision.option is None or decision.profile_first or decision.option.slice.model != "H100-80GB"
    assert not any(o.confidence >= threshold for o in decision.options), [(o.slice.key, o.confidence)
                                                                          for o in decision.options]

    # registered as an engine (the same measurement read as a replayed graph's), the H100 is expected to meet the
    # target: the regime, not the measurement, is what keeps the eager one off it
    member = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    services.workload_regime_set(actor=member, workload=workload, regime="engine")
    engine = services.workload_predict(workload=workload, store=False)
    faster = next(o for o in engine.options if o.slice.key == "H100-80GB")
    assert faster.basis == "scaled from A100-80GB measurement"
    assert faster.throughput >= 1.2 * seen.throughput and faster.throughput > 62
    assert faster.confidence > 0.5 > h100.confidence

