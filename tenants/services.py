"""The only writers of tenant data. Each top-level service is one durable transaction that also
writes its ``AuditEvent``; input is validated first and errors name the field, so nothing is
half-written. The database constraints behind them are the last line of defence against races."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.db.models import Q, Sum
from django.utils import timezone

from core.errors import Conflict, NotFound, PermissionDenied, QuotaExceeded, ValidationFailed
from gpus.catalogue import UnknownModel, model_get
from tenants.access import Actor, restrict
from tenants.audit import audit_record
from tenants.choices import CURRENCIES, PROJECT_LIMITABLE_ROLES, ROLE_RANK, Role, SloMetric, TenantStatus, TokenScope
from tenants.extensions import TenantStatusChange, tenant_status_listeners
from tenants.models import (
    ApiToken,
    Cohort,
    Invitation,
    Membership,
    Project,
    Quota,
    SloContract,
    SloCreditStep,
    Tenant,
    TenantQuota,
)
from tenants.selectors import project_slugs
from tenants.tokens import token_generate

SLUG_HELP = "lowercase letters, digits and hyphens, 1-63 characters, not starting or ending with a hyphen"
MAX_TOKEN_LIFETIME = timedelta(days=366)


def _validate_slug(value: str, field: str) -> str:
    import re

    from tenants.models import SLUG_REGEX

    if not isinstance(value, str) or not re.fullmatch(SLUG_REGEX, value):  # match(): "$" passes "a\n"
        raise ValidationFailed(f"{field} must be {SLUG_HELP}.", field=field)
    return value


def _validate_name(value: str, field: str = "name", max_length: int = 200) -> str:
    value = (value or "").strip()
    if not value:
        raise ValidationFailed(f"{field} must not be blank.", field=field)
    if len(value) > max_length:
        raise ValidationFailed(f"{field} must be at most {max_length} characters.", field=field)
    return value


def _validate_tier(tier: str) -> str:
    try:
        return model_get(tier).code
    except UnknownModel as exc:
        raise ValidationFailed(str(exc.args[0]), field="tier") from None


def _validate_milli(value, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValidationFailed(f"{field} must be a whole number of milli-GPU >= 0.", field=field)
    return value


def _validate_quota_values(tier: str, deserved_gpu_milli, limit_gpu_milli) -> tuple[str, int, int]:
    tier = _validate_tier(tier)
    deserved = _validate_milli(deserved_gpu_milli, "deserved_gpu_milli")
    limit = _validate_milli(limit_gpu_milli, "limit_gpu_milli")
    if limit < deserved:
        raise ValidationFailed("limit_gpu_milli must be >= deserved_gpu_milli.", field="limit_gpu_milli")
    return tier, deserved, limit


# --- tenants -----------------------------------------------------------------------------------


def tenant_create(*, name: str, slug: str, billing_email: str, currency: str = "USD", by_user=None) -> Tenant:
    """Create an active tenant. Slug and currency are checked here and by the database."""
    name = _validate_name(name)
    _validate_slug(slug, "slug")
    try:
        validate_email(billing_email)
    except DjangoValidationError:
        raise ValidationFailed("billing_email must be an email address.", field="billing_email") from None
    if currency not in CURRENCIES:
        raise ValidationFailed(f"currency must be one of {', '.join(CURRENCIES)}.", field="currency")
    with transaction.atomic(durable=True):
        if Tenant.objects.filter(slug=slug).exists():
            raise Conflict(f"A tenant with slug '{slug}' already exists.", field="slug")
        tenant = Tenant.objects.create(name=name, slug=slug, billing_email=billing_email, currency=currency)
        audit_record(tenant=tenant, by=by_user, action="tenant.create", target=slug)
    return tenant


def tenant_set_status(*, tenant: Tenant, status: str, by_user=None, reason: str = "") -> Tenant:
    """Suspend or reactivate a tenant (platform staff). Conditional update: concurrent calls converge.

    Suspension is about money, so it stops the meter (docs/tenancy.md, "Suspension"): in the same
    transaction as the status and its audit row, the tenant's queued leases are *held* (the schedule cycle
    no longer reads them; their reason says why); once that has committed, every lease holding capacity is
    released through ``lease_release`` with a reason naming the suspension. The transaction first waits
    for a schedule cycle that is running (its advisory lock), so a cycle that read the queue before the
    suspension has committed its placements before the release sweep looks, and every later cycle sees the
    tenant suspended. Suspending again sweeps again. Reactivation gives the held leases back to the
    scheduler (a cycle is asked for); released leases stay released.
    """
    if status not in TenantStatus.values:
        raise ValidationFailed(f"status must be one of {', '.join(TenantStatus.values)}.", field="status")
    if tenant.closed_at is not None and status != TenantStatus.SUSPENDED:
        raise Conflict(f"Tenant '{tenant.slug}' was closed by its owner; it cannot be reactivated.", field="status")
    now = timezone.now()
    by = f"staff:{by_user.get_username()}" if by_user is not None and by_user.is_authenticated else "broker"
    note = f" ({reason})" if reason else ""
    listeners = tenant_status_listeners()  # the broker's (tenants.extensions): it holds and releases the leases
    with transaction.atomic(durable=True):
        for listener in listeners:
            listener.prepare()
        changed = Tenant.objects.filter(pk=tenant.pk).exclude(status=status).update(status=status, updated_at=now)
        if changed:
            audit_record(tenant=tenant, by=by_user, action=f"tenant.{status}", target=tenant.slug,
                         data={"reason": reason})
            for listener in listeners:
                listener.changed(TenantStatusChange(tenant=tenant, status=status, by=by, note=note, now=now))
    tenant.refresh_from_db()
    for listener in listeners:
        listener.settled(TenantStatusChange(tenant=tenant, status=tenant.status, by=by, note=note, now=now))
    return tenant


def tenant_update(*, actor: Actor, name: str | None = None, billing_email: str | None = None) -> Tenant:
    actor.require("own")
    changes = {}
    if name is not None:
        changes["name"] = _validate_name(name)
    if billing_email is not None:
        try:
            validate_email(billing_email)
        except DjangoValidationError:
            raise ValidationFailed("billing_email must be an email address.", field="billing_email") from None
        changes["billing_email"] = billing_email
    with transaction.atomic(durable=True):
        if changes:
            Tenant.objects.filter(pk=actor.tenant.pk).update(**changes, updated_at=timezone.now())
            audit_record(tenant=actor.tenant, by=actor.user, action="tenant.update", target=actor.tenant.slug,
                         data={"fields": sorted(changes)})
    return Tenant.objects.get(pk=actor.tenant.pk)


LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,62}$")
MAX_LABEL_KEYS = 20


def tenant_label_keys_set(*, actor: Actor, keys: object) -> Tenant:
    """The label keys the tenant's leases may carry (cost allocation, issue 33): at most ``MAX_LABEL_KEYS`` keys of
    lower-case letters, digits, ``_ . -`` (starting with a letter, at most 63 characters); an empty list goes back
    to the platform's default (``COST_LABEL_KEYS_DEFAULT``). Leases already labelled keep their labels. Needs
    ``manage``; audited with the keys before."""
    actor.require("manage")
    if not isinstance(keys, list | tuple) or len(keys) > MAX_LABEL_KEYS:
        raise ValidationFailed(f"keys must be a list of at most {MAX_LABEL_KEYS} label keys.", field="keys")
    for key in keys:
        if not isinstance(key, str) or not LABEL_KEY_RE.match(key):
            raise ValidationFailed(f"{key!r} is not a label key: lower-case letters, digits, '_', '.', '-', "
                                   "starting with a letter, at most 63 characters.", field="keys")
    cleaned = sorted(set(keys))
    with transaction.atomic(durable=True):
        tenant = Tenant.objects.select_for_update().get(pk=actor.tenant.pk)
        before = list(tenant.label_keys)
        Tenant.objects.filter(pk=tenant.pk).update(label_keys=cleaned, updated_at=timezone.now())
        audit_record(tenant=tenant, by=actor.user, action="tenant.label_keys", target=tenant.slug,
                     data={"before": before, "keys": cleaned})
    return Tenant.objects.get(pk=actor.tenant.pk)


# --- projects ----------------------------------------------------------------------------------


def project_create(*, actor: Actor, slug: str, name: str, description: str = "") -> Project:
    actor.require("manage")
    _validate_slug(slug, "slug")
    name = _validate_name(name)
    with transaction.atomic(durable=True):
        if Project.objects.filter(tenant=actor.tenant, slug=slug).exists():
            raise Conflict(f"Project '{slug}' already exists in this tenant.", field="slug")
        project = Project.objects.create(tenant=actor.tenant, slug=slug, name=name, description=description or "")
        audit_record(tenant=actor.tenant, by=actor.user, action="project.create", target=slug)
    return project


def project_update(
    *, actor: Actor, project: Project, name: str | None = None, description: str | None = None,
    pools: object = None,
) -> Project:
    """Change a project's name, description or node pools (``pools``: each a pool of the fleet, an empty list
    for any pool; see ``project_pools_check``); every value is checked before anything is written."""
    actor.require("manage")
    changes = {}
    if name is not None:
        changes["name"] = _validate_name(name)
    if description is not None:
        changes["description"] = description
    if pools is not None:
        changes["pools"] = project_pools_check(pools)
    with transaction.atomic(durable=True):
        if changes:
            Project.objects.filter(pk=project.pk, tenant=actor.tenant).update(**changes)
            audit_record(tenant=actor.tenant, by=actor.user, action="project.update", target=project.slug,
                         data={"fields": sorted(changes)})
    project.refresh_from_db()
    return project


def project_delete(*, actor: Actor, project: Project) -> None:
    """Delete a project and its quotas. Refused (409) while anything still references it."""
    actor.require("manage")
    from django.db.models import ProtectedError

    try:
        with transaction.atomic(durable=True):
            Project.objects.filter(pk=project.pk, tenant=actor.tenant).delete()
            audit_record(tenant=actor.tenant, by=actor.user, action="project.delete", target=project.slug)
    except ProtectedError:
        raise Conflict(
            f"Project '{project.slug}' still has leases or usage; it cannot be deleted.", field="project"
        ) from None


def project_set_status(*, project: Project, status: str, by_user=None, reason: str = "") -> Project:
    """Suspend or reactivate one project (platform staff). A suspended project takes no new lease requests
    (``broker.services.request`` refuses them, 403 naming ``project``); its leases keep running and may be
    released. Conditional update in one transaction with its audit row: setting the status it has writes nothing."""
    if status not in TenantStatus.values:
        raise ValidationFailed(f"status must be one of {', '.join(TenantStatus.values)}.", field="status")
    with transaction.atomic(durable=True):
        changed = Project.objects.filter(pk=project.pk).exclude(status=status).update(status=status)
        if changed:
            audit_record(tenant=project.tenant, by=by_user, action=f"project.{status}", target=project.slug,
                         data={"reason": reason})
    project.refresh_from_db()
    return project


# --- members -----------------------------------------------------------------------------------


def membership_add(*, tenant: Tenant, user, role: str, by_user=None) -> Membership:
    """Add a user to a tenant (or change nothing if already a member with that role)."""
    if role not in Role.values:
        raise ValidationFailed(f"role must be one of {', '.join(Role.values)}.", field="role")
    with transaction.atomic(durable=True):
        membership, created = Membership.objects.get_or_create(user=user, tenant=tenant, defaults={"role": role})
        if not created and membership.role != role:
            raise Conflict(f"{user.get_username()} is already a {membership.role} of '{tenant.slug}'.", field="user")
        if created:
            audit_record(tenant=tenant, by=by_user, action="member.add", target=user.get_username(),
                         data={"role": role})
    return membership


def _ensure_owner_remains(tenant: Tenant, leaving: Membership) -> None:
    owners = (
        Membership.objects.select_for_update()
        .filter(tenant=tenant, role=Role.OWNER)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    if list(owners) == [leaving.pk]:
        raise Conflict("A tenant must keep at least one owner.", field="role")


def membership_change_role(*, actor: Actor, membership: Membership, role: str) -> Membership:
    """Admins change roles below owner; only owners grant or take away ownership. The last owner stays."""
    actor.require("manage")
    if role not in Role.values:
        raise ValidationFailed(f"role must be one of {', '.join(Role.values)}.", field="role")
    touches_owner = Role.OWNER in (role, membership.role)
    if touches_owner:
        actor.require("own")
    with transaction.atomic(durable=True):
        if membership.role == Role.OWNER and role != Role.OWNER:
            _ensure_owner_remains(actor.tenant, membership)
        changes = {"role": role}
        if role not in PROJECT_LIMITABLE_ROLES:
            changes["project_ids"] = None  # admins and owners reach the whole tenant
        Membership.objects.filter(pk=membership.pk, tenant=actor.tenant).update(**changes)
        revoked = _invitations_of_revoke(actor.tenant, membership.user_id, role=role)
        audit_record(tenant=actor.tenant, by=actor.user, action="member.role", target=str(membership.user_id),
                     data={"old": membership.role, "new": role,
                           **({"projects_cleared": True} if membership.project_ids is not None
                              and "project_ids" in changes else {}),
                           **({"invitations_revoked": revoked} if revoked else {})})
    membership.refresh_from_db()
    return membership


def project_ids_for_slugs(*, tenant: Tenant, slugs, field: str = "projects") -> list[int]:
    """The ids of the tenant's projects named by ``slugs`` (a list), sorted; an unknown slug names the field."""
    if not isinstance(slugs, list | tuple) or any(not isinstance(slug, str) for slug in slugs):
        raise ValidationFailed(f"{field} must be a list of project slugs, or null.", field=field)
    found = dict(Project.objects.filter(tenant=tenant, slug__in=list(slugs)).values_list("slug", "pk"))
    missing = sorted(set(slugs) - set(found))
    if missing:
        raise ValidationFailed(f"No project {missing[0]!r} in this tenant.", field=field)
    return sorted(set(found.values()))


