"""The client's tests use the broker's live-server fixtures: the session's Celery worker, simulated agents that
run workloads under a shared root, and the two-tenant world committed for the live server."""

from tests.broker.conftest import shared, worker, workload_fleet, world  # noqa: F401 (fixtures)
