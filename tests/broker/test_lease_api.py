"""Lease API rules that need no worker: tenant isolation, roles, filters, state conflicts, the schema."""

import pytest

from broker import services
from broker.choices import LeaseState
from broker.models import Lease, LeaseEvent
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_world


@pytest.fixture
def world(db):
    return make_world()


def _lease(world, **gpu):
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease, _ = services.lease_request(actor=actor, project="vision", gpu=gpu or {"kind": "whole"})
    return lease


@pytest.mark.parametrize(("method", "path"), [("get", ""), ("delete", ""), ("post", "/renew")])
def test_lease_api_other_tenant_gets_404_and_nothing_changes(world, method, path):
    lease = _lease(world)
    response = getattr(world.client("outsider"), method)(f"/api/v1/leases/{lease.pk}{path}",
                                                         {"duration_seconds": 600}, format="json")
    assert response.status_code == 404
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.QUEUED
    assert world.client("outsider").get("/api/v1/leases").json()["count"] == 0


def test_lease_api_list_filters_and_validates_state(world):
    _lease(world)
    released = _lease(world, kind="mig", profile="1g.10gb")
    services.lease_release(lease=released, actor="test")
    client = world.client("viewer")
    assert client.get("/api/v1/leases").json()["count"] == 2
    assert [x["id"] for x in client.get("/api/v1/leases?state=released").json()["results"]] == [released.pk]
    bad = client.get("/api/v1/leases?state=sleeping")
    assert bad.status_code == 400 and bad.json()["field"] == "state"


def test_lease_api_release_of_a_queued_lease_is_immediate_and_idempotent(world):
    lease = _lease(world)
    client = world.client("member")
    first = client.delete(f"/api/v1/leases/{lease.pk}")
    second = client.delete(f"/api/v1/leases/{lease.pk}")
    assert (first.status_code, second.status_code) == (202, 202)
    assert first.json()["state"] == second.json()["state"] == "released"
    assert list(LeaseEvent.objects.filter(lease=lease).values_list("to_state", flat=True)) == [
        "requested", "queued", "released"]


def test_lease_api_renew_needs_an_active_lease(world):
    lease = _lease(world)
    response = world.client("member").post(f"/api/v1/leases/{lease.pk}/renew", {"duration_seconds": 600},
                                           format="json")
    assert response.status_code == 409 and response.json()["field"] == "state"


def test_lease_events_are_append_only(world):
    from django.db import IntegrityError, transaction

    lease = _lease(world)
    with pytest.raises(IntegrityError), transaction.atomic():
        LeaseEvent.objects.filter(lease=lease).update(reason="rewritten")


def test_lease_api_is_in_the_openapi_schema(world):
    schema = world.client("member").get("/api/schema/?format=json").json()
    assert {"/api/v1/leases", "/api/v1/leases/{id}", "/api/v1/leases/{id}/renew"} <= set(schema["paths"])


def test_lease_api_openapi_document_validates_without_warnings(db, tmp_path):
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))
    assert "/api/v1/leases" in (tmp_path / "schema.yaml").read_text()


