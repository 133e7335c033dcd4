"""DRF permission that resolves the acting tenant and enforces the role rules of ``tenants.access``."""

from __future__ import annotations

from rest_framework import permissions

from config.errors import PermissionDenied
from tenants.selectors import actor_for_request

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class TenantRolePermission(permissions.BasePermission):
    """Authenticated, a member of a tenant, and allowed the view's action for this method.

    Views declare ``write_action`` (default ``manage``) or override ``required_action(request)``.
    """

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        actor = actor_for_request(request)
        if actor is None:
            raise PermissionDenied("You are not a member of any tenant.")
        request.actor = actor
        if hasattr(view, "required_action"):
            action = view.required_action(request)
        else:
            action = "view" if request.method in SAFE_METHODS else getattr(view, "write_action", "manage")
        actor.require(action)
        return True
