"""What the leasing path does in batches keeps every rule of one-at-a-time: a cycle writes all its
placements at once but only a refused one waits; a lease becomes ACTIVE once all its units are, with one
event; a node's leases are provisioned in one agent call, a refused one requeued alone; requests coalesce
into one pending schedule cycle and none is left behind."""

import pytest
from django.utils import timezone

from broker import services, tasks
from broker.models import Allocation, Lease, LeaseEvent, Node
from broker.services.cycle import _cycle_again_if_new
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_quota, make_world

H100 = {"index": 0, "uuid": "GPU-h100-0", "model": "H100-80GB", "mode": "mig", "memory_mib": 81559}
A100 = {"index": 1, "uuid": "GPU-a100-0", "model": "A100-80GB", "mode": "whole", "memory_mib": 81920}


def _member(world) -> Actor:
    return Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)


def _enroll(world) -> None:
    make_quota(world.project, "A100-80GB", deserved=2000, limit=2000)
    token = services.enrollment_token_create()
    services.node_enroll(node_id="n1", token=token, address="http://127.0.0.1:9/n/n1", inventory={"gpus": [H100, A100]})


@pytest.fixture
def enrolled(db):
    """The two tenants and one node (an H100 in MIG mode, an A100 whole) no agent answers for."""
    world = make_world()
    _enroll(world)
    return world


def test_batching_cycle_places_all_at_once_and_only_a_refused_placement_waits(enrolled):
    actor = _member(enrolled)
    holder, _ = services.lease_request(actor=actor, project="vision", gpu={"kind": "whole", "model": "A100-80GB"})
    assert services.schedule_cycle()["placed"] == 1
    # the holder got a notice: its GPU counts as free, but it has not left yet
    Lease.objects.filter(pk=holder.pk).update(state="preempted")
    claim, _ = services.lease_request(actor=actor, project="vision", gpu={"kind": "whole", "model": "A100-80GB"})
    slices = [services.lease_request(actor=actor, project="vision", gpu={"kind": "mig", "profile": "1g.10gb"})[0]
              for _ in range(3)]
    counts = services.schedule_cycle()
    assert counts["placed"] == 3
    assert [Lease.objects.get(pk=s.pk).state for s in slices] == ["provisioning"] * 3
    claim = Lease.objects.get(pk=claim.pk)
    assert claim.state == "queued" and "still being vacated" in claim.reason
    assert not Allocation.objects.filter(lease=claim).exists()
    for lease in slices:  # each transition has its event, written with it
        assert list(LeaseEvent.objects.filter(lease=lease).values_list("to_state", flat=True)) == [
            "requested", "queued", "provisioning"]
    starts = sorted(Allocation.objects.filter(lease__in=slices).values_list("mig_start", flat=True))
    assert len(set(starts)) == 3


def test_batching_lease_becomes_active_once_all_its_units_are(enrolled):
    actor = _member(enrolled)
    pair, _ = services.lease_request(actor=actor, project="vision",
                                     gpu={"kind": "mig", "profile": "1g.10gb", "count": 2})
    single, _ = services.lease_request(actor=actor, project="vision", gpu={"kind": "mig", "profile": "1g.10gb"})
    services.schedule_cycle()
    first, second = Allocation.objects.filter(lease=pair).select_related("gpu__node").order_by("pk")
    [alone] = Allocation.objects.filter(lease=single).select_related("gpu__node")
    now = timezone.now()
    result = services.allocations_ready(items=[(first, {"device_uuid": "MIG-1"}), (alone, {"device_uuid": "MIG-3"})],
                                        now=now)
    assert result == {"ready": 2, "active": 1}
    assert Lease.objects.get(pk=pair.pk).state == "provisioning"
    assert Lease.objects.get(pk=single.pk).state == "active"
    assert services.allocations_ready(items=[(first, {}), (second, {"device_uuid": "MIG-2", "gpu_instance_id": 9,
                                                                    "access": {"CUDA_VISIBLE_DEVICES": "MIG-2"}})],
                                      now=now) == {"ready": 1, "active": 1}  # the first was recorded already
    pair = Lease.objects.get(pk=pair.pk)
    assert pair.state == "active" and pair.ends_at == now + timezone.timedelta(seconds=pair.duration_seconds)
    second.refresh_from_db()
    assert (second.state, second.device_uuid, second.gpu_instance_id, second.access) == (
        "ready", "MIG-2", 9, {"CUDA_VISIBLE_DEVICES": "MIG-2"})
    assert LeaseEvent.objects.filter(lease=pair, to_state="active").count() == 1
    assert services.allocations_ready(items=[(second, {})], now=now) == {"ready": 0, "active": 0}


@pytest.fixture
def no_tasks(monkeypatch):
    """Record what would be sent to the workers instead of sending it."""
    sent = []
    for name in ("schedule_cycle", "leases_provision_run"):
        monkeypatch.setattr(getattr(tasks, name), "delay", lambda *args, name=name: sent.append((name, args)))
    return sent


