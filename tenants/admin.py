"""Django admin for platform staff, writing through ``tenants.services`` — the same rules, errors and audit
events as the API and the portal — or read-only where no service writes the model.

How a write goes: ``core.admin.ServiceAdmin`` (no wrapping transaction: each service is one durable transaction
of its own; a refusal is a message on the page; no bulk delete), and staff act inside a tenant as an owner would
(``staff_actor``): the audit row names the staff user, and the services' rules hold — the last owner stays, a
suspended tenant's roles and projects do not change.

Per model: tenants (created, renamed, suspended and reactivated; never deleted — they hold the billing
record), projects (created, renamed, deleted while nothing references them), memberships (added, role
changed, removed — here and inline on the tenant), API tokens (read-only; revoked by an action; created by
their member only: the secret is theirs), quotas and tenant quotas (set; zero them rather than delete),
SLO contracts (created and replaced with their credit steps; never deleted — past periods are credited from
them), audit events (read-only)."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from core.admin import ServiceAdmin
from core.errors import ApplicationError
from tenants import services
from tenants.access import Actor
from tenants.choices import Role, TenantStatus
from tenants.models import (
    ApiToken,
    AuditEvent,
    Cohort,
    Membership,
    Project,
    Quota,
    SloContract,
    SloCreditStep,
    Tenant,
    TenantExport,
    TenantQuota,
)
from tenants.selectors import project_slugs


def staff_actor(request, tenant: Tenant) -> Actor:
    """Platform staff acting inside ``tenant`` with an owner's powers (all scopes), so the tenant services
    apply their rules and write their audit rows in the staff user's name."""
    return Actor(user=request.user, tenant=Tenant.objects.get(pk=tenant.pk), role=Role.OWNER)


def _adopt(obj, saved) -> None:
    """Make the admin's in-memory object the row the service saved (its id, its normalised values)."""
    for field in obj._meta.concrete_fields:
        setattr(obj, field.attname, getattr(saved, field.attname))
    obj._state.adding, obj._state.db = False, saved._state.db


