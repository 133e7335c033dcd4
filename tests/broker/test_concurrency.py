"""200 concurrent requests for 50 free GPUs from 8 client threads, two worker processes (4 worker
children): exactly 50 leases ACTIVE, no overlapping allocation, no quota exceeded, the rest waiting with
a reason."""

import threading

from django.db import connection

from broker.models import Allocation, Lease
from tests.factories import make_quota
from tests.support.processes import start_fleet, start_workers, stop_workers, wait_until


def test_concurrency_200_requests_for_50_gpus(live_server, tmp_path, api, world, settings):
    make_quota(world.project, "A100-80GB", deserved=50_000, limit=50_000)
    fleet = start_fleet(live_server.url, tmp_path / "fleet", 10, "a100-80gb:5:whole")
    workers = start_workers(2)
    try:
        client = api("member")
        results: list[int] = []
        lock = threading.Lock()

        def submit(number: int) -> None:
            for index in range(25):
                status, _ = client.call("POST", "/leases", {"project": "vision",
                                                            "gpu": {"kind": "whole", "model": "A100-80GB"}},
                                        {"Idempotency-Key": f"t{number}-{index}"})
                with lock:
                    results.append(status)

        threads = [threading.Thread(target=submit, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert results.count(201) == 200
        wait_until(lambda: Lease.objects.filter(state="active").count() == 50, timeout=120)
        wait_until(lambda: not Lease.objects.filter(state__in=["provisioning", "requested"]).exists(), timeout=60)
        assert Lease.objects.filter(state="active").count() == 50
        waiting = Lease.objects.filter(state="queued")
        assert waiting.count() == 150
        # every request is seen by a cycle (cycles coalesce while one runs) and says why it waits
        wait_until(lambda: all(lease.reason.startswith("waiting:") for lease in waiting.all()), timeout=30)
        with connection.cursor() as cursor:
            cursor.execute("""
                SELECT count(*) FROM broker_allocation a JOIN broker_allocation b
                  ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.slots && b.slots
                 WHERE a.freed_at IS NULL AND b.freed_at IS NULL""")
            assert cursor.fetchone()[0] == 0
        live = Allocation.objects.filter(freed_at__isnull=True)
        assert live.count() == 50 and len({a.gpu_id for a in live}) == 50
        assert sum(a.milli for a in live) <= 50_000
    finally:
        stop_workers(workers)
        fleet.terminate()
        fleet.wait(30)
