"""Cost allocation, spend alerts and standard exports (issue 33), under ``/api/v1/``:

- ``label-keys``: the label keys the tenant's leases may carry (everyone reads; admins set them);
- ``usage/breakdown`` (+ ``.csv``) and ``invoices/{id}/breakdown`` (+ ``.csv``): charges by label, user or project;
- ``invoices/{id}/focus.csv`` | ``.parquet``: the invoice as FOCUS 1.2 rows; ``billing/focus.csv`` | ``.parquet``:
  every tenant's invoices of a month (platform staff);
- ``spend-alert-rules`` (admins write) and ``spend-alerts`` (the alerts raised).

Views parse, read through the selectors, call one service and render; errors are problem+json naming the field.
"""

from __future__ import annotations

from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import selectors
from billing.choices import AlertBasis, InvoiceStatus
from billing.models import Invoice, SpendAlert, SpendAlertRule
from billing.selectors import allocation
from billing.selectors.alerts import spend_alert_list, spend_alert_rule_get, spend_alert_rule_list
from billing.services import MAX_MINOR, alerts, focus, period_parse
from core.api import paginate, parse
from core.errors import NotFound
from core.openapi import PAGE_PARAMETERS, paginated, problem
from tenants import services as tenant_services
from tenants.api.serializers import StrictSerializer
from tenants.api.staff import StaffApi
from tenants.selectors import project_get

MONTH_SCHEMA = {"type": "string", "pattern": r"^[1-9][0-9]{3}-(0[1-9]|1[0-2])$"}
BY = OpenApiParameter("by", {"type": "string", "pattern": r"^(project|user|label:[a-z][a-z0-9_.-]{0,62})$"},
                      description="project | user | label:<key> (e.g. label:team); default project")
PERIOD = OpenApiParameter("period", MONTH_SCHEMA, description="a month, YYYY-MM (default: this month)")


# -- label keys --------------------------------------------------------------------------------------------------
class LabelKeysOutput(serializers.Serializer):
    keys = serializers.ListField(child=serializers.CharField(), help_text="the keys leases may carry now")
    own = serializers.BooleanField(help_text="false: the platform's default keys (the tenant has set none)")


class LabelKeysInput(StrictSerializer):
    keys = serializers.ListField(child=serializers.RegexField(r"^[a-z][a-z0-9_.-]{0,62}$", max_length=63),
                                 max_length=20,
                                 help_text="label keys (lower-case letters, digits, _ . -); [] = the platform's "
                                           "default")


def _keys(tenant) -> dict:
    return {"keys": tenant.allowed_label_keys, "own": bool(tenant.label_keys)}


class LabelKeysApi(APIView):
    write_action = "manage"

    @extend_schema(responses=LabelKeysOutput, summary="The label keys the tenant's leases may carry")
    def get(self, request):
        return Response(LabelKeysOutput(_keys(request.actor.tenant)).data)

    @extend_schema(request=LabelKeysInput, responses=LabelKeysOutput,
                   summary="Set the label keys the tenant's leases may carry (admins)")
    def put(self, request):
        data = parse(LabelKeysInput, request)
        tenant = tenant_services.tenant_label_keys_set(actor=request.actor, keys=data["keys"])
        return Response(LabelKeysOutput(_keys(tenant)).data)


# -- breakdowns --------------------------------------------------------------------------------------------------
class BreakdownGroupOutput(serializers.Serializer):
    key = serializers.CharField(help_text="the label's value ('' = unlabelled), the user's or project's id")
    name = serializers.CharField()
    gpu_hours = serializers.DecimalField(max_digits=18, decimal_places=6)
    amount_minor = serializers.IntegerField()


class BreakdownOutput(serializers.Serializer):
    period = serializers.CharField()
    by = serializers.CharField()
    currency = serializers.CharField()
    groups = BreakdownGroupOutput(many=True)
    total_minor = serializers.IntegerField(help_text="the sum of the groups: the month's usage lines")
    invoice = serializers.CharField(required=False)
    invoice_usage_minor = serializers.IntegerField(required=False)
    invoice_total_minor = serializers.IntegerField(required=False)
    other_minor = serializers.IntegerField(required=False, help_text="energy, discount, commitment, credits, "
                                                                     "corrections: not allocated")