# -- tenants and their members -------------------------------------------------------------------------------
class MembershipInlineForm(forms.ModelForm):
    class Meta:
        model = Membership
        fields = ["user", "role"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:  # a membership is one user's: another user is another membership
            self.fields["user"].disabled = True


class MembershipFormSet(forms.BaseInlineFormSet):
    def clean(self):
        """The services' rule, checked before anything is saved so the page can say it next to the rows:
        a tenant that has an owner keeps one (the service checks again, under a lock)."""
        super().clean()
        if any(form.errors for form in self.forms):
            return
        had_owner = Membership.objects.filter(tenant_id=self.instance.pk, role=Role.OWNER).exists() \
            if self.instance.pk else False
        kept = [form.cleaned_data.get("role") for form in self.forms
                if form.cleaned_data and not form.cleaned_data.get("DELETE")]
        if had_owner and Role.OWNER not in kept:
            raise ValidationError("A tenant must keep at least one owner.")


class MembershipInline(admin.TabularInline):
    model = Membership
    form = MembershipInlineForm
    formset = MembershipFormSet
    extra = 0
    autocomplete_fields = ["user"]
    readonly_fields = ["projects_reached"]  # set by the tenant's admins (portal, API) or its SSO group mapping

    @admin.display(description="Projects")
    def projects_reached(self, membership):
        if membership.pk is None or membership.project_ids is None:
            return "all"
        return ", ".join(project_slugs(tenant=membership.tenant, ids=membership.project_ids)) or "none yet"


class TenantQuotaInline(admin.TabularInline):
    model = TenantQuota
    extra = 0
    can_delete = False
    readonly_fields = ["tier", "deserved_gpu_milli", "limit_gpu_milli", "lending_limit_gpu_milli",
                       "borrowing_limit_gpu_milli"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Cohort)
class CohortAdmin(ServiceAdmin):
    """Cohorts are created here (``cohort_create``); tenants join one on the tenant's page
    (``tenant_cohort_set``), their lending and borrowing limits on their tenant quotas."""

    list_display = ["name", "description", "created_at"]
    fields = ["name", "description", "members_list", "created_at"]
    readonly_fields = ["members_list", "created_at"]

    @admin.display(description="members")
    def members_list(self, obj) -> str:
        return ", ".join(obj.members.values_list("slug", flat=True)) if obj.pk else ""

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields if obj is None else ["name", "description", *self.readonly_fields]

    def has_delete_permission(self, request, obj=None):
        return False  # tenants name it: take them out instead

    def save_model(self, request, obj, form, change):
        if not change:
            _adopt(obj, services.cohort_create(name=obj.name, description=obj.description, by_user=request.user))


@admin.register(Tenant)
class TenantAdmin(ServiceAdmin):
    list_display = ["slug", "name", "status", "currency", "billing_email", "created_at"]
    list_filter = ["status", "currency"]
    search_fields = ["slug", "name", "billing_email"]
    inlines = [MembershipInline, TenantQuotaInline]
    actions = ["suspend", "activate"]

    def get_fields(self, request, obj=None):
        if obj is None:  # a new tenant is active
            return ["name", "slug", "billing_email", "currency"]
        return ["name", "slug", "billing_email", "currency", "status", "cohort", "created_at", "updated_at"]

    def get_readonly_fields(self, request, obj=None):
        # the slug names the tenant everywhere; its invoices are in its currency
        return [] if obj is None else ["slug", "currency", "created_at", "updated_at"]

    def has_delete_permission(self, request, obj=None):
        return False  # no service deletes a tenant: it holds leases, usage and invoices; suspend it

    def save_model(self, request, obj, form, change):
        if not change:
            _adopt(obj, services.tenant_create(name=obj.name, slug=obj.slug, billing_email=obj.billing_email,
                                               currency=obj.currency, by_user=request.user))
            return
        changes = {name: getattr(obj, name) for name in ("name", "billing_email") if name in form.changed_data}
        status = obj.status if "status" in form.changed_data else None
        if status == TenantStatus.ACTIVE:  # reactivate first: a suspended tenant's details cannot change
            services.tenant_set_status(tenant=obj, status=status, by_user=request.user, reason="admin")
        if changes:
            services.tenant_update(actor=staff_actor(request, obj), **changes)
        if "cohort" in form.changed_data:
            services.tenant_cohort_set(tenant=obj, cohort=obj.cohort, by_user=request.user)
        if status == TenantStatus.SUSPENDED:
            services.tenant_set_status(tenant=obj, status=status, by_user=request.user, reason="admin")
        obj.refresh_from_db()

    def save_formset(self, request, form, formset, change):
        if formset.model is not Membership:
            return super().save_formset(request, form, formset, change)
        tenant = form.instance
        formset.save(commit=False)
        for membership in formset.new_objects:
            _adopt(membership, services.membership_add(tenant=tenant, user=membership.user, role=membership.role,
                                                       by_user=request.user))
        # owners granted before owners taken away, so handing ownership over in one save works
        changed = sorted((m for m, fields in formset.changed_objects if "role" in fields),
                         key=lambda m: m.role != Role.OWNER)
        for membership in changed:
            services.membership_change_role(actor=staff_actor(request, tenant),
                                            membership=Membership.objects.get(pk=membership.pk), role=membership.role)
        for membership in formset.deleted_objects:
            services.membership_remove(actor=staff_actor(request, tenant), membership=membership)

    @admin.action(description="Suspend selected tenants")
    def suspend(self, request, queryset):
        self.each_row(request, queryset, "suspended", lambda tenant: services.tenant_set_status(
            tenant=tenant, status=TenantStatus.SUSPENDED, by_user=request.user, reason="admin"))

    @admin.action(description="Reactivate selected tenants")
    def activate(self, request, queryset):
        self.each_row(request, queryset, "reactivated", lambda tenant: services.tenant_set_status(
            tenant=tenant, status=TenantStatus.ACTIVE, by_user=request.user, reason="admin"))


@admin.register(Membership)
class MembershipAdmin(ServiceAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username", "tenant__slug"]
    autocomplete_fields = ["user"]
    fields = ["user", "tenant", "role"]

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else ["user", "tenant"]  # another user or tenant is another membership

    def save_model(self, request, obj, form, change):
        if not change:
            _adopt(obj, services.membership_add(tenant=obj.tenant, user=obj.user, role=obj.role,
                                                by_user=request.user))
        elif "role" in form.changed_data:
            current = Membership.objects.get(pk=obj.pk)
            _adopt(obj, services.membership_change_role(actor=staff_actor(request, obj.tenant), membership=current,
                                                        role=obj.role))

    def delete_model(self, request, obj):
        services.membership_remove(actor=staff_actor(request, obj.tenant), membership=obj)


# -- projects and quotas --------------------------------------------------------------------------------------
class QuotaInline(admin.TabularInline):
    model = Quota
    extra = 0
    can_delete = False
    readonly_fields = ["tier", "deserved_gpu_milli", "limit_gpu_milli", "over_quota_weight"]

    def has_add_permission(self, request, obj=None):
        return False  # quotas are set on the Quota page, where the tenant bound is checked


@admin.register(Project)
class ProjectAdmin(ServiceAdmin):
    list_display = ["slug", "tenant", "name", "status", "idle_reclaim_opt_in", "idle_suspend_opt_out", "created_at"]
    list_filter = ["status", "idle_reclaim_opt_in", "idle_suspend_opt_out", "tenant"]
    search_fields = ["slug", "name", "tenant__slug"]
    inlines = [QuotaInline]
    fields = ["tenant", "slug", "name", "description", "status", "idle_reclaim_opt_in", "idle_suspend_opt_out",
              "pools"]
    actions = ["suspend", "activate"]

    def get_readonly_fields(self, request, obj=None):
        # leases and usage name the project; its status changes by the actions (project_set_status, audited); the
        # idle reclaim opt-in is the tenant's choice (its admins, capacity.services.idle_opt_in_set, audited):
        # shown here, changed by the tenant only; staff override it with a capacity policy of the project's scope.
        # So is the opt-out of suspending idle resumable training (capacity.services.suspend_opt_out_set, audited)
        choices = ["idle_reclaim_opt_in", "idle_suspend_opt_out"]
        return ["status", *choices] if obj is None else ["tenant", "slug", "status", *choices]

    @admin.action(description="Suspend selected projects (no new lease requests)")
    def suspend(self, request, queryset):
        self.each_row(request, queryset, "suspended", lambda project: services.project_set_status(
            project=project, status=TenantStatus.SUSPENDED, by_user=request.user, reason="admin"))

    @admin.action(description="Reactivate selected projects")
    def activate(self, request, queryset):
        self.each_row(request, queryset, "reactivated", lambda project: services.project_set_status(
            project=project, status=TenantStatus.ACTIVE, by_user=request.user, reason="admin"))

    def save_model(self, request, obj, form, change):
        actor = staff_actor(request, obj.tenant)
        if not change:
            pools = list(obj.pools)
            _adopt(obj, services.project_create(actor=actor, slug=obj.slug, name=obj.name,
                                                description=obj.description))
            if pools:
                _adopt(obj, services.project_update(actor=actor, project=Project.objects.get(pk=obj.pk), pools=pools))
        else:
            changes = {name: getattr(obj, name) for name in ("name", "description", "pools")
                       if name in form.changed_data}
            if changes:
                _adopt(obj, services.project_update(actor=actor, project=Project.objects.get(pk=obj.pk), **changes))

    def delete_model(self, request, obj):
        services.project_delete(actor=staff_actor(request, obj.tenant), project=obj)


class TenantQuotaForm(forms.ModelForm):
    class Meta:
        model = TenantQuota
        fields = ["tenant", "tier", "deserved_gpu_milli", "limit_gpu_milli", "lending_limit_gpu_milli",
                  "borrowing_limit_gpu_milli"]


class QuotaForm(forms.ModelForm):
    """Checks the two-level bound with the service's own rule, so the admin shows the API's message."""

    class Meta:
        model = Quota
        fields = ["project", "tier", "deserved_gpu_milli", "limit_gpu_milli", "over_quota_weight"]

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        project = data.get("project") or self.instance.project  # read-only once saved
        tier = data.get("tier", self.instance.tier)
        try:
            services.quota_check(
                project=project, tier=tier, deserved_gpu_milli=data["deserved_gpu_milli"],
                limit_gpu_milli=data["limit_gpu_milli"], over_quota_weight=data["over_quota_weight"],
            )
        except ApplicationError as exc:
            raise ValidationError({exc.field if exc.field in self.fields else None: exc.message}) from exc
        return data


@admin.register(TenantQuota)
class TenantQuotaAdmin(ServiceAdmin):
    form = TenantQuotaForm
    list_display = ["tenant", "tier", "deserved_gpu_milli", "limit_gpu_milli", "lending_limit_gpu_milli",
                    "borrowing_limit_gpu_milli"]
    list_filter = ["tier", "tenant"]

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else ["tenant", "tier"]  # another tier is another bound

    def has_delete_permission(self, request, obj=None):
        return False  # no service deletes a bound its projects' quotas rest on: set it to zero

    def save_model(self, request, obj, form, change):
        _adopt(obj, services.tenant_quota_set(tenant=obj.tenant, tier=obj.tier,
                                              deserved_gpu_milli=obj.deserved_gpu_milli,
                                              limit_gpu_milli=obj.limit_gpu_milli,
                                              lending_limit_gpu_milli=obj.lending_limit_gpu_milli,
                                              borrowing_limit_gpu_milli=obj.borrowing_limit_gpu_milli,
                                              by_user=request.user))


@admin.register(Quota)
class QuotaAdmin(ServiceAdmin):
    form = QuotaForm
    list_display = ["project", "tier", "deserved_gpu_milli", "limit_gpu_milli", "over_quota_weight"]
    list_filter = ["tier", "project__tenant"]

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else ["project", "tier"]  # another tier is another quota

    def has_delete_permission(self, request, obj=None):
        return False  # no service deletes a quota: set it to zero (audited)

    def save_model(self, request, obj, form, change):
        _adopt(obj, services.quota_set(project=obj.project, tier=obj.tier, deserved_gpu_milli=obj.deserved_gpu_milli,
                                       limit_gpu_milli=obj.limit_gpu_milli, over_quota_weight=obj.over_quota_weight,
                                       by_user=request.user))


# -- API tokens -----------------------------------------------------------------------------------------------
@admin.register(ApiToken)
class ApiTokenAdmin(ServiceAdmin):
    list_display = ["prefix", "name", "tenant", "user", "scopes", "project_ids", "created_at", "expires_at",
                    "last_used_at", "revoked_at"]
    list_filter = ["tenant"]
    search_fields = ["prefix", "name", "user__username"]
    fields = ["prefix", "name", "tenant", "user", "scopes", "project_ids", "created_at", "expires_at", "last_used_at",
              "revoked_at"]
    readonly_fields = fields
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False  # created by their member (portal, API or `manage.py tenant_bootstrap`): the secret is theirs

    def has_change_permission(self, request, obj=None):
        return False  # revoked by the action below (audited), never edited

    def has_delete_permission(self, request, obj=None):
        return False  # a revoked token stays on record

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        self.each_row(request, queryset.select_related("tenant"), "revoked", lambda token: services.api_token_revoke(
            actor=staff_actor(request, token.tenant), token=token))


# -- SLO contracts ----------------------------------------------------------------------------------------------
class SloCreditStepInline(admin.TabularInline):
    model = SloCreditStep
    extra = 1


@admin.register(SloContract)
class SloContractAdmin(ServiceAdmin):
    """A contract and its credit steps are saved together by ``slo_contract_save`` (which replaces the steps),
    after the service's own checks; a refusal (an overlapping period, a bad step) is a message."""

    list_display = ["tenant", "name", "effective_from", "effective_to", "time_to_gpu_p95_seconds",
                    "availability_target_pct", "preemption_notice_seconds"]
    list_filter = ["tenant"]
    inlines = [SloCreditStepInline]
    fields = ["tenant", "name", "effective_from", "effective_to", "time_to_gpu_p95_seconds",
              "availability_target_pct", "preemption_notice_seconds", "max_credit_pct", "min_runtime_seconds"]
    VALUES = fields[1:]

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else ["tenant"]

    def has_delete_permission(self, request, obj=None):
        return False  # past periods are credited from it; end it with effective_to instead

    def save_model(self, request, obj, form, change):
        """Nothing yet: the contract is saved with its credit steps in ``save_related``."""

    def save_related(self, request, form, formsets, change):
        steps = next(formset for formset in formsets if formset.model is SloCreditStep)
        steps.save(commit=False)  # what changed, for the admin's log
        credit_steps = [{name: step.cleaned_data[name] for name in ("metric", "threshold", "credit_pct")}
                        for step in steps.forms if step.cleaned_data and not step.cleaned_data.get("DELETE")]
        saved = services.slo_contract_save(
            tenant=form.instance.tenant, contract=SloContract.objects.get(pk=form.instance.pk) if change else None,
            by_user=request.user, credit_steps=credit_steps,
            **{name: form.cleaned_data[name] for name in self.VALUES})
        _adopt(form.instance, saved)


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


# -- sign-in: single sign-on and the second factor (tenants/sso.py, tenants/otp.py; issue 34) ------------------
from tenants.models import SshKey, TenantSignIn, TotpDevice  # noqa: E402
from tenants.otp import second_factor_reset  # noqa: E402
from tenants.ssh_keys import ssh_key_remove_by_staff  # noqa: E402
from tenants.sso import SIGN_IN_FIELDS, group_projects_slugs, sign_in_update  # noqa: E402


class TenantSignInForm(forms.ModelForm):
    issuer = forms.URLField(required=False, max_length=300, assume_scheme="https")
    client_secret = forms.CharField(required=False, widget=forms.PasswordInput, max_length=500,
                                    help_text="Write-only: left empty, the stored secret stays.")

    class Meta:
        model = TenantSignIn
        fields = ["tenant", "sso_enabled", "provider_name", "issuer", "client_id", "client_secret",
                  "allowed_email_domains", "default_role", "group_roles", "local_passwords_disabled",
                  "totp_required"]


@admin.register(TenantSignIn)
class TenantSignInAdmin(ServiceAdmin):
    """A tenant's sign-in settings, written through ``sign_in_update`` (its checks, its audit row)."""

    form = TenantSignInForm
    list_display = ["tenant", "sso_enabled", "issuer", "local_passwords_disabled", "totp_required"]

    def get_readonly_fields(self, request, obj=None):
        # the group → projects mapping is shown here and set by the tenant's owners (portal, API)
        return ["group_projects_mapped"] if obj is None else ["tenant", "group_projects_mapped"]

    @admin.display(description="Group claims to projects")
    def group_projects_mapped(self, sign_in):
        if sign_in.pk is None or not sign_in.group_projects:
            return "-"
        return "; ".join(f"{group}: {', '.join(slugs) or '(deleted projects)'}"
                         for group, slugs in group_projects_slugs(sign_in).items())

    def has_delete_permission(self, request, obj=None):
        return False  # turn single sign-on off instead (audited)

    def save_model(self, request, obj, form, change):
        changes = {name: form.cleaned_data[name] for name in SIGN_IN_FIELDS
                   if name in form.cleaned_data and name != "client_secret"}
        if form.cleaned_data.get("client_secret"):
            changes["client_secret"] = form.cleaned_data["client_secret"]
        _adopt(obj, sign_in_update(tenant=obj.tenant, by=staff_actor(request, obj.tenant), changes=changes))


@admin.register(TotpDevice)
class TotpDeviceAdmin(ServiceAdmin):
    """Users' authenticators: read-only (the secret is never shown); an action resets a lost one."""

    list_display = ["user", "confirmed_at", "created_at"]
    fields = ["user", "confirmed_at", "created_at"]
    readonly_fields = fields
    actions = ["reset"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Reset the authenticator (lost phone): the user sets up a new one")
    def reset(self, request, queryset):
        self.each_row(request, queryset, "reset", lambda device: second_factor_reset(user=device.user,
                                                                                      by=request.user))


@admin.register(SshKey)
class SshKeyAdmin(ServiceAdmin):
    """Users' SSH public keys (the broker's SSH gateway): read-only; an action removes one (a lost laptop),
    audited."""

    list_display = ["name", "user", "fingerprint", "created_at", "last_used_at"]
    search_fields = ["name", "fingerprint", "user__username"]
    fields = ["name", "user", "fingerprint", "public_key", "created_at", "last_used_at"]
    readonly_fields = fields
    actions = ["remove"]

    def has_add_permission(self, request):
        return False  # added by their user (portal, API): the key is theirs

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # removed by the action below (audited)

    @admin.action(description="Remove the key (it opens no new SSH session)")
    def remove(self, request, queryset):
        self.each_row(request, queryset, "removed", lambda key: ssh_key_remove_by_staff(key=key, by_user=request.user))


@admin.register(TenantExport)
class TenantExportAdmin(admin.ModelAdmin):
    """Read-only: exports are requested and built through ``tenants.offboarding`` (audited), never edited."""

    list_display = ["pk", "tenant", "state", "requested_by", "requested_at", "finished_at", "size_bytes"]
    list_filter = ["state", "tenant"]
    readonly_fields = ["tenant", "requested_by", "state", "requested_at", "finished_at", "size_bytes", "sha256",
                       "error"]

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_add_permission(self, request):
        return False


# -- invitations (wave 19: a member joins when they accept) ----------------------------------------------------
from tenants.models import Invitation  # noqa: E402


@admin.register(Invitation)
class InvitationAdmin(ServiceAdmin):
    """Tenants' invitations: read-only (an admin invites and revokes in the portal or the API; the user accepts or
    declines there)."""

    list_display = ["username", "tenant", "role", "state", "invited_by", "created_at", "decided_at"]
    list_filter = ["state", "role"]
    search_fields = ["username", "tenant__slug"]
    fields = list_display
    readonly_fields = fields
