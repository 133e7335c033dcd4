"""Tenant-facing REST API: the tenant, projects, quotas, members, tokens and SLO contracts.

Views parse input, fetch through the tenant-scoped selectors, call one service and render. Objects of
another tenant are not found (404); actions the role does not allow are refused (403).
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api import paginate, parse
from core.openapi import PAGE_PARAMETERS, paginated, problem
from tenants import selectors, services
from tenants.api import serializers as s
from tenants.extensions import quota_usage


class TenantApi(APIView):
    write_action = "own"

    @extend_schema(responses=s.TenantOutput, summary="The caller's tenant and role")
    def get(self, request):
        tenant = selectors.tenant_get(actor=request.actor)
        return Response(s.TenantOutput(tenant, context={"actor": request.actor}).data)

    @extend_schema(request=s.TenantUpdateInput, responses=s.TenantOutput, summary="Rename or change billing email")
    def patch(self, request):
        data = parse(s.TenantUpdateInput, request)
        tenant = services.tenant_update(actor=request.actor, **data)
        return Response(s.TenantOutput(tenant, context={"actor": request.actor}).data)


class ProjectListApi(APIView):
    write_action = "manage"

    @extend_schema(responses=paginated(s.ProjectOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_projects_list", summary="Projects (queues) of the tenant")
    def get(self, request):
        return paginate(self, request, selectors.project_list(actor=request.actor), s.ProjectOutput)

    @extend_schema(request=s.ProjectCreateInput, responses={201: s.ProjectOutput, 409: problem("The slug is taken")},
                   summary="Create a project")
    def post(self, request):
        data = parse(s.ProjectCreateInput, request)
        project = services.project_create(actor=request.actor, **data)
        return Response(s.ProjectOutput(project).data, status=status.HTTP_201_CREATED)


class ProjectDetailApi(APIView):
    write_action = "manage"

    @extend_schema(responses=s.ProjectOutput, summary="One project")
    def get(self, request, slug: str):
        return Response(s.ProjectOutput(selectors.project_get(actor=request.actor, slug=slug)).data)

    @extend_schema(request=s.ProjectUpdateInput, responses=s.ProjectOutput, summary="Update a project")
    def patch(self, request, slug: str):
        project = selectors.project_get(actor=request.actor, slug=slug)
        data = parse(s.ProjectUpdateInput, request)
        return Response(s.ProjectOutput(services.project_update(actor=request.actor, project=project, **data)).data)

    @extend_schema(responses={204: None, 409: problem("The project still has leases or usage")},
                   summary="Delete a project")
    def delete(self, request, slug: str):
        project = selectors.project_get(actor=request.actor, slug=slug)
        services.project_delete(actor=request.actor, project=project)
        return Response(status=status.HTTP_204_NO_CONTENT)


class QuotaListApi(APIView):
    @extend_schema(responses={200: s.QuotasOutput, 404: problem("No such project")},
                   parameters=[OpenApiParameter("project", str, description="only this project's quotas")],
                   summary="Tenant-level and per-project quotas (milli-GPU)")
    def get(self, request):
        project_slug = request.query_params.get("project")
        project = selectors.project_get(actor=request.actor, slug=project_slug) if project_slug else None
        context = {"usage": quota_usage(actor=request.actor)}  # the broker's (tenants.extensions)
        return Response({
            "tenant": s.TenantQuotaOutput(selectors.tenant_quota_list(actor=request.actor), many=True,
                                          context=context).data,
            "projects": s.QuotaOutput(selectors.quota_list(actor=request.actor, project=project), many=True,
                                      context=context).data,
        })


class MemberListApi(APIView):
    @extend_schema(responses=paginated(s.MembershipOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_members_list", summary="Members of the tenant and their roles")
    def get(self, request):
        return paginate(self, request, selectors.membership_list(actor=request.actor), s.MembershipOutput)


class TenantInvitationListApi(APIView):
    """The tenant's pending invitations (admins), and a new one."""

    def required_action(self, request) -> str:
        # a read is a read (the selector keeps it to admins and owners); inviting is managing
        return "view" if request.method in ("GET", "HEAD", "OPTIONS") else "manage"

    @extend_schema(responses=paginated(s.InvitationOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_tenant_invitations_list", summary="The tenant's pending invitations (admins)")
    def get(self, request):
        return paginate(self, request, selectors.invitation_list(actor=request.actor), s.InvitationOutput)

    @extend_schema(request=s.InvitationCreateInput,
                   responses={201: s.InvitationOutput, 409: problem("Already a member, or invited already")},
                   summary="Invite a user by username: they join when they accept (the answer is the same whether "
                           "or not such a user exists yet)")
    def post(self, request):
        data = parse(s.InvitationCreateInput, request)
        invitation = services.membership_invite(actor=request.actor, username=data["username"], role=data["role"])
        return Response(s.InvitationOutput(invitation).data, status=status.HTTP_201_CREATED)


class TenantInvitationDetailApi(APIView):
    """DELETE only: a write, so ``manage`` (the permission's default)."""

    @extend_schema(responses={204: None, 409: problem("No longer pending")},
                   summary="Revoke a pending invitation (admins; an owner's by owners)")
    def delete(self, request, pk: int):
        services.invitation_revoke(actor=request.actor,
                                   invitation=selectors.invitation_get(actor=request.actor, pk=pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationListApi(APIView):
    """The calling user's own pending invitations, any tenant's."""

    @extend_schema(responses=paginated(s.InvitationOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_invitations_list",
                   summary="Your pending invitations to tenants (accept or decline each)")
    def get(self, request):
        return paginate(self, request, selectors.invitations_for_user(user=request.user), s.InvitationOutput)


class InvitationDecideApi(APIView):
    write_action = "self"  # one's own membership (not by a read-only token)
    decision = "accept"

    @extend_schema(request=None, responses={200: s.InvitationOutput, 409: problem("No longer pending")},
                   summary="Accept (become a member with its role) or decline one of your invitations")
    def post(self, request, pk: int):
        invitation = selectors.invitation_for_user(user=request.user, pk=pk)
        invitation = services.invitation_decide(user=request.user, invitation=invitation,
                                                accept=self.decision == "accept")
        return Response(s.InvitationOutput(invitation).data)


class MemberDetailApi(APIView):
    def required_action(self, request) -> str:
        if request.method == "DELETE":
            return "leave"  # leaving the tenant yourself; removing others needs `revoke` (the service)
        return "view" if request.method in ("GET", "HEAD", "OPTIONS") else "manage"

    @extend_schema(responses=s.MembershipOutput, summary="One member")
    def get(self, request, pk: int):
        return Response(s.MembershipOutput(selectors.membership_get(actor=request.actor, pk=pk)).data)

    @extend_schema(request=s.MembershipUpdateInput,
                   responses={200: s.MembershipOutput, 409: problem("A tenant must keep at least one owner")},
                   summary="Change a member's role or the projects they are limited to")
    def patch(self, request, pk: int):
        membership = selectors.membership_get(actor=request.actor, pk=pk)
        data = parse(s.MembershipUpdateInput, request)
        if data.get("projects") is not None:  # checked before the role changes: nothing half-written
            services.membership_projects_check(actor=request.actor, role=data.get("role", membership.role),
                                               projects=data["projects"])
        if "role" in data:  # PATCH: what is absent stays as it is
            membership = services.membership_change_role(actor=request.actor, membership=membership, role=data["role"])
        if "projects" in data:
            membership = services.membership_set_projects(actor=request.actor, membership=membership,
                                                          projects=data["projects"])
        return Response(s.MembershipOutput(membership).data)

    @extend_schema(responses={204: None, 409: problem("A tenant must keep at least one owner")},
                   summary="Remove a member (their tokens are revoked)")
    def delete(self, request, pk: int):
        membership = selectors.membership_get(actor=request.actor, pk=pk)
        services.membership_remove(actor=request.actor, membership=membership)
        return Response(status=status.HTTP_204_NO_CONTENT)


class TokenListApi(APIView):
    write_action = "self"  # anyone may create their own tokens (not while suspended); scopes capped by role

    @extend_schema(responses=paginated(s.ApiTokenOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_tokens_list", summary="API tokens (own; admins see all)")
    def get(self, request):
        return paginate(self, request, selectors.api_token_list(actor=request.actor), s.ApiTokenOutput)

    @extend_schema(request=s.ApiTokenCreateInput, responses={201: s.ApiTokenCreatedOutput},
                   summary="Create a token; the secret is in the response, once")
    def post(self, request):
        data = parse(s.ApiTokenCreateInput, request)
        token, secret = services.api_token_create(actor=request.actor, **data)
        body = s.ApiTokenOutput(token).data
        body["token"] = secret
        return Response(body, status=status.HTTP_201_CREATED)


class TokenDetailApi(APIView):
    write_action = "leave"  # revoking one's own token; the service requires `revoke` for others'

    @extend_schema(responses=s.ApiTokenOutput, summary="One token (never its secret)")
    def get(self, request, pk: int):
        return Response(s.ApiTokenOutput(selectors.api_token_get(actor=request.actor, pk=pk)).data)

    @extend_schema(responses={200: s.ApiTokenOutput}, summary="Revoke a token (idempotent; 200 with the token)")
    def delete(self, request, pk: int):
        token = selectors.api_token_get(actor=request.actor, pk=pk)
        return Response(s.ApiTokenOutput(services.api_token_revoke(actor=request.actor, token=token)).data)


class SloContractListApi(APIView):
    @extend_schema(responses=paginated(s.SloContractOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_slo_contracts_list", summary="SLO contracts of the tenant")
    def get(self, request):
        return paginate(self, request, selectors.slo_contract_list(actor=request.actor), s.SloContractOutput)
