"""Platform-staff API views and the permission they share with tenant views: staff (``is_staff``, by session
or by one of their own API tokens) act on the platform, not inside a tenant, so they pass without belonging to
one; a token's read scope still refuses their writes. Everyone else goes through the tenant rules
(``tenants.permissions``). Kept apart from ``tenants.permissions``, which DRF's settings import before its own
views module is ready."""

from __future__ import annotations

from rest_framework import permissions
from rest_framework.views import APIView

from core.errors import PermissionDenied
from tenants.permissions import SAFE_METHODS, TenantRolePermission
from tenants.selectors import actor_for_request

READ_ONLY_TOKEN = "This API token has read scope only."


def is_staff(request) -> bool:
    """A staff member acting as staff: by session, or by a token of theirs that is not limited to projects (a
    token that names projects, a CI job's, acts only inside them, never on the platform: docs/tenancy.md)."""
    from tenants.models import ApiToken

    token = getattr(request, "auth", None)
    return bool(request.user and request.user.is_authenticated and request.user.is_staff
                and not (isinstance(token, ApiToken) and token.project_ids is not None))


class StaffOrTenantPermission(permissions.BasePermission):
    """Staff: allowed, ``request.actor`` is their tenant actor or None; others: ``TenantRolePermission``."""

    def has_permission(self, request, view) -> bool:
        if not is_staff(request):
            return TenantRolePermission().has_permission(request, view)
        request.actor = actor_for_request(request)
        if request.method not in SAFE_METHODS and request.actor is not None and not request.actor.can_write:
            raise PermissionDenied(READ_ONLY_TOKEN)
        return True


class StaffApi(APIView):
    """A platform-staff endpoint: tenant members are refused (403) once authentication, the tenant rules and
    the rate limit have run, so they are counted like every caller."""

    permission_classes = [StaffOrTenantPermission]

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        if not is_staff(request):
            raise PermissionDenied("This endpoint is for platform staff.")
