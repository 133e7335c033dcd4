"""Readers. Every tenant-facing query is built here on ``tenants.access.restrict``."""

from __future__ import annotations

from django.db.models import QuerySet

from core.errors import NotFound
from tenants.access import Actor, project_scope, require_admin_read, restrict
from tenants.choices import ROLE_RANK, Role
from tenants.models import (
    ApiToken,
    Cohort,
    Invitation,
    Membership,
    Project,
    Quota,
    SloContract,
    Tenant,
    TenantQuota,
)

SESSION_TENANT_KEY = "tenant_slug"


def membership_list_for_user(*, user) -> QuerySet[Membership]:
    if not user.is_authenticated:
        return Membership.objects.none()
    return Membership.objects.filter(user=user).select_related("tenant").order_by("tenant__slug")


def actor_for_request(request) -> Actor | None:
    """The actor behind a request: the token's tenant for API tokens, else the session's chosen tenant
    (the first one the user belongs to when none was chosen)."""
    cached = getattr(request, "_cached_actor", None)
    if cached is not None and cached.user == request.user:
        return cached
    token = getattr(request, "auth", None)
    if isinstance(token, ApiToken):
        actor = Actor(user=request.user, tenant=token.tenant, role=Role(token.role),
                      scopes=frozenset(token.scopes), token=token,
                      project_ids=project_scope(token_project_ids=token.project_ids,
                                                member_project_ids=getattr(token, "member_project_ids", None)),
                      token_project_scoped=token.project_ids is not None)
    else:
        memberships = list(membership_list_for_user(user=request.user))
        if not memberships:
            return None
        chosen = request.session.get(SESSION_TENANT_KEY) if hasattr(request, "session") else None
        membership = next((m for m in memberships if m.tenant.slug == chosen), memberships[0])
        actor = Actor(user=request.user, tenant=membership.tenant, role=Role(membership.role),
                      project_ids=project_scope(token_project_ids=None, member_project_ids=membership.project_ids))
    request._cached_actor = actor
    from core.logging import tenant_var

    tenant_var.set(actor.tenant.slug)
    return actor


def tenant_get(*, actor: Actor) -> Tenant:
    return restrict(Tenant.objects.all(), actor).get()


def project_list(*, actor: Actor) -> QuerySet[Project]:
    return restrict(Project.objects.all(), actor).order_by("slug")


def project_slugs(*, tenant: Tenant, ids) -> list[str] | None:
    """The slugs of project ids (a limit's, for answers and audit rows), sorted; None stays None."""
    if ids is None:
        return None
    return sorted(Project.objects.filter(tenant=tenant, pk__in=list(ids)).values_list("slug", flat=True))


def project_get(*, actor: Actor, slug: str) -> Project:
    project = project_list(actor=actor).filter(slug=slug).first()
    if project is None:
        raise NotFound(f"No project '{slug}' in this tenant.", field="project")
    return project


def quota_list(*, actor: Actor, project: Project | None = None) -> QuerySet[Quota]:
    quotas = restrict(Quota.objects.select_related("project"), actor)
    if project is not None:
        quotas = quotas.filter(project=project)
    return quotas.order_by("project__slug", "tier")


def tenant_quota_list(*, actor: Actor) -> QuerySet[TenantQuota]:
    return restrict(TenantQuota.objects.all(), actor).order_by("tier")


def membership_list(*, actor: Actor) -> QuerySet[Membership]:
    return restrict(Membership.objects.select_related("user"), actor).order_by("user__username")


def membership_get(*, actor: Actor, pk: int) -> Membership:
    membership = membership_list(actor=actor).filter(pk=pk).first()
    if membership is None:
        raise NotFound("No such member in this tenant.")
    return membership


def invitation_list(*, actor: Actor) -> QuerySet[Invitation]:
    """The tenant's pending invitations, for its admins and owners (who is invited is theirs to know; a member's
    or viewer's read is refused, as the audit trail's)."""
    require_admin_read(actor, "Invitations are")
    return restrict(Invitation.objects.filter(state=Invitation.State.PENDING), actor).order_by("-created_at", "-pk")


