"""The staff API for tenants (issue 29): tenants, their status, quotas, projects and SLO contracts, for platform
teams that automate what the staff pages (``portal/ops.py``) and the Django admin do.

Every write goes through the same ``tenants.services`` function those pages call, so the rules, the error
messages (problem+json naming the field) and the audit row are the same; nothing here writes a row itself.
Staff act on the platform, not inside a tenant: objects are found through the ``platform_*`` selectors, and
the services that take an ``Actor`` get ``staff_actor`` (the staff user with an owner's powers in that
tenant, as the admin does). Everyone who is not staff gets 403 (``StaffApi``); a staff member's read-only
token may read but not write.
"""

from __future__ import annotations

import re

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from core.api import paginate, parse
from core.errors import NotFound
from core.openapi import PAGE_PARAMETERS, paginated, problem
from tenants import selectors, services
from tenants.access import Actor
from tenants.api.serializers import NAME_PATTERN, POOLS_HELP, SLUG_PATTERN, SloContractOutput, StrictSerializer
from tenants.api.staff import StaffApi
from tenants.choices import CURRENCIES, Role, SloMetric, TenantStatus
from tenants.models import Cohort, Project, Quota, Tenant, TenantQuota

STAFF_ONLY = "Platform staff only (is_staff); everyone else gets 403."


def staff_actor(request, tenant: Tenant) -> Actor:
    """The staff user acting inside ``tenant`` with an owner's powers, so the tenant services apply their own
    rules (a suspended tenant's details do not change) and audit in the staff user's name."""
    return Actor(user=request.user, tenant=tenant, role=Role.OWNER)


# -- serializers ---------------------------------------------------------------------------------------------
class _SlugField(serializers.RegexField):
    def __init__(self, **kwargs):
        super().__init__(SLUG_PATTERN, max_length=63,
                         help_text="lowercase letters, digits and hyphens; not starting or ending with one", **kwargs)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if not re.fullmatch(SLUG_PATTERN, value):  # RegexField searches: "$" also matches before a final "\n"
            raise serializers.ValidationError("Lowercase letters, digits and hyphens, not starting or ending with one.")
        return value


COHORT_HELP = "the cohort the tenant lends idle guarantee to and borrows from; null: none"


class PlatformTenantOutput(serializers.ModelSerializer):
    project_count = serializers.IntegerField(read_only=True, help_text="projects (queues) of the tenant")
    member_count = serializers.IntegerField(read_only=True, help_text="members of the tenant")
    cohort = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True, help_text=COHORT_HELP)

    class Meta:
        model = Tenant
        fields = ["slug", "name", "status", "billing_email", "currency", "created_at", "updated_at",
                  "project_count", "member_count", "cohort"]


class PlatformTenantCreateInput(StrictSerializer):
    slug = _SlugField()
    name = serializers.RegexField(NAME_PATTERN, max_length=200)
    billing_email = serializers.EmailField()
    currency = serializers.ChoiceField(choices=list(CURRENCIES), default="USD")


class PlatformTenantUpdateInput(StrictSerializer):
    name = serializers.RegexField(NAME_PATTERN, required=False, max_length=200)
    billing_email = serializers.EmailField(required=False)
    cohort = serializers.CharField(required=False, allow_null=True, max_length=63,
                                   help_text=COHORT_HELP + " (a cohort's name; null takes the tenant out)")


class CohortOutput(serializers.ModelSerializer):
    members = serializers.SlugRelatedField(slug_field="slug", many=True, read_only=True,
                                           help_text="the tenants in the cohort")

    class Meta:
        model = Cohort
        fields = ["name", "description", "created_at", "members"]


class CohortCreateInput(StrictSerializer):
    name = _SlugField()
    description = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)


class StatusInput(StrictSerializer):
    status = serializers.ChoiceField(choices=TenantStatus.choices)
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=200,
                                   help_text="why (kept in the audit log)")


