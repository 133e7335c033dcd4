"""The agent side of a release, after ``lease_release`` moved the lease to RELEASING (the worker's
``lease_release_run``): the workload gets its grace to stop, the node destroys the instances, the allocations are
freed and the lease reaches its final state."""

from __future__ import annotations

from django.utils import timezone

from broker.choices import LeaseState
from broker.models import Lease
from broker.services.groups import allocations_free
from broker.services.provisioning import lease_release_instances
from broker.services.workloads import workload_stop_for_release


def lease_release_finish(*, lease_id: int, final: str) -> str:
    lease = Lease.objects.get(pk=lease_id)
    if lease.state != LeaseState.RELEASING:
        return lease.state
    workload_stop_for_release(lease=lease)  # SIGTERM and its grace before the devices go
    lease_release_instances(lease=lease)
    reason = "the lease reached its end" if final == LeaseState.EXPIRED else "released"
    # the final event says why (the RELEASING one's reason) when the lease failed or its workload ended it
    if final == LeaseState.FAILED:
        reason = f"failed: {lease.reason}" if lease.reason else "failed"
    elif final == LeaseState.RELEASED and lease.reason.startswith("the workload "):
        reason = f"released: {lease.reason}"
    return allocations_free(lease=lease, now=timezone.now(), to=final, reason=reason).state
