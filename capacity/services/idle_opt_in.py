"""A project's opt-in to idle reclaim of its interactive leases (``Project.idle_reclaim_opt_in``): its admins and
owners set and clear it (``manage``); each change is audited in the tenant's trail with the rule it took on. The
planner reads it through ``capacity.selectors.policies_in_force`` (docs/capacity.md, "Tenants opt in"). So is the
project's opt-out of the suspension of its idle resumable training (``Project.idle_suspend_opt_out``,
``suspend_opt_out_set``; docs/capacity.md, "Suspension of idle training")."""

from __future__ import annotations

from django.db import transaction

from capacity.selectors import idle_opt_in_modes, suspend_modes
from capacity.services.common import _audit
from core.errors import ValidationFailed
from tenants.access import Actor
from tenants.models import Project


def _rule_data(rule) -> dict:
    """The idle rule a change took on, as its audit row records it."""
    return {"enabled": rule.enabled, "threshold_permille": rule.threshold_permille,
            "window_seconds": rule.window_seconds, "notice_seconds": rule.notice_seconds}


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
                    "rule": _rule_data(rule)},
                   target=row.slug, tenant=actor.tenant)
    project.idle_reclaim_opt_in = opt_in
    return project


def suspend_opt_out_set(*, actor: Actor, project: Project, opt_out: object) -> Project:
    """Opt ``project`` (one of the actor's tenant's projects) out of (``True``) or back in to (``False``) the
    suspension of its idle resumable training. Opted out, the loop never suspends its leases, whatever a policy
    says. A value that is already so changes nothing and writes no audit row."""
    actor.require("manage")
    if not isinstance(opt_out, bool):
        raise ValidationFailed("suspend_opt_out must be true or false.", field="suspend_opt_out")
    with transaction.atomic(durable=True):
        row = Project.objects.select_for_update().get(pk=project.pk, tenant=actor.tenant)
        if row.idle_suspend_opt_out != opt_out:
            Project.objects.filter(pk=row.pk).update(idle_suspend_opt_out=opt_out)
            row.idle_suspend_opt_out = opt_out
            modes = suspend_modes(project=row)
            rule = modes.rule
            _audit("project.idle_suspend_opt_out" if opt_out else "project.idle_suspend_opt_in", actor,
                   {"opt_out": opt_out, "mode": modes.mode.value, "rule": _rule_data(rule)},
                   target=row.slug, tenant=actor.tenant)
    project.idle_suspend_opt_out = opt_out
    return project
