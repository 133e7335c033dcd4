"""Corrections, prepaid credits and taxes over the API (issue 33 items 1, 2, 3).

Tenants read: their credit notes (and each one's PDF/CSV) and their prepaid credit balance; an invoice shows
its balance due (``billing.api.serializers``). Platform staff write: a credit note on an invoice (whole or per
line), a local void (with its credit note), a payment received, a refund of a payment, a tenant's credit
grants, its tax profile and tax rates. Views parse, read, call one service and render; errors are problem+json
naming the field."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.choices import CreditNoteReason
from billing.core.pricing import from_minor
from billing.models import CreditGrant, CreditNote, CreditNoteLine, Invoice, Payment, Refund, TaxProfile, TaxRate
from billing.selectors import balances
from billing.selectors.credit_note_documents import credit_note_download
from billing.services.credit_notes import credit_note_issue, invoice_void, payment_record, refund_record
from billing.services.credits import credit_grant_create
from billing.services.tax import tax_profile_set, tax_rate_create, tax_rate_deactivate
from core.api import paginate, parse
from core.errors import NotFound
from core.openapi import PAGE_PARAMETERS, paginated, problem
from tenants.api.staff import StaffApi
from tenants.selectors import platform_tenant_get

STAFF_ONLY = "Platform staff only (is_staff); everyone else gets 403."


# -- serializers -----------------------------------------------------------------------------------------------
class CreditNoteLineOutput(serializers.ModelSerializer):
    position = serializers.IntegerField(source="invoice_line.position", allow_null=True, default=None)

    class Meta:
        model = CreditNoteLine
        fields = ["position", "description", "amount_minor"]


class CreditNoteOutput(serializers.ModelSerializer):
    invoice = serializers.IntegerField(source="invoice_id")
    invoice_number = serializers.CharField(source="invoice.number")
    amount = serializers.SerializerMethodField()
    lines = CreditNoteLineOutput(many=True, read_only=True)

    class Meta:
        model = CreditNote
        fields = ["id", "number", "invoice", "invoice_number", "currency", "reason", "memo", "voids_invoice",
                  "amount_minor", "amount", "issued_at", "lines"]

    def get_amount(self, obj) -> str:
        return str(from_minor(obj.amount_minor, obj.currency))


class CreditNoteLineInput(serializers.Serializer):
    position = serializers.IntegerField(help_text="The invoice line's position.")
    amount_minor = serializers.IntegerField()


class CreditNoteInput(serializers.Serializer):
    reason = serializers.ChoiceField(choices=CreditNoteReason.choices)
    memo = serializers.CharField(max_length=500)
    lines = CreditNoteLineInput(many=True, required=False, help_text="Credit per invoice line; or amount_minor.")
    amount_minor = serializers.IntegerField(required=False, help_text="Credit on the whole invoice; or lines.")


class VoidInput(serializers.Serializer):
    memo = serializers.CharField(max_length=500)


class PaymentInput(serializers.Serializer):
    amount_minor = serializers.IntegerField()
    received_at = serializers.DateTimeField(required=False)
    reference = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")


class PaymentOutput(serializers.ModelSerializer):
    class Meta:
        model = Payment
        fields = ["id", "invoice", "currency", "amount_minor", "received_at", "reference"]


class RefundInput(serializers.Serializer):
    amount_minor = serializers.IntegerField()
    reason = serializers.CharField(max_length=300)
    reference = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")


class RefundOutput(serializers.ModelSerializer):
    class Meta:
        model = Refund
        fields = ["id", "payment", "amount_minor", "reason", "refunded_at", "reference"]


class InvoiceBalanceOutput(serializers.Serializer):
    id = serializers.IntegerField()
    number = serializers.CharField()
    status = serializers.CharField()
    currency = serializers.CharField()
    total_minor = serializers.IntegerField()
    credit_notes_minor = serializers.IntegerField()
    credits_drawn_minor = serializers.IntegerField()
    payments_minor = serializers.IntegerField()
    refunds_minor = serializers.IntegerField()
    balance_due_minor = serializers.IntegerField(help_text="total − credit notes − credits drawn − payments + "
                                                           "refunds; negative: owed to the tenant")


class CreditGrantOutput(serializers.ModelSerializer):
    remaining_minor = serializers.IntegerField()
    usable = serializers.BooleanField(help_text="Has a balance and has not expired.")

    class Meta:
        model = CreditGrant
        fields = ["id", "currency", "amount_minor", "remaining_minor", "priority", "expires_at", "granted_at",
                  "reason", "usable"]


class CreditBalanceOutput(serializers.Serializer):
    available_minor = serializers.DictField(child=serializers.IntegerField(),
                                            help_text="Usable prepaid credit per currency.")
    grants = CreditGrantOutput(many=True)


class CreditGrantInput(serializers.Serializer):
    amount_minor = serializers.IntegerField()
    reason = serializers.CharField(max_length=300)
    currency = serializers.CharField(max_length=3, required=False)
    priority = serializers.IntegerField(required=False, default=0, help_text="Lower draws first.")
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)


# -- tenants: read ---------------------------------------------------------------------------------------------
class CreditNoteListApi(APIView):
    @extend_schema(responses=paginated(CreditNoteOutput), parameters=PAGE_PARAMETERS,
                   operation_id="v1_credit_notes_list", summary="The tenant's credit notes, newest first")
    def get(self, request):
        return paginate(self, request, balances.credit_note_list(actor=request.actor).prefetch_related(
            "lines__invoice_line"), CreditNoteOutput)


class CreditNoteDetailApi(APIView):
    @extend_schema(responses=CreditNoteOutput, summary="A credit note with its lines")
    def get(self, request, pk: int):
        return Response(CreditNoteOutput(balances.credit_note_get(actor=request.actor, pk=pk)).data)


class CreditNoteDocumentApi(APIView):
    @extend_schema(responses={(200, "application/pdf"): OpenApiTypes.BINARY, (200, "text/csv"): OpenApiTypes.STR},
                   summary="Credit note as PDF or CSV", operation_id="v1_credit_notes_document")
    def get(self, request, pk: int, fmt: str):
        return credit_note_download(balances.credit_note_get(actor=request.actor, pk=pk), fmt)


class CreditBalanceApi(APIView):
    @extend_schema(responses=CreditBalanceOutput, summary="The tenant's prepaid credit: balance and grants")
    def get(self, request):
        return Response(CreditBalanceOutput(balances.credit_balance(actor=request.actor, now=timezone.now())).data)


# -- platform staff: write -------------------------------------------------------------------------------------
def _invoice(pk: int) -> Invoice:
    invoice = Invoice.objects.select_related("tenant").filter(pk=pk).first()
    if invoice is None:
        raise NotFound(f"No invoice {pk}.", field="id")
    return invoice


def _balance(invoice: Invoice) -> dict:
    return {"id": invoice.pk, "number": invoice.number or "", "status": Invoice.objects.get(pk=invoice.pk).status,
            "currency": invoice.currency, **balances.invoice_balance(invoice=invoice)}


FINAL_ONLY = problem("The invoice is a draft (or, for a void, paid or void already)")


class StaffCreditNoteApi(StaffApi):
    @extend_schema(request=CreditNoteInput, responses={201: CreditNoteOutput, 409: FINAL_ONLY},
                   description=f"{STAFF_ONLY} Credit a finalized or paid invoice: ``lines`` (per invoice line, each "
                               f"at most what is left of it) or ``amount_minor`` of the whole invoice.",
                   summary="Issue a credit note against an invoice")
    def post(self, request, pk: int):
        invoice = _invoice(pk)
        data = parse(CreditNoteInput, request)
        lines = [dict(line) for line in data["lines"]] if "lines" in data else None
        note = credit_note_issue(invoice=invoice, reason=data["reason"], memo=data["memo"], lines=lines,
                                 amount_minor=data.get("amount_minor"), by_user=request.user)
        return Response(CreditNoteOutput(CreditNote.objects.prefetch_related("lines__invoice_line").get(pk=note.pk))
                        .data, status=status.HTTP_201_CREATED)


class StaffInvoiceVoidApi(StaffApi):
    @extend_schema(request=VoidInput, responses={200: InvoiceBalanceOutput, 409: FINAL_ONLY},
                   description=f"{STAFF_ONLY} Voids a finalized, unpaid invoice and issues the credit note for what "
                               f"is left to credit.", summary="Void an invoice (with its credit note)")
    def post(self, request, pk: int):
        invoice = _invoice(pk)
        data = parse(VoidInput, request)
        invoice = invoice_void(invoice=invoice, memo=data["memo"], by_user=request.user)
        return Response(InvoiceBalanceOutput(_balance(invoice)).data)


class StaffPaymentApi(StaffApi):
    @extend_schema(request=PaymentInput, responses={201: PaymentOutput, 409: FINAL_ONLY}, description=STAFF_ONLY,
                   summary="Record a payment received against an invoice")
    def post(self, request, pk: int):
        invoice = _invoice(pk)
        data = parse(PaymentInput, request)
        payment = payment_record(invoice=invoice, by_user=request.user, **data)
        return Response(PaymentOutput(payment).data, status=status.HTTP_201_CREATED)


class StaffInvoiceBalanceApi(StaffApi):
    @extend_schema(responses=InvoiceBalanceOutput, description=STAFF_ONLY,
                   summary="An invoice's balance: total, credit notes, credits drawn, payments, refunds")
    def get(self, request, pk: int):
        return Response(InvoiceBalanceOutput(_balance(_invoice(pk))).data)


class StaffRefundApi(StaffApi):
    @extend_schema(request=RefundInput, responses={201: RefundOutput}, description=STAFF_ONLY,
                   summary="Refund (part of) a payment")
    def post(self, request, pk: int):
        payment = Payment.objects.filter(pk=pk).first()
        if payment is None:
            raise NotFound(f"No payment {pk}.", field="id")
        data = parse(RefundInput, request)
        refund = refund_record(payment=payment, by_user=request.user, **data)
        return Response(RefundOutput(refund).data, status=status.HTTP_201_CREATED)


class StaffCreditGrantApi(StaffApi):
    @extend_schema(responses=CreditBalanceOutput, description=STAFF_ONLY,
                   summary="A tenant's prepaid credit: balance and grants")
    def get(self, request, slug: str):
        tenant = platform_tenant_get(slug=slug)
        return Response(CreditBalanceOutput(balances.credit_balance(tenant=tenant, now=timezone.now())).data)

    @extend_schema(request=CreditGrantInput, responses={201: CreditBalanceOutput}, description=STAFF_ONLY,
                   summary="Grant a tenant prepaid credit")
    def post(self, request, slug: str):
        tenant = platform_tenant_get(slug=slug)
        data = parse(CreditGrantInput, request)
        credit_grant_create(tenant=tenant, by_user=request.user, **data)
        return Response(CreditBalanceOutput(balances.credit_balance(tenant=tenant, now=timezone.now())).data,
                        status=status.HTTP_201_CREATED)


# -- taxes: platform staff ---------------------------------------------------------------------------------------
class TaxRateOutput(serializers.ModelSerializer):
    class Meta:
        model = TaxRate
        fields = ["id", "jurisdiction", "name", "percentage", "inclusive", "active", "created_at"]


class TaxProfileOutput(serializers.Serializer):
    tenant = serializers.CharField()
    tax_id = serializers.CharField()
    reverse_charge = serializers.BooleanField()
    legal_note = serializers.CharField()
    rates = TaxRateOutput(many=True)


class TaxProfileInput(serializers.Serializer):
    tax_id = serializers.CharField(max_length=40, required=False, allow_blank=True, default="")
    reverse_charge = serializers.BooleanField(required=False, default=False)
    legal_note = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")


class TaxRateInput(serializers.Serializer):
    jurisdiction = serializers.CharField(max_length=40)
    name = serializers.CharField(max_length=60)
    percentage = serializers.CharField(help_text="0–100, at most 4 decimal places, e.g. \"19\" or \"7.25\".")
    inclusive = serializers.BooleanField(required=False, default=False)


def _tax(tenant) -> dict:
    profile = TaxProfile.objects.filter(tenant=tenant).first()
    return {"tenant": tenant.slug, "tax_id": profile.tax_id if profile else "",
            "reverse_charge": bool(profile and profile.reverse_charge),
            "legal_note": profile.legal_note if profile else "",
            "rates": list(TaxRate.objects.filter(tenant=tenant).order_by("-active", "pk"))}


class StaffTaxApi(StaffApi):
    @extend_schema(responses=TaxProfileOutput, description=STAFF_ONLY,
                   summary="A tenant's tax id, reverse charge and tax rates")
    def get(self, request, slug: str):
        return Response(TaxProfileOutput(_tax(platform_tenant_get(slug=slug))).data)

    @extend_schema(request=TaxProfileInput, responses=TaxProfileOutput, description=STAFF_ONLY,
                   summary="Set a tenant's tax id and reverse charge (with its legal note)")
    def put(self, request, slug: str):
        tenant = platform_tenant_get(slug=slug)
        tax_profile_set(tenant=tenant, by_user=request.user, **parse(TaxProfileInput, request))
        return Response(TaxProfileOutput(_tax(tenant)).data)

    @extend_schema(request=TaxRateInput, responses={201: TaxProfileOutput, 409: problem("An active rate of that "
                                                                                        "name and jurisdiction")},
                   description=STAFF_ONLY, summary="Add a tax rate to a tenant's invoices")
    def post(self, request, slug: str):
        tenant = platform_tenant_get(slug=slug)
        tax_rate_create(tenant=tenant, by_user=request.user, **parse(TaxRateInput, request))
        return Response(TaxProfileOutput(_tax(tenant)).data, status=status.HTTP_201_CREATED)


class StaffTaxRateApi(StaffApi):
    @extend_schema(responses={204: None}, description=STAFF_ONLY,
                   summary="Deactivate a tax rate (drafts lose it; finalized invoices keep theirs)")
    def delete(self, request, slug: str, pk: int):
        tenant = platform_tenant_get(slug=slug)
        rate = TaxRate.objects.filter(tenant=tenant, pk=pk).first()
        if rate is None:
            raise NotFound(f"No tax rate {pk} of {slug}.", field="id")
        tax_rate_deactivate(rate=rate, by_user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
