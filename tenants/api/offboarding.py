"""A tenant's exports and its closure (``tenants.offboarding``), for its owners:

- ``GET /api/v1/tenant/exports``, ``POST`` (202: built by a worker), ``GET .../{id}``, ``GET .../{id}/archive``
  (the zip, once ready);
- ``POST /api/v1/tenant/close`` with ``{"confirm": "<slug>"}``.

Another tenant's export is 404; members, viewers, read-only and project-limited tokens get 403.
"""

from __future__ import annotations

from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api import paginate, parse
from core.openapi import PAGE_PARAMETERS, paginated, problem
from tenants import offboarding
from tenants.api.serializers import StrictSerializer, TenantOutput
from tenants.models import TenantExport

OWNERS_ONLY = "The tenant's owners only (a write token, not limited to projects); others get 403."


class TenantExportOutput(serializers.ModelSerializer):
    requested_by = serializers.CharField(source="requested_by.username", allow_null=True, default=None)
    archive = serializers.SerializerMethodField(help_text="where to download the zip once ready; null before")

    class Meta:
        model = TenantExport
        fields = ["id", "state", "requested_by", "requested_at", "finished_at", "size_bytes", "sha256", "error",
                  "archive"]

    def get_archive(self, export: TenantExport) -> str | None:
        return f"/api/v1/tenant/exports/{export.pk}/archive" if export.state == TenantExport.State.READY else None


class TenantCloseInput(StrictSerializer):
    confirm = serializers.CharField(max_length=63, help_text="the tenant's slug, to confirm")


class TenantExportListApi(APIView):
    write_action = "leave"  # giving back: allowed while suspended; the service requires an owner

    @extend_schema(responses=paginated(TenantExportOutput), parameters=PAGE_PARAMETERS, description=OWNERS_ONLY,
                   operation_id="v1_tenant_exports_list", summary="The tenant's data exports")
    def get(self, request):
        return paginate(self, request, offboarding.tenant_export_list(actor=request.actor), TenantExportOutput)

    @extend_schema(request=None, responses={202: TenantExportOutput, 409: problem("The tenant is closed")},
                   description=f"{OWNERS_ONLY} A worker builds the zip (members, projects, leases, usage, invoices "
                               "with PDFs, audit events, manifest.json with each file's SHA-256).",
                   summary="Request an export of everything the tenant owns")
    def post(self, request):
        export = offboarding.tenant_export_request(actor=request.actor)
        return Response(TenantExportOutput(export).data, status=status.HTTP_202_ACCEPTED)


class TenantExportDetailApi(APIView):
    @extend_schema(responses=TenantExportOutput, description=OWNERS_ONLY, summary="One export and its state")
    def get(self, request, pk: int):
        return Response(TenantExportOutput(offboarding.tenant_export_get(actor=request.actor, pk=pk)).data)


class TenantExportArchiveApi(APIView):
    @extend_schema(responses={(200, "application/zip"): OpenApiTypes.BINARY, 409: problem("Not ready yet")},
                   description=OWNERS_ONLY, summary="Download an export's zip",
                   operation_id="v1_tenant_exports_archive")
    def get(self, request, pk: int):
        export, path = offboarding.tenant_export_archive(actor=request.actor, pk=pk)
        response = FileResponse(path.open("rb"), content_type="application/zip", as_attachment=True,
                                filename=path.name)
        response["X-Content-SHA256"] = export.sha256
        return response


class TenantCloseApi(APIView):
    write_action = "leave"  # leaving for good: allowed while suspended; the service requires an owner

    @extend_schema(request=TenantCloseInput,
                   responses={200: TenantOutput, 409: problem("Leases are not finished, or already closed")},
                   description=f"{OWNERS_ONLY} Refused while leases run. Issues the final invoice, removes the "
                               "members' personal data (pseudonyms), revokes every token and suspends the tenant "
                               "for good; invoices, usage and leases are kept.",
                   summary="Close the tenant")
    def post(self, request):
        data = parse(TenantCloseInput, request)
        tenant = offboarding.tenant_close(actor=request.actor, confirm=data["confirm"])
        return Response(TenantOutput(tenant, context={"actor": request.actor}).data)
