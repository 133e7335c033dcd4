"""Auto-tiering's rows (docs/tiering.md): workloads tenants register, their profiles per slice with where each
figure came from, the throughput samples a running workload reports, and the trained decision models."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class Provenance(models.TextChoices):
    PROFILED = "profiled", "profiled (a profiling lease)"
    OBSERVED = "observed", "observed (a running lease's telemetry)"
    PREDICTED = "predicted", "predicted (the decision engine)"


class Regime(models.TextChoices):
    """How a workload runs (``gpus.performance.REGIMES``); empty: inferred from its measured engine activity."""

    INFER = "", "infer from the measured engine activity"
    ENGINE = "engine", "engine (a serving engine or a replayed CUDA graph)"
    EAGER = "eager", "eager (the framework's model(x), operation by operation)"


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
    # the performance model's regime it runs in; "" = inferred from its profile's measured engine activity
    regime = models.CharField(max_length=8, blank=True, default="", choices=Regime.choices)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.CheckConstraint(condition=models.Q(regime__in=["", "engine", "eager"]),
                                   name="tiering_workload_regime_known"),
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
    # a predicted row: what its figure rests on ("scaled from <slice> measurement", "predicted (±X %)")
    basis = models.CharField(max_length=120, blank=True, default="")
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
    # the registered workload the sample's process says it is (the advice reads a lease's workload from it)
    workload = models.ForeignKey(Workload, null=True, blank=True, on_delete=models.SET_NULL, related_name="samples")

    class Meta:
        ordering = ["lease_id", "reported_at", "id"]

    def __str__(self) -> str:
        return f"lease {self.lease_id}: {self.throughput:.1f}/s"


class TierModelRecord(models.Model):
    """A trained decision model: the pickled ``tiering.engine.forest.TierModel``, the date of the newest
    profile it was trained on, how many rows, its validation error (architectures held out) and its
    calibrated confidence threshold."""

    trained_at = models.DateTimeField(default=timezone.now)
    training_set_date = models.DateTimeField()
    rows = models.PositiveIntegerField()
    validation_error = models.FloatField(null=True, blank=True)
    compute_efficiency = models.FloatField()
    memory_efficiency = models.FloatField()
    # the calibration, chosen on held-out folds of architectures as the benchmark's is (docs/tiering.md): the
    # least confidence to place on, the measurement noise taken out of the errors, and per candidate
    # threshold the misses and regret on those folds
    threshold = models.FloatField(null=True, blank=True)
    noise = models.FloatField(null=True, blank=True)
    calibration = models.JSONField(default=dict, blank=True)
    blob = models.BinaryField()

    class Meta:
        ordering = ["-trained_at", "-id"]

    def __str__(self) -> str:
        return f"model {self.pk} trained {self.trained_at:%Y-%m-%d %H:%M} on {self.rows} rows"


class ProfilingState(models.TextChoices):
    RUNNING = "running", "running"
    DONE = "done", "done"
    FAILED = "failed", "failed (no slice could be measured)"


class ProfilingRun(models.Model):
    """A profiling run (docs/tiering.md, "The profiler"): one short lease per candidate slice, requested at
    once (the scheduler runs them in parallel where capacity allows), each running the workload for
    ``window_seconds`` while Prometheus scrapes its DCGM series and the workload reports its throughput; each
    becomes a ``profiled`` profile row. ``token_prefix`` names the API token minted for the workload's samples
    (revoked when the run ends)."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="profiling_runs")
    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="profiling_runs")
    project = models.ForeignKey("tenants.Project", on_delete=models.PROTECT, related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    state = models.CharField(max_length=16, choices=ProfilingState.choices, default=ProfilingState.RUNNING)
    window_seconds = models.PositiveIntegerField()
    deadline_at = models.DateTimeField()
    token_prefix = models.CharField(max_length=32, blank=True, default="")
    outcome = models.CharField(max_length=500, blank=True, default="")
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["workload"], condition=models.Q(state="running"),
                                    name="tiering_one_running_profiling_per_workload"),
        ]

    def __str__(self) -> str:
        return f"profiling {self.workload_id} ({self.state})"


