"""The capacity loop's pages. Tenants: ``/advice`` — their advice and the changes that touched their leases,
open first, accepted or rejected in place (htmx) where the service lets them; ``/settings/idle-reclaim`` — each
project's opt-in to idle reclaim of its interactive leases, the notice and the saving shown before the choice.
Platform staff: ``/ops/capacity`` — pools, warm instances and what holding them costs, the loop's recent actions, the
review queue, the policies and a planner run on demand.

Reads go through ``capacity.selectors`` (tenant-scoped: another tenant's adjustment is 404), writes through
one ``capacity.services`` function each; the service's message is what the user reads."""

from __future__ import annotations

import json

from django.contrib import messages
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone

from capacity import presenters as capacity_presenters
from capacity import selectors as capacity_selectors
from capacity import services as capacity_services
from capacity.choices import AdjustmentState, LoopMode
from capacity.selectors import MODE_FIELDS, NUMBER_FIELDS
from core.errors import ApplicationError, ValidationFailed
from portal import forms
from portal.ops import StaffView
from portal.views import TenantView
from tenants.selectors import project_get, project_list
from tiering import selectors as tiering_selectors

ADVICE_PAGE_SIZE = 100
RECENT = 20
REVIEW_MAX = 50
WARM_SHOWN = 100
POLICY_FIELDS = {"scope", "idle_rules", *MODE_FIELDS, *NUMBER_FIELDS}


def _decided_message(adjustment) -> str:
    if adjustment.state == AdjustmentState.REJECTED:
        return f"Adjustment {adjustment.pk} rejected."
    return f"Adjustment {adjustment.pk}: {adjustment.get_state_display().lower()} — {adjustment.outcome}"


# -- tenants: advice ----------------------------------------------------------------------------------------
class AdviceView(TenantView):
    template_name = "portal/advice.html"

    def get(self, request):
        rows = capacity_presenters.open_first(capacity_selectors.adjustment_list(actor=self.actor))[:ADVICE_PAGE_SIZE]
        context = {"rows": capacity_presenters.adjustment_rows(rows, user=request.user, actor=self.actor),
                   "panel": capacity_presenters.advice_panel(actor=self.actor),
                   # auto-tiering's advice on running leases (tiering/advice.py): migrate or quantize, advice only
                   "tier_advice": tiering_selectors.advice_list(actor=self.actor)[:ADVICE_PAGE_SIZE]}
        return render(request, self.template_name, context)


class AdviceDecideView(TenantView):
    """``POST /advice/<id>/accept`` and ``…/reject``: with htmx the row comes back decided (or with the
    service's refusal in it); without, a redirect to the page with the outcome as a message."""

    http_method_names = ["post"]
    write_action = "release"  # the weakest a kind needs (idle reclaim); the service asks more for the others
    decision = "accept"

    def post(self, request, pk: int):
        adjustment = capacity_selectors.adjustment_get(actor=self.actor, pk=pk)
        error = None
        try:
            if self.decision == "accept":
                adjustment = capacity_services.adjustment_accept(adjustment=adjustment, user=request.user,
                                                              actor=self.actor)
            else:
                adjustment = capacity_services.adjustment_reject(adjustment=adjustment, user=request.user,
                                                              actor=self.actor,
                                                              reason=request.POST.get("reason", "").strip())
        except ApplicationError as refused:
            error = refused.message
            adjustment = capacity_selectors.adjustment_get(actor=self.actor, pk=pk)
        if request.htmx:
            row = capacity_presenters.adjustment_row(adjustment, user=request.user, actor=self.actor)
            return render(request, "portal/partials/_advice_row.html", {"row": row, "error": error})
        if error:
            messages.error(request, error)
        else:
            messages.success(request, _decided_message(adjustment))
        return redirect(f"{reverse('portal:advice')}#adj-{pk}")


# -- tenants: a project's opt-in to idle reclaim -------------------------------------------------------------------
def _opt_in_card(shown) -> dict:
    """One project's card: the opt-in, what happens to an idle interactive lease, the saving over 7 days."""
    estimate = shown.estimate
    saving = ""
    if estimate is not None and estimate.saving_minor is not None:
        saving = capacity_presenters.money_text(estimate.saving_minor, estimate.currency)
    rule = shown.rule
    rule_text = (f"idle under {rule.threshold_permille / 10:.1f} % engine activity over {rule.window_seconds} s; "
                 f"notice {rule.notice_seconds} s" if rule.enabled else "switched off by platform staff")
    return {"shown": shown, "project": shown.project, "estimate": estimate, "saving": saving, "rule": rule_text}


