"""The one permission layer: who is acting, for which tenant, with which powers.

Every tenant-facing query goes through ``restrict(queryset, actor)``, which keeps only the actor's
tenant's rows (via the model's ``tenant_lookup``). Objects of another tenant are therefore simply not
found (404), by any route. Within the tenant, ``actor.require(action)`` refuses with 403 what the role
or the token's scopes do not allow.

Actions, from weakest to strongest:
  ``view``   read anything of the tenant                          viewer, member, admin, owner
  ``use``    request and manage leases, own tokens with write     member, admin, owner
  ``manage`` projects, members below owner, all tokens            admin, owner
  ``own``    owners, billing settings, the tenant itself          owner
Any action but ``view`` also needs the ``write`` scope when a token acts, and an active tenant.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from django.db.models import Model, QuerySet

from config.errors import PermissionDenied, TenantSuspended
from tenants.choices import ROLE_RANK, Role, TokenScope

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

    from tenants.models import ApiToken, Tenant

Action = Literal["view", "use", "manage", "own"]
ACTION_MIN_ROLE: dict[str, Role] = {
    "view": Role.VIEWER,
    "use": Role.MEMBER,
    "manage": Role.ADMIN,
    "own": Role.OWNER,
}


@dataclass(frozen=True)
class Actor:
    """A user acting inside one tenant, through the portal (all scopes) or an API token."""

    user: AbstractBaseUser
    tenant: Tenant
    role: Role
    scopes: frozenset[str] = field(default_factory=lambda: frozenset(TokenScope.values))
    token: ApiToken | None = None

    def can(self, action: Action) -> bool:
        if ROLE_RANK[Role(self.role)] < ROLE_RANK[ACTION_MIN_ROLE[action]]:
            return False
        return action == "view" or TokenScope.WRITE in self.scopes

    def require(self, action: Action) -> None:
        """Raise 403 unless the actor may perform ``action`` now."""
        if not self.can(action):
            if action != "view" and TokenScope.WRITE not in self.scopes:
                raise PermissionDenied("This API token has read scope only.")
            raise PermissionDenied(
                f"Your role '{self.role}' in tenant '{self.tenant.slug}' does not allow this "
                f"(needs {ACTION_MIN_ROLE[action].value} or higher)."
            )
        if action != "view" and not self.tenant.is_active:
            raise TenantSuspended(f"Tenant '{self.tenant.slug}' is suspended; only reading is allowed.")


def restrict(queryset: QuerySet, actor: Actor) -> QuerySet:
    """Only the rows of ``queryset`` that belong to the actor's tenant."""
    model: type[Model] = queryset.model
    lookup = getattr(model, "tenant_lookup", None)
    if lookup is None:
        raise TypeError(f"{model.__name__} declares no tenant_lookup; it cannot be shown to tenants")
    if lookup == "":
        return queryset.filter(pk=actor.tenant.pk)
    return queryset.filter(**{lookup: actor.tenant})
