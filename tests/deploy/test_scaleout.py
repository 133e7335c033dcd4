"""Scale out on this machine (issue 18): 2 web servers, 3 Celery workers on distinct host names, 2 scheduler
workers and 2 beat contenders against one PostgreSQL, one broker and the shared cache, with 100 simulated nodes
over HTTP, take a few hundred lease requests from concurrent clients. Then, from PostgreSQL and the agents:
every lease is ACTIVE, placed once (one allocation, one PROVISIONING and one ACTIVE transition), no GPU slot is
held twice, the agents hold exactly the live allocations (no orphan, none lost), the schedule cycles never
overlapped, one beat led, every worker did work, a task's result came back, and the failed-token throttle counts
across both web servers (the shared cache). The same flow with Redis and with RabbitMQ as the Celery broker.

Real processes, started and stopped by PID (tests/deploy/cluster.py). RabbitMQ: a vhost of the test's own,
made and deleted with ``rabbitmqctl`` (infra/services.py ``ensure_rabbitmq``); where no RabbitMQ answers the
test is skipped locally and fails in CI (tests/real_parts.py).
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from infra import services
from tests.api.server import test_database_url as database_url
from tests.deploy.cluster import Cluster
from tests.real_parts import require

pytestmark = [pytest.mark.slow]

LEASES = 200
NODES = 100
TOKEN_FAILURE_LIMIT = 6
RABBITMQ_HINT = ("Debian package rabbitmq-server, running on 127.0.0.1:5672 with the guest user (or RABBITMQ_URL); "
                 "make test installs the package: infra/test.py SYSTEM_PACKAGES")


@pytest.fixture
def rabbitmq_url():
    service = services.ensure_rabbitmq(vhost=f"gpubroker-test-{os.getpid()}")
    require("RabbitMQ (an AMQP broker answering at RABBITMQ_URL or amqp://guest:guest@127.0.0.1:5672/)",
            service is not None, RABBITMQ_HINT)
    yield service.url
    service.shutdown()


def _bearer_status(url: str) -> int:
    request = urllib.request.Request(url + "/api/v1/leases", headers={"Authorization": "Bearer gpub_nope.wrong"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def _scale_out(broker_url: str) -> None:
    folder = Path(tempfile.mkdtemp(prefix="gpubroker-scaleout-"))  # kept, with every process's log, on a failure
    cluster = Cluster(database_url(), broker_url, folder, web=2, workers=3, schedulers=2, beats=2, nodes=NODES,
                      create_latency_seconds=0.02,
                      environment={"API_TOKEN_FAILURE_LIMIT": str(TOKEN_FAILURE_LIMIT)})
    try:
        cluster.start()
        cluster.submit(LEASES, clients=8)
        cluster.wait_active(LEASES, timeout=600)

        # every lease ACTIVE (the only end state this flow documents: the fleet has room for all of them)
        assert cluster.sql("SELECT state, count(*) FROM broker_lease GROUP BY state") == [("active", LEASES)]
        # placed once: one allocation each (ever, freed ones included), one PROVISIONING and one ACTIVE transition
        assert cluster.sql("SELECT lease_id FROM broker_allocation GROUP BY lease_id HAVING count(*) <> 1") == []
        assert cluster.sql("SELECT state, count(*) FROM broker_allocation GROUP BY state") == [("ready", LEASES)]
        for state in ("provisioning", "active"):
            assert cluster.sql("SELECT count(*), count(DISTINCT lease_id) FROM broker_leaseevent WHERE to_state = %s",
                               (state,)) == [(LEASES, LEASES)], state
        # no GPU slot held twice (the exclusion constraint's promise, checked rather than assumed)
        assert cluster.sql(
            "SELECT count(*) FROM broker_allocation a JOIN broker_allocation b ON a.gpu_id = b.gpu_id "
            "AND a.id < b.id AND a.slots && b.slots WHERE a.freed_at IS NULL AND b.freed_at IS NULL") == [(0,)]
        # the agents hold exactly the live allocations: no orphan instance, none lost, none made twice
        live = sorted(f"alloc-{pk}" for (pk,) in cluster.sql(
            "SELECT id FROM broker_allocation WHERE freed_at IS NULL"))
        held = cluster.agent_instances()
        assert len(held) == len(set(held))
        assert sorted(held) == live
        # spread over the fleet, not one node
        nodes_used = cluster.sql("SELECT count(DISTINCT g.node_id) FROM broker_allocation a "
                                 "JOIN broker_gpu g ON g.id = a.gpu_id")[0][0]
        assert nodes_used >= 2

        # one cycle at a time: the spans the cycles held the lock (logged by each scheduler worker) are disjoint
        cycles = cluster.cycles()
        assert cycles, "no schedule cycle logged"
        for (start, end, who), (next_start, _, next_who) in itertools.pairwise(cycles):
            assert next_start >= end, f"cycles overlapped: {who} {start:.6f}-{end:.6f}, {next_who} {next_start:.6f}-"
        # one beat among the contenders
        assert sorted(cluster.leaders().values()) == ["leading", "standby"], cluster.leaders()
        # every worker host took part in provisioning
        for process in cluster.processes["worker"]:
            assert "broker.leases_provision_run" in cluster.log(process.name), f"{process.name} ran no provisioning"
        # a task's result comes back through the result backend (Redis, or rpc:// with RabbitMQ)
        said = cluster._manage("shell", "-c", "from config.celery import ping; "
                               f"print(ping.apply_async(queue={cluster.queue!r}).get(timeout=60))")
        assert said.split()[-1] == "pong"

        # the failed-token throttle counts in the shared cache: failures spread over both web servers add up
        first = [_bearer_status(cluster.url(n)) for n in range(TOKEN_FAILURE_LIMIT)]
        assert first == [401] * TOKEN_FAILURE_LIMIT
        assert [_bearer_status(cluster.url(n)) for n in range(2)] == [429, 429]
    except BaseException:
        print(f"scale-out logs: {cluster.folder}; cycles: {len(cluster.cycles())}")
        raise
    finally:
        cluster.stop()
    shutil.rmtree(folder, ignore_errors=True)


def test_scaleout_redis_no_double_allocation_one_cycle_at_a_time(transactional_db):
    broker = os.environ["CELERY_BROKER_URL"]
    require("Redis as the Celery broker (CELERY_BROKER_URL redis://…, or redis-server on the PATH)",
            broker.startswith(("redis://", "rediss://")))
    _scale_out(broker)


def test_scaleout_rabbitmq_no_double_allocation_one_cycle_at_a_time(transactional_db, rabbitmq_url):
    _scale_out(rabbitmq_url)
