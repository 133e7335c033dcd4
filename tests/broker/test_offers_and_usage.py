"""Offers (free capacity per model) and quota usage follow the allocations the scheduler writes."""

import pytest

from broker import services
from broker.models import Allocation
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_world

H100 = {"index": 0, "uuid": "GPU-h100-0", "model": "H100-80GB", "mode": "mig", "memory_mib": 81559}
A100 = {"index": 1, "uuid": "GPU-a100-0", "model": "A100-80GB", "mode": "whole", "memory_mib": 81920}


@pytest.fixture
def world(db):
    world = make_world()
    token = services.enrollment_token_create()
    services.node_enroll(node_id="n1", token=token, address="http://127.0.0.1:9/n/n1", inventory={"gpus": [H100, A100]})
    return world


def test_offers_and_quota_usage_follow_placements(world):
    client = world.client("member")
    offers = {o["model"]: o for o in client.get("/api/v1/offers").json()["offers"]}
    assert offers["A100-80GB"]["whole"] == {"gpus": 1, "free": 1}
    free = {m["profile"]: m["free"] for m in offers["H100-80GB"]["mig"]}
    assert (free["1g.10gb"], free["3g.40gb"], free["7g.80gb"]) == (7, 2, 1)

    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease, _ = services.lease_request(actor=actor, project="vision", gpu={"kind": "mig", "profile": "3g.40gb"})
    assert services.schedule_cycle()["placed"] == 1
    allocation = Allocation.objects.get(lease=lease)
    assert (allocation.mig_profile, allocation.milli) == ("3g.40gb", 428)

    offers = {o["model"]: o for o in client.get("/api/v1/offers").json()["offers"]}
    free = {m["profile"]: m["free"] for m in offers["H100-80GB"]["mig"]}
    assert (free["3g.40gb"], free["4g.40gb"], free["7g.80gb"]) == (1, int(allocation.mig_start == 4), 0)
    quotas = client.get("/api/v1/quotas").json()
    [vision] = [q for q in quotas["projects"] if q["tier"] == "H100-80GB"]
    assert (vision["in_use_gpu_milli"], vision["over_quota_in_use_gpu_milli"]) == (428, 0)
    [tenant] = [q for q in quotas["tenant"] if q["tier"] == "H100-80GB"]
    assert tenant["in_use_gpu_milli"] == 428
    # the outsider sees its own (empty) usage, never acme's
    outsider = world.client("outsider").get("/api/v1/quotas").json()
    assert all(q["in_use_gpu_milli"] == 0 for q in outsider["projects"] + outsider["tenant"])


