"""The broker's part in a tenant leaving (``tenants.offboarding``): its leases and their events in the export,
and the closure refused while any lease of the tenant is not finished (waiting, holding or giving back capacity:
release them first, ``DELETE /api/v1/leases/{id}``)."""

from __future__ import annotations

from broker.choices import FINAL_STATES
from broker.models import Lease, LeaseEvent
from tenants.models import Tenant
from tenants.offboarding import csv_bytes


def leases_part(tenant: Tenant) -> dict[str, bytes]:
    stamp = lambda moment: moment.isoformat() if moment else ""  # noqa: E731
    leases = Lease.objects.filter(tenant=tenant).select_related("project", "created_by").order_by("pk")
    events = LeaseEvent.objects.filter(lease__tenant=tenant).order_by("lease_id", "at", "pk")
    return {
        "leases.csv": csv_bytes(
            ["id", "project", "state", "kind", "count", "profile", "milli", "tier", "workload_class", "over_quota",
             "requested_at", "active_at", "finished_at", "requested_by", "reason"],
            ([lease.pk, lease.project.slug, lease.state, lease.kind, lease.count, lease.profile, lease.milli,
              lease.tier, lease.workload_class, lease.over_quota, stamp(lease.requested_at), stamp(lease.active_at),
              stamp(lease.finished_at), lease.created_by.get_username() if lease.created_by else "", lease.reason]
             for lease in leases)),
        "lease_events.csv": csv_bytes(["lease", "at", "from_state", "to_state", "actor", "reason"],
                                 ([e.lease_id, stamp(e.at), e.from_state, e.to_state, e.actor, e.reason]
                                  for e in events)),
    }


def leases_unfinished(tenant: Tenant) -> str | None:
    live = list(Lease.objects.filter(tenant=tenant).exclude(state__in=FINAL_STATES).order_by("pk")
                .values_list("pk", flat=True)[:11])
    if not live:
        return None
    shown = ", ".join(str(pk) for pk in live[:10]) + (" …" if len(live) > 10 else "")
    return f"leases not finished ({shown}); release them first."