def membership_projects_check(*, actor: Actor, role: str, projects: list[str] | None) -> list[int] | None:
    """The ids of a project limit for a member of ``role``, or the field's error: unknown projects, a limit on
    an admin or an owner."""
    actor.require("manage")
    if projects is None:
        return None
    project_ids = project_ids_for_slugs(tenant=actor.tenant, slugs=projects)
    if role not in PROJECT_LIMITABLE_ROLES:
        raise ValidationFailed(f"A {role} reaches every project of the tenant; only members and viewers can be "
                               "limited to projects.", field="projects")
    return project_ids


def membership_set_projects(*, actor: Actor, membership: Membership, projects: list[str] | None) -> Membership:
    """Limit a member or viewer to named projects (slugs; an empty list: none yet), or lift the limit (None).
    Admins do it; admins and owners themselves always reach the whole tenant. Takes effect on the member's next
    request, in the portal and through every token of theirs."""
    actor.require("manage")
    with transaction.atomic(durable=True):
        current = Membership.objects.select_for_update().filter(pk=membership.pk, tenant=actor.tenant).first()
        if current is None:
            raise ValidationFailed("No such member in this tenant.", field="member")
        project_ids = membership_projects_check(actor=actor, role=current.role, projects=projects)
        if current.project_ids != project_ids:
            Membership.objects.filter(pk=current.pk).update(project_ids=project_ids)
            audit_record(tenant=actor.tenant, by=actor.user, action="member.projects",
                         target=str(current.user_id),
                         data={"old": project_slugs(tenant=actor.tenant, ids=current.project_ids),
                               "new": project_slugs(tenant=actor.tenant, ids=project_ids)})
    membership.refresh_from_db()
    return membership