class IdleReclaimView(TenantView):
    """``/settings/idle-reclaim``: per project, the opt-in to idle reclaim of its interactive leases, with the notice
    and the saving shown before the choice. Everyone in the tenant reads; admins and owners choose (``manage``).
    ``POST`` (``project``, ``opt_in`` true/false, or ``suspend_opt_out`` true/false: the suspension of its idle
    resumable training): with htmx the project's card comes back, changed or with the service's refusal in it;
    without, a redirect to the page with the outcome as a message."""

    template_name = "portal/settings_idle_reclaim.html"
    write_action = "manage"

    def get(self, request):
        policies = capacity_selectors.policies_in_force()  # once for the page, not once per project
        cards = [_opt_in_card(capacity_selectors.idle_opt_in_get(project=project, policies=policies))
                 for project in project_list(actor=self.actor)]
        return render(request, self.template_name, {"cards": cards, "can_manage": self.actor.can("manage"),
                                                     "tab": "idle-reclaim"})

    def post(self, request):
        project = project_get(actor=self.actor, slug=request.POST.get("project", ""))
        suspend = "suspend_opt_out" in request.POST  # the card's second form: the suspension opt-out
        name = "suspend_opt_out" if suspend else "opt_in"
        raw = request.POST.get(name, "")
        error = None
        try:
            if raw not in ("true", "false"):
                raise ValidationFailed(f"{name} must be true or false.", field=name)
            if suspend:
                project = capacity_services.suspend_opt_out_set(actor=self.actor, project=project,
                                                                opt_out=raw == "true")
            else:
                project = capacity_services.idle_opt_in_set(actor=self.actor, project=project, opt_in=raw == "true")
        except ApplicationError as refused:
            error = refused.message
        card = _opt_in_card(capacity_selectors.idle_opt_in_get(project=project))
        if request.htmx:
            return render(request, "portal/partials/_idle_opt_in.html",
                          {"card": card, "can_manage": True, "error": error}, status=400 if error else 200)
        if error:
            messages.error(request, error)
        elif suspend:
            messages.success(request, f"Project {project.slug}: idle training is "
                                      + ("never suspended." if project.idle_suspend_opt_out else
                                         "suspended as the idle reclaim mode says."))
        else:
            messages.success(request, f"Project {project.slug}: idle interactive leases are "
                                      + ("reclaimed automatically." if project.idle_reclaim_opt_in else
                                         "only proposed for reclaim, as advice."))
        return redirect(f"{reverse('portal:idle-reclaim')}#idle-{project.slug}")


# -- platform staff: the capacity loop ------------------------------------------------------------------------
def _policy_values(policy) -> dict:
    """A policy as its form shows it: modes ("" = inherit), numbers ("" = inherit), idle rules as JSON."""
    values = {name: getattr(policy, name) for name in MODE_FIELDS}
    values |= {name: "" if getattr(policy, name) is None else getattr(policy, name) for name in NUMBER_FIELDS}
    values["idle_rules"] = json.dumps(policy.idle_rules, sort_keys=True) if policy.idle_rules else ""
    values["scope"] = policy.scope
    return values


def _policy_errors(error: ApplicationError | None) -> forms.FieldErrors:
    """The service's message under the field the form shows (every ``idle_rules.<class>.<key>`` under the
    idle rules box); one that names no field of the form above it."""
    errors = forms.FieldErrors()
    if error is not None:
        key = forms.field_key(error.field)
        key = "idle_rules" if key.startswith("idle_rules") else key
        errors[key if key in POLICY_FIELDS else "__all__"] = error.message
    return errors