LENDING_HELP = "in the tenant's cohort: how much of its idle guarantee the other members may borrow; null: no limit"
BORROWING_HELP = "in the tenant's cohort: how far its use may go beyond its deserved; null: no limit"


class PlatformTenantQuotaOutput(serializers.ModelSerializer):
    class Meta:
        model = TenantQuota
        fields = ["tier", "deserved_gpu_milli", "limit_gpu_milli", "lending_limit_gpu_milli",
                  "borrowing_limit_gpu_milli"]
        extra_kwargs = {"lending_limit_gpu_milli": {"help_text": LENDING_HELP},
                        "borrowing_limit_gpu_milli": {"help_text": BORROWING_HELP}}


class TenantQuotaInput(StrictSerializer):
    deserved_gpu_milli = serializers.IntegerField(min_value=0, max_value=2**31 - 1)
    limit_gpu_milli = serializers.IntegerField(min_value=0, max_value=2**31 - 1)


class PlatformTenantQuotaInput(TenantQuotaInput):
    lending_limit_gpu_milli = serializers.IntegerField(min_value=0, max_value=2**31 - 1, required=False,
                                                       allow_null=True, help_text=LENDING_HELP + "; left out: kept")
    borrowing_limit_gpu_milli = serializers.IntegerField(min_value=0, max_value=2**31 - 1, required=False,
                                                         allow_null=True, help_text=BORROWING_HELP + "; left out: kept")


class ProjectQuotaInput(TenantQuotaInput):
    over_quota_weight = serializers.IntegerField(min_value=0, max_value=1000, default=1)