def invitation_get(*, actor: Actor, pk: int) -> Invitation:
    """One invitation of the tenant, in any state (revoking one no longer pending is a conflict, not a miss)."""
    require_admin_read(actor, "Invitations are")
    invitation = restrict(Invitation.objects.filter(pk=pk), actor).first()
    if invitation is None:
        raise NotFound("No such invitation in this tenant.", field="id")
    return invitation


def invitations_for_user(*, user) -> QuerySet[Invitation]:
    """The pending invitations naming ``user`` (any tenant's, open ones): theirs to accept or decline."""
    if not user.is_authenticated:
        return Invitation.objects.none()
    return (Invitation.objects.filter(username=user.get_username(), state=Invitation.State.PENDING,
                                      tenant__closed_at__isnull=True)
            .select_related("tenant", "invited_by").order_by("-created_at", "-pk"))


def invitation_for_user(*, user, pk: int) -> Invitation:
    """One invitation naming ``user``, in any state (deciding one no longer pending is a conflict); another
    user's is not found."""
    invitation = (Invitation.objects.filter(pk=pk, username=user.get_username()).select_related("tenant").first()
                  if user.is_authenticated else None)
    if invitation is None:
        raise NotFound("No such invitation.", field="id")
    return invitation


def api_token_list(*, actor: Actor) -> QuerySet[ApiToken]:
    """Admins see every token of the tenant (seeing is a read: also through their read-only tokens);
    others only their own."""
    tokens = restrict(ApiToken.objects.select_related("user"), actor)
    if ROLE_RANK[Role(actor.role)] < ROLE_RANK[Role.ADMIN]:
        tokens = tokens.filter(user=actor.user)
    return tokens.order_by("-created_at", "id")


def api_token_get(*, actor: Actor, pk: int) -> ApiToken:
    token = api_token_list(actor=actor).filter(pk=pk).first()
    if token is None:
        raise NotFound("No such token.")
    return token


def slo_contract_list(*, actor: Actor) -> QuerySet[SloContract]:
    return restrict(SloContract.objects.prefetch_related("credit_steps"), actor).order_by("-effective_from")


# --- platform staff (not restricted to a tenant: never call these from a tenant-facing view) ---------


def platform_tenant_list() -> QuerySet[Tenant]:
    """Every tenant with its number of projects and members."""
    from django.db.models import Count

    return Tenant.objects.select_related("cohort").annotate(
        project_count=Count("projects", distinct=True), member_count=Count("memberships", distinct=True)
    ).order_by("slug")


def platform_tenant_get(*, slug: str) -> Tenant:
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        raise NotFound(f"No tenant '{slug}'.", field="tenant")
    return tenant


def platform_cohort_list() -> QuerySet[Cohort]:
    """Every cohort with its member tenants (platform staff)."""
    return Cohort.objects.prefetch_related("members").order_by("name")


def platform_cohort_get(*, name: str) -> Cohort:
    cohort = platform_cohort_list().filter(name=name).first()
    if cohort is None:
        raise NotFound(f"No cohort '{name}'.", field="cohort")
    return cohort


def platform_tenant_quota_list(*, tenant: Tenant) -> QuerySet[TenantQuota]:
    return TenantQuota.objects.filter(tenant=tenant).order_by("tier")


def platform_project_list(*, tenant: Tenant) -> QuerySet[Project]:
    return Project.objects.filter(tenant=tenant).prefetch_related("quotas").order_by("slug")


def platform_quota_list(*, tenant: Tenant) -> QuerySet[Quota]:
    """Every project quota of the tenant, by project then tier."""
    return Quota.objects.filter(project__tenant=tenant).select_related("project").order_by("project__slug", "tier")


def platform_slo_contract_list(*, tenant: Tenant) -> QuerySet[SloContract]:
    return SloContract.objects.filter(tenant=tenant).prefetch_related("credit_steps").order_by("-effective_from")


def platform_slo_contract_get(*, tenant: Tenant, pk: int) -> SloContract:
    contract = platform_slo_contract_list(tenant=tenant).filter(pk=pk).first()
    if contract is None:
        raise NotFound("No such SLO contract.", field="contract")
    return contract
