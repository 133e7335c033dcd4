"""Django admin for the capacity loop: adjustments are read-only but for the audited decisions (accept,
reject), and policies are written through ``capacity.services.policy_set`` / ``policy_delete``, so the admin
gets the same rules and errors as the API and the ops page."""

from __future__ import annotations

from django.contrib import admin, messages

from capacity import services
from capacity.models import Adjustment, CapacityPolicy
from capacity.selectors import MODE_FIELDS, NUMBER_FIELDS
from core.admin import ServiceAdmin
from core.errors import ApplicationError


@admin.register(Adjustment)
class AdjustmentAdmin(admin.ModelAdmin):
    list_display = ["id", "kind", "target", "state", "mode", "tenant", "proposed_at", "applied_by", "finished_at"]
    list_filter = ["kind", "state", "mode"]
    search_fields = ["target", "reason"]
    list_select_related = ["tenant"]
    fields = ["kind", "target", "state", "mode", "reason", "change", "evidence", "gain_gpu_seconds",
              "gain_money_minor", "currency", "priced_with", "gain_time_to_gpu_seconds", "risk", "tenant_ids",
              "tenant", "project", "lease", "gpu", "proposed_at", "last_seen_at", "decided_at", "decided_by",
              "applied_by", "finished_at", "outcome", "effect", "effect_at", "fingerprint"]
    readonly_fields = fields
    actions = ["accept", "reject"]

    def has_add_permission(self, request):
        return False  # the planner proposes them

    def has_change_permission(self, request, obj=None):
        return False  # decided by the actions below (audited), never edited

    def has_delete_permission(self, request, obj=None):
        return False  # the record of what the loop did

    def _decide(self, request, queryset, decision: str) -> None:
        done = 0
        for adjustment in queryset.order_by("pk"):
            try:
                if decision == "accept":
                    adjustment = services.adjustment_accept(adjustment=adjustment, user=request.user)
                else:
                    adjustment = services.adjustment_reject(adjustment=adjustment, user=request.user,
                                                            reason="in the admin")
            except ApplicationError as error:
                self.message_user(request, f"Adjustment {adjustment.pk}: {error.message}", level=messages.ERROR)
                continue
            done += 1
            level = messages.WARNING if adjustment.state == "failed" else messages.SUCCESS
            self.message_user(request, f"Adjustment {adjustment.pk}: {adjustment.state} — {adjustment.outcome}",
                              level=level)
        if not done:
            self.message_user(request, "Nothing was decided.", level=messages.WARNING)

    @admin.action(description="Accept the selected proposals (advice recorded, changes applied now)")
    def accept(self, request, queryset):
        self._decide(request, queryset, "accept")

    @admin.action(description="Reject the selected proposals")
    def reject(self, request, queryset):
        self._decide(request, queryset, "reject")


@admin.register(CapacityPolicy)
class CapacityPolicyAdmin(ServiceAdmin):
    """The form checks field types (and that a new scope is not taken); the service checks the rest (the
    scope names a GPU model or a project, the idle rules' classes and bounds) and its refusal comes back as
    a message on the form, nothing saved."""

    list_display = ["scope_label", *MODE_FIELDS, "updated_at"]
    search_fields = ["scope"]
    fields = ["scope", *MODE_FIELDS, "idle_rules", *NUMBER_FIELDS, "updated_at"]

    @admin.display(description="scope", ordering="scope")
    def scope_label(self, obj) -> str:
        return obj.scope or "(default)"

    def get_readonly_fields(self, request, obj=None):
        # a policy is its scope: another scope is another policy (add it)
        return ["scope", "updated_at"] if obj is not None else ["updated_at"]

    def has_delete_permission(self, request, obj=None):
        return obj is None or obj.scope != ""  # the default scope stays (its fields can be emptied)

    def save_model(self, request, obj, form, change):
        values = {name: form.cleaned_data[name] for name in (*MODE_FIELDS, "idle_rules", *NUMBER_FIELDS)
                  if name in form.cleaned_data}
        policy = services.policy_set(scope=obj.scope, values=values, by_user=request.user)
        obj.pk, obj.updated_at = policy.pk, policy.updated_at

    def delete_model(self, request, obj):
        services.policy_delete(policy=obj, by_user=request.user)
