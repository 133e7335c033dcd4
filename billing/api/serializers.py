from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from billing.models import Invoice, InvoiceLine
from billing.pricing import from_minor


class UsageGroupOutput(serializers.Serializer):
    key = serializers.CharField()
    gpu_hours = serializers.DecimalField(max_digits=18, decimal_places=6)
    engine_active_avg = serializers.DecimalField(max_digits=7, decimal_places=4, allow_null=True)
    idle_gpu_hours = serializers.DecimalField(max_digits=18, decimal_places=6, allow_null=True)
    amount_minor = serializers.IntegerField(allow_null=True, help_text="cost at the prices in force; null if unpriced")


class UsageOutput(serializers.Serializer):
    start = serializers.DateTimeField(source="from")
    end = serializers.DateTimeField(source="to")
    group_by = serializers.CharField()
    currency = serializers.CharField()
    groups = UsageGroupOutput(many=True)


class InvoiceLineOutput(serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    model = serializers.CharField(source="tier")
    amount = serializers.SerializerMethodField()

    class Meta:
        model = InvoiceLine
        fields = ["position", "kind", "description", "project", "model", "mig_profile", "workload_class",
                  "over_quota", "quantity", "unit", "unit_price", "amount_minor", "amount", "gpu_hours",
                  "engine_active_avg", "memory_used_avg_mib", "idle_gpu_hours", "evidence"]

    def get_amount(self, obj) -> str:
        return str(from_minor(obj.amount_minor, obj.invoice.currency))


@extend_schema_field({"type": "string", "pattern": r"^\d{4}-\d{2}$", "example": "2026-01"})
class MonthField(serializers.DateField):
    """A month as ``YYYY-MM`` (documented so: ``format: date`` promised a day that is not there)."""


class InvoiceOutput(serializers.ModelSerializer):
    period = MonthField(format="%Y-%m")
    total = serializers.SerializerMethodField()

    class Meta:
        model = Invoice
        fields = ["id", "number", "period", "status", "currency", "subtotal_minor", "discount_minor",
                  "credit_minor", "total_minor", "total", "computed_at", "finalized_at", "paid_at", "voided_at"]

    def get_total(self, obj) -> str:
        return str(from_minor(obj.total_minor, obj.currency))


class InvoiceDetailOutput(InvoiceOutput):
    lines = InvoiceLineOutput(many=True, read_only=True)

    class Meta(InvoiceOutput.Meta):
        fields = [*InvoiceOutput.Meta.fields, "lines"]
