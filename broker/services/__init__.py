"""The only writers of leasing data (docs/architecture.md §4-5), one module per stage of a lease's life:

- ``request``: a request validated (``broker.validation``), admitted (``broker.extensions``) and queued;
- ``cycle``: the schedule cycle — placements, warm binds, preemptions and their notices;
- ``provisioning``: the agents' work outside transactions, and what they made, recorded;
- ``release``: the agent side of a release (the workload stopped, the instances destroyed, the lease final);
- ``transitions``: the conditional update every change is made of; release, renew, expire, hold;
- ``groups``: lease groups leave together; ``allocations_free`` (a member that fails takes its group with it);
- ``workloads``: the tenants' jobs on their leases;
- ``nodes``: enrollment, signed agent requests, heartbeats, the reconcile, cordons;
- ``triggers``: follow-up tasks after commit (sent by name: ``broker.tasks`` registers them) and the flag that lets
  one cycle serve many triggers;
- ``suspension``: what a tenant's suspension does to its leases (registered in ``tenants.extensions``).

Every lease change is a conditional update (``WHERE state = <the state we read>``) plus a ``LeaseEvent`` in the
same transaction; a change that lost a race raises ``LeaseStateConflict`` and writes nothing. Follow-up work is
enqueued with ``transaction.on_commit``. Agent calls happen outside transactions; their results are written
afterwards by the same rules, so a worker killed at any point leaves state that the next run (or the reconcile)
converges. Callers import this package (``from broker import services``); the names below are its surface.
"""

from broker.services.cycle import (
    ADVISORY_LOCK,
    lease_notice_seconds,
    lease_preempt,
    lease_preempt_due,
    lease_suspend,
    schedule_cycle,
    schedule_cycle_wait,
)
from broker.services.elastic import (
    lease_grow,
    lease_grow_apply,
    lease_grow_give_up,
    lease_shrink,
    lease_shrink_apply,
    leases_shrunk_exist,
)
from broker.services.groups import allocations_free
from broker.services.nodes import (
    ENROLL_PREFIX,
    SILENT_NOTE,
    STUCK_AFTER,
    AgentUnauthenticated,
    EnrollmentConflict,
    enrollment_token_create,
    enrollment_token_revoke,
    gpu_release,
    leases_resume_stuck,
    node_cordon,
    node_enroll,
    node_heartbeat,
    node_heartbeat_signed,
    node_inventory_sync,
    node_reconcile,
    node_reenroll_approve,
    node_request_verify,
    node_uncordon,
    nodes_check_heartbeats,
)
from broker.services.provisioning import (
    agent_client,
    allocation_ready,
    allocation_spec,
    allocations_destroy,
    allocations_ready,
    lease_notice,
    lease_provision,
    lease_release_instances,
    leases_provision,
    leases_provision_give_up,
    workloads_start_after,
)
from broker.services.release import lease_release_finish
from broker.services.request import lease_request
from broker.services.transitions import (
    HOLD_RELEASED_REASON,
    lease_expire_due,
    lease_expiries_upcoming,
    lease_group_release,
    lease_release,
    lease_renew,
    lease_transition,
    leases_hold,
    leases_release_all,
    leases_unhold,
)
from broker.services.triggers import CYCLE_FLAG_SECONDS, cycle_flag_clear, enqueue, schedule_cycle_request
from broker.services.workloads import (
    lease_workload_start,
    workload_logs,
    workload_placement_log_keep,
    workload_placements,
    workload_stop_for_release,
    workloads_report,
)
from broker.validation import MAX_COUNT, MAX_GPU_INDEX, MAX_GPU_MEMORY_MIB, MEMBER_MAX_PRIORITY

__all__ = [
    "ADVISORY_LOCK",
    "CYCLE_FLAG_SECONDS",
    "ENROLL_PREFIX",
    "HOLD_RELEASED_REASON",
    "MAX_COUNT",
    "MAX_GPU_INDEX",
    "MAX_GPU_MEMORY_MIB",
    "MEMBER_MAX_PRIORITY",
    "SILENT_NOTE",
    "STUCK_AFTER",
    "AgentUnauthenticated",
    "EnrollmentConflict",
    "agent_client",
    "allocation_ready",
    "allocation_spec",
    "allocations_destroy",
    "allocations_free",
    "allocations_ready",
    "cycle_flag_clear",
    "enqueue",
    "enrollment_token_create",
    "enrollment_token_revoke",
    "gpu_release",
    "lease_expire_due",
    "lease_expiries_upcoming",
    "lease_group_release",
    "lease_grow",
    "lease_grow_apply",
    "lease_grow_give_up",
    "lease_notice",
    "lease_notice_seconds",
    "lease_preempt",
    "lease_preempt_due",
    "lease_provision",
    "lease_release",
    "lease_release_finish",
    "lease_release_instances",
    "lease_renew",
    "lease_request",
    "lease_shrink",
    "lease_shrink_apply",
    "lease_suspend",
    "lease_transition",
    "lease_workload_start",
    "leases_hold",
    "leases_provision",
    "leases_provision_give_up",
    "leases_release_all",
    "leases_resume_stuck",
    "leases_shrunk_exist",
    "leases_unhold",
    "node_cordon",
    "node_enroll",
    "node_heartbeat",
    "node_heartbeat_signed",
    "node_inventory_sync",
    "node_reconcile",
    "node_reenroll_approve",
    "node_request_verify",
    "node_uncordon",
    "nodes_check_heartbeats",
    "schedule_cycle",
    "schedule_cycle_request",
    "schedule_cycle_wait",
    "workload_logs",
    "workload_placement_log_keep",
    "workload_placements",
    "workload_stop_for_release",
    "workloads_report",
    "workloads_start_after",
]
