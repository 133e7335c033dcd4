"""Pipelines, their plans (what ESG or a baseline chose) and model splits. The planners are the pure
``pipelines.planner``; these rows keep their input and answer, and the leases a plan was applied as."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from tenants.models import Project, Tenant


class Pipeline(models.Model):
    tenant_lookup = "tenant"
    project_lookup = "project"  # a project-limited member or token sees only its projects' (tenants.access)

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="pipelines")
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="pipelines")
    name = models.CharField(max_length=100)
    stages = models.JSONField()  # [{"name", "architecture"} | {"name", "profile": [{tier, kind, ...}]}]
    edges = models.JSONField(default=list)  # [[from, to], ...]
    slo_ms = models.FloatField()
    rate_rps = models.FloatField()
    tiers = models.JSONField(default=list)  # GPU models the stages may run on
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"pipeline {self.pk} {self.name}"


class PlanState(models.TextChoices):
    PLANNED = "planned"
    APPLIED = "applied"
    RELEASED = "released"


class PipelinePlan(models.Model):
    tenant_lookup = "tenant"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="plans")
    method = models.CharField(max_length=20)
    feasible = models.BooleanField()
    latency_ms = models.FloatField(null=True)
    cost_per_1k = models.FloatField(null=True)  # minor units of the price list's currency
    result = models.JSONField()  # the planner's answer (stages, SLO split, baselines for comparison)
    state = models.CharField(max_length=10, choices=PlanState.choices, default=PlanState.PLANNED)
    created_at = models.DateTimeField(default=timezone.now)
    applied_at = models.DateTimeField(null=True)
    released_at = models.DateTimeField(null=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"plan {self.pk} ({self.method}, {self.state})"


class PlanLease(models.Model):
    """One stage of an applied plan: the lease that holds its instances."""

    plan = models.ForeignKey(PipelinePlan, on_delete=models.CASCADE, related_name="leases")
    stage = models.CharField(max_length=100)
    lease = models.OneToOneField("broker.Lease", on_delete=models.PROTECT, related_name="pipeline_stage")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["plan", "stage"], name="plan_stage_once")]

    def __str__(self) -> str:
        return f"plan {self.plan_id} stage {self.stage}: lease {self.lease_id}"


class ModelSplit(models.Model):
    """A split planned over candidate GPUs; once applied, its groups are leased as one lease group (one lease per
    GPU of the split, the layer range in its access details) in ``project``."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="model_splits")
    project = models.ForeignKey(Project, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    name = models.CharField(max_length=100, blank=True)
    architecture = models.CharField(max_length=40, blank=True)
    batch = models.PositiveIntegerField(default=1)
    layers = models.JSONField()  # the layer table used
    gpus = models.JSONField()  # the candidates
    feasible = models.BooleanField()
    result = models.JSONField()  # heuristic, with the baselines beside it
    state = models.CharField(max_length=10, choices=PlanState.choices, default=PlanState.PLANNED)
    applied_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"model split {self.pk} {self.architecture or self.name}"


class ModelSplitLease(models.Model):
    """One group of an applied split: the lease that holds its GPU."""

    split = models.ForeignKey(ModelSplit, on_delete=models.CASCADE, related_name="leases")
    group = models.PositiveSmallIntegerField()  # index in the split's groups
    lease = models.OneToOneField("broker.Lease", on_delete=models.PROTECT, related_name="model_split_group")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["split", "group"], name="model_split_group_once")]

    def __str__(self) -> str:
        return f"model split {self.split_id} group {self.group}: lease {self.lease_id}"
