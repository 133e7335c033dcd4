"""Billing API. Tenants: usage summaries, invoices and their PDF/CSV documents, and their spend caps (admins
write, everyone in the tenant reads; another tenant's cap is 404). Platform staff: price books and each
tenant's billing terms (``StaffApi``: members get 403). Views parse, read through ``billing.selectors``, call
one ``billing.services`` function and render; errors are problem+json naming the field."""

from __future__ import annotations

from datetime import UTC, datetime

from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import selectors, services
from billing.api import serializers as s
from billing.core.metering import HOUR, hour_floor
from billing.selectors import documents, quotes
from billing.services.metering_run import usage_meter_recent
from broker import selectors as broker_selectors
from broker.api import serializers as leasing_s
from broker.api.permissions import ReadOnlyPostPermission
from core.api import paginate, parse
from core.errors import NotFound, ValidationFailed
from core.openapi import PAGE_PARAMETERS, paginated, problem
from tenants.api.staff import StaffApi
from tenants.selectors import platform_tenant_get, project_get


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
        group_by = request.query_params.get("group_by", "project")
        selectors.usage_query_check(start=start, end=end, group_by=group_by)  # a bad request meters nothing
        # the last two hours are not metered by the hourly run yet: metered on demand, labelled an estimate
        recent = end > hour_floor(now) - HOUR
        metered_until = usage_meter_recent(tenant_id=request.actor.tenant.pk, now=now) if recent else None
        summary = selectors.usage_summary(actor=request.actor, start=start, end=end, group_by=group_by)
        summary["metered_until"] = metered_until
        summary["live_estimate"] = metered_until is not None and end > hour_floor(metered_until)
        return Response(s.UsageOutput(summary).data)


