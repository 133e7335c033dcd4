"""Django admin for platform staff: nodes and their GPUs, read-only but for the audited actions (approve a
node's re-enrollment, release a GPU), which go through the services. Secrets are never shown."""

from django.contrib import admin, messages

from broker import selectors, services
from broker.models import EnrollmentToken, Gpu, Node
from core.errors import ApplicationError


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    can_delete = False
    fields = ["index", "uuid", "model", "mode", "memory_mib", "nvlink_domain", "share_enforcement",
              "share_enforcement_reason", "lost_at", "released_at"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["node_id", "pool", "status", "cordoned", "address", "last_heartbeat_at", "reenroll_approved_at",
                    "isolation", "isolation_warning"]
    list_filter = ["status", "cordoned", "pool", "isolation"]
    search_fields = ["node_id", "hostname", "address"]
    fields = ["node_id", "pool", "address", "hostname", "agent_version", "status", "cordoned", "enrolled_at",
              "last_heartbeat_at", "silent_since", "reenroll_approved_at", "workload_runtime", "isolation",
              "isolation_warning", "workload_roots", "host_cpu_milli", "host_memory_mib"]
    readonly_fields = fields
    inlines = [GpuInline]
    actions = ["approve_reenrollment"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="Isolation warning")
    def isolation_warning(self, node):
        return selectors.node_isolation_warning(node=node, tenant_count=selectors.node_tenant_count(node=node))

    @admin.action(description="Approve one token re-enrollment of the selected nodes (agents that lost their secret)")
    def approve_reenrollment(self, request, queryset):
        for node in queryset.order_by("pk"):
            services.node_reenroll_approve(node=node, by_user=request.user, reason="admin")
        self.message_user(request, "The next enrollment of each selected node with a valid token is accepted once.")


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["uuid", "node", "index", "model", "mode", "nvlink_domain", "share_enforcement", "lost_at",
                    "released_at"]
    list_filter = ["model", "mode", "share_enforcement"]
    search_fields = ["uuid", "node__node_id"]
    fields = ["uuid", "node", "index", "model", "mode", "memory_mib", "share_enforcement", "share_enforcement_reason",
              "nvlink_domain", "lost_at", "released_at"]
    readonly_fields = fields
    actions = ["release"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Release the selected GPUs from their nodes (another node may then claim them)")
    def release(self, request, queryset):
        for gpu in queryset.order_by("pk"):
            try:
                services.gpu_release(gpu=gpu, by_user=request.user, reason="admin")
            except ApplicationError as error:
                self.message_user(request, f"{gpu.uuid}: {error.message}", level=messages.ERROR)


@admin.register(EnrollmentToken)
class EnrollmentTokenAdmin(admin.ModelAdmin):
    """Tokens are created by ``manage.py agent_token_create`` (printed once; only the hash is stored)."""

    list_display = ["prefix", "pool", "uses_left", "expires_at", "created_at"]
    list_filter = ["pool"]
    search_fields = ["prefix"]
    fields = ["prefix", "pool", "uses_left", "expires_at", "created_at"]
    readonly_fields = fields
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Revoke the selected enrollment tokens (their remaining uses are taken away)")
    def revoke(self, request, queryset):
        taken = sum(services.enrollment_token_revoke(prefix=token.prefix, by_user=request.user, reason="admin")
                    for token in queryset.order_by("pk"))
        self.message_user(request, f"{taken} enrollment use(s) revoked.")