def test_enrollment_refuses_a_spent_token_and_names_bad_inventory(world):
    token = services.enrollment_token_create(uses=1)
    services.node_enroll(node_id="n2", token=token, address="http://127.0.0.1:9/n/n2", inventory={"gpus": []})
    client = world.client("member")
    body = {"node_id": "n3", "token": token, "address": "http://127.0.0.1:9/n/n3", "inventory": {"gpus": []}}
    response = client.post("/api/v1/agents/enroll", body, format="json")
    assert response.status_code == 401 and response.json()["field"] == "token"
    fresh = services.enrollment_token_create()
    bad = client.post("/api/v1/agents/enroll", {**body, "token": fresh, "inventory": {"gpus": [{"uuid": "x"}]}},
                      format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "inventory.gpus[0]"


def test_heartbeat_must_be_signed(world):
    from agent.protocol import sign
    from broker.models import Node

    client = world.client("member")
    unsigned = client.post("/api/v1/agents/n1/heartbeat", {}, format="json")
    assert unsigned.status_code == 401
    node = Node.objects.get(node_id="n1")
    body = b"{}"
    headers = sign(node.secret, "n1", "POST", "/api/v1/agents/n1/heartbeat", body)
    signed = client.generic("POST", "/api/v1/agents/n1/heartbeat", body, content_type="application/json",
                            **{f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()})
    assert signed.status_code == 200
    forged = sign("wrong", "n1", "POST", "/api/v1/agents/n1/heartbeat", body)
    refused = client.generic("POST", "/api/v1/agents/n1/heartbeat", body, content_type="application/json",
                             **{f"HTTP_{k.upper().replace('-', '_')}": v for k, v in forged.items()})
    assert refused.status_code == 401


def test_preemption_notice_is_the_victims_slo_contract(world, settings):
    from datetime import timedelta
    from decimal import Decimal

    from django.utils import timezone

    from broker.models import Lease
    from tenants import services as tenant_services
    from tests.factories import make_project, make_quota

    settings.LEASE_MIN_RUNTIME_SECONDS = 0
    now = timezone.now()
    tenant_services.slo_contract_create(
        tenant=world.acme, name="gold", effective_from=now - timedelta(days=1), effective_to=None,
        time_to_gpu_p95_seconds=60, availability_target_pct=Decimal("99.5"), preemption_notice_seconds=300,
        credit_steps=[])
    make_quota(world.project, "A100-80GB", deserved=0, limit=1000, tenant_deserved=1000, tenant_limit=2000)
    nlp = make_project(world.acme, "nlp")
    make_quota(nlp, "A100-80GB", deserved=1000, limit=1000, tenant_deserved=1000, tenant_limit=2000)
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    borrowed, _ = services.lease_request(actor=actor, project="vision", gpu={"kind": "whole", "model": "A100-80GB"})
    services.schedule_cycle()
    allocation = Allocation.objects.get(lease=borrowed)
    services.allocation_ready(allocation=allocation, instance={"device_uuid": "GPU-a100-0"}, now=timezone.now())
    assert Lease.objects.get(pk=borrowed.pk).state == "active"
    claim, _ = services.lease_request(actor=actor, project="nlp", gpu={"kind": "whole", "model": "A100-80GB"})
    assert services.schedule_cycle()["preempt"] == 1
    victim = Lease.objects.get(pk=borrowed.pk)
    assert victim.state == "preempted"
    notice = (victim.notice_deadline - victim.events.last().at).total_seconds()
    assert notice == 300
    assert "waiting" in Lease.objects.get(pk=claim.pk).reason


def _placed_lease(world, profile="1g.10gb"):
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease, _ = services.lease_request(actor=actor, project="vision", gpu={"kind": "mig", "profile": profile})
    assert services.schedule_cycle()["placed"] == 1
    return lease


def test_provisioning_on_a_dead_agent_requeues_with_the_reason(world, settings):
    from broker.models import Lease
    from broker.tasks import lease_provision_run

    settings.AGENT_TIMEOUT_SECONDS = 1
    lease = _placed_lease(world)  # node n1's address is a closed port: the agent is dead
    result = lease_provision_run.apply(args=[lease.pk])
    assert result.get() == "queued"
    lease = Lease.objects.get(pk=lease.pk)
    assert lease.state == "queued" and "did not answer" in lease.reason
    assert not Allocation.objects.filter(lease=lease, freed_at__isnull=True).exists()


def test_silent_node_is_taken_out_and_its_leases_fail(world, settings):
    from datetime import timedelta

    from django.utils import timezone

    from broker.models import Lease, Node

    settings.AGENT_LOST_AFTER_SECONDS = 120  # the grace has passed 5 minutes later
    lease = _placed_lease(world)
    allocation = Allocation.objects.get(lease=lease)
    services.allocation_ready(allocation=allocation, instance={"device_uuid": "MIG-x"}, now=timezone.now())
    later = timezone.now() + timedelta(minutes=5)
    assert services.nodes_check_heartbeats(now=later) == 1
    assert Node.objects.get(node_id="n1").status == "silent"
    lease = Lease.objects.get(pk=lease.pk)
    assert lease.state == "failed" and "stopped answering" in lease.reason
    # a silent node takes no new work
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    services.lease_request(actor=actor, project="vision", gpu={"kind": "mig", "profile": "1g.10gb"})
    assert services.schedule_cycle()["placed"] == 0
