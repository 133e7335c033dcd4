"""Billing's kind of data in the retention policy (``tenants.retention``): the hourly utilisation samples.

``UtilisationUsage`` rows (a lease's engine-active fraction, memory and energy per hour, from Prometheus) are
purged after ``RETENTION_UTILISATION_DAYS``; what an invoice shows of them is already aggregated into its lines
(``InvoiceLine.engine_active_avg``, ``memory_used_avg_mib``, ``idle_gpu_hours``), which are kept with the
invoice. A row of a month whose invoice is still a draft is never purged (the draft is recomputed from it).
The allocation usage (``AllocationUsage``) is what invoices charge: it is kept, like them.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db.models import DateField, Exists, OuterRef
from django.db.models.functions import TruncMonth

from billing.choices import InvoiceStatus
from billing.models import Invoice, UtilisationUsage
from tenants.retention import RetentionKind


def _old(cutoff: datetime):
    draft = Invoice.objects.filter(tenant=OuterRef("tenant"), status=InvoiceStatus.DRAFT, period=OuterRef("month"))
    return (UtilisationUsage.objects.filter(hour_start__lt=cutoff)
            .annotate(month=TruncMonth("hour_start", output_field=DateField(), tzinfo=UTC))
            .exclude(Exists(draft)))


def _purge(cutoff: datetime) -> int:
    ids = list(_old(cutoff).values_list("pk", flat=True))
    return UtilisationUsage.objects.filter(pk__in=ids).delete()[0] if ids else 0


UTILISATION = RetentionKind(
    name="utilisation_samples", setting="RETENTION_UTILISATION_DAYS", purge=_purge,
    count=lambda cutoff: _old(cutoff).count(),
    description="hourly utilisation samples per lease (aggregated into invoice lines, which are kept)")
