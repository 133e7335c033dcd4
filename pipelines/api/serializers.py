from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from pipelines.models import ModelSplit, Pipeline, PipelinePlan
from tenants.api.serializers import StrictSerializer


class PipelineInput(StrictSerializer):
    project = serializers.CharField(max_length=100)
    name = serializers.CharField(max_length=100)
    stages = serializers.ListField(child=serializers.JSONField(), min_length=1, max_length=24)
    edges = serializers.ListField(child=serializers.ListField(child=serializers.CharField(), min_length=2,
                                                              max_length=2), required=False, default=list)
    slo_ms = serializers.FloatField()
    rate_rps = serializers.FloatField()
    tiers = serializers.ListField(child=serializers.CharField(), required=False, default=list)


class PlanInput(StrictSerializer):
    method = serializers.ChoiceField(choices=["esg", "even_greedy", "astar"], default="esg")


class ApplyInput(StrictSerializer):
    duration_seconds = serializers.IntegerField(min_value=60, max_value=30 * 86400, default=3600)


class ModelSplitInput(StrictSerializer):
    name = serializers.CharField(max_length=100, required=False, default="")
    architecture = serializers.CharField(max_length=40, required=False, default="")
    layers = serializers.ListField(child=serializers.JSONField(), required=False, default=None, allow_null=True)
    batch = serializers.IntegerField(min_value=1, max_value=1024, default=1)
    gpus = serializers.ListField(child=serializers.JSONField(), min_length=1, max_length=64)


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