@pytest.mark.parametrize(("body", "status", "field"), [
    ({"project": "vision", "gpu": {"kind": "share", "milli": 0, "memory_mib": 1024}}, 400, "gpu.milli"),
    ({"project": "vision", "gpu": {"kind": "share", "milli": 1000, "memory_mib": 1024}}, 400, "gpu.milli"),
    ({"project": "vision", "gpu": {"kind": "share", "milli": 250}}, 400, "gpu.memory_mib"),
    ({"project": "vision", "gpu": {"kind": "whole", "gang": "yes"}}, 400, "gpu.gang"),
    ({"project": "vision", "gpu": {"kind": "whole", "colour": "red"}}, 400, "gpu.colour"),
    ({"project": "vision", "gpu": {"kind": "whole", "profile": "1g.10gb"}}, 400, "gpu.profile"),
    ({"project": "vision", "gpu": {"kind": "mig"}}, 400, "gpu.profile"),
    ({"project": "vision", "gpu": "a100"}, 400, "gpu"),
    ({"project": "vision", "gpu": {"kind": "whole", "count": 65}}, 400, "gpu.count"),
    # elastic leases (issue 32 item 6): 1 <= min_count <= count, whole GPUs and shares only
    ({"project": "vision", "gpu": {"kind": "whole", "count": 2, "min_count": 3}}, 400, "gpu.min_count"),
    ({"project": "vision", "gpu": {"kind": "whole", "count": 2, "min_count": 0}}, 400, "gpu.min_count"),
    ({"project": "vision", "gpu": {"kind": "whole", "count": 2, "min_count": "1"}}, 400, "gpu.min_count"),
    ({"project": "vision", "gpu": {"kind": "mig", "profile": "1g.10gb", "count": 2, "min_count": 1}}, 400,
     "gpu.min_count"),
    ({"project": "vision", "gpu": {"kind": "whole"}, "priority": 1000}, 400, "priority"),
    ({"project": "vision", "gpu": {"kind": "whole"}, "workload_class": "mining"}, 400, "workload_class"),
    ({"project": "vision", "gpu": {"kind": "whole"}, "duration_seconds": 10**9}, 400, "duration_seconds"),
    ({"project": "vision", "gpu": {"kind": "whole"}, "extra": 1}, 400, "extra"),
    ({"project": "nowhere", "gpu": {"kind": "whole"}}, 404, "project"),
    ({"project": "vision", "gpu": {"kind": "whole", "model": "L4"}}, 409, "gpu"),  # no L4 quota
])
def test_lease_api_every_bad_request_names_its_field_and_writes_nothing(world, body, status, field):
    response = world.client("member").post("/api/v1/leases", body, format="json")
    assert response.status_code == status, response.json()
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["field"] == field
    assert not Lease.objects.exists()


