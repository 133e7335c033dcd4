"""The broker's kind of data in the retention policy (``tenants.retention``): raw lease events.

A lease's events (every transition, every workload report) are purged once the lease has been finished for
``RETENTION_LEASE_EVENT_DAYS``: the events of a lease that is still live, or finished more recently, are all kept,
so a lease's history is never cut in the middle. What the events proved is kept elsewhere: the lease row itself
(its times and state), the metered usage and the invoices, and the SLO evaluations of past months.
"""

from __future__ import annotations

from datetime import datetime

from broker.choices import FINAL_STATES
from broker.models import LeaseEvent
from tenants.retention import RetentionKind


def _old(cutoff: datetime):
    return LeaseEvent.objects.filter(lease__state__in=FINAL_STATES, lease__finished_at__lt=cutoff)


LEASE_EVENTS = RetentionKind(
    name="lease_events", setting="RETENTION_LEASE_EVENT_DAYS",
    purge=lambda cutoff: _old(cutoff).delete()[0], count=lambda cutoff: _old(cutoff).count(),
    description="raw lease events (transitions, workload reports) of leases finished before the cutoff")
