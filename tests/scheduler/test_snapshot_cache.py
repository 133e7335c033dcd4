"""The snapshot kept between cycles (broker/snapshot.py) equals the snapshot read whole, after any fleet change.

Random sequences of changes — nodes enrolled, cordoned, silenced, renamed; GPUs lost, found, switched, given a
mode target; leases placed, freed, preempted, requeued, reprioritised; warm pool members made, bound, freed — are
committed by PostgreSQL transactions like the services' (the triggers see them as they see the services'), and
after every step the kept snapshot, brought up to date from the change log, must equal ``scheduler_snapshot`` read
whole at that moment: every record, in the same order."""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.models import Allocation, Gpu, Lease, Node, SnapshotChange, SnapshotEpoch
from broker.selectors import scheduler_snapshot
from broker.snapshot import SnapshotCache
from tests.factories import make_project, make_quota, make_tenant

MODEL = "H100-80GB"
MODES = ("whole", "mig", "shared")


def _node(n: int) -> Node:
    node = Node.objects.create(node_id=f"snap-{uuid.uuid4().hex[:8]}-{n}", address="http://127.0.0.1:1",
                               secret="s")
    for index in range(2):
        Gpu.objects.create(node=node, uuid=f"GPU-{uuid.uuid4()}", index=index, model=MODEL,
                           mode=MODES[(n + index) % 3], memory_mib=81_559, nvlink_domain=f"{node.node_id}/nv")
    return node


def _free_gpus() -> list[Gpu]:
    busy = set(Allocation.objects.filter(freed_at__isnull=True).values_list("gpu_id", flat=True))
    return [gpu for gpu in Gpu.objects.order_by("pk") if gpu.pk not in busy]


def _allocate(lease: Lease | None, gpu: Gpu, **extra) -> Allocation:
    fields = {"tier": MODEL, "kind": "whole", "slots": (0, 8), "milli": 1000, "memory_mib": 81_559, **extra}
    return Allocation.objects.create(lease=lease, gpu=gpu, **fields)


