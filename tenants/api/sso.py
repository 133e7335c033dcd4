"""The sign-in settings over the API (``tenants.sso``, ``tenants.otp``): a tenant's owners read and change
their tenant's (``/api/v1/tenant/sign-in``), platform staff any tenant's (``/api/v1/tenants/{slug}/sign-in``).
The client secret is write-only: answers say only whether one is set."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api import parse
from core.openapi import problem
from tenants import selectors
from tenants.api.platform import STAFF_ONLY, staff_actor
from tenants.api.serializers import StrictSerializer
from tenants.api.staff import StaffApi
from tenants.choices import Role
from tenants.sso import group_projects_slugs, sign_in_get, sign_in_update

JIT_ROLES = [Role.ADMIN.value, Role.MEMBER.value, Role.VIEWER.value]  # a first sign-in never makes an owner


class SignInOutput(serializers.Serializer):
    sso_enabled = serializers.BooleanField()
    provider_name = serializers.CharField()
    issuer = serializers.CharField()
    client_id = serializers.CharField()
    client_secret_set = serializers.SerializerMethodField()
    allowed_email_domains = serializers.ListField(child=serializers.CharField())
    default_role = serializers.ChoiceField(choices=JIT_ROLES)
    group_roles = serializers.DictField(child=serializers.ChoiceField(choices=Role.choices))
    group_projects = serializers.SerializerMethodField(
        help_text="Group claim → the projects (slugs) its members and viewers reach; empty: no project limits "
                  "from single sign-on.")
    local_passwords_disabled = serializers.BooleanField()
    totp_required = serializers.BooleanField()
    callback_url = serializers.SerializerMethodField(help_text="The redirect URI to register at the provider.")

    def get_client_secret_set(self, sign_in) -> bool:
        return bool(sign_in.client_secret_sealed)

    @extend_schema_field(serializers.DictField(child=serializers.ListField(child=serializers.CharField())))
    def get_group_projects(self, sign_in) -> dict:
        return group_projects_slugs(sign_in)

    def get_callback_url(self, sign_in) -> str:
        return self.context["request"].build_absolute_uri("/accounts/sso/callback")


class SignInUpdateInput(StrictSerializer):
    """Only the fields sent change."""

    sso_enabled = serializers.BooleanField(required=False)
    provider_name = serializers.CharField(required=False, allow_blank=True, max_length=100)
    issuer = serializers.CharField(required=False, allow_blank=True, max_length=300,
                                   help_text="https:// (http:// only on the loopback); discovery is read from "
                                             "<issuer>/.well-known/openid-configuration")
    client_id = serializers.CharField(required=False, allow_blank=True, max_length=200)
    client_secret = serializers.CharField(required=False, write_only=True, max_length=500, trim_whitespace=False)
    allowed_email_domains = serializers.ListField(child=serializers.CharField(max_length=253), required=False,
                                                  max_length=50)
    default_role = serializers.ChoiceField(choices=JIT_ROLES, required=False)
    group_roles = serializers.DictField(child=serializers.ChoiceField(choices=Role.choices), required=False)
    group_projects = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField(max_length=63), max_length=1000), required=False,
        help_text='{"group": ["project-slug", ...]}: members and viewers reach the projects of their mapped groups '
                  '(none when no group of theirs is mapped), set at each sign-in; {} turns the mapping off.')
    local_passwords_disabled = serializers.BooleanField(required=False)
    totp_required = serializers.BooleanField(required=False)


def _out(request, sign_in) -> dict:
    return SignInOutput(sign_in, context={"request": request}).data


class TenantSignInApi(APIView):
    write_action = "own"

    @extend_schema(responses=SignInOutput, summary="The tenant's sign-in settings: single sign-on, passwords, "
                                                   "second factor")
    def get(self, request):
        return Response(_out(request, sign_in_get(tenant=selectors.tenant_get(actor=request.actor))))

    @extend_schema(request=SignInUpdateInput,
                   responses={200: SignInOutput, 409: problem("A domain belongs to another tenant's SSO")},
                   summary="Change the tenant's sign-in settings (owners; fields left out keep their value)")
    def patch(self, request):
        data = parse(SignInUpdateInput, request)
        tenant = selectors.tenant_get(actor=request.actor)
        return Response(_out(request, sign_in_update(tenant=tenant, by=request.actor, changes=dict(data))))


class PlatformTenantSignInApi(StaffApi):
    @extend_schema(responses=SignInOutput, operation_id="v1_staff_tenants_sign_in_retrieve", description=STAFF_ONLY,
                   summary="A tenant's sign-in settings")
    def get(self, request, slug: str):
        return Response(_out(request, sign_in_get(tenant=selectors.platform_tenant_get(slug=slug))))

    @extend_schema(request=SignInUpdateInput,
                   responses={200: SignInOutput, 409: problem("A domain belongs to another tenant's SSO")},
                   operation_id="v1_staff_tenants_sign_in_partial_update", description=STAFF_ONLY,
                   summary="Change a tenant's sign-in settings (fields left out keep their value)")
    def patch(self, request, slug: str):
        tenant = selectors.platform_tenant_get(slug=slug)
        data = parse(SignInUpdateInput, request)
        return Response(_out(request, sign_in_update(tenant=tenant, by=staff_actor(request, tenant),
                                                     changes=dict(data))))
