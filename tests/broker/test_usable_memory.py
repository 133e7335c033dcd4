"""Issue 28, defect 2 on the broker's side: a node's agent reports each GPU's usable memory (the nameplate less
the driver's reservation: 81,079 of an H100's 81,559 MiB), the broker keeps it on the GPU and the scheduler
sizes shares on it, so it never places a share that the database (or the agent) must refuse."""

from __future__ import annotations

from datetime import UTC, datetime

from agent.backend import InstanceSpec
from agent.sim import SimBackend
from broker import services
from broker.models import Allocation, Gpu
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_quota

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def _enrolled_h100(world, tmp_path) -> tuple[SimBackend, Actor]:
    """A simulated H100 node in shared mode, enrolled with the inventory its agent reports."""
    sim = SimBackend(tmp_path, "h100-node", [("H100-80GB", 1, "shared")])
    services.node_enroll(node_id="h100-node", token=services.enrollment_token_create(),
                         address="http://127.0.0.1:9/n/h100-node", inventory=sim.inventory(), hostname="h100-host")
    make_quota(world.project, tier="H100-80GB")
    return sim, Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)


def _share(memory_mib: int) -> dict:
    return {"kind": "share", "model": "H100-80GB", "milli": 500, "memory_mib": memory_mib}


def test_broker_keeps_the_usable_memory_the_agent_reports(world, tmp_path):
    sim, _ = _enrolled_h100(world, tmp_path)

    gpu = Gpu.objects.get(uuid=sim.inventory()["gpus"][0]["uuid"])
    assert gpu.memory_mib == 81_079  # not the nameplate's 81,559


def test_broker_places_no_share_beyond_the_gpus_usable_memory(world, tmp_path):
    _, actor = _enrolled_h100(world, tmp_path)

    lease, _ = services.lease_request(actor=actor, project="vision", gpu=_share(81_080), now=NOW)
    result = services.schedule_cycle(now=NOW)

    # sized on the nameplate (81,559) the core placed it, the database refused the write (the GPU row holds
    # 81,079) and the lease read "the capacity chosen is still being vacated" cycle after cycle
    assert (result["waiting"], result.get("refused", 0)) == (1, 0)
    assert not Allocation.objects.filter(lease=lease).exists()
    lease.refresh_from_db()
    assert lease.reason == "waiting: no H100-80GB GPU has 500 milli and 81080 MiB free"


def test_broker_places_a_share_of_exactly_the_usable_memory_and_the_agent_makes_it(world, tmp_path):
    sim, actor = _enrolled_h100(world, tmp_path)

    lease, _ = services.lease_request(actor=actor, project="vision", gpu=_share(81_079), now=NOW)
    services.schedule_cycle(now=NOW)

    allocation = Allocation.objects.select_related("gpu").get(lease=lease)
    instance, created = sim.create(allocation.instance_id,
                                   InstanceSpec.from_json(services.allocation_spec(allocation)))
    assert created and instance["memory_mib"] == 81_079
    assert instance["device_uuid"] == allocation.gpu.uuid