def _apply(step: tuple[str, int], projects: list) -> None:
    """One fleet change, committed."""
    op, pick = step
    now = timezone.now()
    with transaction.atomic():
        nodes = list(Node.objects.order_by("pk"))
        gpus = list(Gpu.objects.order_by("pk"))
        live = list(Lease.objects.filter(state__in=["active", "provisioning", "preempted"]).order_by("pk"))
        if op == "enroll" or not nodes:
            _node(pick)
        elif op == "cordon":
            node = nodes[pick % len(nodes)]
            Node.objects.filter(pk=node.pk).update(cordoned=not node.cordoned)
        elif op == "silence":
            node = nodes[pick % len(nodes)]
            Node.objects.filter(pk=node.pk).update(status="silent" if node.status == "ready" else "ready")
        elif op == "rename":
            node = nodes[pick % len(nodes)]
            Node.objects.filter(pk=node.pk).update(node_id=f"{node.node_id}-r")
        elif op == "host":  # its agent reports another host CPU / memory (migration 0020 logs it)
            node = nodes[pick % len(nodes)]
            Node.objects.filter(pk=node.pk).update(host_cpu_milli=node.host_cpu_milli + 1000 * (1 + pick % 3),
                                                   host_memory_mib=(node.host_memory_mib + 1024) * (pick % 2))
        elif op == "nvlink":  # a GPU's NVLink domain as its agent reports it
            gpu = gpus[pick % len(gpus)]
            Gpu.objects.filter(pk=gpu.pk).update(nvlink_domain=f"nvl{pick % 3}")
        elif op == "heartbeat":  # a column the snapshot does not read: no change logged, nothing to re-read
            Node.objects.filter(pk=nodes[pick % len(nodes)].pk).update(last_heartbeat_at=now)
        elif op == "lose":  # half the time a GPU something runs on
            busy = list(Gpu.objects.filter(pk__in=Allocation.objects.filter(freed_at__isnull=True).values("gpu_id"))
                        .order_by("pk"))
            gpu = busy[pick % len(busy)] if busy and pick % 2 else gpus[pick % len(gpus)]
            Gpu.objects.filter(pk=gpu.pk).update(lost_at=None if gpu.lost_at else now)
        elif op == "move":  # a GPU claimed by another node (its allocations' node changes with it)
            gpu = gpus[pick % len(gpus)]
            Gpu.objects.filter(pk=gpu.pk).update(node=nodes[pick % len(nodes)], index=100 + gpu.pk)
        elif op == "switch":
            gpu = gpus[pick % len(gpus)]
            Gpu.objects.filter(pk=gpu.pk).update(mode=MODES[(MODES.index(gpu.mode) + 1) % 3])
        elif op == "target":
            gpu = gpus[pick % len(gpus)]
            Gpu.objects.filter(pk=gpu.pk).update(mode_target="" if gpu.mode_target else "mig")
        elif op == "place":
            free = _free_gpus()
            if free:
                project = projects[pick % len(projects)]
                started = {"active_at": now - timedelta(seconds=pick)} if pick % 3 else {"queued_at": None}
                lease = Lease.objects.create(tenant=project.tenant, project=project, kind="whole", tier=MODEL,
                                             state="active", duration_seconds=3600, priority=pick % 4,
                                             group_key=f"g{pick % 2}" if pick % 5 == 0 else None,
                                             cpu_milli_per_unit=1000 * (pick % 3), **started)
                for gpu in free[pick % len(free):][:1 + pick % 2]:
                    _allocate(lease, gpu, preemptible=bool(pick % 2))
        elif op == "free" and live:
            lease = live[pick % len(live)]
            Allocation.objects.filter(lease=lease, freed_at__isnull=True).update(freed_at=now, state="freed")
            Lease.objects.filter(pk=lease.pk).update(state="released", finished_at=now)
        elif op == "preempt" and live:
            lease = live[pick % len(live)]
            Lease.objects.filter(pk=lease.pk).update(state="active" if lease.state == "preempted" else "preempted")
        elif op == "priority" and live:
            lease = live[pick % len(live)]
            Lease.objects.filter(pk=lease.pk).update(priority=lease.priority + 1, active_at=now)
        elif op == "warm":
            free = _free_gpus()
            if free:
                _allocate(None, free[pick % len(free)], kind="mig", mig_profile="1g.10gb", mig_start=pick % 7,
                          slots=(pick % 7, pick % 7 + 1), milli=142, memory_mib=9_728,
                          state="warm" if pick % 2 else "pending")
        elif op == "bind":
            warm = list(Allocation.objects.filter(lease__isnull=True, freed_at__isnull=True).order_by("pk"))
            if warm:
                project = projects[pick % len(projects)]
                lease = Lease.objects.create(tenant=project.tenant, project=project, kind="mig", tier=MODEL,
                                             state="active", duration_seconds=3600, active_at=now)
                Allocation.objects.filter(pk=warm[pick % len(warm)].pk).update(lease=lease, state="ready")
        elif op == "unwarm":
            warm = list(Allocation.objects.filter(lease__isnull=True, freed_at__isnull=True).order_by("pk"))
            if warm:
                Allocation.objects.filter(pk=warm[pick % len(warm)].pk).update(freed_at=now, state="freed")


OPS = ("enroll", "cordon", "silence", "rename", "move", "heartbeat", "host", "nvlink", "lose", "switch", "target",
       "place", "free", "preempt", "priority", "warm", "bind", "unwarm")


def _other() -> psycopg.Connection:
    """A second connection to the test database (its own transactions), with the parameters Django connects with
    (the embedded PostgreSQL's socket directory is in OPTIONS, not in HOST)."""
    params = connection.get_connection_params()
    for django_only in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(django_only, None)
    return psycopg.connect(**params)


def _check(cache: SnapshotCache) -> None:
    now = timezone.now()
    kept = cache.load(now=now)
    whole = scheduler_snapshot(now=now)
    assert kept.nodes == whole.nodes
    assert kept.gpus == whole.gpus
    assert kept.allocations == whole.allocations
    assert kept.warm == whole.warm
    assert kept == whole


