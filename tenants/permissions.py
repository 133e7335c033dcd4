"""DRF permission that resolves the acting tenant and enforces the role rules of ``tenants.access``.

It is the default permission class of every tenant-facing API view (``REST_FRAMEWORK`` settings), so the
rules below hold for a view that declares nothing:

- a read (GET, HEAD, OPTIONS) needs the ``view`` action;
- any other method is a write: it needs the token's ``write`` scope, whatever the view declares (checked
  here, before the view runs, so a view cannot forget it), and the view's action for that method —
  ``required_action(request)`` when the view defines it, else ``write_action``, else ``manage``.

The services check their own, finer rules again (``actor.require``), e.g. revoking another member's token.
"""

from __future__ import annotations

from rest_framework import permissions

from core.errors import PermissionDenied
from tenants.selectors import actor_for_request

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
DEFAULT_WRITE_ACTION = "manage"


def view_action(view, request) -> str:
    """The ``tenants.access`` action a request to ``view`` needs (reads: ``view``)."""
    if hasattr(view, "required_action"):
        action = view.required_action(request)
    elif request.method in SAFE_METHODS:
        action = "view"
    else:
        action = getattr(view, "write_action", DEFAULT_WRITE_ACTION)
    if request.method not in SAFE_METHODS and action == "view":
        raise ValueError(f"{type(view).__name__}: a {request.method} is a write; declare its action")
    return action


class TenantRolePermission(permissions.BasePermission):
    """Authenticated, a member of a tenant, and allowed the view's action for this method."""

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        actor = actor_for_request(request)
        if actor is None:
            raise PermissionDenied("You are not a member of any tenant.")
        request.actor = actor
        if request.method not in SAFE_METHODS and not actor.can_write:
            raise PermissionDenied("This API token has read scope only.")
        actor.require(view_action(view, request))
        return True
