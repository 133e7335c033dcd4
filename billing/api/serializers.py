from decimal import Decimal

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from billing.choices import CapAction, RateKind
from billing.core.pricing import from_minor
from billing.models import BillingTerms, Invoice, InvoiceLine, PriceBook, PriceRate, SpendCap
from billing.services import MAX_MINOR
from broker.api.serializers import GPU_OUTPUT_SCHEMA
from gpus.catalogue import MODELS
from tenants.api.serializers import StrictSerializer
from tenants.choices import CURRENCIES


class UsageGroupOutput(serializers.Serializer):
    key = serializers.CharField()
    gpu_hours = serializers.DecimalField(max_digits=18, decimal_places=6)
    engine_active_avg = serializers.DecimalField(max_digits=7, decimal_places=4, allow_null=True)
    idle_gpu_hours = serializers.DecimalField(max_digits=18, decimal_places=6, allow_null=True)
    amount_minor = serializers.IntegerField(allow_null=True, help_text="cost at the prices in force; null if unpriced")


class UsageOutput(serializers.Serializer):
    start = serializers.DateTimeField(source="from")
    end = serializers.DateTimeField(source="to")
    group_by = serializers.CharField()
    currency = serializers.CharField(help_text="of every amount_minor (integer minor units: cents for USD)")
    metered_until = serializers.DateTimeField(
        allow_null=True, help_text="the hour in progress (and the last one until the hourly run closes it) is metered "
        "on demand up to this moment; null when the window ends before them")
    live_estimate = serializers.BooleanField(
        help_text="true: the figures include the hour in progress, metered up to metered_until and recomputed whole "
        "when the hour ends; costs are at the prices in force, before discounts and SLO credits: an estimate, "
        "not an invoice")
    groups = UsageGroupOutput(many=True)


