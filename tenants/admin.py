"""Django admin for platform staff. Writes that carry rules (quotas) go through the services so the
admin gets the same errors as the API."""

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from config.errors import ApplicationError
from tenants import services
from tenants.models import (
    ApiToken,
    AuditEvent,
    Membership,
    Project,
    Quota,
    SloContract,
    SloCreditStep,
    Tenant,
    TenantQuota,
)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


class TenantQuotaInline(admin.TabularInline):
    model = TenantQuota
    extra = 0
    can_delete = False
    readonly_fields = ["tier", "deserved_gpu_milli", "limit_gpu_milli"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "status", "currency", "billing_email", "created_at"]
    list_filter = ["status", "currency"]
    search_fields = ["slug", "name", "billing_email"]
    inlines = [MembershipInline, TenantQuotaInline]
    actions = ["suspend", "activate"]

    @admin.action(description="Suspend selected tenants")
    def suspend(self, request, queryset):
        for tenant in queryset:
            services.tenant_set_status(tenant=tenant, status="suspended", by_user=request.user, reason="admin")

    @admin.action(description="Reactivate selected tenants")
    def activate(self, request, queryset):
        for tenant in queryset:
            services.tenant_set_status(tenant=tenant, status="active", by_user=request.user, reason="admin")


class QuotaInline(admin.TabularInline):
    model = Quota
    extra = 0
    can_delete = False
    readonly_fields = ["tier", "deserved_gpu_milli", "limit_gpu_milli", "over_quota_weight"]

    def has_add_permission(self, request, obj=None):
        return False  # quotas are set on the Quota page, where the tenant bound is checked


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["slug", "tenant", "name", "created_at"]
    list_filter = ["tenant"]
    search_fields = ["slug", "name", "tenant__slug"]
    inlines = [QuotaInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username", "tenant__slug"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "name", "tenant", "user", "scopes", "created_at", "expires_at", "last_used_at",
                    "revoked_at"]
    list_filter = ["tenant"]
    search_fields = ["prefix", "name", "user__username"]
    readonly_fields = ["prefix", "secret_hash", "created_at", "last_used_at"]

    def has_add_permission(self, request):
        return False  # tokens are created by their member (portal, API or `manage.py tenant_bootstrap`)


class TenantQuotaForm(forms.ModelForm):
    class Meta:
        model = TenantQuota
        fields = ["tenant", "tier", "deserved_gpu_milli", "limit_gpu_milli"]


class QuotaForm(forms.ModelForm):
    """Checks the two-level bound with the service's own rule, so the admin shows the API's message."""

    class Meta:
        model = Quota
        fields = ["project", "tier", "deserved_gpu_milli", "limit_gpu_milli", "over_quota_weight"]

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        try:
            services.quota_check(
                project=data["project"], tier=data["tier"], deserved_gpu_milli=data["deserved_gpu_milli"],
                limit_gpu_milli=data["limit_gpu_milli"], over_quota_weight=data["over_quota_weight"],
            )
        except ApplicationError as exc:
            raise ValidationError({exc.field if exc.field in self.fields else None: exc.message}) from exc
        return data


@admin.register(TenantQuota)
class TenantQuotaAdmin(admin.ModelAdmin):
    form = TenantQuotaForm
    list_display = ["tenant", "tier", "deserved_gpu_milli", "limit_gpu_milli"]
    list_filter = ["tier", "tenant"]

    def save_model(self, request, obj, form, change):
        services.tenant_quota_set(tenant=obj.tenant, tier=obj.tier, deserved_gpu_milli=obj.deserved_gpu_milli,
                                  limit_gpu_milli=obj.limit_gpu_milli, by_user=request.user)


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    form = QuotaForm
    list_display = ["project", "tier", "deserved_gpu_milli", "limit_gpu_milli", "over_quota_weight"]
    list_filter = ["tier", "project__tenant"]

    def save_model(self, request, obj, form, change):
        services.quota_set(project=obj.project, tier=obj.tier, deserved_gpu_milli=obj.deserved_gpu_milli,
                           limit_gpu_milli=obj.limit_gpu_milli, over_quota_weight=obj.over_quota_weight,
                           by_user=request.user)


class SloCreditStepInline(admin.TabularInline):
    model = SloCreditStep
    extra = 1


@admin.register(SloContract)
class SloContractAdmin(admin.ModelAdmin):
    list_display = ["tenant", "name", "effective_from", "effective_to", "time_to_gpu_p95_seconds",
                    "availability_target_pct", "preemption_notice_seconds"]
    list_filter = ["tenant"]
    inlines = [SloCreditStepInline]


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "tenant", "actor", "action", "target"]
    list_filter = ["action", "tenant"]
    search_fields = ["target", "action"]

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_add_permission(self, request):
        return False
