"""The capacity loop's REST API.

Tenants: ``/adjustments`` — their own advice and every change that touched one of their leases (another
tenant's is 404); admins accept or reject their own idle-reclaim and right-sizing advice, and opt a project in to
idle reclaim of its interactive leases (``/projects/<slug>/idle-reclaim``). Platform staff:
every adjustment, and ``/capacity/…`` — the loop's policies, the fleet's pools and warm instances, and a
planner run on demand. Views parse, read through ``capacity.selectors``, call one ``capacity.services`` function
and render; the services enforce who may decide what.
"""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from capacity import presenters, selectors, services
from capacity.api import serializers as s
from capacity.choices import AdjustmentKind, AdjustmentState
from core.api import paginate, parse
from core.errors import ValidationFailed
from core.openapi import PAGE_PARAMETERS, paginated, problem
from tenants.api.staff import StaffApi, StaffOrTenantPermission, is_staff
from tenants.selectors import project_get

RECENT = 20
CONFLICT = problem("The adjustment is no longer proposed (decided, expired or being applied)")
NOT_YOURS = problem("Only platform staff decide this kind (or the token is read-only, or the role is below "
                    "what the kind needs)")
STAFF_ONLY = "Platform staff only (is_staff); everyone else gets 403."


def _choice(request, name: str, values: list[str]) -> str:
    raw = request.query_params.get(name)
    if raw is None:
        return ""
    if raw not in values:
        raise ValidationFailed(f"{name} must be one of {', '.join(values)} (or be left out).", field=name)
    return raw


def _flag(request, name: str) -> bool:
    raw = request.query_params.get(name)
    if raw is None:
        return False
    if raw not in ("true", "false"):
        raise ValidationFailed(f"{name} must be true or false (or be left out).", field=name)
    return raw == "true"


def _adjustment(request, pk: int):
    return selectors.adjustment_get(actor=request.actor, pk=pk, staff=is_staff(request))


def _seen(request) -> dict:
    """The serializer context that shows an adjustment as the reader may read it (``presenters.seen_by``)."""
    return {"viewer_tenant": None if is_staff(request) else request.actor.tenant.pk}


# -- adjustments (tenants and staff) ----------------------------------------------------------------------
class AdjustmentListApi(APIView):
    permission_classes = [StaffOrTenantPermission]

    @extend_schema(
        parameters=[OpenApiParameter("kind", {"type": "string", "enum": list(AdjustmentKind.values)}),
                    OpenApiParameter("state", {"type": "string", "enum": list(AdjustmentState.values)}),
                    OpenApiParameter("open", bool, description="true: only proposed and applying ones"),
                    *PAGE_PARAMETERS],
        responses=paginated(s.AdjustmentOutput), operation_id="v1_adjustments_list",
        summary="The capacity loop's adjustments and advice: the tenant's own and those touching its leases "
                "(staff: all), newest first")
    def get(self, request):
        rows = selectors.adjustment_list(actor=request.actor, staff=is_staff(request),
                                         kind=_choice(request, "kind", list(AdjustmentKind.values)),
                                         state=_choice(request, "state", list(AdjustmentState.values)),
                                         open_only=_flag(request, "open"))
        return paginate(self, request, rows, s.AdjustmentOutput, context=_seen(request))


class AdjustmentDetailApi(APIView):
    permission_classes = [StaffOrTenantPermission]

    @extend_schema(responses=s.AdjustmentOutput, summary="One adjustment with its evidence and outcome")
    def get(self, request, pk: int):
        return Response(s.AdjustmentOutput(_adjustment(request, pk), context=_seen(request)).data)


class AdjustmentAcceptApi(APIView):
    permission_classes = [StaffOrTenantPermission]
    write_action = "release"  # the weakest a kind needs (idle reclaim); the service asks more for the others

    @extend_schema(request=None, responses={200: s.AdjustmentOutput, 403: NOT_YOURS, 409: CONFLICT},
                   summary="Accept: advice is recorded as accepted, a change is applied now (the answer shows "
                           "its outcome)")
    def post(self, request, pk: int):
        adjustment = _adjustment(request, pk)
        adjustment = services.adjustment_accept(adjustment=adjustment, user=request.user, actor=request.actor)
        return Response(s.AdjustmentOutput(adjustment, context=_seen(request)).data)


class AdjustmentRejectApi(APIView):
    permission_classes = [StaffOrTenantPermission]
    write_action = "release"

    @extend_schema(request=s.AdjustmentRejectInput, responses={200: s.AdjustmentOutput, 403: NOT_YOURS,
                                                                409: CONFLICT},
                   summary="Reject a proposed adjustment, with an optional reason")
    def post(self, request, pk: int):
        data = parse(s.AdjustmentRejectInput, request)
        adjustment = _adjustment(request, pk)
        adjustment = services.adjustment_reject(adjustment=adjustment, user=request.user, actor=request.actor,
                                                reason=data["reason"])
        return Response(s.AdjustmentOutput(adjustment, context=_seen(request)).data)


