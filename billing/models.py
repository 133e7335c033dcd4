"""Metered usage. ``AllocationUsage`` is one row per lease per UTC hour: the exact seconds it held its
GPU capacity in that hour and the units held. Unique per (lease, hour), written by upsert, so metering
any window again changes nothing."""

from django.db import models
from django.db.models import Q


class AllocationUsage(models.Model):
    tenant_lookup = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="usage")
    project = models.ForeignKey("tenants.Project", on_delete=models.PROTECT, related_name="usage")
    lease = models.ForeignKey("broker.Lease", on_delete=models.PROTECT, related_name="usage")
    hour_start = models.DateTimeField()
    seconds = models.DecimalField(max_digits=10, decimal_places=6)  # ≤ 3600, microseconds exact
    tier = models.CharField(max_length=32)
    kind = models.CharField(max_length=8)
    mig_profile = models.CharField(max_length=32, blank=True)
    gpu_milli = models.PositiveIntegerField()  # quota units held (whole 1000, MIG compute/7, share milli)
    memory_mib = models.PositiveIntegerField()  # real memory held
    workload_class = models.CharField(max_length=16)
    over_quota = models.BooleanField()
    metered_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["lease", "hour_start"], name="usage_one_row_per_lease_hour"),
            models.CheckConstraint(condition=Q(seconds__gte=0) & Q(seconds__lte=3600), name="usage_seconds_in_hour"),
        ]
        indexes = [models.Index(fields=["tenant", "hour_start"])]

    def __str__(self) -> str:
        return f"lease {self.lease_id} {self.hour_start:%Y-%m-%d %H}:00 {self.seconds} s"