class InvoiceListApi(APIView):
    @extend_schema(responses=paginated(s.InvoiceOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_invoices_list", summary="Invoices of the tenant, newest month first")
    def get(self, request):
        return paginate(self, request, selectors.invoice_list(actor=request.actor), s.InvoiceOutput)


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


# -- price books and terms: platform staff -----------------------------------------------------------------------
STAFF_ONLY = "Platform staff only (is_staff); everyone else gets 403."
STARTED = problem("The book has started: usage was priced by it, so it cannot change (create a new book from a "
                  "later date)")


def _book_values(data: dict) -> dict:
    """The validated body as ``billing.services`` takes it (decimals as ``Decimal``, rates as dicts)."""
    values = dict(data)
    if "rates" in values:
        values["rates"] = [dict(rate) for rate in values["rates"]]
    return values


class PriceBookListApi(StaffApi):
    @extend_schema(responses=paginated(s.PriceBookOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_price_books_list", description=STAFF_ONLY,
                   summary="Every price book with its rates and state (upcoming, in force, superseded)")
    def get(self, request):
        return paginate(self, request, selectors.price_book_list(), s.PriceBookOutput,
                         context={"states": selectors.price_book_states()})

    @extend_schema(request=s.PriceBookCreateInput, responses={201: s.PriceBookOutput}, description=STAFF_ONLY,
                   summary="Create a price book (the general list of a currency, or a tenant's own) with its rates")
    def post(self, request):
        values = _book_values(parse(s.PriceBookCreateInput, request))
        slug = values.pop("tenant")
        try:
            tenant = platform_tenant_get(slug=slug) if slug is not None else None
        except NotFound as error:  # a body field, not the path: 400 naming it
            raise ValidationFailed(error.message, field="tenant") from None
        book = services.price_book_create(tenant=tenant, by_user=request.user, **values)
        return Response(s.PriceBookOutput(selectors.price_book_get(pk=book.pk)).data, status=status.HTTP_201_CREATED)


class PriceBookDetailApi(StaffApi):
    @extend_schema(responses=s.PriceBookOutput, description=STAFF_ONLY, summary="One price book with its rates")
    def get(self, request, pk: int):
        return Response(s.PriceBookOutput(selectors.price_book_get(pk=pk)).data)

    @extend_schema(request=s.PriceBookUpdateInput, responses={200: s.PriceBookOutput, 409: STARTED},
                   description=f"{STAFF_ONLY} Only a book that has not started changes; fields left out keep "
                               f"their value, rates replace them all.",
                   summary="Change an upcoming price book")
    def patch(self, request, pk: int):
        book = selectors.price_book_get(pk=pk)
        values = _book_values(parse(s.PriceBookUpdateInput, request))
        book = services.price_book_update(book=book, changes=values, by_user=request.user)
        return Response(s.PriceBookOutput(book).data)

    @extend_schema(responses={204: None, 409: STARTED}, description=STAFF_ONLY,
                   summary="Delete an upcoming price book")
    def delete(self, request, pk: int):
        services.price_book_delete(book=selectors.price_book_get(pk=pk), by_user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class BillingTermsApi(StaffApi):
    def _schedule(self, tenant) -> dict:
        return {"tenant": tenant.slug, "currency": tenant.currency,
                "in_force": selectors.billing_terms_in_force(tenant=tenant),
                "terms": list(selectors.billing_terms_list(tenant=tenant))}

    @extend_schema(responses=s.BillingTermsScheduleOutput, description=STAFF_ONLY,
                   summary="A tenant's billing terms: those of this month's invoice and every start")
    def get(self, request, slug: str):
        tenant = platform_tenant_get(slug=slug)
        return Response(s.BillingTermsScheduleOutput(self._schedule(tenant)).data)

    @extend_schema(request=s.BillingTermsInput, responses=s.BillingTermsScheduleOutput,
                   description=f"{STAFF_ONLY} Sets the discount and committed minimum from a month (this one or "
                               f"later) on, replacing terms that start then.",
                   summary="Set a tenant's billing terms from a month on")
    def put(self, request, slug: str):
        tenant = platform_tenant_get(slug=slug)
        data = parse(s.BillingTermsInput, request)
        services.billing_terms_set(tenant=tenant, by_user=request.user, **data)
        return Response(s.BillingTermsScheduleOutput(self._schedule(tenant)).data)


# -- spend caps: the tenant's admins -----------------------------------------------------------------------------
CAP_TAKEN = problem("The scope (the tenant, or that project) already has a spend cap")


class SpendCapListApi(APIView):
    write_action = "manage"

    @extend_schema(responses=paginated(s.SpendCapOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_spend_caps_list",
                   summary="The tenant's monthly spend caps (tenant-wide first, then per project)")
    def get(self, request):
        return paginate(self, request, selectors.spend_cap_list(actor=request.actor), s.SpendCapOutput)

    @extend_schema(request=s.SpendCapCreateInput,
                   responses={201: s.SpendCapOutput, 404: problem("No such project in this tenant"), 409: CAP_TAKEN},
                   summary="Set a monthly spend cap on the tenant or one project (admins)")
    def post(self, request):
        data = parse(s.SpendCapCreateInput, request)
        slug = data.pop("project")
        project = project_get(actor=request.actor, slug=slug) if slug is not None else None
        cap = services.spend_cap_create(tenant=request.actor.tenant, project=project, actor=request.actor, **data)
        return Response(s.SpendCapOutput(cap).data, status=status.HTTP_201_CREATED)


class SpendCapDetailApi(APIView):
    write_action = "manage"

    @extend_schema(responses=s.SpendCapOutput, summary="One spend cap")
    def get(self, request, pk: int):
        return Response(s.SpendCapOutput(selectors.spend_cap_get(actor=request.actor, pk=pk)).data)

    @extend_schema(request=s.SpendCapUpdateInput, responses=s.SpendCapOutput,
                   summary="Change a spend cap's amount or action (admins)")
    def patch(self, request, pk: int):
        cap = selectors.spend_cap_get(actor=request.actor, pk=pk)
        data = parse(s.SpendCapUpdateInput, request)
        return Response(s.SpendCapOutput(services.spend_cap_update(cap=cap, actor=request.actor, **data)).data)

    @extend_schema(responses={204: None}, summary="Remove a spend cap (admins)")
    def delete(self, request, pk: int):
        services.spend_cap_delete(cap=selectors.spend_cap_get(actor=request.actor, pk=pk), actor=request.actor)
        return Response(status=status.HTTP_204_NO_CONTENT)


# -- what a request would cost, and what is on offer (leasing's answers with billing's prices) -----------------
class QuoteApi(APIView):
    """What a lease request would get, before it is made; writes nothing (``billing.selectors.quotes.lease_quote``,
    the function behind the portal's live preview too)."""

    permission_classes = [ReadOnlyPostPermission]  # a quote reads only: `view`, read-only tokens included

    @extend_schema(
        request=leasing_s.LeaseCreateInput,
        responses={200: s.QuoteOutput, 404: problem("No such project in this tenant"),
                   409: problem("Quota exceeded: no model's quota limit allows this request")},
        summary="Quote a lease request: fit or queue, quota, price, budget (nothing is written)")
    def post(self, request):
        data = parse(leasing_s.LeaseCreateInput, request)
        quote = quotes.lease_quote(actor=request.actor, **data)
        return Response(s.QuoteOutput(quote).data)


class OfferListApi(APIView):
    @extend_schema(responses=s.OfferListOutput, summary="GPU models on offer with their free capacity now")
    def get(self, request):
        return Response({"offers": selectors.offer_prices(tenant=request.actor.tenant,
                                                          offers=broker_selectors.offer_list())})
