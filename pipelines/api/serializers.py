from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from gpus.architectures import ARCHITECTURES
from gpus.catalogue import MODELS, model_get
from gpus.layers import layered
from gpus.performance import SPECS
from pipelines.models import ModelSplit, Pipeline, PipelinePlan
from tenants.api.serializers import StrictSerializer

# "not only spaces", the same in the validator (Python's ``re``) and in the OpenAPI pattern a client checks with an
# ECMAScript regex: Python's ``\s`` also holds the separators U+001C-U+001F and U+0085, ECMAScript's holds U+FEFF,
# so a bare ``\S`` let a fuzzer send a name of one U+001F that the schema allowed and the validator refused
VISIBLE = r"[^\s\u001c-\u001f\u0085\ufeff]"


class NumberField(serializers.FloatField):
    """A JSON number, as the document says: no string coerced into one (``"3"`` is refused)."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        # an integer past a bound must not pass by rounding to it as a float (10**18 + 1 -> 1e18)
        if isinstance(data, int) and self.max_value is not None and data > self.max_value:
            self.fail("max_value", max_value=self.max_value)
        if isinstance(data, int) and self.min_value is not None and data < self.min_value:
            self.fail("min_value", min_value=self.min_value)
        return super().to_internal_value(data)


# GPU models the planners have compute figures for (gpus.performance), in the catalogue's order
TIERS = [model.code for model in MODELS if model.code in SPECS]


class ProfileRowInput(StrictSerializer):
    """A measured latency: one batch of ``batch`` on a slice of ``tier`` takes ``latency_ms``."""

    tier = serializers.ChoiceField(choices=TIERS)
    kind = serializers.ChoiceField(choices=["whole", "mig", "share"], required=False,
                                   help_text="whole (default), mig (name the profile) or share (give milli)")
    profile = serializers.CharField(max_length=32, required=False,
                                    help_text="a MIG profile of the tier, e.g. 3g.40gb (kind mig)")
    milli = serializers.IntegerField(min_value=1, max_value=1000, required=False,
                                     help_text="thousandths of the GPU's time (kind share)")
    batch = serializers.IntegerField(min_value=1, max_value=1024, required=False)
    latency_ms = NumberField(min_value=0.001, max_value=3_600_000)


class StageInput(StrictSerializer):
    """A stage runs one model: a registered workload (its auto-tiering profiles), a catalogue architecture
    (profiled by the performance model) or measured rows."""

    name = serializers.RegexField(VISIBLE, max_length=100, help_text="unique in the pipeline; not only spaces")
    architecture = serializers.ChoiceField(choices=sorted(ARCHITECTURES), required=False)
    workload = serializers.CharField(max_length=64, required=False,
                                     help_text="a registered workload (auto-tiering): its profile rows give the "
                                               "latency per slice, measured first, else predicted; rows given in "
                                               "profile fill the slices it has none for")
    profile = serializers.ListField(child=ProfileRowInput(), min_length=1, max_length=200, required=False)
    task = serializers.ChoiceField(choices=["inference", "generation"], required=False,
                                   help_text="with an architecture: inference (one forward pass, the default) or "
                                             "generation (a decoder's answer: time to first token, then tokens)")
    prompt_tokens = serializers.IntegerField(min_value=1, max_value=32768, required=False,
                                             help_text="generation: the prompt's tokens (512)")
    output_tokens = serializers.IntegerField(min_value=1, max_value=32768, required=False,
                                             help_text="generation: the answer's tokens (128)")


class PipelineInput(StrictSerializer):
    """An inference pipeline: stages, the edges between them, an end-to-end SLO and an arrival rate."""

    project = serializers.CharField(max_length=100)
    name = serializers.RegexField(VISIBLE, max_length=100, help_text="not only spaces")
    stages = serializers.ListField(child=StageInput(), min_length=1, max_length=24)
    edges = serializers.ListField(child=serializers.ListField(child=serializers.RegexField(VISIBLE, max_length=100),
                                                              min_length=2, max_length=2),
                                  required=False, default=list, max_length=600,
                                  help_text="[from, to] pairs of stage names: no loop, no cycle")
    slo_ms = NumberField(min_value=0.001, max_value=3_600_000)
    rate_rps = NumberField(min_value=0.001, max_value=1_000_000)
    tiers = serializers.ListField(child=serializers.ChoiceField(choices=TIERS), required=False, default=list,
                                  max_length=len(TIERS))


class PlanInput(StrictSerializer):
    method = serializers.ChoiceField(choices=["esg", "even_greedy", "astar"], default="esg")


class ApplyInput(StrictSerializer):
    duration_seconds = serializers.IntegerField(min_value=60, max_value=30 * 86400, default=3600)


class LayerInput(StrictSerializer):
    """One layer of a model, in order: parameters, FLOPs per sample, the activation it hands on per sample."""

    name = serializers.CharField(max_length=100, required=False)
    params = serializers.IntegerField(min_value=0, max_value=10**12)
    flops = NumberField(min_value=0, max_value=10**18, help_text="per sample; a multiply-add counts 2")
    out_bytes = serializers.IntegerField(min_value=0, max_value=1 << 40, help_text="activation handed on, per sample")


class SplitGpuInput(StrictSerializer):
    """A candidate GPU: where it is, its model and the memory free on it."""

    id = serializers.CharField(max_length=100, required=False, help_text="unique among the candidates")
    node = serializers.CharField(max_length=100, required=False)
    model = serializers.ChoiceField(choices=TIERS)
    free_mib = serializers.IntegerField(min_value=1, max_value=max(model_get(t).memory_mib for t in TIERS),
                                        required=False, help_text="at most the model's memory (default: all of it)")


class SplitCandidatesInput(StrictSerializer):
    """How to choose the candidate GPUs instead of listing them: ``free`` (the whole GPUs free now that the tenant
    may lease) or ``tier`` with ``count`` (hypothetical GPUs of one model: planned, nothing reserved)."""

    free = serializers.BooleanField(required=False, help_text="true: the whole GPUs free now, within the "
                                                               "tenant's quotas")
    project = serializers.CharField(max_length=100, required=False,
                                    help_text="free: count this project's quota headroom (default: the best of the "
                                              "tenant's projects)")
    models = serializers.ListField(child=serializers.ChoiceField(choices=TIERS), required=False,
                                   max_length=len(TIERS), help_text="free: only these GPU models")
    nodes = serializers.IntegerField(min_value=1, max_value=1000, required=False,
                                     help_text="free: at most this many nodes (those with the most free GPUs)")
    tier = serializers.ChoiceField(choices=TIERS, required=False, help_text="a GPU model: plan on count of them")
    count = serializers.IntegerField(min_value=1, max_value=64, required=False, help_text="tier: how many GPUs")
    per_node = serializers.IntegerField(min_value=1, max_value=16, required=False,
                                        help_text="tier: GPUs per node (default: as the fleet's nodes of the "
                                                  "model hold them, else 8)")


class ModelSplitInput(StrictSerializer):
    """A model (a catalogue architecture, or a layer table) to split over candidate GPUs at a batch size."""

    name = serializers.CharField(max_length=100, required=False, default="")
    architecture = serializers.ChoiceField(choices=["", *layered()], required=False, default="",
                                           help_text="a catalogue architecture with a layer table; or give layers")
    layers = serializers.ListField(child=LayerInput(), min_length=1, max_length=1000, required=False, default=None,
                                   allow_null=True)
    batch = serializers.IntegerField(min_value=1, max_value=1024, default=1)
    gpus = serializers.ListField(child=SplitGpuInput(), min_length=1, max_length=64, required=False, default=None,
                                 allow_null=True, help_text="the candidate GPUs; or give candidates")
    candidates = SplitCandidatesInput(required=False, default=None, allow_null=True,
                                      help_text="choose the candidates: {free: true} or {tier, count}; or give gpus")


class PlanOutput(serializers.ModelSerializer):
    leases = serializers.SerializerMethodField()

    class Meta:
        model = PipelinePlan
        fields = ["id", "pipeline", "method", "feasible", "latency_ms", "cost_per_1k", "state", "result",
                  "created_at", "applied_at", "released_at", "leases"]

    def get_leases(self, plan) -> list[dict]:
        return [{"stage": link.stage, "lease": link.lease_id, "state": link.lease.state}
                for link in plan.leases.select_related("lease").order_by("id")]


class PipelineOutput(serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = Pipeline
        fields = ["id", "project", "name", "stages", "edges", "slo_ms", "rate_rps", "tiers", "created_at"]


class ModelSplitApplyInput(StrictSerializer):
    project = serializers.CharField(max_length=100)
    duration_seconds = serializers.IntegerField(min_value=60, max_value=30 * 86400, default=3600)


class SplitLeaseOutput(serializers.Serializer):
    group = serializers.IntegerField()
    lease = serializers.IntegerField(source="lease_id")
    state = serializers.CharField(source="lease.state")


class ModelSplitOutput(serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    leases = serializers.SerializerMethodField()

    class Meta:
        model = ModelSplit
        fields = ["id", "name", "architecture", "batch", "gpus", "feasible", "result", "state", "project",
                  "created_at", "applied_at", "released_at", "leases"]

    @extend_schema_field(SplitLeaseOutput(many=True))
    def get_leases(self, split) -> list[dict]:
        return SplitLeaseOutput(split.leases.select_related("lease").order_by("group"), many=True).data
