"""Tenant-facing billing API: usage summaries, invoices and their PDF/CSV documents."""

from __future__ import annotations

from datetime import UTC, datetime

from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import documents, selectors
from billing.api import serializers as s
from config.errors import ValidationFailed
from config.openapi import PAGE_PARAMETERS, paginated
from tenants.api.views import _paginate


def _moment(request, name: str, default: datetime) -> datetime:
    raw = request.query_params.get(name)
    if raw is None:
        return default  # absent; an empty value is no date: 400 below
    try:
        value = parse_datetime(raw)
        day = parse_date(raw) if value is None else None
    except ValueError:  # well formed but no such moment (month 13)
        value = day = None
    if value is None:
        if day is None:
            raise ValidationFailed(f"{name} must be an ISO 8601 date or date-time.", field=name)
        value = datetime(day.year, day.month, day.day, tzinfo=UTC)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


_DATE_OR_TIME = {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "string", "format": "date"}]}


class UsageApi(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("from", _DATE_OR_TIME, description="start (default: month start)"),
                    OpenApiParameter("to", _DATE_OR_TIME, description="end, exclusive (default: now); after from, "
                                     "at most 400 days later"),
                    OpenApiParameter("group_by", str, enum=["project", "model", "day"])],
        responses=s.UsageOutput, summary="Metered GPU usage and its cost, grouped")
    def get(self, request):
        now = timezone.now()
        start = _moment(request, "from", now.replace(day=1, hour=0, minute=0, second=0, microsecond=0))
        end = _moment(request, "to", now)
        summary = selectors.usage_summary(actor=request.actor, start=start, end=end,
                                          group_by=request.query_params.get("group_by", "project"))
        return Response(s.UsageOutput(summary).data)


class InvoiceListApi(APIView):
    @extend_schema(responses=paginated(s.InvoiceOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_invoices_list", summary="Invoices of the tenant, newest month first")
    def get(self, request):
        return _paginate(self, request, selectors.invoice_list(actor=request.actor), s.InvoiceOutput)


class InvoiceDetailApi(APIView):
    @extend_schema(responses=s.InvoiceDetailOutput, summary="An invoice with its lines")
    def get(self, request, pk: int):
        return Response(s.InvoiceDetailOutput(selectors.invoice_get(actor=request.actor, invoice_id=pk)).data)


class InvoiceDocumentApi(APIView):
    """``/invoices/{id}.pdf`` and ``.csv``: the documents, from the stored invoice."""

    @extend_schema(responses={(200, "application/pdf"): OpenApiTypes.BINARY,
                              (200, "text/csv"): OpenApiTypes.STR}, summary="Invoice as PDF or CSV",
                   operation_id="v1_invoices_document")
    def get(self, request, pk: int, fmt: str):
        return documents.invoice_download(selectors.invoice_get(actor=request.actor, invoice_id=pk), fmt)
