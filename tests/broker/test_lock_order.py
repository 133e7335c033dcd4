"""Writers that lock several GPU rows never deadlock (issue 27 item 12: one ``DeadlockDetected`` in
``node_inventory_sync`` during a kill test).

Two kinds of writer run at once on real PostgreSQL, each in its own thread and connection, many rounds, every
round started together at a barrier: inventory syncs of one node with different inventories (an enrollment and a
reconcile, or two reconciles, each reporting a different subset: the rows one reports, the other marks lost),
and allocation inserts (the cycle's placement write, the warm pool), which lock each allocation's GPU row for
its foreign key (at commit). Every writer must lock in one order — GPU key order, and as an update of non-key
columns does (``FOR NO KEY UPDATE``), which an allocation's foreign-key lock never waits for."""

from __future__ import annotations

import random
import threading
import uuid
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from broker import services
from broker.models import Allocation, Gpu, Node

MODEL = "H100-80GB"
GPUS = 8
ROUNDS = 40


def _inventory(uuids: list[str]) -> dict:
    return {"gpus": [{"index": index, "uuid": value, "model": MODEL, "mode": "whole", "memory_mib": 81_559}
                     for index, value in uuids]}


def _deadlocked(error: DatabaseError) -> bool:
    cause = error.__cause__
    return getattr(cause, "sqlstate", None) == "40P01" or "deadlock detected" in str(error)


def _run(writers, rounds: int) -> tuple[list[str], list[BaseException]]:
    """Each writer ``rounds`` times, all of them released together every round; the deadlocks seen, and any
    other error."""
    barrier = threading.Barrier(len(writers))
    deadlocks: list[str] = []
    errors: list[BaseException] = []

    def loop(writer, seed: int) -> None:
        rng = random.Random(seed)
        try:
            for round_ in range(rounds):
                barrier.wait(timeout=60)
                try:
                    writer(rng, round_)
                except DatabaseError as error:
                    if not _deadlocked(error):
                        raise
                    deadlocks.append(f"{writer.__name__} round {round_}: {error}".splitlines()[0])
        except BaseException as error:  # reported by the test, not lost in a thread
            errors.append(error)
            barrier.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=loop, args=(writer, seed)) for seed, writer in enumerate(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    return deadlocks, errors


@pytest.fixture
def node(transactional_db):
    node = Node.objects.create(node_id=f"locks-{uuid.uuid4().hex[:8]}", address="http://127.0.0.1:1", secret="s",
                               status="ready")
    # created in reverse uuid order: key order and uuid order (the index a lookup by uuid walks) disagree
    for index in reversed(range(GPUS)):
        Gpu.objects.create(node=node, uuid=f"GPU-lock-{index:02d}", index=index, model=MODEL, mode="whole",
                           memory_mib=81_559)
    return node


def test_lock_order_inventory_syncs_of_one_node_never_deadlock(node):
    gpus = [(gpu.index, gpu.uuid) for gpu in Gpu.objects.filter(node=node)]

    def sync(rng, round_):
        reported = rng.sample(gpus, rng.randint(1, GPUS - 1))
        with transaction.atomic(durable=True):
            services.node_inventory_sync(node=node, inventory=_inventory(reported), now=timezone.now())

    deadlocks, errors = _run([sync, sync, sync], ROUNDS)
    assert not errors, errors
    assert deadlocks == []


def test_lock_order_inventory_sync_and_allocation_inserts_never_deadlock(node):
    """A sync locks the GPUs an inventory reports and marks lost those it leaves out, while the cycle inserts
    allocations on several of them (each insert locks its GPU row for the foreign key, at commit: Django's
    foreign keys are deferred). The sync's ``FOR NO KEY UPDATE`` and those ``KEY SHARE`` locks never wait for
    each other, whatever order the inserts come in. (A guard: the old sync's ``FOR UPDATE`` did conflict with
    them, but in 40 rounds here it never deadlocked — the foreign-key locks are all taken in one short moment at
    commit; the deadlocks this file reproduces are those between syncs, above.)"""
    gpus = [(gpu.index, gpu.uuid) for gpu in Gpu.objects.filter(node=node)]
    pks = list(Gpu.objects.filter(node=node).order_by("pk").values_list("pk", flat=True))

    def sync(rng, round_):
        reported = rng.sample(gpus, rng.randint(1, GPUS - 1))
        with transaction.atomic(durable=True):
            services.node_inventory_sync(node=node, inventory=_inventory(reported), now=timezone.now())

    def place(rng, round_):
        now = timezone.now()
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            # in either order (the sync must not care), a moment apart: a write of thousands of allocations takes
            # a while, and each row's foreign-key lock is held from its insert to the commit
            for pk in sorted(rng.sample(pks, 4), reverse=rng.random() < 0.5):
                Allocation.objects.create(lease=None, gpu_id=pk, tier=MODEL, kind="mig", mig_profile="1g.10gb",
                                          mig_start=0, slots=(0, 1), milli=143, memory_mib=9_984, state="warm",
                                          created_at=now)
                cursor.execute("SELECT pg_sleep(0.002)")
            Allocation.objects.filter(gpu_id__in=pks, freed_at__isnull=True).update(
                state="freed", freed_at=now + timedelta(microseconds=1))

    deadlocks, errors = _run([sync, place], ROUNDS)
    assert not errors, errors
    assert deadlocks == []
