"""The capacity loop in the service: run the planner, keep its proposals as rows, apply them.

``plan_run`` (the periodic Celery task ``capacity.plan_run``): snapshot (``capacity.selectors``) → the pure
planner (``capacity.planner.plan_capacity``) → ``adjustments_record`` (one open row per fingerprint; rows no
longer proposed expire) → every ``auto`` proposal applied → effects measured → tenants told. The clock is read
once per run and passed down.

Applying goes through the agents and the broker's services with conditional updates, so a race with the
scheduler never double-books:
- a **mode switch** (and a **MIG layout**) closes the GPU to the scheduler first (``Gpu.mode_target``, set
  under the schedule cycle's advisory lock after checking that no lease holds it), then asks the agent, then
  records the mode; a drain preempts the over-quota holders with their promised notice and switches once they
  have left (``mode_switch``);
- a **warm pool** inserts warm allocations (no lease) — the exclusion constraint keeps them apart from
  every lease — then asks the agent to create them; a schedule cycle binds one to a lease with no agent
  call (``broker.services.cycle._bind_warm``) (``warm_pool``);
- **idle reclaim** notices a lease (deadline, agent notice, ``lease.notice`` notification), then releases
  (in quota) or preempts (over quota) it, or withdraws the notice when it is busy again (``idle_reclaim``);
- **right-sizing** and **quota advice** are advice: accepting one records it (quota advice accepted by
  staff changes the project's deserved quota through ``tenants.services.quota_set``, ``quota_advice``);
  right-sizing is priced from the tenant's own price book (``right_size``).

The package, by concern: ``run`` (plan_run, recording), ``decisions`` (accept, reject), ``applying`` (the
dispatch per kind and the sweep of interrupted rows), one module per kind that changes something
(``mode_switch``, ``warm_pool``, ``idle_reclaim``, ``right_size``, ``quota_advice``), ``effects``,
``policies``, ``idle_opt_in`` (a project's opt-in to idle reclaim of its interactive leases, and its opt-out of
the suspension of its idle resumable training); ``common`` holds
the row helpers and the one audit helper.
"""

from capacity.services.applying import adjustment_apply, applying_sweep
from capacity.services.common import LOOP, AdjustmentConflict
from capacity.services.decisions import adjustment_accept, adjustment_reject
from capacity.services.effects import effects_measure
from capacity.services.idle_opt_in import idle_opt_in_set, suspend_opt_out_set
from capacity.services.mode_switch import drains_finish, drains_run, mode_switch_for
from capacity.services.policies import IDLE_CLASSES, RULE_KEYS, policy_delete, policy_set
from capacity.services.run import (
    PLAN_LOCK,
    adjustments_record,
    fingerprint,
    plan_on_wait,
    plan_run,
    plan_soon_clear,
)

__all__ = [
    "IDLE_CLASSES", "LOOP", "PLAN_LOCK", "RULE_KEYS", "AdjustmentConflict", "adjustment_accept", "adjustment_apply",
    "adjustment_reject", "adjustments_record", "applying_sweep", "drains_finish", "drains_run", "effects_measure",
    "fingerprint", "idle_opt_in_set", "mode_switch_for", "plan_on_wait", "plan_run", "plan_soon_clear",
    "policy_delete", "policy_set", "suspend_opt_out_set",
]