def membership_remove(*, actor: Actor, membership: Membership) -> None:
    """Remove a member; their tokens for this tenant are revoked in the same transaction. Leaving
    oneself (``leave``) and removing others (``revoke``, owners: ``own``) take access away, so a suspended
    tenant may still do them; a read-only token never can."""
    if membership.user_id == actor.user.pk:
        actor.require("leave")
    else:
        actor.require("revoke")
        if membership.role == Role.OWNER:
            actor.require("own")
    now = timezone.now()
    with transaction.atomic(durable=True):
        if membership.role == Role.OWNER:
            _ensure_owner_remains(actor.tenant, membership)
        ApiToken.objects.filter(tenant=actor.tenant, user_id=membership.user_id, revoked_at__isnull=True).update(
            revoked_at=now
        )
        Membership.objects.filter(pk=membership.pk, tenant=actor.tenant).delete()
        revoked = _invitations_of_revoke(actor.tenant, membership.user_id, role=None)
        audit_record(tenant=actor.tenant, by=actor.user, action="member.remove", target=str(membership.user_id),
                     data={"invitations_revoked": revoked} if revoked else {})


def _invitations_of_revoke(tenant: Tenant, user_id: int, *, role: str | None) -> int:
    """Revoke the pending invitations a member issued that their new ``role`` (None: removed) could not issue
    now: an invitation is only as good as its inviter's standing (owners invite owners; admins the rest). In the
    caller's transaction; how many."""
    pending = Invitation.objects.filter(tenant=tenant, invited_by_id=user_id, state=Invitation.State.PENDING)
    if role == Role.OWNER:
        return 0
    if role == Role.ADMIN:
        pending = pending.filter(role=Role.OWNER)
    return pending.update(state=Invitation.State.REVOKED, decided_at=timezone.now())


