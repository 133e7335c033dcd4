"""The capacity loop's rows: what the planner proposed and what became of it, and the loop's settings.

Rules the database keeps: one open (proposed or applying) adjustment per fingerprint — the planner runs
every minute and proposes the same thing again while the world stays the same, which refreshes the row
instead of adding one; a state is one of ``AdjustmentState``; a policy's scope is unique.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q
from django.utils import timezone

from capacity.choices import OPEN_STATES, AdjustmentKind, AdjustmentState, LoopMode


class Adjustment(models.Model):
    """One adjustment of the fleet's shape or one piece of advice (docs/capacity.md).

    ``change``, ``evidence`` are the planner's (``capacity.planner.types.Change`` / ``Evidence`` as JSON);
    the expected gain is split in three integers; ``risk`` lists the leases it would touch. ``tenant`` /
    ``project`` / ``lease`` / ``gpu`` say whom it concerns (a tenant sees its own advice and the changes
    that touched its leases). ``effect`` is what was measured after it was applied."""

    tenant_lookup = "tenant"

    kind = models.CharField(max_length=16, choices=AdjustmentKind.choices)
    target = models.CharField(max_length=120)
    fingerprint = models.CharField(max_length=64)
    state = models.CharField(max_length=12, choices=AdjustmentState.choices, default=AdjustmentState.PROPOSED)
    mode = models.CharField(max_length=8, choices=LoopMode.choices)
    reason = models.TextField()
    change = models.JSONField(default=dict)
    evidence = models.JSONField(default=dict)
    gain_gpu_seconds = models.BigIntegerField(default=0)
    gain_money_minor = models.BigIntegerField(default=0)
    currency = models.CharField(max_length=3, blank=True)
    # the price book the money gain was priced at where it is not the general one the planner used (a tenant's
    # own book pricing its right-sizing advice); shown beside the gain, never written into ``reason``
    priced_with = models.CharField(max_length=200, blank=True)
    gain_time_to_gpu_seconds = models.IntegerField(default=0)
    risk = ArrayField(models.BigIntegerField(), default=list, blank=True)
    tenant_ids = ArrayField(models.BigIntegerField(), default=list, blank=True)  # every tenant it concerns
    tenant = models.ForeignKey("tenants.Tenant", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    project = models.ForeignKey("tenants.Project", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    lease = models.ForeignKey("broker.Lease", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    gpu = models.ForeignKey("broker.Gpu", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    proposed_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)  # the newest planner run that proposed it
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    applied_by = models.CharField(max_length=150, blank=True)  # "loop" or "user:alice"
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.TextField(blank=True)  # why it failed, expired or was rejected; what applying did
    effect = models.JSONField(null=True, blank=True)
    effect_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-proposed_at", "-pk"]
        constraints = [
            models.UniqueConstraint(fields=["fingerprint"], condition=Q(state__in=OPEN_STATES),
                                    name="adjustment_one_open_per_fingerprint"),
            models.CheckConstraint(condition=Q(state__in=AdjustmentState.values), name="adjustment_state_valid"),
            models.CheckConstraint(condition=Q(kind__in=AdjustmentKind.values), name="adjustment_kind_valid"),
        ]
        indexes = [models.Index(fields=["state", "kind"], name="capacity_adj_state_kind"),
                   models.Index(fields=["tenant", "state"], name="capacity_adj_tenant_state")]

    def __str__(self) -> str:
        return f"adjustment {self.pk} ({self.kind} {self.target}, {self.state})"

    @property
    def step(self) -> str:
        return str(self.change.get("step", ""))


class CapacityPolicy(models.Model):
    """The loop's settings for one scope: ``""`` (the default), ``pool:<model>`` (mode switch, MIG layout,
    warm pool) or ``project:<id>`` (idle reclaim, right-sizing, quota advice). A field left empty (null)
    takes the default scope's value, then the planner's built-in default."""

    tenant_lookup = None  # platform settings

    scope = models.CharField(max_length=80, unique=True, blank=True)
    mode_switch = models.CharField(max_length=8, choices=LoopMode.choices, blank=True)
    mig_layout = models.CharField(max_length=8, choices=LoopMode.choices, blank=True)
    warm_pool = models.CharField(max_length=8, choices=LoopMode.choices, blank=True)
    idle_reclaim = models.CharField(max_length=8, choices=LoopMode.choices, blank=True)
    right_size = models.CharField(max_length=8, choices=LoopMode.choices, blank=True)
    quota_advice = models.CharField(max_length=8, choices=LoopMode.choices, blank=True)
    # per reclaim class ("interactive", "inference", "training", "over-quota"):
    # {"enabled": bool, "threshold_permille": int, "window_seconds": int, "notice_seconds": int}
    idle_rules = models.JSONField(default=dict, blank=True)
    warm_target_p95_seconds = models.PositiveIntegerField(null=True, blank=True)
    cold_provision_seconds = models.PositiveIntegerField(null=True, blank=True)
    warm_min_arrivals = models.PositiveIntegerField(null=True, blank=True)
    mode_hold_seconds = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["scope"]
        verbose_name_plural = "capacity policies"

    def __str__(self) -> str:
        return f"capacity policy {self.scope or '(default)'}"
