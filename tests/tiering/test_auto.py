"""``gpu: {"kind": "auto", "workload": ...}`` at admission, through the API and the portal's request form: the
lease asks for the slice the prediction names at the tenant's prices (the cheapest predicted to meet the target),
with the prediction and its confidence in its reason; a workload never measured is refused with ``profile_first``
and a profiling run starts; a quote previews the choice and writes nothing; bad auto bodies name the field."""

from datetime import timedelta

import pytest
from django.test import Client, TestCase
from django.utils import timezone

from billing import services as billing
from broker import services as broker
from broker.models import Gpu, Lease
from gpus.performance import estimate, slice_from_key
from tests.factories import make_quota, make_world
from tiering import services
from tiering.models import ProfilingRun, Workload

pytestmark = pytest.mark.django_db

BERT = {"name": "bert-serving", "architecture": "bert-base", "task": "inference", "precision": "int8",
        "batch_size": 8, "seq_len": 128, "target_throughput": 400.0}


@pytest.fixture(scope="module")
def trained_world(django_db_setup, django_db_blocker):
    """The world, its node, prices, the seeded reference set and a model trained on it, built once for the module
    as Django's ``TestCase.setUpTestData`` builds class data: in transactions opened for the module and rolled back
    at its end. Each test runs in a savepoint inside them (pytest-django's ``db``), so what it writes is undone as
    before; training the forest (``model_retrain``) took 3 to 10 s per test."""
    with django_db_blocker.unblock():
        atomics = TestCase._enter_atomics()
        try:
            yield _world()
        finally:
            TestCase._rollback_atomics(atomics)


@pytest.fixture
def world(trained_world, db):
    return trained_world


def _world():
    world = make_world()
    for tier in ("A100-80GB", "L4"):
        make_quota(world.project, tier=tier)
    billing.price_book_create(name="list", currency="USD", effective_from=timezone.now() - timedelta(days=1),
                              rates=[{"tier": "H100-80GB", "per_hour": "3.00"},
                                     {"tier": "A100-80GB", "per_hour": "1.80"}, {"tier": "L4", "per_hour": "0.70"}])
    token = broker.enrollment_token_create(uses=1)
    broker.node_enroll(node_id="node-a", token=token, address="http://127.0.0.1:9/n/node-a", inventory={"gpus": [
        {"index": 0, "uuid": "GPU-a100", "model": "A100-80GB", "mode": "whole", "memory_mib": 81920},
        {"index": 1, "uuid": "GPU-l4", "model": "L4", "mode": "whole", "memory_mib": 23034}]})
    services.reference_set_seed(count=40, seed=1)
    services.model_retrain()
    world.client("member").post("/api/v1/workloads", BERT, format="json")
    return world


def _measure(workload: Workload) -> None:
    """What the profiler's reference lease measures (the performance model on a whole A100-80GB)."""
    truth = estimate(services.spec_of(workload), slice_from_key("A100-80GB"))
    services.profile_record(workload=workload, slice_key="A100-80GB", provenance="profiled",
                            throughput=truth.throughput, memory_mib=truth.memory_mib, engine_active=truth.engine_active)


def _shape_of(lease: Lease) -> str:
    model = lease.models_allowed[0]
    return {"mig": f"{model}/mig/{lease.profile}", "share": f"{model}/share/{lease.milli}"}.get(lease.kind, model)


def test_auto_never_measured_is_refused_with_profile_first_and_a_profiling_run_starts(world):
    client = world.client("member")
    body = {"project": "vision", "gpu": {"kind": "auto", "workload": "bert-serving"}}
    answer = client.post("/api/v1/leases", body, format="json")
    assert answer.status_code == 409 and answer["Content-Type"].startswith("application/problem+json")
    problem = answer.json()
    assert problem["code"] == "profile_first" and problem["field"] == "gpu.workload", problem
    run = ProfilingRun.objects.get()
    assert problem["profiling_run"] == run.pk and run.state == "running"
    # the run's leases: the whole GPU of each priced model in the fleet, the reference first
    assert sorted(run.leases.values_list("slice_key", flat=True)) == ["A100-80GB", "L4"]
    again = client.post("/api/v1/leases", body, format="json").json()
    assert again["code"] == "profile_first" and "under way" in again["detail"]
    assert ProfilingRun.objects.count() == 1
    assert not Lease.objects.exclude(pk__in=run.leases.values("lease")).exists()  # no lease of its own


