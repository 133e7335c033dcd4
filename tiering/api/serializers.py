from rest_framework import serializers

from tenants.api.serializers import StrictSerializer
from tiering.models import AdviceBasis, LeaseSample, Profile, Workload


class WorkloadOutput(serializers.ModelSerializer):
    regime_in_use = serializers.SerializerMethodField(help_text=(
        "the regime the performance model uses for it: the registered one, else inferred from its measured engine "
        "activity, else engine"))
    regime_source = serializers.SerializerMethodField(help_text="how regime_in_use is known")

    class Meta:
        model = Workload
        fields = ["name", "framework", "architecture", "task", "precision", "batch_size", "seq_len", "image_size",
                  "target_throughput", "target_latency_ms", "regime", "regime_in_use", "regime_source", "created_at"]

    def _regime(self, workload) -> tuple[str, str]:
        from tiering.services import workload_regime

        cache = self.context.setdefault("regimes", {})
        if workload.pk not in cache:
            cache[workload.pk] = workload_regime(workload)
        return cache[workload.pk]

    def get_regime_in_use(self, workload) -> str:
        return self._regime(workload)[0]

    def get_regime_source(self, workload) -> str:
        return self._regime(workload)[1]


class WorkloadInput(StrictSerializer):
    """The body's shape (unknown fields and wrong JSON types refused, naming the field); its values are checked
    by ``tiering.services.workload_clean``, which names the field at fault."""

    name = serializers.CharField()
    architecture = serializers.CharField()
    framework = serializers.CharField(required=False)
    task = serializers.ChoiceField(["training", "inference", "generation"], required=False)
    precision = serializers.ChoiceField(["fp32", "tf32", "bf16", "fp16", "fp8", "int8"], required=False)
    batch_size = serializers.IntegerField(required=False)
    seq_len = serializers.IntegerField(required=False)
    image_size = serializers.IntegerField(required=False)
    target_throughput = serializers.FloatField(required=False)
    target_latency_ms = serializers.FloatField(required=False)
    regime = serializers.ChoiceField(["engine", "eager"], required=False, allow_null=True, help_text=(
        "engine (a serving engine or a replayed CUDA graph), eager (the framework's model(x)), or null (or left "
        "out): inferred from the measured engine activity"))


class WorkloadRegimeInput(StrictSerializer):
    """``PATCH /api/v1/workloads/{name}``: the regime (null: inferred from the measured engine activity); a body
    without it changes nothing."""

    regime = serializers.ChoiceField(["engine", "eager"], required=False, allow_null=True)


class ProfileOutput(serializers.ModelSerializer):
    lease = serializers.IntegerField(source="lease_id", allow_null=True)

    class Meta:
        model = Profile
        fields = ["slice_key", "tier", "provenance", "throughput", "memory_mib", "engine_active", "step_ms",
                  "confidence", "fits", "basis", "lease", "measured_at"]


class OptionOutput(serializers.Serializer):
    slice = serializers.CharField()
    label = serializers.CharField()
    price_per_hour = serializers.FloatField()
    throughput = serializers.FloatField()
    memory_mib = serializers.IntegerField()
    confidence = serializers.FloatField()
    basis = serializers.CharField(help_text=(
        'what the figure rests on: "measured", "scaled from <slice> measurement" or "predicted (±X %)"'))


class PredictionOutput(serializers.Serializer):
    workload = serializers.CharField()
    regime = serializers.CharField(help_text="the regime the figures are in (the workload's regime_in_use)")
    required_throughput = serializers.FloatField()
    chosen = OptionOutput(allow_null=True)
    slices = OptionOutput(many=True, help_text="every slice weighed, with what its figure rests on")
    profile_first = serializers.BooleanField()
    reason = serializers.CharField()
    explore = serializers.ListField(child=serializers.CharField(), help_text=(
        "the cheaper slices to profile first while a slice is confident (exploring; chosen is the confident "
        "one), cheapest first; empty otherwise"))


class SampleInput(StrictSerializer):
    """Bounds as ``tiering.services.lease_sample_record`` checks them."""

    throughput = serializers.FloatField(min_value=0, max_value=1e12)
    step_ms = serializers.FloatField(required=False, min_value=0, max_value=3.6e6)
    workload = serializers.CharField(required=False, max_length=64,
                                     help_text="the registered workload this process is (the advice reads it)")


class SampleOutput(serializers.ModelSerializer):
    lease = serializers.IntegerField(source="lease_id")
    workload = serializers.CharField(source="workload.name", allow_null=True, default=None)

    class Meta:
        model = LeaseSample
        fields = ["lease", "throughput", "step_ms", "workload", "reported_at"]


def _slice_keys() -> list[str]:
    from gpus.performance import SPECS, slices_for

    return sorted(where.key for model in SPECS for where in slices_for(model))


class ProfilingRunInput(StrictSerializer):
    """Bounds as ``tiering.profiler.profiling_start`` checks them (it names the field at fault); ``slices``:
    slice keys (``MODEL``, ``MODEL/mig/PROFILE``, ``MODEL/share/MILLI``), default the whole GPU of every priced
    model in the fleet."""

    project = serializers.CharField()
    slices = serializers.ListField(child=serializers.ChoiceField(choices=_slice_keys()), required=False,
                                   min_length=1, max_length=12)
    window_seconds = serializers.IntegerField(required=False, min_value=5, max_value=3600)


class ProfilingLeaseOutput(serializers.Serializer):
    slice_key = serializers.CharField()
    lease = serializers.IntegerField(source="lease_id")
    done = serializers.BooleanField()
    outcome = serializers.CharField()
    throughput = serializers.FloatField(source="profile.throughput", allow_null=True, default=None)
    memory_mib = serializers.IntegerField(source="profile.memory_mib", allow_null=True, default=None)
    engine_active = serializers.FloatField(source="profile.engine_active", allow_null=True, default=None)


class ProfilingRunOutput(serializers.Serializer):
    id = serializers.IntegerField()
    workload = serializers.CharField(source="workload.name")
    project = serializers.CharField(source="project.slug")
    state = serializers.CharField()
    window_seconds = serializers.IntegerField()
    deadline_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    outcome = serializers.CharField()
    leases = ProfilingLeaseOutput(many=True, source="leases.all")


class AdviceOutput(serializers.Serializer):
    id = serializers.IntegerField()
    lease = serializers.IntegerField(source="lease_id")
    workload = serializers.CharField(source="workload.name")
    kind = serializers.CharField()
    current_slice = serializers.CharField()
    suggested_slice = serializers.CharField()
    reason = serializers.CharField()
    saving_per_hour = serializers.FloatField()
    speedup = serializers.FloatField(allow_null=True)
    evidence = serializers.DictField()
    basis = serializers.ChoiceField(choices=AdviceBasis.choices, help_text=(
        "what the suggested slice's figure rests on: a measurement of the workload there, another slice's "
        "measurement scaled by the performance model's ratio in the workload's regime, or a prediction of the model "
        "(quantization advice always: nothing was measured at the new precision)"))
    expected_error = serializers.FloatField(allow_null=True, help_text=(
        "unless measured there: the model's typical relative error for the workload's regime and task (its median "
        "absolute error cross-validated by architecture on measured GPUs, docs/tiering.md §2.2); null for a "
        "measurement"))
    open = serializers.BooleanField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