def membership_invite(*, actor: Actor, username: str, role: str, now: datetime | None = None) -> Invitation:
    """Invite a user, by username, to the actor's tenant with ``role`` (admins; only owners invite owners). The
    user joins only when they accept (``invitation_decide``). The answer is the same whether or not a user of
    that name exists (the invitation waits for one): an admin learns nothing of another tenant's users, and
    nobody is made a member of a tenant without saying yes."""
    actor.require("manage")
    if role not in Role.values:
        raise ValidationFailed(f"role must be one of {', '.join(Role.values)}.", field="role")
    if role == Role.OWNER:
        actor.require("own")
    username = (username or "").strip()
    if not username or len(username) > 150:
        raise ValidationFailed("username must be 1 to 150 characters.", field="username")
    if Membership.objects.filter(tenant=actor.tenant, user__username=username).exists():
        raise Conflict(f"{username} is already a member of '{actor.tenant.slug}'.", field="username")
    try:
        with transaction.atomic():
            invitation = Invitation.objects.create(tenant=actor.tenant, username=username, role=role,
                                                   invited_by=actor.user, created_at=now or timezone.now())
    except IntegrityError:
        raise Conflict(f"{username} has an invitation to '{actor.tenant.slug}' already; revoke it to change "
                       "the role.", field="username") from None
    audit_record(tenant=actor.tenant, by=actor.user, action="member.invite", target=username, data={"role": role})
    return invitation


def invitation_revoke(*, actor: Actor, invitation: Invitation, now: datetime | None = None) -> Invitation:
    """Withdraw a pending invitation of the actor's tenant (admins; an owner's invitation by owners)."""
    actor.require("manage")
    if invitation.role == Role.OWNER:
        actor.require("own")
    if Invitation.objects.filter(pk=invitation.pk, tenant=actor.tenant, state=Invitation.State.PENDING).update(
            state=Invitation.State.REVOKED, decided_at=now or timezone.now()) != 1:
        raise Conflict("The invitation is no longer pending.", field="id")
    audit_record(tenant=actor.tenant, by=actor.user, action="member.invite_revoke", target=invitation.username,
                 data={"role": invitation.role})
    invitation.refresh_from_db()
    return invitation


def invitation_decide(*, user, invitation: Invitation, accept: bool, now: datetime | None = None) -> Invitation:
    """The invited user accepts (becomes a member with the invitation's role) or declines. Only the user the
    invitation names, only while it is pending; audited in the tenant's trail."""
    if not user.is_authenticated or invitation.username != user.get_username():
        raise NotFound("No such invitation.", field="id")
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        locked = Invitation.objects.select_for_update().filter(pk=invitation.pk).first()
        if locked is None or locked.state != Invitation.State.PENDING:
            raise Conflict("The invitation is no longer pending (accepted, declined or revoked).", field="id")
        if locked.tenant.closed_at is not None:
            raise Conflict("That tenant is closed.", field="id")
        if accept and not locked.tenant.is_active:
            raise Conflict(f"'{locked.tenant.slug}' is suspended and takes no new members now; the invitation "
                           "waits until it is active again.", field="id")
        locked.state = Invitation.State.ACCEPTED if accept else Invitation.State.DECLINED
        locked.decided_at = now
        locked.save(update_fields=["state", "decided_at"])
        if accept and not Membership.objects.filter(tenant=locked.tenant, user=user).exists():
            Membership.objects.create(user=user, tenant=locked.tenant, role=locked.role)
        audit_record(tenant=locked.tenant, by=user, action="member.add" if accept else "member.invite_decline",
                     target=user.get_username(), data={"role": locked.role, "invitation": locked.pk})
    return locked


# --- API tokens --------------------------------------------------------------------------------