class CapacityView(StaffView):
    template_name = "ops/capacity.html"

    def render_page(self, request, *, form: str = "", error: ApplicationError | None = None, status: int = 200):
        now = timezone.now()
        errors = _policy_errors(error)
        policies = []
        for policy in capacity_selectors.policy_list():
            key = f"policy-{policy.pk}"
            policies.append({"policy": policy, "key": key,
                             "values": request.POST if form == key else _policy_values(policy)})
        staff = {"user": request.user, "actor": None}
        context = {
            "pools": capacity_selectors.fleet_pools(),
            "warm": list(capacity_selectors.warm_instances()[:WARM_SHOWN]),
            "holding": capacity_presenters.warm_holding_cost(start=capacity_presenters.month_start(now), end=now),
            "review": capacity_presenters.adjustment_rows(capacity_selectors.adjustment_list(
                actor=None, staff=True, state=AdjustmentState.PROPOSED)[:REVIEW_MAX], **staff),
            "recent": capacity_presenters.adjustment_rows(
                capacity_selectors.adjustment_list(actor=None, staff=True)[:RECENT], **staff),
            "policies": policies,
            "new_values": request.POST if form == "policy-new" else {},
            "mode_fields": MODE_FIELDS,
            "number_fields": NUMBER_FIELDS,
            "modes": LoopMode.choices,
            "default_mode": capacity_presenters.default_mode(),
            "form": form,
            "errors": errors,
            "now": now,
        }
        if request.htmx and request.htmx.target == "capacity-live":
            return render(request, "ops/partials/_capacity_live.html", context)
        return render(request, self.template_name, context, status=status)

    def get(self, request):
        return self.render_page(request)


class CapacityDecideView(StaffView):
    """Accept or reject from the review queue (staff decide every kind)."""

    http_method_names = ["post"]
    decision = "accept"

    def post(self, request, pk: int):
        adjustment = capacity_selectors.adjustment_get(actor=None, pk=pk, staff=True)
        error = None
        try:
            if self.decision == "accept":
                adjustment = capacity_services.adjustment_accept(adjustment=adjustment, user=request.user)
            else:
                adjustment = capacity_services.adjustment_reject(adjustment=adjustment, user=request.user,
                                                              reason=request.POST.get("reason", "").strip())
        except ApplicationError as refused:
            error = refused.message
            adjustment = capacity_selectors.adjustment_get(actor=None, pk=pk, staff=True)
        if request.htmx:
            row = capacity_presenters.adjustment_row(adjustment, user=request.user, actor=None)
            return render(request, "ops/partials/_review_row.html", {"row": row, "error": error})
        if error:
            messages.error(request, error)
        else:
            messages.success(request, _decided_message(adjustment))
        return redirect(f"{reverse('portal:ops-capacity')}#review")


class CapacityPolicySaveView(CapacityView):
    """Create (``/ops/capacity/policies``) or change (``…/<id>``) a scope's policy; a refused form comes back
    with the service's message under its field and the values as typed."""

    http_method_names = ["post"]

    def post(self, request, pk: int | None = None):
        policy = capacity_selectors.policy_get(pk=pk) if pk else None
        form = f"policy-{pk}" if pk else "policy-new"
        try:
            scope, values = forms.policy_input(request.POST)
            policy = capacity_services.policy_set(scope=policy.scope if policy else scope, values=values,
                                               by_user=request.user)
        except ApplicationError as error:
            return self.render_page(request, form=form, error=error, status=error.status)
        messages.success(request, f"Policy {policy.scope or '(default)'} saved.")
        return redirect(f"{reverse('portal:ops-capacity')}#policies")


class CapacityPolicyDeleteView(CapacityView):
    http_method_names = ["post"]

    def post(self, request, pk: int):
        policy = capacity_selectors.policy_get(pk=pk)
        try:
            capacity_services.policy_delete(policy=policy, by_user=request.user)
        except ApplicationError as error:
            return self.render_page(request, form=f"policy-{pk}", error=error, status=error.status)
        messages.success(request, f"Policy {policy.scope} deleted: the scope inherits the default again.")
        return redirect(f"{reverse('portal:ops-capacity')}#policies")


class CapacityRunView(StaffView):
    http_method_names = ["post"]

    def post(self, request):
        counts = capacity_services.plan_run()
        if counts.get("skipped"):
            messages.error(request, "Another planner run is in progress; nothing was done.")
        else:
            text = ", ".join(f"{counts.get(name, 0)} {name}" for name in ("proposed", "new", "expired", "applied",
                                                                          "failed"))
            note = "" if counts.get("prometheus") == "ok" else f" ({counts.get('prometheus')})"
            messages.success(request, f"Planner run: {text}.{note}")
        return redirect("portal:ops-capacity")