class PlatformQuotaOutput(serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = Quota
        fields = ["project", "tier", "deserved_gpu_milli", "limit_gpu_milli", "over_quota_weight"]


class PlatformQuotasOutput(serializers.Serializer):
    tenant = PlatformTenantQuotaOutput(many=True, help_text="the tenant's bound per tier")
    projects = PlatformQuotaOutput(many=True, help_text="each project's quota per tier, within the tenant's bound")


class PlatformProjectOutput(serializers.ModelSerializer):
    quotas = PlatformQuotaOutput(many=True, read_only=True)
    pools = serializers.ListField(child=serializers.CharField(), read_only=True, help_text=POOLS_HELP)

    class Meta:
        model = Project
        fields = ["slug", "name", "description", "status", "pools", "created_at", "quotas"]


class PlatformProjectCreateInput(StrictSerializer):
    slug = _SlugField()
    name = serializers.RegexField(NAME_PATTERN, max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, default="")


class PlatformProjectUpdateInput(StrictSerializer):
    name = serializers.RegexField(NAME_PATTERN, required=False, max_length=200)
    description = serializers.CharField(required=False, allow_blank=True)
    pools = serializers.ListField(child=serializers.CharField(max_length=63), required=False, max_length=50,
                                  help_text=POOLS_HELP)


class CreditStepInput(StrictSerializer):
    metric = serializers.ChoiceField(choices=SloMetric.choices)
    threshold = serializers.DecimalField(max_digits=12, decimal_places=4,
                                         help_text="seconds for time_to_gpu_p95, a percentage otherwise")
    credit_pct = serializers.DecimalField(max_digits=5, decimal_places=2)


class SloContractInput(StrictSerializer):
    name = serializers.RegexField(NAME_PATTERN, max_length=100)
    effective_from = serializers.DateTimeField(help_text="ISO 8601 with a time zone")
    effective_to = serializers.DateTimeField(required=False, allow_null=True, default=None,
                                             help_text="ISO 8601 with a time zone; null: open-ended")
    time_to_gpu_p95_seconds = serializers.IntegerField(min_value=1, max_value=2**31 - 1)
    availability_target_pct = serializers.DecimalField(max_digits=6, decimal_places=3)
    preemption_notice_seconds = serializers.IntegerField(min_value=0, max_value=2**31 - 1)
    max_credit_pct = serializers.DecimalField(max_digits=5, decimal_places=2, default="100")
    min_runtime_seconds = serializers.IntegerField(
        min_value=0, max_value=2**31 - 1, required=False, allow_null=True, default=None,
        help_text="over-quota leases of the tenant are not reclaimed before this runtime while the contract is in "
                  "force; null: the platform's minimum runtime")
    credit_steps = CreditStepInput(many=True, required=False, default=list)


# -- views ---------------------------------------------------------------------------------------------------
def _project(tenant: Tenant, slug: str) -> Project:
    project = selectors.platform_project_list(tenant=tenant).filter(slug=slug).first()
    if project is None:
        raise NotFound(f"No project '{slug}' in tenant '{tenant.slug}'.", field="project")
    return project


def _project_out(tenant: Tenant, slug: str) -> dict:
    return PlatformProjectOutput(_project(tenant, slug)).data


def _tenant_out(slug: str) -> dict:
    return PlatformTenantOutput(selectors.platform_tenant_list().get(slug=slug)).data


class PlatformTenantListApi(StaffApi):
    @extend_schema(responses=paginated(PlatformTenantOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_staff_tenants_list", description=STAFF_ONLY,
                   summary="Every tenant with its status and numbers of projects and members")
    def get(self, request):
        return paginate(self, request, selectors.platform_tenant_list(), PlatformTenantOutput)

    @extend_schema(request=PlatformTenantCreateInput,
                   responses={201: PlatformTenantOutput, 409: problem("The slug is taken")},
                   operation_id="v1_staff_tenants_create", description=STAFF_ONLY, summary="Create a tenant (active)")
    def post(self, request):
        data = parse(PlatformTenantCreateInput, request)
        tenant = services.tenant_create(by_user=request.user, **data)
        return Response(_tenant_out(tenant.slug), status=status.HTTP_201_CREATED)


class PlatformTenantDetailApi(StaffApi):
    @extend_schema(responses=PlatformTenantOutput, operation_id="v1_staff_tenants_retrieve",
                   description=STAFF_ONLY, summary="One tenant")
    def get(self, request, slug: str):
        return Response(_tenant_out(selectors.platform_tenant_get(slug=slug).slug))

    @extend_schema(request=PlatformTenantUpdateInput,
                   responses={200: PlatformTenantOutput, 403: problem("The tenant is suspended")},
                   operation_id="v1_staff_tenants_partial_update", description=STAFF_ONLY,
                   summary="Rename a tenant or change its billing e-mail (fields left out keep their value)")
    def patch(self, request, slug: str):
        tenant = selectors.platform_tenant_get(slug=slug)
        data = parse(PlatformTenantUpdateInput, request)
        if "cohort" in data:
            name = data.pop("cohort")
            cohort = None if name is None else selectors.platform_cohort_get(name=name)
            if data:
                services.tenant_update(actor=staff_actor(request, tenant), **data)
            services.tenant_cohort_set(tenant=tenant, cohort=cohort, by_user=request.user)
        else:
            services.tenant_update(actor=staff_actor(request, tenant), **data)
        return Response(_tenant_out(slug))


class PlatformCohortListApi(StaffApi):
    @extend_schema(responses=paginated(CohortOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_staff_cohorts_list", description=STAFF_ONLY,
                   summary="Cohorts: tenants that lend each other their idle guaranteed capacity")
    def get(self, request):
        return paginate(self, request, selectors.platform_cohort_list(), CohortOutput)

    @extend_schema(request=CohortCreateInput, responses={201: CohortOutput, 409: problem("The name is taken")},
                   operation_id="v1_staff_cohorts_create", description=STAFF_ONLY,
                   summary="Create a cohort (put tenants in it with PATCH /api/v1/tenants/{slug})")
    def post(self, request):
        data = parse(CohortCreateInput, request)
        cohort = services.cohort_create(by_user=request.user, **data)
        return Response(CohortOutput(selectors.platform_cohort_get(name=cohort.name)).data,
                        status=status.HTTP_201_CREATED)


class PlatformTenantStatusApi(StaffApi):
    @extend_schema(request=StatusInput, responses=PlatformTenantOutput,
                   operation_id="v1_staff_tenants_status_update",
                   description=f"{STAFF_ONLY} Suspending holds the tenant's queued leases and releases its running "
                               f"ones (docs/tenancy.md, \"Suspension\"); reactivating gives the held ones back to "
                               f"the scheduler. Setting the status the tenant has changes nothing.",
                   summary="Suspend or reactivate a tenant")
    def put(self, request, slug: str):
        tenant = selectors.platform_tenant_get(slug=slug)
        data = parse(StatusInput, request)
        services.tenant_set_status(tenant=tenant, by_user=request.user, **data)
        return Response(_tenant_out(slug))


class PlatformQuotaListApi(StaffApi):
    @extend_schema(responses=PlatformQuotasOutput, operation_id="v1_staff_tenants_quotas_retrieve",
                   description=STAFF_ONLY, summary="A tenant's quota per tier and its projects' quotas (milli-GPU)")
    def get(self, request, slug: str):
        tenant = selectors.platform_tenant_get(slug=slug)
        return Response(PlatformQuotasOutput({
            "tenant": selectors.platform_tenant_quota_list(tenant=tenant),
            "projects": selectors.platform_quota_list(tenant=tenant),
        }).data)


class PlatformTenantQuotaApi(StaffApi):
    @extend_schema(request=PlatformTenantQuotaInput,
                   responses={200: PlatformTenantQuotaOutput,
                              409: problem("The tenant's projects already hold more than the new bound")},
                   operation_id="v1_staff_tenants_quotas_update", description=STAFF_ONLY,
                   summary="Set a tenant's quota for one tier (its bound for every project)")
    def put(self, request, slug: str, tier: str):
        tenant = selectors.platform_tenant_get(slug=slug)
        data = parse(PlatformTenantQuotaInput, request)
        quota = services.tenant_quota_set(tenant=tenant, tier=tier, by_user=request.user, **data)
        return Response(PlatformTenantQuotaOutput(quota).data)


class PlatformProjectListApi(StaffApi):
    @extend_schema(responses=paginated(PlatformProjectOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_staff_projects_list", description=STAFF_ONLY,
                   summary="A tenant's projects with their status and quotas")
    def get(self, request, slug: str):
        tenant = selectors.platform_tenant_get(slug=slug)
        return paginate(self, request, selectors.platform_project_list(tenant=tenant), PlatformProjectOutput)

    @extend_schema(request=PlatformProjectCreateInput,
                   responses={201: PlatformProjectOutput, 403: problem("The tenant is suspended"),
                              409: problem("The slug is taken")},
                   operation_id="v1_staff_projects_create", description=STAFF_ONLY,
                   summary="Create a project in a tenant")
    def post(self, request, slug: str):
        tenant = selectors.platform_tenant_get(slug=slug)
        data = parse(PlatformProjectCreateInput, request)
        project = services.project_create(actor=staff_actor(request, tenant), **data)
        return Response(_project_out(tenant, project.slug), status=status.HTTP_201_CREATED)


class PlatformProjectDetailApi(StaffApi):
    @extend_schema(responses=PlatformProjectOutput, operation_id="v1_staff_projects_retrieve",
                   description=STAFF_ONLY, summary="One project of a tenant")
    def get(self, request, slug: str, project: str):
        return Response(_project_out(selectors.platform_tenant_get(slug=slug), project))

    @extend_schema(request=PlatformProjectUpdateInput,
                   responses={200: PlatformProjectOutput, 403: problem("The tenant is suspended")},
                   operation_id="v1_staff_projects_partial_update", description=STAFF_ONLY,
                   summary="Rename a project or change its description")
    def patch(self, request, slug: str, project: str):
        tenant = selectors.platform_tenant_get(slug=slug)
        target = _project(tenant, project)
        data = parse(PlatformProjectUpdateInput, request)
        services.project_update(actor=staff_actor(request, tenant), project=target, **data)
        return Response(_project_out(tenant, project))


class PlatformProjectStatusApi(StaffApi):
    @extend_schema(request=StatusInput, responses=PlatformProjectOutput,
                   operation_id="v1_staff_projects_status_update",
                   description=f"{STAFF_ONLY} A suspended project takes no new lease requests (403 naming "
                               f"`project`); its leases keep running and may be released.",
                   summary="Suspend or reactivate one project")
    def put(self, request, slug: str, project: str):
        tenant = selectors.platform_tenant_get(slug=slug)
        target = _project(tenant, project)
        data = parse(StatusInput, request)
        services.project_set_status(project=target, by_user=request.user, **data)
        return Response(_project_out(tenant, project))


class PlatformProjectQuotaApi(StaffApi):
    @extend_schema(request=ProjectQuotaInput,
                   responses={200: PlatformQuotaOutput, 409: problem("Over the tenant's quota for that tier")},
                   operation_id="v1_staff_projects_quotas_update", description=STAFF_ONLY,
                   summary="Set a project's quota for one tier, within its tenant's bound")
    def put(self, request, slug: str, project: str, tier: str):
        tenant = selectors.platform_tenant_get(slug=slug)
        target = _project(tenant, project)
        data = parse(ProjectQuotaInput, request)
        quota = services.quota_set(project=target, tier=tier, by_user=request.user, **data)
        return Response(PlatformQuotaOutput(quota).data)


def _contract_values(data: dict) -> dict:
    values = dict(data)
    values["credit_steps"] = [dict(step) for step in values.get("credit_steps", [])]
    return values


class PlatformSloContractListApi(StaffApi):
    @extend_schema(responses=paginated(SloContractOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_staff_slo_contracts_list", description=STAFF_ONLY,
                   summary="A tenant's SLO contracts (the latest first) with their credit steps")
    def get(self, request, slug: str):
        tenant = selectors.platform_tenant_get(slug=slug)
        return paginate(self, request, selectors.platform_slo_contract_list(tenant=tenant), SloContractOutput)

    @extend_schema(request=SloContractInput,
                   responses={201: SloContractOutput, 409: problem("The period overlaps another contract")},
                   operation_id="v1_staff_slo_contracts_create", description=STAFF_ONLY,
                   summary="Create an SLO contract with its credit steps")
    def post(self, request, slug: str):
        tenant = selectors.platform_tenant_get(slug=slug)
        values = _contract_values(parse(SloContractInput, request))
        contract = services.slo_contract_save(tenant=tenant, by_user=request.user, **values)
        contract = selectors.platform_slo_contract_get(tenant=tenant, pk=contract.pk)
        return Response(SloContractOutput(contract).data, status=status.HTTP_201_CREATED)


class PlatformSloContractDetailApi(StaffApi):
    @extend_schema(responses=SloContractOutput, operation_id="v1_staff_slo_contracts_retrieve",
                   description=STAFF_ONLY, summary="One SLO contract")
    def get(self, request, slug: str, pk: int):
        tenant = selectors.platform_tenant_get(slug=slug)
        return Response(SloContractOutput(selectors.platform_slo_contract_get(tenant=tenant, pk=pk)).data)

    @extend_schema(request=SloContractInput,
                   responses={200: SloContractOutput, 409: problem("The period overlaps another contract")},
                   operation_id="v1_staff_slo_contracts_update", description=STAFF_ONLY,
                   summary="Replace every value of an SLO contract, its credit steps included")
    def put(self, request, slug: str, pk: int):
        tenant = selectors.platform_tenant_get(slug=slug)
        contract = selectors.platform_slo_contract_get(tenant=tenant, pk=pk)
        values = _contract_values(parse(SloContractInput, request))
        services.slo_contract_save(tenant=tenant, contract=contract, by_user=request.user, **values)
        return Response(SloContractOutput(selectors.platform_slo_contract_get(tenant=tenant, pk=pk)).data)