# -- platform staff: policies, the fleet, a planner run ---------------------------------------------------
class PolicyListApi(StaffApi):
    @extend_schema(responses=paginated(s.PolicyOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_capacity_policies_list", summary="The capacity loop's policies, by scope",
                   description=STAFF_ONLY)
    def get(self, request):
        return paginate(self, request, selectors.policy_list(), s.PolicyOutput)

    @extend_schema(request=s.PolicyCreateInput, responses={201: s.PolicyOutput, 200: s.PolicyOutput},
                   summary="Set the policy of a scope (201 when the scope had none, 200 when it changed)",
                   description=f"{STAFF_ONLY} Fields left out keep their value; null is inherit.")
    def post(self, request):
        data = parse(s.PolicyCreateInput, request)
        existed = selectors.policy_list().filter(scope=data["scope"]).exists()
        policy = services.policy_set(scope=data["scope"], values=s.policy_values(data), by_user=request.user)
        return Response(s.PolicyOutput(policy).data, status=status.HTTP_200_OK if existed else status.HTTP_201_CREATED)


class PolicyDetailApi(StaffApi):
    @extend_schema(responses=s.PolicyOutput, summary="One capacity policy", description=STAFF_ONLY)
    def get(self, request, pk: int):
        return Response(s.PolicyOutput(selectors.policy_get(pk=pk)).data)

    @extend_schema(request=s.PolicyUpdateInput, responses=s.PolicyOutput,
                   summary="Change a policy's modes, idle rules or numbers (null: inherit)",
                   description=STAFF_ONLY)
    def patch(self, request, pk: int):
        data = parse(s.PolicyUpdateInput, request)
        policy = selectors.policy_get(pk=pk)
        policy = services.policy_set(scope=policy.scope, values=s.policy_values(data), by_user=request.user)
        return Response(s.PolicyOutput(policy).data)

    @extend_schema(responses={204: None}, summary="Delete a scope's policy (not the default's: 400 naming scope)",
                   description=STAFF_ONLY)
    def delete(self, request, pk: int):
        services.policy_delete(policy=selectors.policy_get(pk=pk), by_user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class FleetApi(StaffApi):
    @extend_schema(responses=s.FleetOutput, summary="Pools (GPUs by mode, changing), warm instances, the warm "
                   "pools' holding cost this month and the loop's last 20 adjustments", description=STAFF_ONLY)
    def get(self, request):
        now = timezone.now()
        body = {"pools": selectors.fleet_pools(), "warm_instances": list(selectors.warm_instances()),
                "warm_holding": presenters.warm_holding_cost(start=presenters.month_start(now), end=now),
                "recent": list(selectors.adjustment_list(actor=None, staff=True)[:RECENT])}
        return Response(s.FleetOutput(body).data)


class PlanRunApi(StaffApi):
    @extend_schema(request=None, responses=s.PlanRunOutput,
                   summary="Run the planner now (synchronously): proposals recorded, auto ones applied",
                   description=STAFF_ONLY)
    def post(self, request):
        return Response(s.PlanRunOutput(services.plan_run()).data)


# -- tenants: a project's idle reclaim opt-in -------------------------------------------------------------------
class ProjectIdleReclaimApi(APIView):
    """Read by anyone in the tenant; set and cleared by its admins and owners (``manage``: a member gets 403).
    Another tenant's project is 404."""

    write_action = "manage"

    @extend_schema(responses=s.IdleOptInOutput,
                   summary="A project's opt-in to idle reclaim of its interactive leases: the rule, the notice, "
                           "the modes with and without it, and the saving estimated from the last 7 days")
    def get(self, request, slug: str):
        project = project_get(actor=request.actor, slug=slug)
        return Response(s.IdleOptInOutput(selectors.idle_opt_in_get(project=project)).data)

    @extend_schema(request=s.IdleOptInInput, responses=s.IdleOptInOutput,
                   summary="Opt in (true) or out (false): opted in, idle interactive leases are reclaimed "
                           "automatically unless a staff policy of the project's scope sets idle reclaim; "
                           "suspend_opt_out true: the project's idle training is never suspended")
    def put(self, request, slug: str):
        project = project_get(actor=request.actor, slug=slug)  # another tenant's: 404 whatever the body
        data = parse(s.IdleOptInInput, request)
        if "opt_in" in data:
            project = services.idle_opt_in_set(actor=request.actor, project=project, opt_in=data["opt_in"])
        if "suspend_opt_out" in data:
            project = services.suspend_opt_out_set(actor=request.actor, project=project,
                                                   opt_out=data["suspend_opt_out"])
        return Response(s.IdleOptInOutput(selectors.idle_opt_in_get(project=project)).data)