class InvoiceLineOutput(serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    model = serializers.CharField(source="tier")
    amount = serializers.SerializerMethodField()

    class Meta:
        model = InvoiceLine
        fields = ["position", "kind", "description", "project", "model", "mig_profile", "workload_class",
                  "over_quota", "profiling", "quantity", "unit", "unit_price", "amount_minor", "amount", "gpu_hours",
                  "engine_active_avg", "memory_used_avg_mib", "idle_gpu_hours", "evidence"]

    def get_amount(self, obj) -> str:
        return str(from_minor(obj.amount_minor, obj.invoice.currency))


@extend_schema_field({"type": "string", "pattern": r"^\d{4}-\d{2}$", "example": "2026-01"})
class MonthField(serializers.DateField):
    """A month as ``YYYY-MM`` (documented so: ``format: date`` promised a day that is not there)."""


class InvoiceOutput(serializers.ModelSerializer):
    period = MonthField(format="%Y-%m")
    total = serializers.SerializerMethodField()
    # what is still owed (billing.selectors.balances): total − credit notes − credits drawn − payments + refunds
    credit_notes_minor = serializers.IntegerField(read_only=True)
    credits_drawn_minor = serializers.IntegerField(read_only=True)
    payments_minor = serializers.IntegerField(read_only=True)
    refunds_minor = serializers.IntegerField(read_only=True)
    balance_due_minor = serializers.IntegerField(read_only=True, help_text="Negative: owed to the tenant.")

    class Meta:
        model = Invoice
        fields = ["id", "number", "period", "status", "currency", "subtotal_minor", "discount_minor",
                  "credit_minor", "total_minor", "total", "credit_notes_minor", "credits_drawn_minor",
                  "payments_minor", "refunds_minor", "balance_due_minor", "computed_at", "finalized_at", "paid_at",
                  "voided_at"]

    def get_total(self, obj) -> str:
        return str(from_minor(obj.total_minor, obj.currency))


class InvoiceDetailOutput(InvoiceOutput):
    lines = InvoiceLineOutput(many=True, read_only=True)

    class Meta(InvoiceOutput.Meta):
        fields = [*InvoiceOutput.Meta.fields, "lines"]


# -- price books (platform staff) ------------------------------------------------------------------------------
MODEL_CODES = [m.code for m in MODELS]
BOOK_STATES = ["upcoming", "in_force", "superseded"]


RATE_KIND_HELP = "whole (per GPU-hour), mig (per instance-hour of mig_profile), share (per GPU-hour of shares)"


class PriceRateOutput(serializers.ModelSerializer):
    # a plain string here: "kind" names other choice sets elsewhere (lease shapes, adjustments), and one enum
    # component per choice set keeps the document's names stable (the input below has the enum)
    kind = serializers.CharField(help_text=RATE_KIND_HELP)

    class Meta:
        model = PriceRate
        fields = ["tier", "kind", "mig_profile", "per_hour"]


class PriceBookOutput(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True,
                                          help_text="null: the general list of its currency")
    rates = PriceRateOutput(many=True, read_only=True)
    state = serializers.SerializerMethodField(help_text="upcoming (not started: may change or be deleted), "
                                                        "in_force, superseded")

    class Meta:
        model = PriceBook
        fields = ["id", "name", "currency", "tenant", "effective_from", "over_quota_multiplier",
                  "interactive_multiplier", "profiling_multiplier", "energy_per_kwh", "state", "rates", "created_at"]

    @extend_schema_field({"type": "string", "enum": BOOK_STATES})
    def get_state(self, obj) -> str:
        states = self.context.get("states")
        if states is None:
            from billing.selectors import price_book_states

            states = self.context["states"] = price_book_states()
        return states.get(obj.pk, "upcoming")


PROFILING_HELP = ("the profiling rate: profiling leases (auto-tiering measuring a workload on a tier) pay the base "
                  "rate × this")


class PriceRateInput(StrictSerializer):
    tier = serializers.ChoiceField(choices=MODEL_CODES, help_text="a GPU model code")
    kind = serializers.ChoiceField(choices=RateKind.choices, default=RateKind.WHOLE, help_text=RATE_KIND_HELP)
    mig_profile = serializers.CharField(max_length=32, allow_blank=True, default="",
                                        help_text="a MIG profile of the model, for kind mig only")
    per_hour = serializers.DecimalField(max_digits=14, decimal_places=6, min_value=Decimal(0),
                                        help_text="base price per unit-hour in the book's currency")


class PriceBookUpdateInput(StrictSerializer):
    """Fields left out keep their value; ``rates`` replaces every rate."""

    name = serializers.CharField(max_length=100, required=False)
    effective_from = serializers.DateTimeField(required=False, help_text="in the future")
    over_quota_multiplier = serializers.DecimalField(max_digits=6, decimal_places=4, min_value=Decimal("0.0001"),
                                                     required=False)
    interactive_multiplier = serializers.DecimalField(max_digits=6, decimal_places=4, min_value=Decimal("0.0001"),
                                                      required=False)
    profiling_multiplier = serializers.DecimalField(max_digits=6, decimal_places=4, min_value=Decimal("0.0001"),
                                                    required=False, help_text=PROFILING_HELP)
    energy_per_kwh = serializers.DecimalField(max_digits=10, decimal_places=6, min_value=Decimal(0),
                                              allow_null=True, required=False)
    rates = PriceRateInput(many=True, required=False, allow_empty=False)


class PriceBookCreateInput(PriceBookUpdateInput):
    name = serializers.CharField(max_length=100)
    currency = serializers.ChoiceField(choices=list(CURRENCIES))
    tenant = serializers.CharField(max_length=63, allow_null=True, required=False, default=None,
                                   help_text="a tenant slug for its own book; null or absent: the general list")
    effective_from = serializers.DateTimeField(help_text="when its prices start; before the end of usage already "
                                                         "metered in its scope is refused")
    over_quota_multiplier = serializers.DecimalField(max_digits=6, decimal_places=4, min_value=Decimal("0.0001"),
                                                     default=Decimal("0.6"))
    interactive_multiplier = serializers.DecimalField(max_digits=6, decimal_places=4, min_value=Decimal("0.0001"),
                                                      default=Decimal("1.25"))
    profiling_multiplier = serializers.DecimalField(max_digits=6, decimal_places=4, min_value=Decimal("0.0001"),
                                                    default=Decimal("1"), help_text=PROFILING_HELP)
    energy_per_kwh = serializers.DecimalField(max_digits=10, decimal_places=6, min_value=Decimal(0),
                                              allow_null=True, default=None)
    rates = PriceRateInput(many=True, allow_empty=False)


# -- billing terms (platform staff) ----------------------------------------------------------------------------
class BillingTermsOutput(serializers.ModelSerializer):
    period = serializers.SerializerMethodField(help_text="the first month (YYYY-MM) the terms apply to")
    discount_pct = serializers.DecimalField(max_digits=5, decimal_places=2)

    class Meta:
        model = BillingTerms
        fields = ["period", "effective_from", "discount_pct", "monthly_commit_minor"]

    @extend_schema_field({"type": "string", "pattern": r"^\d{4}-\d{2}$", "example": "2026-12"})
    def get_period(self, obj) -> str:
        return f"{obj.effective_from:%Y-%m}"


class BillingTermsScheduleOutput(serializers.Serializer):
    tenant = serializers.CharField()
    currency = serializers.CharField(help_text="of monthly_commit_minor")
    in_force = BillingTermsOutput(allow_null=True, help_text="the terms of this month's invoice (null: none)")
    terms = BillingTermsOutput(many=True, help_text="every start, the latest first")


class BillingTermsInput(StrictSerializer):
    period = serializers.RegexField(r"^\d{4}-\d{2}$", max_length=7, required=False, allow_null=True, default=None,
                                    help_text="first month the terms apply to (YYYY-MM), this month or later; "
                                              "default: this month")
    discount_pct = serializers.DecimalField(max_digits=5, decimal_places=2, min_value=Decimal(0),
                                            max_value=Decimal(100), help_text="discount on usage, percent")
    monthly_commit_minor = serializers.IntegerField(min_value=0, max_value=MAX_MINOR,
                                                    help_text="committed monthly minimum, minor units")


# -- spend caps (tenant admins) --------------------------------------------------------------------------------
class SpendCapOutput(serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True,
                                           help_text="null: the whole tenant")
    action = serializers.ChoiceField(choices=CapAction.choices)
    currency = serializers.CharField(source="tenant.currency")

    class Meta:
        model = SpendCap
        fields = ["id", "project", "monthly_minor", "currency", "action"]


class SpendCapUpdateInput(StrictSerializer):
    monthly_minor = serializers.IntegerField(min_value=1, max_value=MAX_MINOR, required=False,
                                             help_text="the month's cap in minor units of the tenant's currency")
    action = serializers.ChoiceField(choices=CapAction.choices, required=False,
                                     help_text="refuse: requests over the cap get 402; warn: a warning only")


class SpendCapCreateInput(SpendCapUpdateInput):
    project = serializers.CharField(max_length=63, allow_null=True, required=False, default=None,
                                    help_text="a project slug (unknown: 404); null or absent: the whole tenant")
    monthly_minor = serializers.IntegerField(min_value=1, max_value=MAX_MINOR,
                                             help_text="the month's cap in minor units of the tenant's currency")
    action = serializers.ChoiceField(choices=CapAction.choices, default=CapAction.REFUSE,
                                     help_text="refuse: requests over the cap get 402; warn: a warning only")


class OfferListOutput(serializers.Serializer):
    offers = serializers.ListField(child=serializers.DictField(), help_text="GPU models with free capacity and "
                                   "the tenant's prices per hour")


class QuotePriceOutput(serializers.Serializer):
    currency = serializers.CharField()
    per_hour = serializers.CharField(help_text="decimal, major units: the whole request (count included) per hour, "
                                               "at the rate it would run at (over-quota, interactive)")
    for_duration = serializers.CharField(help_text="decimal, major units: per_hour for duration_seconds")
    for_duration_minor = serializers.IntegerField(help_text="the same in minor units (rounded once)")
    duration_seconds = serializers.IntegerField()
    formatted = serializers.CharField(help_text='e.g. "4.00 USD per hour, 8.00 USD for 2 h"')
    description = serializers.CharField(help_text="what is priced, on which model, at which rate")
    book = serializers.CharField(help_text="the price book it comes from")


class QuoteBudgetOutput(serializers.Serializer):
    outcome = serializers.ChoiceField(choices=["ok", "warn", "refuse"],
                                      help_text="refuse: POST /leases would answer 402; warn: accepted with the "
                                                "warning; ok: within every cap, or none is set")
    message = serializers.CharField(allow_blank=True, help_text="the guard's own words (empty when ok)")
    currency = serializers.CharField()
    cap_scope = serializers.ChoiceField(choices=["tenant", "project"], allow_null=True,
                                        help_text="the cap the figures are of: the refusing one, else the one "
                                                  "with the least headroom; null when no cap applies")
    cap_minor = serializers.IntegerField(allow_null=True)
    spent_minor = serializers.IntegerField(allow_null=True, help_text="metered this month")
    request_minor = serializers.IntegerField(allow_null=True, help_text="this request, within the month, at the "
                                             "in-quota rate (as the request's guard counts it)")
    forecast_minor = serializers.IntegerField(allow_null=True, help_text="spent + live leases + this request")


class ShareEnforcementOutput(serializers.Serializer):
    enforcement = serializers.ChoiceField(choices=["mps", "none", "partial"],
                                          help_text="mps: every shared GPU of the model runs MPS; none: none does; "
                                                    "partial: some do (the lease says which kind it got)")
    mps_gpus = serializers.IntegerField()
    unenforced_gpus = serializers.IntegerField()
    detail = serializers.CharField(help_text="what it means, in a sentence")


class QuoteOutput(serializers.Serializer):
    outcome = serializers.ChoiceField(choices=["fits", "reclaims", "waits"],
                                      help_text="fits: placed at the next cycle; reclaims: placed once over-quota "
                                                "work of others has had its preemption notice; waits: queued")
    reason = serializers.CharField(help_text="the scheduler's reason, in the tenant's words")
    project = serializers.CharField()
    tier = serializers.CharField(allow_blank=True, help_text="the GPU model it would run on (when it waits: the "
                                                             "first whose quota admits it now)")
    gpu = serializers.SerializerMethodField()
    units_milli = serializers.IntegerField(help_text="what it counts against the quota of tier")
    over_quota = serializers.BooleanField()
    preemption_risk = serializers.CharField(help_text="what over_quota means for this request, in a sentence")
    guarantee_covered = serializers.BooleanField(
        allow_null=True, help_text="whether the project's guarantee would cover it, the project's own queued requests "
                                   "ahead of it counted: only covered leases are time-to-GPU samples of the SLO "
                                   "(docs/billing.md, \"SLO evaluation\"); null when no plan was made (a suspended "
                                   "tenant)")
    preemption_notice_seconds = serializers.IntegerField(allow_null=True, help_text="the notice it would get "
                                                         "before a preemption (over quota only)")
    queue_position = serializers.IntegerField(allow_null=True)
    expected_wait_seconds = serializers.IntegerField(
        allow_null=True, help_text="0 when it fits; when it reclaims, the longest notice its victims are promised "
                                   "(at most); when it waits, the time to estimated_start; null when it waits and "
                                   "no estimate can be made (docs/scheduling.md, \"Estimated start times\")")
    estimated_start = serializers.DateTimeField(
        allow_null=True, help_text="when it waits: when it would start, were the running leases to leave at their "
                                   "expiry and nothing else arrive; null otherwise or when it cannot be estimated")
    price = QuotePriceOutput(allow_null=True)
    price_unavailable_reason = serializers.CharField(allow_null=True, help_text="why price is null")
    budget = QuoteBudgetOutput()
    share_enforcement = ShareEnforcementOutput(
        allow_null=True, help_text="a share request only (else null): whether a share's compute and memory limits "
                                   "would hold on the model's shared GPUs (MPS) or not (docs/leasing.md)")

    @extend_schema_field(GPU_OUTPUT_SCHEMA)
    def get_gpu(self, obj) -> dict:
        return obj.gpu