def _format(fmt: str, known: tuple[str, ...]) -> str:
    """The document format of the path (``.csv``, ``.parquet``); another one is 404 naming ``fmt``."""
    if fmt not in known:
        raise NotFound(f"No .{fmt} document here; the formats are {', '.join(known)}.", field="fmt")
    return fmt


def _period(request):
    raw = request.query_params.get("period")
    return period_parse(raw) if raw is not None else timezone.now().date().replace(day=1)


def csv_response(text: str, name: str) -> HttpResponse:
    response = HttpResponse(text, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}.csv"'
    return response


class UsageBreakdownApi(APIView):
    @extend_schema(parameters=[PERIOD, BY], responses={200: BreakdownOutput, (200, "text/csv"): OpenApiTypes.STR},
                   operation_id="v1_usage_breakdown",
                   summary="A month's usage charges by label, requesting user or project (showback)")
    def get(self, request, fmt: str = ""):
        if fmt:
            _format(fmt, ("csv",))
        period = _period(request)
        result = allocation.usage_breakdown(tenant=request.actor.tenant, period=period,
                                            by=request.query_params.get("by", "project"))
        if fmt == "csv":
            name = f"usage-{period:%Y-%m}-{result['by'].replace(':', '-')}"
            return csv_response(allocation.breakdown_csv(result), name)
        return Response(BreakdownOutput(result).data)


class InvoiceBreakdownApi(APIView):
    @extend_schema(parameters=[BY], responses={200: BreakdownOutput, (200, "text/csv"): OpenApiTypes.STR},
                   operation_id="v1_invoice_breakdown",
                   summary="An invoice's usage lines by label, requesting user or project (chargeback)")
    def get(self, request, pk: int, fmt: str = ""):
        if fmt:
            _format(fmt, ("csv",))
        invoice = selectors.invoice_get(actor=request.actor, invoice_id=pk)
        result = allocation.invoice_breakdown(invoice=invoice, by=request.query_params.get("by", "project"))
        if fmt == "csv":
            name = f"{result['invoice']}-{result['by'].replace(':', '-')}"
            return csv_response(allocation.breakdown_csv(result), name)
        return Response(BreakdownOutput(result).data)


class UsageBreakdownDocumentApi(UsageBreakdownApi):
    """``usage/breakdown.<fmt>``: the same answer as a file, under an operation id of its own."""

    @extend_schema(parameters=[PERIOD, BY], responses={(200, "text/csv"): OpenApiTypes.STR},
                   operation_id="v1_usage_breakdown_document",
                   summary="A month's usage charges by label, requesting user or project, as CSV")
    def get(self, request, fmt: str = ""):
        return super().get(request, fmt=fmt)


class InvoiceBreakdownDocumentApi(InvoiceBreakdownApi):
    """``invoices/<id>/breakdown.<fmt>``: the same answer as a file, under an operation id of its own."""

    @extend_schema(parameters=[BY], responses={(200, "text/csv"): OpenApiTypes.STR},
                   operation_id="v1_invoice_breakdown_document",
                   summary="An invoice's usage lines by label, requesting user or project, as CSV")
    def get(self, request, pk: int, fmt: str = ""):
        return super().get(request, pk=pk, fmt=fmt)


# -- FOCUS exports -----------------------------------------------------------------------------------------------
def focus_response(rows: list[dict], name: str, fmt: str) -> HttpResponse:
    if fmt == "parquet":
        response = HttpResponse(focus.focus_parquet(rows), content_type="application/vnd.apache.parquet")
    else:
        response = HttpResponse(focus.focus_csv(rows), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}.focus.{fmt}"'
    return response


FOCUS_FORMATS = ("csv", "parquet")
FOCUS_RESPONSES = {(200, "text/csv"): OpenApiTypes.STR, (200, "application/vnd.apache.parquet"): OpenApiTypes.BINARY}


class InvoiceFocusApi(APIView):
    @extend_schema(responses=FOCUS_RESPONSES, operation_id="v1_invoice_focus",
                   summary="An invoice as FOCUS 1.2 cost and usage rows (CSV or Parquet), one row per charge")
    def get(self, request, pk: int, fmt: str):
        _format(fmt, FOCUS_FORMATS)
        invoice = selectors.invoice_get(actor=request.actor, invoice_id=pk)
        return focus_response(focus.focus_rows(invoice), invoice.number or f"draft-{invoice.pk}", fmt)