def test_batching_requests_coalesce_into_one_pending_cycle(transactional_db, no_tasks):
    world = make_world()
    actor = _member(world)
    leases = [services.lease_request(actor=actor, project="vision", gpu={"kind": "whole"})[0] for _ in range(3)]
    assert no_tasks == [("schedule_cycle", ())]  # one cycle asked for; the others rely on it
    services.schedule_cycle()  # it sees all three (no nodes here: they wait, with the reason)
    assert all(Lease.objects.get(pk=lease.pk).reason.startswith("waiting:") for lease in leases)
    assert no_tasks == [("schedule_cycle", ())]  # nothing unseen after its commit: no further cycle
    services.lease_request(actor=actor, project="vision", gpu={"kind": "whole"})
    assert no_tasks == [("schedule_cycle", ())] * 2  # after a cycle's look, a request asks again


def test_batching_request_during_a_cycle_gets_the_next_one(transactional_db, no_tasks):
    world = make_world()
    actor = _member(world)
    first, _ = services.lease_request(actor=actor, project="vision", gpu={"kind": "whole"})
    # a request that commits after the pending cycle read the queue (its trigger found the flag set) ...
    services.lease_request(actor=actor, project="vision", gpu={"kind": "whole"})
    assert no_tasks == [("schedule_cycle", ())]
    _cycle_again_if_new([first.pk])  # ... is found by that cycle's look after its commit
    assert no_tasks == [("schedule_cycle", ())] * 2


def test_batching_a_node_is_provisioned_in_one_call_and_a_refusal_requeues_alone(fleet, world, no_tasks):
    make_quota(world.project, "H100-80GB", deserved=4000, limit=4000)
    actor = _member(world)
    whole = [services.lease_request(actor=actor, project="vision", gpu={"kind": "mig", "profile": "7g.80gb"})[0]
             for _ in range(2)]
    services.schedule_cycle()
    [(_, (lease_ids,))] = [sent for sent in no_tasks if sent[0] == "leases_provision_run"]
    assert sorted(lease_ids) == sorted(lease.pk for lease in whole)  # one node: one task for both
    lost = Allocation.objects.select_related("gpu__node").get(lease=whole[1])
    services.agent_client(lost.gpu.node).faults(drop_gpu=lost.gpu.uuid)  # it fell off the bus meanwhile
    assert services.leases_provision(lease_ids=lease_ids) == {"active": 1, "requeued": 1}
    assert Lease.objects.get(pk=whole[0].pk).state == "active"
    requeued = Lease.objects.get(pk=whole[1].pk)
    assert requeued.state == "queued" and "refused" in requeued.reason
    assert not Allocation.objects.filter(lease=requeued, freed_at__isnull=True).exists()
    node = Node.objects.get(pk=lost.gpu.node_id)
    held = {i["allocation_id"] for i in services.agent_client(node).inventory()["instances"]}
    assert held == {a.instance_id for a in Allocation.objects.filter(gpu__node=node, freed_at__isnull=True)}


def test_batching_a_cycle_sends_one_provisioning_task_per_batch_of_nodes():
    """Per node while few (spread over the workers), batches of at most 32 nodes at fleet scale."""
    from broker.services.cycle import provision_batches

    assert provision_batches([[1], [2, 3], [4]]) == [[1], [2, 3], [4]]
    nodes = [[n] for n in range(1918)]
    batches = provision_batches(nodes)
    assert len(batches) == 60 and max(len(batch) for batch in batches) <= 32
    assert [lease for batch in batches for lease in batch] == list(range(1918))  # every lease once, in order
    assert provision_batches([]) == []


def test_batching_one_task_provisions_several_nodes_at_once(fleet, world, no_tasks):
    make_quota(world.project, "H100-80GB", deserved=4000, limit=4000)
    make_quota(world.project, "A100-80GB", deserved=4000, limit=4000)
    actor = _member(world)
    mig, _ = services.lease_request(actor=actor, project="vision", gpu={"kind": "mig", "profile": "7g.80gb"})
    whole, _ = services.lease_request(actor=actor, project="vision",
                                      gpu={"kind": "whole", "model": "A100-80GB"})
    services.schedule_cycle()
    sent = [args[0] for name, args in no_tasks if name == "leases_provision_run"]
    assert sorted(sent) == sorted([[mig.pk], [whole.pk]])  # two nodes: a task each
    nodes = set(Allocation.objects.filter(lease__in=[mig, whole]).values_list("gpu__node", flat=True))
    assert len(nodes) == 2
    # the same two leases in one task (a batch): both nodes' agents called, all recorded in one go
    assert services.leases_provision(lease_ids=[mig.pk, whole.pk]) == {"active": 2, "requeued": 0}
    assert {Lease.objects.get(pk=pk).state for pk in (mig.pk, whole.pk)} == {"active"}
    assert services.leases_provision(lease_ids=[mig.pk, whole.pk]) == {"active": 0, "requeued": 0}  # idempotent