def api_token_create(
    *, actor: Actor, name: str, scopes: list[str], expires_at: datetime | None = None, now: datetime | None = None,
    projects: list[str] | None = None,
) -> tuple[ApiToken, str]:
    """Create a token for the acting member; return it with its secret, which is never shown again.

    Viewers may only hold read tokens; a token can never grant more than its member's role. A read-only
    token cannot create tokens, and no token is created while the tenant is suspended (``self``).
    ``projects`` (slugs of the tenant's projects) limits the token to them (``tenants.access.restrict``);
    None: the whole tenant.
    """
    actor.require("self")
    now = now or timezone.now()
    name = _validate_name(name, "name", 100)
    if not scopes or not isinstance(scopes, list | tuple) or any(s not in TokenScope.values for s in scopes):
        raise ValidationFailed("scopes must be a non-empty list of 'read' and 'write'.", field="scopes")
    scopes = sorted(set(scopes))
    if TokenScope.WRITE in scopes:
        if ROLE_RANK[Role(actor.role)] < ROLE_RANK[Role.MEMBER]:
            raise PermissionDenied("Viewers can only create tokens with read scope.", field="scopes")
        if TokenScope.WRITE not in actor.scopes:
            raise PermissionDenied("A read-only token cannot create a write token.", field="scopes")
    if expires_at is not None:
        if expires_at <= now:
            raise ValidationFailed("expires_at must be in the future.", field="expires_at")
        if expires_at - now > MAX_TOKEN_LIFETIME:
            raise ValidationFailed("expires_at must be within 366 days.", field="expires_at")
    project_ids = None
    if projects is not None:
        if not isinstance(projects, list | tuple) or not projects:
            raise ValidationFailed("projects must be a non-empty list of project slugs, or null.", field="projects")
        # a member limited to projects names only theirs: another project of the tenant is "not found" to them
        found = dict(restrict(Project.objects.filter(slug__in=list(projects)), actor).values_list("slug", "pk"))
        missing = sorted(set(projects) - set(found))
        if missing:
            raise ValidationFailed(f"No project {missing[0]!r} in this tenant.", field="projects")
        project_ids = sorted(set(found.values()))
    token_text, prefix, secret_hash = token_generate()
    with transaction.atomic(durable=True):
        token = ApiToken.objects.create(
            tenant=actor.tenant,
            user=actor.user,
            name=name,
            prefix=prefix,
            secret_hash=secret_hash,
            scopes=scopes,
            created_at=now,
            expires_at=expires_at,
            project_ids=project_ids,
        )
        audit_record(tenant=actor.tenant, by=actor.user, action="token.create", target=prefix,
                     data={"scopes": scopes, "projects": sorted(projects) if projects is not None else None,
                           "expires_at": expires_at.isoformat() if expires_at else None})
    return token, token_text


def api_token_revoke(*, actor: Actor, token: ApiToken, now: datetime | None = None) -> ApiToken:
    """Revoke a token (own tokens: ``leave``; admins any of the tenant: ``revoke``). Revoking twice is
    harmless; it takes access away, so a suspended tenant may still do it."""
    actor.require("leave" if token.user_id == actor.user.pk else "revoke")
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        changed = ApiToken.objects.filter(pk=token.pk, tenant=actor.tenant, revoked_at__isnull=True).update(
            revoked_at=now
        )
        if changed:
            audit_record(tenant=actor.tenant, by=actor.user, action="token.revoke", target=token.prefix)
    token.refresh_from_db()
    return token


TOKEN_USE_AUDIT_INTERVAL = timedelta(days=1)


def api_token_mark_used(*, token: ApiToken, now: datetime) -> None:
    """Record use at most once a minute per token (a conditional update, never a write per request); the
    first use, and the first after a day unused, is also an audit row (``token.use``: the tenant's auditors
    see that a token is in use, not each request)."""
    if token.last_used_at is not None and token.last_used_at >= now - timedelta(seconds=60):
        return  # the row as loaded for this request is recent enough: no query at all
    with transaction.atomic():
        changed = ApiToken.objects.filter(pk=token.pk).filter(
            Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - timedelta(seconds=60))
        ).update(last_used_at=now)
        if changed and (token.last_used_at is None or token.last_used_at < now - TOKEN_USE_AUDIT_INTERVAL):
            audit_record(tenant=token.tenant, by=token.user, action="token.use", target=token.prefix,
                         data={"last_used_at": token.last_used_at.isoformat() if token.last_used_at else None})


# --- quotas (platform staff) -------------------------------------------------------------------


KEEP = object()  # a keyword left out: the value stays as it is


