"""The broker's side of a tenant's status change (``tenants.services.tenant_set_status`` calls it through
``tenants.extensions``; ``BrokerConfig.ready`` registers it): suspension is about money, so it stops the meter
(docs/tenancy.md, "Suspension")."""

from __future__ import annotations

from broker.services.cycle import schedule_cycle_wait
from broker.services.transitions import leases_hold, leases_release_all, leases_unhold
from tenants.choices import TenantStatus
from tenants.extensions import TenantStatusChange, TenantStatusListener


def tenant_status_changed(change: TenantStatusChange) -> None:
    """In the status change's transaction: a suspended tenant's waiting leases are held (the schedule cycle no
    longer reads them; their reason says why); a reactivated tenant's are given back to the scheduler."""
    tenant = change.tenant
    if change.status == TenantStatus.SUSPENDED:
        leases_hold(tenant_id=tenant.pk, reason=f"held: tenant '{tenant.slug}' is suspended{change.note}",
                    actor=change.by, now=change.now)
    else:
        leases_unhold(tenant_id=tenant.pk, actor=change.by, now=change.now)


def tenant_status_settled(change: TenantStatusChange) -> None:
    """After commit: every lease of a suspended tenant that holds capacity is released (suspending again sweeps
    again); released leases stay released after a reactivation."""
    tenant = change.tenant
    if change.status == TenantStatus.SUSPENDED:
        leases_release_all(tenant_id=tenant.pk, actor=change.by,
                           reason=f"released: tenant '{tenant.slug}' was suspended{change.note}")


# ``prepare``: wait for a running schedule cycle (its advisory lock), so a cycle that read the queue before the
# suspension has committed its placements before the release sweep looks, and every later cycle sees the
# tenant's new status
TENANT_STATUS_LISTENER = TenantStatusListener(prepare=schedule_cycle_wait, changed=tenant_status_changed,
                                              settled=tenant_status_settled)
