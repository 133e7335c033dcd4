"""A POST that writes nothing: ``POST /api/v1/quotes`` takes the lease request's body (too rich for a query
string) but only reads, so it is held to the tenant rules of a read (``tenants.permissions``): authenticated,
a member of a tenant, and the ``view`` action — a viewer and a read-only token may ask for a quote."""

from __future__ import annotations

from rest_framework import permissions

from core.errors import PermissionDenied
from tenants.selectors import actor_for_request


class ReadOnlyPostPermission(permissions.BasePermission):
    """``TenantRolePermission`` as it treats a GET, for a view whose POST reads only."""

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        actor = actor_for_request(request)
        if actor is None:
            raise PermissionDenied("You are not a member of any tenant.")
        request.actor = actor
        actor.require("view")
        return True
