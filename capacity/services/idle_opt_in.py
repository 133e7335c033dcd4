"""A project's opt-in to idle reclaim of its interactive leases (``Project.idle_reclaim_opt_in``): its admins and
owners set and clear it (``manage``); each change is audited in the tenant's trail with the rule it took on. The
planner reads it through ``capacity.selectors.policies_in_force`` (docs/capacity.md, "Tenants opt in")."""

from __future__ import annotations

from django.db import transaction

from capacity.selectors import idle_opt_in_modes
from capacity.services.common import _audit
from core.errors import ValidationFailed
from tenants.access import Actor
from tenants.models import Project


def idle_opt_in_set(*, actor: Actor, project: Project, opt_in: object) -> Project:
    """Set (``True``) or clear (``False``) the opt-in of ``project``, one of the actor's tenant's projects. A
    value that is already so changes nothing and writes no audit row."""
    actor.require("manage")
    if not isinstance(opt_in, bool):
        raise ValidationFailed("opt_in must be true or false.", field="opt_in")
    with transaction.atomic(durable=True):
        row = Project.objects.select_for_update().get(pk=project.pk, tenant=actor.tenant)
        if row.idle_reclaim_opt_in != opt_in:
            Project.objects.filter(pk=row.pk).update(idle_reclaim_opt_in=opt_in)
            row.idle_reclaim_opt_in = opt_in
            modes = idle_opt_in_modes(project=row)  # the rule and modes only: no estimate inside the lock
            rule = modes.rule
            _audit("project.idle_reclaim_opt_in" if opt_in else "project.idle_reclaim_opt_out", actor,
                   {"opt_in": opt_in, "mode": modes.mode(opt_in).value, "staff_mode": modes.staff_mode,
                    "rule": {"enabled": rule.enabled, "threshold_permille": rule.threshold_permille,
                             "window_seconds": rule.window_seconds, "notice_seconds": rule.notice_seconds}},
                   target=row.slug, tenant=actor.tenant)
    project.idle_reclaim_opt_in = opt_in
    return project
