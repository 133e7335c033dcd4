"""Auto-tiering's rows (docs/tiering.md): workloads tenants register, their profiles per slice with where each
figure came from, the throughput samples a running workload reports, and the trained decision models."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Provenance(models.TextChoices):
    PROFILED = "profiled", "profiled (a profiling lease)"
    OBSERVED = "observed", "observed (a running lease's telemetry)"
    PREDICTED = "predicted", "predicted (the decision engine)"


class Workload(models.Model):
    """A tenant's workload: an architecture run a certain way, with a throughput or latency target. A workload
    without a tenant belongs to the platform's reference set (the profile database's seed)."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", null=True, blank=True, on_delete=models.PROTECT,
                               related_name="workloads")
    name = models.CharField(max_length=64)
    framework = models.CharField(max_length=32, blank=True, default="")
    architecture = models.CharField(max_length=64)
    task = models.CharField(max_length=16)
    precision = models.CharField(max_length=8)
    batch_size = models.PositiveIntegerField()
    seq_len = models.PositiveIntegerField(default=512)
    image_size = models.PositiveIntegerField(default=224)
    target_throughput = models.FloatField(null=True, blank=True)
    target_latency_ms = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="tiering_workload_name_per_tenant",
                                    nulls_distinct=False),
            models.CheckConstraint(condition=models.Q(target_throughput__gt=0) | models.Q(target_latency_ms__gt=0)
                                   | models.Q(tenant__isnull=True), name="tiering_workload_has_target"),
        ]

    def __str__(self) -> str:
        return self.name


class Profile(models.Model):
    """A workload on one slice (``H100-80GB``, ``A100-80GB/mig/3g.40gb``, ``L4/share/500``): throughput
    (samples/s; tokens/s for generation), peak framebuffer, engine activity, step latency, and provenance."""

    tenant_lookup = "workload__tenant"

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="profiles")
    slice_key = models.CharField(max_length=64)
    tier = models.CharField(max_length=32)
    provenance = models.CharField(max_length=16, choices=Provenance.choices)
    throughput = models.FloatField()
    memory_mib = models.PositiveIntegerField()
    engine_active = models.FloatField(null=True, blank=True)
    step_ms = models.FloatField(null=True, blank=True)
    confidence = models.FloatField(null=True, blank=True)
    fits = models.BooleanField(default=True)
    lease = models.ForeignKey("broker.Lease", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    measured_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["workload_id", "slice_key", "-measured_at"]
        indexes = [models.Index(fields=["workload", "slice_key", "provenance"], name="tiering_profile_slice")]

    def __str__(self) -> str:
        return f"{self.workload_id} on {self.slice_key} ({self.provenance}): {self.throughput:.1f}/s"


class LeaseSample(models.Model):
    """The workload's own throughput, reported by the workload through ``POST /api/v1/leases/{id}/samples``."""

    tenant_lookup = "lease__tenant"

    lease = models.ForeignKey("broker.Lease", on_delete=models.CASCADE, related_name="tiering_samples")
    throughput = models.FloatField()
    step_ms = models.FloatField(null=True, blank=True)
    reported_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["lease_id", "reported_at", "id"]

    def __str__(self) -> str:
        return f"lease {self.lease_id}: {self.throughput:.1f}/s"


class TierModelRecord(models.Model):
    """A trained decision model: the pickled ``tiering.engine.forest.TierModel``, the date of the newest
    profile it was trained on, how many rows, and its validation error (architectures held out)."""

    trained_at = models.DateTimeField(default=timezone.now)
    training_set_date = models.DateTimeField()
    rows = models.PositiveIntegerField()
    validation_error = models.FloatField(null=True, blank=True)
    compute_efficiency = models.FloatField()
    memory_efficiency = models.FloatField()
    blob = models.BinaryField()

    class Meta:
        ordering = ["-trained_at", "-id"]

    def __str__(self) -> str:
        return f"model {self.pk} trained {self.trained_at:%Y-%m-%d %H:%M} on {self.rows} rows"