def _cohort_limit(value, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**31 - 1:
        raise ValidationFailed(f"{field} must be a whole number of milli-GPU >= 0, or null for no limit.",
                               field=field)
    return value


def tenant_quota_set(
    *, tenant: Tenant, tier: str, deserved_gpu_milli: int, limit_gpu_milli: int,
    lending_limit_gpu_milli: object = KEEP, borrowing_limit_gpu_milli: object = KEEP,
    by_user=None,
) -> TenantQuota:
    """Set a tenant's bound for one tier. Lowering it below what its projects already hold is refused. The cohort
    limits (read while the tenant is in a cohort; null: none) stay as they are unless given."""
    tier, deserved, limit = _validate_quota_values(tier, deserved_gpu_milli, limit_gpu_milli)
    limits = {}
    if lending_limit_gpu_milli is not KEEP:
        limits["lending_limit_gpu_milli"] = _cohort_limit(lending_limit_gpu_milli, "lending_limit_gpu_milli")
    if borrowing_limit_gpu_milli is not KEEP:
        limits["borrowing_limit_gpu_milli"] = _cohort_limit(borrowing_limit_gpu_milli, "borrowing_limit_gpu_milli")
    with transaction.atomic(durable=True):
        quota, _ = TenantQuota.objects.select_for_update().get_or_create(
            tenant=tenant, tier=tier, defaults={"deserved_gpu_milli": deserved, "limit_gpu_milli": limit}
        )
        projects = Quota.objects.filter(project__tenant=tenant, tier=tier)
        held = projects.aggregate(total=Sum("deserved_gpu_milli"))["total"] or 0
        if held > deserved:
            raise QuotaExceeded(
                f"Projects of '{tenant.slug}' already hold {held} milli-GPU deserved on {tier}; "
                f"the tenant quota cannot go below that.",
                field="deserved_gpu_milli",
            )
        widest = max(projects.values_list("limit_gpu_milli", flat=True), default=0)
        if widest > limit:
            raise QuotaExceeded(
                f"A project of '{tenant.slug}' has limit {widest} on {tier}; the tenant limit cannot go below that.",
                field="limit_gpu_milli",
            )
        TenantQuota.objects.filter(pk=quota.pk).update(deserved_gpu_milli=deserved, limit_gpu_milli=limit, **limits)
        audit_record(tenant=tenant, by=by_user, action="tenant_quota.set", target=tier,
                     data={"deserved_gpu_milli": deserved, "limit_gpu_milli": limit, **limits})
    quota.refresh_from_db()
    return quota


# --- cohorts (platform staff) and node pools -----------------------------------------------------


def cohort_create(*, name: str, description: str = "", by_user=None) -> Cohort:
    """Create a cohort (platform staff): tenants put in it lend each other their idle guarantee
    (``tenant_cohort_set``). Audited in the platform's log (no tenant)."""
    _validate_slug(name, "name")
    if not isinstance(description, str) or len(description) > 200:
        raise ValidationFailed("description must be text of at most 200 characters.", field="description")
    with transaction.atomic(durable=True):
        if Cohort.objects.filter(name=name).exists():
            raise Conflict(f"Cohort '{name}' already exists.", field="name")
        cohort = Cohort.objects.create(name=name, description=description)
        audit_record(tenant=None, by=by_user, action="cohort.create", target=name)
    return cohort


def tenant_cohort_set(*, tenant: Tenant, cohort: Cohort | None, by_user=None) -> Tenant:
    """Put a tenant in a cohort, move it to another, or take it out (``cohort`` None; platform staff). A tenant
    belongs to at most one cohort; the next schedule cycle applies it (nothing running is preempted for it)."""
    with transaction.atomic(durable=True):
        before_id = Tenant.objects.select_for_update().filter(pk=tenant.pk).values_list("cohort_id", flat=True).get()
        before = Cohort.objects.filter(pk=before_id).values_list("name", flat=True).first()
        Tenant.objects.filter(pk=tenant.pk).update(cohort=cohort)
        audit_record(tenant=tenant, by=by_user, action="tenant.cohort_set", target=tenant.slug,
                     data={"from": before, "to": cohort.name if cohort else None})
    tenant.refresh_from_db()
    return tenant


def project_pools_check(pools: object) -> list[str]:
    """The node pools a project may be bound to, sorted, each once: every one a pool of the fleet (the broker's
    nodes, ``tenants.extensions.fleet_pools``); an empty list binds it to none (any pool). Leases are placed in
    them from the next schedule cycle on (running ones stay where they are)."""
    from tenants.extensions import fleet_pools

    if not isinstance(pools, list | tuple) or not all(isinstance(pool, str) for pool in pools):
        raise ValidationFailed("pools must be a list of pool names.", field="pools")
    wanted = sorted(set(pools))
    if not wanted:
        return wanted
    known = fleet_pools()
    unknown = [pool for pool in wanted if pool not in known]
    if unknown:
        listed = ", ".join(sorted(known)) or "none"
        raise ValidationFailed(f"No node pool {', '.join(repr(p) for p in unknown)} in the fleet (pools: {listed}).",
                               field="pools")
    return wanted


def quota_check(
    *,
    project: Project,
    tier: str,
    deserved_gpu_milli: int,
    limit_gpu_milli: int,
    over_quota_weight: int = 1,
    lock: bool = False,
) -> tuple[str, int, int, int]:
    """Validate a project quota against its tenant's bound; return the normalised values.

    With ``lock`` the tenant quota row is locked (inside a transaction), so racing writers serialise.
    """
    tier, deserved, limit = _validate_quota_values(tier, deserved_gpu_milli, limit_gpu_milli)
    if (
        isinstance(over_quota_weight, bool)
        or not isinstance(over_quota_weight, int)
        or not (0 <= over_quota_weight <= 1000)
    ):
        raise ValidationFailed("over_quota_weight must be a whole number from 0 to 1000.", field="over_quota_weight")
    bounds = TenantQuota.objects.filter(tenant_id=project.tenant_id, tier=tier)
    bound = (bounds.select_for_update() if lock else bounds).first()
    if bound is None:
        raise QuotaExceeded(f"Tenant has no quota for {tier}; set the tenant quota first.", field="tier")
    others = (
        Quota.objects.filter(project__tenant_id=project.tenant_id, tier=tier)
        .exclude(project=project)
        .aggregate(total=Sum("deserved_gpu_milli"))["total"]
        or 0
    )
    if others + deserved > bound.deserved_gpu_milli:
        raise QuotaExceeded(
            f"deserved_gpu_milli {deserved} plus the tenant's other projects ({others}) exceeds the tenant "
            f"quota for {tier} ({bound.deserved_gpu_milli}).",
            field="deserved_gpu_milli",
        )
    if limit > bound.limit_gpu_milli:
        raise QuotaExceeded(
            f"limit_gpu_milli {limit} exceeds the tenant limit for {tier} ({bound.limit_gpu_milli}).",
            field="limit_gpu_milli",
        )
    return tier, deserved, limit, over_quota_weight


def quota_set(
    *,
    project: Project,
    tier: str,
    deserved_gpu_milli: int,
    limit_gpu_milli: int,
    over_quota_weight: int = 1,
    by_user=None,
) -> Quota:
    """Set a project's quota for one tier, within its tenant's bound (locked, so racing calls cannot
    together oversell the tenant quota)."""
    with transaction.atomic(durable=True):
        tier, deserved, limit, weight = quota_check(
            project=project,
            tier=tier,
            deserved_gpu_milli=deserved_gpu_milli,
            limit_gpu_milli=limit_gpu_milli,
            over_quota_weight=over_quota_weight,
            lock=True,
        )
        quota, _ = Quota.objects.update_or_create(
            project=project,
            tier=tier,
            defaults={"deserved_gpu_milli": deserved, "limit_gpu_milli": limit, "over_quota_weight": weight},
        )
        audit_record(tenant=project.tenant, by=by_user, action="quota.set", target=f"{project.slug}/{tier}",
                     data={"deserved_gpu_milli": deserved, "limit_gpu_milli": limit, "over_quota_weight": weight})
    return quota


# --- SLO contracts (platform staff) ------------------------------------------------------------


def slo_contract_create(
    *,
    tenant: Tenant,
    name: str,
    effective_from: datetime,
    effective_to: datetime | None,
    time_to_gpu_p95_seconds: int,
    availability_target_pct: Decimal,
    preemption_notice_seconds: int,
    credit_steps: list[dict],
    max_credit_pct: Decimal = Decimal(100),
    min_runtime_seconds: int | None = None,
    by_user=None,
) -> SloContract:
    """Create a contract with its credit schedule; periods of one tenant's contracts never overlap."""
    name = _validate_name(name, "name", 100)
    if effective_to is not None and effective_to <= effective_from:
        raise ValidationFailed("effective_to must be after effective_from.", field="effective_to")
    if not isinstance(time_to_gpu_p95_seconds, int) or time_to_gpu_p95_seconds <= 0:
        raise ValidationFailed("time_to_gpu_p95_seconds must be a positive integer.", field="time_to_gpu_p95_seconds")
    availability = Decimal(availability_target_pct)
    if not Decimal(0) < availability <= Decimal(100):
        raise ValidationFailed("availability_target_pct must be in (0, 100].", field="availability_target_pct")
    min_runtime_seconds = _min_runtime(min_runtime_seconds)
    for index, step in enumerate(credit_steps):
        if step.get("metric") not in SloMetric.values:
            raise ValidationFailed(
                f"metric must be one of {', '.join(SloMetric.values)}.", field=f"credit_steps[{index}].metric"
            )
        credit = Decimal(str(step.get("credit_pct", "0")))
        if not Decimal(0) < credit <= Decimal(100):
            raise ValidationFailed("credit_pct must be in (0, 100].", field=f"credit_steps[{index}].credit_pct")
    with transaction.atomic(durable=True):
        overlapping = SloContract.objects.filter(tenant=tenant).filter(
            Q(effective_to__isnull=True) | Q(effective_to__gt=effective_from)
        )
        if effective_to is not None:
            overlapping = overlapping.filter(effective_from__lt=effective_to)
        if overlapping.exists():
            raise Conflict("The period overlaps another SLO contract of this tenant.", field="effective_from")
        try:
            contract = SloContract.objects.create(
                tenant=tenant,
                name=name,
                effective_from=effective_from,
                effective_to=effective_to,
                time_to_gpu_p95_seconds=time_to_gpu_p95_seconds,
                availability_target_pct=availability,
                preemption_notice_seconds=preemption_notice_seconds,
                max_credit_pct=max_credit_pct,
                min_runtime_seconds=min_runtime_seconds,
            )
        except IntegrityError:
            raise Conflict("The period overlaps another SLO contract of this tenant.", field="effective_from") from None
        SloCreditStep.objects.bulk_create(
            SloCreditStep(
                contract=contract,
                metric=s["metric"],
                threshold=Decimal(str(s["threshold"])),
                credit_pct=Decimal(str(s["credit_pct"])),
            )
            for s in credit_steps
        )
        audit_record(tenant=tenant, by=by_user, action="slo_contract.create", target=name)
    return contract


def _min_runtime(value) -> int | None:
    """A contract's minimum runtime: None (the platform's) or whole seconds >= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**31 - 1:
        raise ValidationFailed("min_runtime_seconds must be a whole number of seconds >= 0, or null for the "
                               "platform's minimum runtime.", field="min_runtime_seconds")
    return value


def _decimal(value, field: str) -> Decimal:
    from decimal import InvalidOperation

    try:
        number = Decimal(str(value))
    except (InvalidOperation, ValueError):
        raise ValidationFailed(f"{field} must be a number.", field=field) from None
    if not number.is_finite():
        raise ValidationFailed(f"{field} must be a number.", field=field)
    return number


def slo_contract_check(
    *,
    name: str,
    effective_from: datetime,
    effective_to: datetime | None,
    time_to_gpu_p95_seconds: int,
    availability_target_pct,
    preemption_notice_seconds: int,
    max_credit_pct,
    credit_steps: list[dict],
    min_runtime_seconds: int | None = None,
) -> dict:
    """Validate every value of a contract and its credit steps (errors name the field); the normalised
    values."""
    name = _validate_name(name, "name", 100)
    if not isinstance(effective_from, datetime) or timezone.is_naive(effective_from):
        raise ValidationFailed("effective_from must be a date and time with a time zone.", field="effective_from")
    if effective_to is not None:
        if not isinstance(effective_to, datetime) or timezone.is_naive(effective_to):
            raise ValidationFailed("effective_to must be a date and time with a time zone.", field="effective_to")
        if effective_to <= effective_from:
            raise ValidationFailed("effective_to must be after effective_from.", field="effective_to")
    for field, value, low in (("time_to_gpu_p95_seconds", time_to_gpu_p95_seconds, 1),
                              ("preemption_notice_seconds", preemption_notice_seconds, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 2**31 - 1:
            raise ValidationFailed(f"{field} must be a whole number of seconds >= {low}.", field=field)
    availability = _decimal(availability_target_pct, "availability_target_pct")
    if not Decimal(0) < availability <= Decimal(100):
        raise ValidationFailed("availability_target_pct must be in (0, 100].", field="availability_target_pct")
    max_credit = _decimal(max_credit_pct, "max_credit_pct")
    if not Decimal(0) < max_credit <= Decimal(100):
        raise ValidationFailed("max_credit_pct must be in (0, 100].", field="max_credit_pct")
    steps, seen = [], set()
    for index, step in enumerate(credit_steps):
        where = f"credit_steps[{index}]"
        metric = step.get("metric")
        if metric not in SloMetric.values:
            raise ValidationFailed(f"metric must be one of {', '.join(SloMetric.values)}.", field=f"{where}.metric")
        threshold = _decimal(step.get("threshold"), f"{where}.threshold")
        if threshold < 0 or (metric != SloMetric.TIME_TO_GPU_P95 and threshold > 100):
            limit = "be >= 0" if metric == SloMetric.TIME_TO_GPU_P95 else "be in [0, 100] (a percentage)"
            raise ValidationFailed(f"threshold must {limit}.", field=f"{where}.threshold")
        credit = _decimal(step.get("credit_pct"), f"{where}.credit_pct")
        if not Decimal(0) < credit <= Decimal(100):
            raise ValidationFailed("credit_pct must be in (0, 100].", field=f"{where}.credit_pct")
        if (metric, threshold) in seen:
            raise ValidationFailed("Two credit steps have the same metric and threshold.", field=f"{where}.threshold")
        seen.add((metric, threshold))
        steps.append({"metric": metric, "threshold": threshold, "credit_pct": credit})
    return {"name": name, "effective_from": effective_from, "effective_to": effective_to,
            "time_to_gpu_p95_seconds": time_to_gpu_p95_seconds, "availability_target_pct": availability,
            "preemption_notice_seconds": preemption_notice_seconds, "max_credit_pct": max_credit,
            "min_runtime_seconds": _min_runtime(min_runtime_seconds), "credit_steps": steps}


def slo_contract_save(*, tenant: Tenant, contract: SloContract | None = None, by_user=None, **values) -> SloContract:
    """Create a contract (``contract`` None) or replace every value of one, credit steps included, after
    ``slo_contract_check``. Periods of one tenant's contracts never overlap (checked, and the exclusion
    constraint holds it against races)."""
    values = slo_contract_check(**values)
    if contract is None:
        return slo_contract_create(tenant=tenant, by_user=by_user, **values)
    steps = values.pop("credit_steps")
    overlap = Conflict("The period overlaps another SLO contract of this tenant.", field="effective_from")
    try:
        with transaction.atomic(durable=True):
            others = SloContract.objects.filter(tenant=tenant).exclude(pk=contract.pk).filter(
                Q(effective_to__isnull=True) | Q(effective_to__gt=values["effective_from"]))
            if values["effective_to"] is not None:
                others = others.filter(effective_from__lt=values["effective_to"])
            if others.exists():
                raise overlap
            SloContract.objects.filter(pk=contract.pk, tenant=tenant).update(**values)
            SloCreditStep.objects.filter(contract=contract).delete()
            SloCreditStep.objects.bulk_create(SloCreditStep(contract=contract, **step) for step in steps)
            audit_record(tenant=tenant, by=by_user, action="slo_contract.update", target=values["name"])
    except IntegrityError:
        raise overlap from None
    contract.refresh_from_db()
    return contract


# --- bootstrap ---------------------------------------------------------------------------------


def user_get_or_create(*, username: str, email: str = "", password: str | None = None, is_staff: bool = False):
    User = get_user_model()
    user, created = User.objects.get_or_create(username=username, defaults={"email": email, "is_staff": is_staff})
    if created:
        if password:
            user.set_password(password)
        else:
            user.set_unusable_password()
        user.save(update_fields=["password"])
    return user, created
