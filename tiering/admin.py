"""Django admin for auto-tiering: read-only views of workloads, profiles, profiling runs, advice and trained
models (they are written by ``tiering.services``, ``tiering.profiler`` and ``tiering.advice`` only, audited), and
one action: retrain the decision model now (the periodic task's service)."""

from __future__ import annotations

from django.contrib import admin, messages

from tiering import services
from tiering.models import Profile, ProfilingLease, ProfilingRun, TierAdvice, TierModelRecord, Workload


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Workload)
class WorkloadAdmin(ReadOnly):
    list_display = ["name", "tenant", "architecture", "task", "precision", "batch_size", "target_throughput",
                    "target_latency_ms", "created_at"]
    list_filter = ["task", "precision"]
    search_fields = ["name", "architecture"]


@admin.register(Profile)
class ProfileAdmin(ReadOnly):
    list_display = ["workload", "slice_key", "provenance", "throughput", "memory_mib", "engine_active", "confidence",
                    "fits", "lease", "measured_at"]
    list_filter = ["provenance", "tier"]
    search_fields = ["workload__name", "slice_key"]


class ProfilingLeaseInline(admin.TabularInline):
    model = ProfilingLease
    fields = ["slice_key", "lease", "done", "outcome", "profile"]
    readonly_fields = fields
    can_delete = False
    extra = 0


@admin.register(ProfilingRun)
class ProfilingRunAdmin(ReadOnly):
    list_display = ["id", "workload", "tenant", "state", "window_seconds", "started_at", "finished_at"]
    list_filter = ["state"]
    inlines = [ProfilingLeaseInline]


@admin.register(TierAdvice)
class TierAdviceAdmin(ReadOnly):
    list_display = ["id", "kind", "tenant", "lease", "workload", "current_slice", "suggested_slice", "saving_per_hour",
                    "basis", "expected_error", "open", "updated_at"]
    list_filter = ["kind", "basis", "open"]


@admin.register(TierModelRecord)
class TierModelRecordAdmin(ReadOnly):
    list_display = ["id", "trained_at", "training_set_date", "rows", "validation_error", "compute_efficiency",
                    "memory_efficiency"]
    exclude = ["blob"]
    actions = ["retrain"]

    @admin.action(description="Retrain the decision model now (on every measured profile)")
    def retrain(self, request, queryset):
        record = services.model_retrain()
        if record is None:
            self.message_user(request, "Too few profile rows to train on.", messages.WARNING)
        else:
            self.message_user(request, f"Model {record.pk} trained on {record.rows} rows.", messages.SUCCESS)