class StaffFocusApi(StaffApi):
    @extend_schema(parameters=[OpenApiParameter("period", MONTH_SCHEMA, required=True, description="a month, YYYY-MM"),
                               OpenApiParameter("status", str, enum=["finalized", "all"],
                                                description="finalized (default: finalized and paid) | all (drafts "
                                                            "too)")],
                   responses=FOCUS_RESPONSES, operation_id="v1_staff_focus",
                   description="Platform staff only (is_staff); everyone else gets 403.",
                   summary="Every tenant's invoices of a month as FOCUS 1.2 rows (CSV or Parquet)")
    def get(self, request, fmt: str):
        _format(fmt, FOCUS_FORMATS)
        period = period_parse(request.query_params.get("period", ""))
        invoices = Invoice.objects.filter(period=period).select_related("tenant").order_by("tenant__slug")
        if request.query_params.get("status", "finalized") != "all":
            invoices = invoices.filter(status__in=[InvoiceStatus.FINALIZED, InvoiceStatus.PAID])
        return focus_response(focus.focus_rows_many(invoices), f"gpubroker-{period:%Y-%m}", fmt)


# -- spend alerts ------------------------------------------------------------------------------------------------
class SpendAlertRuleOutput(serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True,
                                           help_text="null: the whole tenant")
    currency = serializers.CharField(source="tenant.currency")

    class Meta:
        model = SpendAlertRule
        fields = ["id", "project", "thresholds_pct", "budget_minor", "forecast", "currency"]


class SpendAlertRuleInput(StrictSerializer):
    project = serializers.CharField(max_length=63, allow_null=True, required=False, default=None,
                                    help_text="a project slug (unknown: 404); null or absent: the whole tenant")
    thresholds_pct = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=1000),
                                           min_length=1, max_length=10, required=False,
                                           help_text="percentages of the base (default 50, 80, 100)")
    budget_minor = serializers.IntegerField(min_value=1, max_value=MAX_MINOR, required=False, allow_null=True,
                                            help_text="the base of the percentages (default: the scope's cap)")
    forecast = serializers.BooleanField(required=False, default=True, help_text="watch the forecast too")


class SpendAlertOutput(serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    basis = serializers.ChoiceField(choices=AlertBasis.choices)

    class Meta:
        model = SpendAlert
        fields = ["id", "project", "period", "basis", "threshold_pct", "base_minor", "amount_minor", "currency",
                  "message", "created_at"]


class SpendAlertRuleListApi(APIView):
    write_action = "manage"

    @extend_schema(responses=paginated(SpendAlertRuleOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_spend_alert_rules_list", summary="The tenant's spend alert rules")
    def get(self, request):
        return paginate(self, request, spend_alert_rule_list(actor=request.actor), SpendAlertRuleOutput)

    @extend_schema(request=SpendAlertRuleInput,
                   responses={200: SpendAlertRuleOutput, 404: problem("No such project in this tenant"),
                              400: problem("No budget and no cap to take the percentages of (budget_minor)")},
                   summary="Set (create or replace) the alert rule of the tenant or one project (admins)")
    def put(self, request):
        data = parse(SpendAlertRuleInput, request)
        slug = data.pop("project")
        project = project_get(actor=request.actor, slug=slug) if slug is not None else None
        rule = alerts.spend_alert_rule_set(actor=request.actor, project=project, **data)
        return Response(SpendAlertRuleOutput(rule).data)


class SpendAlertRuleDetailApi(APIView):
    write_action = "manage"

    @extend_schema(responses=SpendAlertRuleOutput, summary="One spend alert rule")
    def get(self, request, pk: int):
        return Response(SpendAlertRuleOutput(spend_alert_rule_get(actor=request.actor, pk=pk)).data)

    @extend_schema(responses={204: None}, summary="Remove a spend alert rule (admins)")
    def delete(self, request, pk: int):
        alerts.spend_alert_rule_delete(actor=request.actor, rule=spend_alert_rule_get(actor=request.actor, pk=pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class SpendAlertListApi(APIView):
    @extend_schema(responses=paginated(SpendAlertOutput), parameters=[PERIOD, *PAGE_PARAMETERS],
                   operation_id="v1_spend_alerts_list",
                   summary="Spend alerts raised (thresholds reached, month-boundary cap checks), newest first")
    def get(self, request):
        raw = request.query_params.get("period")
        period = period_parse(raw) if raw is not None else None
        return paginate(self, request, spend_alert_list(actor=request.actor, period=period), SpendAlertOutput)
