"""The one permission layer: who is acting, for which tenant, with which powers.

Every tenant-facing query goes through ``restrict(queryset, actor)``, which keeps only the actor's
tenant's rows (via the model's ``tenant_lookup``). Objects of another tenant are therefore simply not
found (404), by any route. Within the tenant, ``actor.require(action)`` refuses with 403 what the role,
the token's scopes or the tenant's status do not allow.

Actions (``ACTIONS``: the weakest role allowed, and whether a suspended tenant may still do it):
  ``view``     read anything of the tenant                               viewer and up    suspended too
  ``leave``    give up one's own access: revoke one's own token, leave    viewer and up    suspended too
  ``self``     create one's own API tokens                               viewer and up    active only
  ``release``  give a lease back (stops its meter)                       member and up    suspended too
  ``use``      request and renew leases                                  member and up    active only
  ``revoke``   take access away from others: their tokens, memberships   admin and up     suspended too
  ``manage``   projects, roles below owner                               admin and up     active only
  ``own``      owners, billing settings, the tenant itself               owner            active only
Every action but ``view`` changes something, so it also needs the ``write`` scope when a token acts.
A token limited to named projects (``ApiToken.project_ids``) sees, through ``restrict``, only those projects
and what belongs to them (models that name ``project_lookup``); it may do only what stays inside a project
(``view``, ``leave``, ``use``, ``release``): ``PROJECT_SCOPED_ACTIONS``. A member or viewer limited to named
projects (``Membership.project_ids``) is narrowed by ``restrict`` the same way, whether in the portal or through
any token of theirs (the actor's projects are the token's and the member's in common); their role already keeps
them from the tenant-wide actions, and they may still create their own tokens (``self``).
A suspended tenant may read and may only give things back (leases, tokens, memberships): it can start
nothing that costs money or grants access (docs/tenancy.md, "Suspension").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from django.db.models import Model, QuerySet

from core.errors import PermissionDenied, TenantSuspended
from tenants.choices import ROLE_RANK, Role, TokenScope

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

    from tenants.models import ApiToken, Tenant

Action = Literal["view", "leave", "self", "release", "use", "revoke", "manage", "own"]


@dataclass(frozen=True)
class ActionRule:
    min_role: Role
    while_suspended: bool  # giving things back is always allowed; starting or granting anything is not


ACTIONS: dict[str, ActionRule] = {
    "view": ActionRule(Role.VIEWER, True),
    "leave": ActionRule(Role.VIEWER, True),
    "self": ActionRule(Role.VIEWER, False),
    "release": ActionRule(Role.MEMBER, True),
    "use": ActionRule(Role.MEMBER, False),
    "revoke": ActionRule(Role.ADMIN, True),
    "manage": ActionRule(Role.ADMIN, False),
    "own": ActionRule(Role.OWNER, False),
}
ACTION_MIN_ROLE: dict[str, Role] = {action: rule.min_role for action, rule in ACTIONS.items()}
# what a project-scoped token may do: nothing that reaches the tenant as a whole (its projects, members,
# tokens, owners and billing settings)
PROJECT_SCOPED_ACTIONS = frozenset({"view", "leave", "use", "release"})


@dataclass(frozen=True)
class Actor:
    """A user acting inside one tenant, through the portal (all scopes) or an API token."""

    user: AbstractBaseUser
    tenant: Tenant
    role: Role
    scopes: frozenset[str] = field(default_factory=lambda: frozenset(TokenScope.values))
    token: ApiToken | None = None
    # the projects the actor reaches (a project-scoped token's, a project-limited member's, or both in common);
    # None: the whole tenant
    project_ids: frozenset[int] | None = None
    token_project_scoped: bool = False  # the token itself names projects: PROJECT_SCOPED_ACTIONS only

    @property
    def can_write(self) -> bool:
        """False for a read-only API token: it may only read, whatever its member's role."""
        return TokenScope.WRITE in self.scopes

    def can(self, action: Action) -> bool:
        rule = ACTIONS[action]
        if ROLE_RANK[Role(self.role)] < ROLE_RANK[rule.min_role]:
            return False
        if action != "view" and not self.can_write:
            return False
        if self.token_project_scoped and action not in PROJECT_SCOPED_ACTIONS:
            return False
        return rule.while_suspended or self.tenant.is_active

    def require(self, action: Action) -> None:
        """Raise 403 unless the actor may perform ``action`` now."""
        rule = ACTIONS[action]
        if action != "view" and not self.can_write:
            raise PermissionDenied("This API token has read scope only.")
        if self.token_project_scoped and action not in PROJECT_SCOPED_ACTIONS:
            raise PermissionDenied("This API token is limited to named projects; it cannot act on the tenant "
                                   "as a whole.")
        if ROLE_RANK[Role(self.role)] < ROLE_RANK[rule.min_role]:
            raise PermissionDenied(
                f"Your role '{self.role}' in tenant '{self.tenant.slug}' does not allow this "
                f"(needs {rule.min_role.value} or higher)."
            )
        if not rule.while_suspended and not self.tenant.is_active:
            raise TenantSuspended(f"Tenant '{self.tenant.slug}' is suspended; only reading and giving back "
                                  f"(releasing leases, revoking tokens) are allowed.")


def project_scope(*, token_project_ids, member_project_ids) -> frozenset[int] | None:
    """The projects an actor reaches: what the token and the membership both allow (None: no limit)."""
    limits = [frozenset(ids) for ids in (token_project_ids, member_project_ids) if ids is not None]
    if not limits:
        return None
    return frozenset.intersection(*limits)


def require_admin_read(actor: Actor, what: str) -> None:
    """A read kept to the tenant's admins and owners, never to a project-limited actor (the audit trail, the
    pending invitations): ``what`` opens the refusal ("The audit trail is")."""
    if ROLE_RANK[Role(actor.role)] < ROLE_RANK[Role.ADMIN] or actor.project_ids is not None:
        raise PermissionDenied(f"{what} for the tenant's admins and owners (and not for a token limited to projects).")


def restrict(queryset: QuerySet, actor: Actor) -> QuerySet:
    """Only the rows of ``queryset`` that belong to the actor's tenant, and, for a project-scoped token or a
    project-limited member, of the rows that belong to a project (the model's ``project_lookup``) only its
    projects'."""
    model: type[Model] = queryset.model
    lookup = getattr(model, "tenant_lookup", None)
    if lookup is None:
        raise TypeError(f"{model.__name__} declares no tenant_lookup; it cannot be shown to tenants")
    if lookup == "":
        return queryset.filter(pk=actor.tenant.pk)
    queryset = queryset.filter(**{lookup: actor.tenant})
    project_lookup = getattr(model, "project_lookup", None)
    if actor.project_ids is not None and project_lookup is not None:
        queryset = queryset.filter(**{f"{project_lookup}__in": sorted(actor.project_ids)})
    return queryset