class ProfilingLease(models.Model):
    """One candidate slice of a profiling run and its lease; ``profile`` once measured (or found not to fit),
    ``outcome`` says what happened."""

    tenant_lookup = "run__tenant"

    run = models.ForeignKey(ProfilingRun, on_delete=models.CASCADE, related_name="leases")
    slice_key = models.CharField(max_length=64)
    lease = models.ForeignKey("broker.Lease", on_delete=models.PROTECT, related_name="+")
    profile = models.ForeignKey(Profile, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    outcome = models.CharField(max_length=300, blank=True, default="")
    done = models.BooleanField(default=False)

    class Meta:
        ordering = ["run_id", "slice_key"]
        constraints = [models.UniqueConstraint(fields=["run", "slice_key"], name="tiering_profiling_slice_once")]

    def __str__(self) -> str:
        return f"{self.run_id}: {self.slice_key}"


class AdviceKind(models.TextChoices):
    TOO_BIG = "too_big", "migrate to a smaller slice (saving)"
    TOO_SMALL = "too_small", "migrate to a bigger slice (speed-up)"
    QUANTIZE = "quantize", "quantize to INT8/FP8 (advice only)"


class AdviceBasis(models.TextChoices):
    """What the figure an advice quotes for its suggested slice rests on (issue 31)."""

    MEASURED = "measured", "a measurement of the workload on that slice"
    SCALED = "scaled", "another slice's measurement, scaled by the performance model"
    PREDICTED = "predicted", "a prediction of the performance model"


class TierAdvice(models.Model):
    """Advice on a running lease from its telemetry (docs/tiering.md, "Advice"): on the wrong tier (too big: the
    target is met with room to spare and a cheaper slice is predicted to meet it; too small: under target or
    under memory pressure), or it would fit a cheaper slice quantized. Advice only: nothing changes by itself.
    One open row per (lease, kind), refreshed at each scan; closed when the lease ends or the advice no longer
    holds."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="+")
    lease = models.ForeignKey("broker.Lease", on_delete=models.CASCADE, related_name="+")
    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="advice")
    kind = models.CharField(max_length=12, choices=AdviceKind.choices)
    current_slice = models.CharField(max_length=64)
    suggested_slice = models.CharField(max_length=64)
    reason = models.TextField()
    saving_per_hour = models.FloatField(default=0.0)  # in the price book's currency, per hour
    speedup = models.FloatField(null=True, blank=True)
    evidence = models.JSONField(default=dict)
    # what the suggested slice's figure rests on, and, unless measured there, the model's typical error for the
    # workload's regime (cross-validated median absolute error on measured GPUs, ``gpus.measured.expected_error``)
    basis = models.CharField(max_length=10, choices=AdviceBasis.choices, default=AdviceBasis.PREDICTED)
    expected_error = models.FloatField(null=True, blank=True)
    open = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-updated_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["lease", "kind"], condition=models.Q(open=True),
                                               name="tiering_one_open_advice_per_lease_kind"),
                       models.CheckConstraint(condition=models.Q(basis__in=AdviceBasis.values),
                                              name="tiering_advice_basis_known"),
                       # a measurement there needs no error bar; a prediction (or a scaled one) always has one
                       models.CheckConstraint(condition=models.Q(basis=AdviceBasis.MEASURED,
                                                                 expected_error__isnull=True)
                                              | (~models.Q(basis=AdviceBasis.MEASURED)
                                                 & models.Q(expected_error__isnull=False, expected_error__gte=0)),
                                              name="tiering_advice_error_matches_basis")]

    def __str__(self) -> str:
        return f"{self.kind} for lease {self.lease_id}: {self.suggested_slice}"

    @property
    def basis_text(self) -> str:
        """What the suggested slice's figure rests on, in the words the portal shows."""
        if self.basis == AdviceBasis.MEASURED or self.expected_error is None:
            return "a measurement on that slice"
        error = f"{self.expected_error:.0%}"
        if self.basis == AdviceBasis.SCALED:
            return f"another slice's measurement, scaled by the model (its ratio typically within ±{error})"
        return f"a prediction of the performance model, typically within ±{error}"