def test_auto_places_on_the_predicted_slice_with_its_confidence_in_the_reason(world):
    client = world.client("member")
    workload = Workload.objects.get(name="bert-serving")
    _measure(workload)
    predicted = client.post("/api/v1/workloads/bert-serving/prediction").json()
    assert not predicted["profile_first"], predicted
    chosen = predicted["chosen"]

    # a quote previews the same choice and writes nothing
    before = (Lease.objects.count(), ProfilingRun.objects.count())
    quote = client.post("/api/v1/quotes", {"project": "vision", "gpu": {"kind": "auto", "workload": "bert-serving"}},
                        format="json")
    assert quote.status_code == 200, quote.json()
    assert quote.json()["gpu"]["model"] == slice_from_key(chosen["slice"]).model
    assert (Lease.objects.count(), ProfilingRun.objects.count()) == before

    answer = client.post("/api/v1/leases", {"project": "vision", "gpu": {"kind": "auto", "workload": "bert-serving"}},
                         format="json")
    assert answer.status_code == 201, answer.json()
    lease = Lease.objects.get(pk=answer.json()["id"])
    assert _shape_of(lease) == chosen["slice"]
    assert "auto-tiering of workload 'bert-serving'" in lease.reason and "confidence" in lease.reason
    assert f"{chosen['confidence']:.0%}" in lease.reason
    first = lease.events.order_by("pk").first()
    assert "predicted" in first.reason and "confidence" in first.reason
    # truly meets the target there (the performance model is the simulated fleet's truth)
    assert estimate(services.spec_of(workload), slice_from_key(chosen["slice"])).throughput >= 400
    # the same body with the same key is the same lease; predictions were not written by the request
    again = client.post("/api/v1/leases", {"project": "vision", "gpu": {"kind": "auto", "workload": "bert-serving"}},
                        format="json", HTTP_IDEMPOTENCY_KEY="k1")
    replay = client.post("/api/v1/leases", {"project": "vision", "gpu": {"kind": "auto", "workload": "bert-serving"}},
                         format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert again.status_code == 201 and replay.status_code == 200 and again.json()["id"] == replay.json()["id"]


def test_auto_with_an_inline_target_needs_a_bigger_slice(world):
    client = world.client("member")
    workload = Workload.objects.get(name="bert-serving")
    _measure(workload)
    small = client.post("/api/v1/leases", {"project": "vision", "gpu": {"kind": "auto", "workload": "bert-serving",
                                                                       "target_throughput": 50.0}}, format="json")
    big = client.post("/api/v1/leases", {"project": "vision", "gpu": {"kind": "auto", "workload": "bert-serving",
                                                                     "target_throughput": 7600.0}}, format="json")
    assert small.status_code == 201 and big.status_code == 201, (small.json(), big.json())
    small_slice = _shape_of(Lease.objects.get(pk=small.json()["id"]))
    big_slice = _shape_of(Lease.objects.get(pk=big.json()["id"]))
    spec = services.spec_of(workload)
    # 7,600/s: more than a whole A100-80GB (6,432/s in the model) or any H100 MIG slice or share (6,876/s at
    # most) gives, less than a whole H100 (8,258/s): no cheaper slice is worth exploring
    assert estimate(spec, slice_from_key(big_slice)).throughput >= 7600
    assert estimate(spec, slice_from_key(small_slice)).throughput < 7600  # a cheaper slice for the small target
    assert "7,600/s needed" in Lease.objects.get(pk=big.json()["id"]).reason


@pytest.mark.parametrize(("gpu", "status", "field"), [
    ({"kind": "auto"}, 400, "gpu.workload"),
    ({"kind": "auto", "workload": "nope"}, 404, "gpu.workload"),
    ({"kind": "auto", "workload": "bert-serving", "model": "L4"}, 400, "gpu.model"),
    ({"kind": "auto", "workload": "bert-serving", "target_throughput": -3}, 400, "gpu.target_throughput"),
])
def test_auto_bad_bodies_name_the_field(world, gpu, status, field):
    answer = world.client("member").post("/api/v1/leases", {"project": "vision", "gpu": gpu}, format="json")
    assert answer.status_code == status and answer.json()["field"] == field, answer.json()
    assert not Lease.objects.exists()


def test_auto_through_the_portal_request_form(world):
    workload = Workload.objects.get(name="bert-serving")
    _measure(workload)
    chosen = services.workload_predict(workload=workload, store=False).option.slice.key
    browser = Client()
    browser.force_login(world.member)
    page = browser.get("/leases/new")
    assert 'value="auto"' in page.content.decode() and "bert-serving" in page.content.decode()
    answer = browser.post("/leases/new", {"project": "vision", "gpu.kind": "auto", "gpu.workload": "bert-serving",
                                          "gpu.gang": "true", "workload_class": "inference",
                                          "duration_seconds": "3600", "idempotency_key": "form-1"})
    assert answer.status_code == 302, answer.content.decode()[:2000]
    lease = Lease.objects.get(idempotency_key="form-1")
    assert _shape_of(lease) == chosen and "auto-tiering" in lease.reason
    # a bad inline target is shown next to its field
    page = browser.post("/leases/new", {"project": "vision", "gpu.kind": "auto", "gpu.workload": "bert-serving",
                                        "gpu.target_throughput": "fast", "duration_seconds": "3600"})
    assert page.status_code == 400 and 'id="err-gpu_target_throughput"' in page.content.decode()


def test_workload_profile_page_charts_throughput_and_price_per_slice_with_the_recommendation(world):
    """The portal's profile page: an SVG row per slice (measured or predicted), cheapest first, the recommended
    slice highlighted and the target drawn; the list links to it; another tenant gets 404."""
    import re

    workload = Workload.objects.get(name="bert-serving")
    _measure(workload)
    world.client("member").post("/api/v1/workloads/bert-serving/prediction")  # stores the predicted profiles
    chosen = services.workload_predict(workload=workload, store=False).option.slice.key
    browser = Client()
    browser.force_login(world.member)
    listing = browser.get("/workloads/").content.decode()
    assert 'href="/workloads/bert-serving"' in listing
    page = browser.get("/workloads/bert-serving").content.decode()
    start = page.index('<svg class="tier-chart"')
    svg = page[start:page.index("</svg>", start)]
    rows = re.findall(r'<g class="tier-row([^"]*)" data-slice="([^"]+)"', svg)
    offered = {s.key for s, _ in services.tenant_slice_prices(tenant=world.acme)}
    assert {key for _, key in rows} == offered
    assert [key for classes, key in rows if "recommended" in classes] == [chosen]
    assert "★ recommended" in svg and 'class="target"' in svg and "(profiled)" in svg
    # a predicted bar says what it rests on: the A100 measurement scaled (measured beats modelled)
    assert "(scaled from A100-80GB measurement)" in svg and "(predicted)" not in svg
    assert "A100-80GB" in page and "profiled" in page  # the measurement table
    outsider = Client()
    outsider.force_login(world.outsider)
    assert outsider.get("/workloads/bert-serving").status_code == 404


def test_a_profiling_run_starts_from_the_workload_page(world):
    browser = Client()
    browser.force_login(world.member)
    answer = browser.post("/workloads/bert-serving/profile", {"project": "vision"})
    assert answer.status_code == 302
    run = ProfilingRun.objects.get()
    assert sorted(run.leases.values_list("slice_key", flat=True)) == ["A100-80GB", "L4"]
    again = browser.post("/workloads/bert-serving/profile", {"project": "vision"})
    assert again.status_code == 409 and "being profiled already" in again.content.decode()
    viewer = Client()
    viewer.force_login(world.viewer)
    assert viewer.post("/workloads/bert-serving/profile", {"project": "vision"}).status_code == 403
    assert ProfilingRun.objects.count() == 1


def test_the_tiering_decision_outlives_placement_on_the_lease_api_and_portal(world):
    """The scheduler rewrites a lease's reason as it moves it (placed, provisioning, running); the prediction
    that chose its slice stays on the lease as its ``decision``, in the API and on the portal's page."""
    client = world.client("member")
    _measure(Workload.objects.get(name="bert-serving"))
    answer = client.post("/api/v1/leases", {"project": "vision", "gpu": {"kind": "auto", "workload": "bert-serving"}},
                         format="json")
    assert answer.status_code == 201, answer.json()
    body = answer.json()
    assert body["decision"].startswith("auto-tiering of workload 'bert-serving'") and "confidence" in body["decision"]
    lease = Lease.objects.get(pk=body["id"])
    assert lease.kind in ("whole", "share"), _shape_of(lease)  # the demo node's GPUs serve these two kinds
    if lease.kind == "share":  # the GPU of its model serves shares
        Gpu.objects.filter(model=lease.models_allowed[0]).update(mode="shared")
    counts = broker.schedule_cycle()
    assert counts["placed"] == 1, (counts, _shape_of(lease))
    lease = Lease.objects.get(pk=body["id"])
    assert lease.state != "queued" and "auto-tiering" not in lease.reason  # the scheduler's reason replaced it
    assert lease.decision == body["decision"]
    shown = client.get(f"/api/v1/leases/{lease.pk}").json()
    assert shown["decision"] == body["decision"] and shown["reason"] == lease.reason
    browser = Client()
    browser.force_login(world.member)
    page = browser.get(f"/leases/{lease.pk}").content.decode()
    assert "Shape chosen by" in page and "auto-tiering of workload &#x27;bert-serving&#x27;" in page
    # a lease whose shape was asked for outright has no decision, and the page shows no such line
    plain = client.post("/api/v1/leases", {"project": "vision", "gpu": {"kind": "whole", "model": "L4"}},
                        format="json")
    assert plain.status_code == 201 and plain.json()["decision"] == ""
    assert "Shape chosen by" not in browser.get(f"/leases/{plain.json()['id']}").content.decode()


def test_exploring_refuses_with_profile_first_and_profiles_the_cheaper_candidates(world, monkeypatch):
    """When the engine is confident of one slice but a cheaper one might do, the request is refused with
    ``profile_first`` and the profiling run measures exactly those cheaper slices (not the default whole GPUs)."""
    from tiering.engine.decide import Decision, Option

    _measure(Workload.objects.get(name="bert-serving"))
    # the fleet must hold the cheaper slices (L4 shares: an L4 in shared mode), or they are no candidates (issue 29)
    shared_l4 = {"index": 0, "uuid": "GPU-l4-shared", "model": "L4", "mode": "shared", "memory_mib": 23034}
    broker.node_enroll(node_id="node-s", token=broker.enrollment_token_create(uses=1),
                       address="http://127.0.0.1:9/n/node-s", inventory={"gpus": [shared_l4]})
    confident = Option(slice_from_key("A100-80GB"), 1.8, 3000.0, 2000, 0.9)
    cheaper = (slice_from_key("L4/share/250"), slice_from_key("L4/share/500"))
    monkeypatch.setattr(services, "workload_predict", lambda **_: Decision(
        confident, 400.0, True, "cheaper slices might do: profile first", cheaper))
    answer = world.client("member").post(
        "/api/v1/leases", {"project": "vision", "gpu": {"kind": "auto", "workload": "bert-serving"}}, format="json")
    assert answer.status_code == 409 and answer.json()["code"] == "profile_first", answer.json()
    run = ProfilingRun.objects.get(pk=answer.json()["profiling_run"])
    assert sorted(run.leases.values_list("slice_key", flat=True)) == ["L4/share/250", "L4/share/500"]
    assert all(Lease.objects.get(pk=item.lease_id).profiling for item in run.leases.all())
    prediction = world.client("member").post("/api/v1/workloads/bert-serving/prediction").json()
    assert prediction["explore"] == ["L4/share/250", "L4/share/500"] and prediction["profile_first"]