@pytest.fixture
def projects(transactional_db):
    made = []
    for slug in ("one", "two"):
        tenant = make_tenant(f"snap-{slug}")
        project = make_project(tenant, f"p-{slug}")
        make_quota(project)
        made.append(project)
    return made


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 50)), min_size=1, max_size=25))
def test_kept_snapshot_equals_a_fresh_one_after_every_change(projects, steps):
    cache = SnapshotCache()
    _check(cache)
    for step in steps:
        _apply(step, projects)
        _check(cache)
    assert cache.stats["delta"] >= len(steps)  # kept and brought up to date, not read whole every time


def test_a_lost_gpu_takes_its_allocations_out(projects):
    cache = SnapshotCache()
    for step in [("enroll", 0), ("place", 3), ("lose", 1)]:
        _apply(step, projects)
        _check(cache)
    assert cache.load(now=timezone.now()).allocations == ()


def test_a_change_committed_after_the_read_began_is_not_missed(projects):
    """A transaction still open when the cache reads, committed after: its change has an id at or above the
    watermark, so the next load reads it, whatever order the writers committed in."""
    for n in range(3):
        _node(n)
    cache = SnapshotCache()
    _check(cache)
    gpu = Gpu.objects.order_by("pk").first()
    with _other() as other:
        other.execute("UPDATE broker_gpu SET lost_at = now() WHERE id = %s", [gpu.pk])  # open, not committed
        _check(cache)  # not seen yet: equal to a fresh read, which does not see it either
        assert f"g{gpu.pk}" in {g.id for g in cache.load(now=timezone.now()).gpus}
        other.commit()
    _check(cache)
    assert f"g{gpu.pk}" not in {g.id for g in cache.load(now=timezone.now()).gpus}


def test_flush_pruning_and_own_changes_read_whole(projects):
    _node(0)
    cache = SnapshotCache()
    _check(cache)
    assert cache.stats["full"] == 1
    # changes pruned that the cache may not have seen: read whole
    Node.objects.update(cordoned=True)
    SnapshotEpoch.objects.update(pruned_xid=cache.watermark)
    _check(cache)
    assert cache.stats["full"] == 2
    # the log's epoch gone (a TRUNCATE of the fleet's tables deletes it): read whole
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE broker_snapshotchange")
    _node(1)
    SnapshotEpoch.objects.all().delete()
    _check(cache)
    assert cache.stats["full"] == 3
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE broker_allocation, broker_gpu, broker_node CASCADE")
    assert not SnapshotEpoch.objects.exists()  # the truncate trigger
    _check(cache)
    assert cache.stats["full"] == 4 and cache.nodes == {}
    # inside a transaction that changed the fleet (it may roll back): read whole and not kept
    _node(2)
    _check(cache)
    with transaction.atomic():
        _node(3)
        before = dict(cache.nodes)
        snapshot = cache.load(now=timezone.now())
        assert len(snapshot.nodes) == 2 and cache.nodes == before and cache.stats["bypass"] == 1
        transaction.set_rollback(True)
    _check(cache)


def test_changes_written_after_the_read_by_the_reading_transaction_are_read_next(projects):
    """The cycle reads, then writes its placements in the same transaction: the next read must see them, even
    when that transaction had its id before it read (its own id is in no snapshot's running list)."""
    node = _node(0)
    cache = SnapshotCache()
    _check(cache)
    with transaction.atomic():
        Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now())  # an id, no change logged
        with _other() as other:  # a later transaction ends first: this one's id is now below xmax
            other.execute("SELECT pg_current_xact_id()")  # an id, committed
        cache.load(now=timezone.now())
        assert cache.stats["bypass"] == 0
        _apply(("place", 1), projects)
    _check(cache)
    assert len(cache.load(now=timezone.now()).allocations) == 1


def test_only_snapshot_columns_are_logged(projects):
    node = _node(0)
    SnapshotChange.objects.all().delete()
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now(), agent_version="9")
    Gpu.objects.filter(node=node).update(mode_since=timezone.now())
    assert not SnapshotChange.objects.exists()
    Node.objects.filter(pk=node.pk).update(cordoned=True)
    assert list(SnapshotChange.objects.values_list("kind", "key")) == [("node", node.pk)]