def test_lease_api_an_elastic_lease_keeps_its_minimum(world):
    response = world.client("member").post("/api/v1/leases", {"project": "vision", "gpu": {
        "kind": "share", "milli": 250, "memory_mib": 1024, "count": 2, "min_count": 1}}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["gpu"]["min_count"] == 1 and Lease.objects.get().min_count == 1
    response = world.client("member").post("/api/v1/leases", {"project": "vision", "gpu": {"kind": "whole"}},
                                           format="json")
    assert "min_count" not in response.json()["gpu"] and Lease.objects.latest("pk").min_count == 0


def test_lease_api_suspended_tenant_cannot_request(world):
    from tenants import services as tenant_services

    tenant_services.tenant_set_status(tenant=world.acme, status="suspended")
    response = world.client("member").post("/api/v1/leases", {"project": "vision", "gpu": {"kind": "whole"}},
                                           format="json")
    assert response.status_code == 403 and not Lease.objects.exists()


def test_lease_api_body_must_be_an_object(world):
    response = world.client("member").post("/api/v1/leases", ["whole"], format="json")
    assert response.status_code == 400 and response.json()["field"] == "body"


def test_lease_api_renew_means_from_now_and_the_fields_agree(world):
    """Renewing for 7,200 s ends the lease 7,200 s after the renewal; its duration_seconds becomes the whole
    planned length, so active_at + duration_seconds == ends_at before and after."""
    from datetime import timedelta

    from django.utils import timezone

    lease = _lease(world)
    started = timezone.now() - timedelta(seconds=1800)
    Lease.objects.filter(pk=lease.pk).update(state=LeaseState.ACTIVE, active_at=started,
                                             ends_at=started + timedelta(seconds=3600), duration_seconds=3600)
    response = world.client("member").post(f"/api/v1/leases/{lease.pk}/renew", {"duration_seconds": 7200},
                                           format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    lease.refresh_from_db()
    assert abs((lease.ends_at - timezone.now()).total_seconds() - 7200) < 5
    assert lease.active_at + timedelta(seconds=lease.duration_seconds) == lease.ends_at
    assert body["duration_seconds"] == lease.duration_seconds and abs(lease.duration_seconds - 9000) <= 1
    assert "7200 s from the renewal" in lease.events.order_by("-pk").first().reason


def test_a_request_no_node_could_ever_hold_is_refused_by_field(world):
    """Ten 7g.80gb slices as a gang where the largest node has 2 H100s: 422 on gpu.count, nothing written;
    spread (gang false) over a fleet that holds them, the same request queues."""
    from broker.models import Gpu

    token = services.enrollment_token_create(uses=2)
    for node in ("node-a", "node-b"):
        services.node_enroll(node_id=node, token=token, address=f"http://127.0.0.1:9/n/{node}", inventory={
            "gpus": [{"index": i, "uuid": f"GPU-{node}-{i}", "model": "H100-80GB", "mode": "mig",
                      "memory_mib": 81559} for i in range(2)]})
    assert Gpu.objects.count() == 4
    from tests.factories import make_quota

    make_quota(world.project, deserved=8000, limit=16000)
    client = world.client("member")
    before = Lease.objects.count()
    body = {"project": "vision", "gpu": {"kind": "mig", "profile": "7g.80gb", "count": 10, "model": "H100-80GB"}}
    response = client.post("/api/v1/leases", body, format="json")
    assert response.status_code in (400, 422) and response.json()["field"] == "gpu.count", response.content
    assert "at most 2" in response.json()["detail"] and Lease.objects.count() == before
    spread = {"project": "vision", "gpu": {"kind": "mig", "profile": "7g.80gb", "count": 4, "gang": False,
                                           "model": "H100-80GB"}}
    assert client.post("/api/v1/leases", spread, format="json").status_code == 201
    gang = {"project": "vision", "gpu": {"kind": "mig", "profile": "1g.10gb", "count": 14, "model": "H100-80GB"}}
    assert client.post("/api/v1/leases", gang, format="json").status_code == 201  # 2 GPUs x 7 on one node
    gang["gpu"]["count"] = 15
    assert client.post("/api/v1/leases", gang, format="json").json()["field"] == "gpu.count"


def test_waiting_reasons_name_the_project_by_slug(world):
    """A request on a model its project has no quota for waits with the project's slug in the reason, not the
    scheduler's internal id."""
    from tenants import services as tenant_services

    token = services.enrollment_token_create(uses=1)
    services.node_enroll(node_id="node-a", token=token, address="http://127.0.0.1:9/n/node-a", inventory={
        "gpus": [{"index": 0, "uuid": "GPU-a100", "model": "A100-80GB", "mode": "whole", "memory_mib": 81920}]})
    tenant_services.tenant_quota_set(tenant=world.acme, tier="A100-80GB", deserved_gpu_milli=1000,
                                     limit_gpu_milli=1000)
    lease = _lease(world, kind="whole")  # auto: the H100 quota has no GPU, the A100 GPU has no project quota
    services.schedule_cycle()
    lease.refresh_from_db()
    assert lease.state == LeaseState.QUEUED, lease.reason
    assert "project 'vision' has no quota for A100-80GB" in lease.reason, lease.reason
    assert f"project {world.project.pk} " not in lease.reason


def test_a_reclaim_reason_names_no_other_tenants_lease(world, settings):
    """globex's in-quota request reclaims acme's over-quota whole GPU: globex is told a lease was given notice,
    not acme's lease id or project."""
    from django.utils import timezone

    settings.LEASE_MIN_RUNTIME_SECONDS = 0
    token = services.enrollment_token_create(uses=1)
    services.node_enroll(node_id="node-a", token=token, address="http://127.0.0.1:9/n/node-a", inventory={
        "gpus": [{"index": 0, "uuid": "GPU-h100", "model": "H100-80GB", "mode": "whole", "memory_mib": 81559}]})
    from tenants import services as tenant_services

    tenant_services.quota_set(project=world.project, tier="H100-80GB", deserved_gpu_milli=0, limit_gpu_milli=1000)
    over = _lease(world, kind="whole")
    services.schedule_cycle()
    allocation = over.allocations.get()
    services.allocation_ready(allocation=allocation, instance={}, now=timezone.now())
    assert allocation.preemptible
    actor = Actor(user=world.outsider, tenant=world.globex, role=Role.OWNER)
    mine, _ = services.lease_request(actor=actor, project="secret", gpu={"kind": "whole"})
    services.schedule_cycle()
    mine.refresh_from_db()
    assert "1 over-quota lease(s) given notice" in mine.reason, mine.reason
    assert f"lease {over.pk}" not in mine.reason and f"{over.pk} (" not in mine.reason
    assert "vision" not in mine.reason and "in quota on H100-80GB" in mine.reason


def test_model_auto_ranks_models_by_the_price_book(world):
    """An 8 GB share-free whole-GPU request with model auto: the T4 (16 GB) and the L4 (24 GB) both serve it;
    with the L4 cheaper in the general book, auto takes the L4 and says why."""
    from datetime import timedelta

    from django.utils import timezone

    from billing import services as billing
    from tenants import services as tenant_services

    billing.price_book_create(name="list", currency="USD", effective_from=timezone.now() - timedelta(days=1),
                              rates=[{"tier": "T4", "per_hour": "0.90"}, {"tier": "L4", "per_hour": "0.80"}])
    token = services.enrollment_token_create(uses=1)
    services.node_enroll(node_id="node-a", token=token, address="http://127.0.0.1:9/n/node-a", inventory={"gpus": [
        {"index": 0, "uuid": "GPU-t4", "model": "T4", "mode": "whole", "memory_mib": 15360},
        {"index": 1, "uuid": "GPU-l4", "model": "L4", "mode": "whole", "memory_mib": 23034}]})
    for tier in ("T4", "L4"):
        tenant_services.tenant_quota_set(tenant=world.acme, tier=tier, deserved_gpu_milli=1000, limit_gpu_milli=1000)
        tenant_services.quota_set(project=world.project, tier=tier, deserved_gpu_milli=1000, limit_gpu_milli=1000)
    lease = _lease(world, kind="whole", memory_mib=8192)
    services.schedule_cycle()
    lease.refresh_from_db()
    assert lease.tier == "L4", lease.reason
    # the price with its currency and decimals (it read "at 80 per GPU-hour": minor units, no currency)
    assert "auto: L4 at 0.80 USD per GPU-hour" in lease.reason


def test_a_preempted_lease_is_not_told_another_tenants_lease(world, settings):
    """acme's over-quota lease is reclaimed by globex: its reason says 'another tenant', no lease id."""
    from django.utils import timezone

    from tenants import services as tenant_services

    settings.LEASE_MIN_RUNTIME_SECONDS = 0
    token = services.enrollment_token_create(uses=1)
    services.node_enroll(node_id="node-a", token=token, address="http://127.0.0.1:9/n/node-a", inventory={
        "gpus": [{"index": 0, "uuid": "GPU-h100", "model": "H100-80GB", "mode": "whole", "memory_mib": 81559}]})
    tenant_services.quota_set(project=world.project, tier="H100-80GB", deserved_gpu_milli=0, limit_gpu_milli=1000)
    over = _lease(world, kind="whole")
    services.schedule_cycle()
    services.allocation_ready(allocation=over.allocations.get(), instance={}, now=timezone.now())
    actor = Actor(user=world.outsider, tenant=world.globex, role=Role.OWNER)
    mine, _ = services.lease_request(actor=actor, project="secret", gpu={"kind": "whole"})
    services.schedule_cycle()
    over.refresh_from_db()
    assert over.state == LeaseState.PREEMPTED, over.reason
    assert "for in-quota work (another tenant)" in over.reason and f"lease {mine.pk}" not in over.reason
