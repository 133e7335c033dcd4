"""Billing data: metered usage, price books, invoices, SLO evaluations, spend caps and the Stripe mirror.

Metering rows are unique per (lease, hour) and written by upsert, so metering any window again changes
nothing. Rates are ``Decimal``; amounts are integer minor units of the invoice currency. A finalized
invoice and its lines cannot change: triggers (migration 0003) refuse it, whatever code tries.
"""

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import F, Q

from billing.choices import (
    AlertBasis,
    CapAction,
    CreditNoteReason,
    DunningState,
    InvoiceStatus,
    LineKind,
    MeterSource,
    RateKind,
    StripeState,
)


class AllocationUsage(models.Model):
    tenant_lookup = "tenant"

    # tenant and project are copies of the lease's (the metering statement takes them from it), kept for the
    # invoice's query; the database guards them through the lease, and the lease's own foreign keys to its
    # tenant and project. Per-row foreign-key checks and single-column indexes cost more than the rest of a
    # row's insert (measurements for issue 16: docs/billing.md), so:
    # - the lease is checked once per statement, not per row: triggers of migration 0005 (a usage row's lease
    #   must exist, locked FOR KEY SHARE as a foreign key would; a lease with usage cannot be deleted);
    # - the project needs no index: a project with usage has leases, whose PROTECT refuses its deletion;
    # - the primary key is (lease, hour_start), the row's identity, not a surrogate id: one index and one sequence
    #   step less per row (≈ 1.1 µs of PostgreSQL CPU of ≈ 6.7 per row written; migration 0007, docs/billing.md);
    # (tenant, hour_start) and the primary key (lease, hour_start) serve the lookups.
    pk = models.CompositePrimaryKey("lease", "hour_start")
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="usage", db_index=False,
                               db_constraint=False)
    project = models.ForeignKey("tenants.Project", on_delete=models.DO_NOTHING, related_name="usage",
                                db_index=False, db_constraint=False)
    lease = models.ForeignKey("broker.Lease", on_delete=models.PROTECT, related_name="usage", db_index=False,
                              db_constraint=False)
    hour_start = models.DateTimeField()
    seconds = models.DecimalField(max_digits=10, decimal_places=6)  # ≤ 3600, microseconds exact
    tier = models.CharField(max_length=32)
    kind = models.CharField(max_length=8)
    mig_profile = models.CharField(max_length=32, blank=True)
    gpu_milli = models.PositiveIntegerField()  # quota units held (whole 1000, MIG compute/7, share milli)
    memory_mib = models.PositiveIntegerField()  # real memory held
    workload_class = models.CharField(max_length=16)
    over_quota = models.BooleanField()
    profiling = models.BooleanField(default=False)  # a profiling lease's: the price book's profiling rate
    metered_at = models.DateTimeField()
    labels = models.JSONField(default=dict, db_default={})  # the lease's cost allocation labels (issue 33)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(seconds__gte=0) & Q(seconds__lte=3600), name="usage_seconds_in_hour"),
        ]
        indexes = [models.Index(fields=["tenant", "hour_start"])]

    def __str__(self) -> str:
        return f"lease {self.lease_id} {self.hour_start:%Y-%m-%d %H}:00 {self.seconds} s"


class UtilisationUsage(models.Model):
    """What a lease did with its capacity in one UTC hour, from Prometheus (DCGM metrics): the average
    engine-active fraction over its consumers, average framebuffer used and the energy apportioned to it
    (a MIG instance gets its GPU's energy by compute-slice share; a share by milli)."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="+")
    lease = models.ForeignKey("broker.Lease", on_delete=models.PROTECT, related_name="utilisation")
    hour_start = models.DateTimeField()
    engine_active_avg = models.DecimalField(max_digits=7, decimal_places=6, null=True)  # 0..1
    fb_used_avg_mib = models.DecimalField(max_digits=12, decimal_places=3, null=True)
    energy_wh = models.DecimalField(max_digits=16, decimal_places=6, null=True)
    samples = models.PositiveIntegerField(default=0)
    metered_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["lease", "hour_start"], name="utilisation_one_row_per_lease_hour"),
            models.CheckConstraint(condition=Q(engine_active_avg__isnull=True)
                                   | (Q(engine_active_avg__gte=0) & Q(engine_active_avg__lte=1)),
                                   name="utilisation_engine_active_fraction"),
        ]
        indexes = [models.Index(fields=["tenant", "hour_start"])]

    def __str__(self) -> str:
        return f"lease {self.lease_id} {self.hour_start:%Y-%m-%d %H}:00 utilisation"


class MeterWindow(models.Model):
    """One hour of one meter: open until every source answered for it (Prometheus down or late keeps a
    utilisation window open; a later run fills it). ``closed_at`` null = still to do."""

    source = models.CharField(max_length=16, choices=MeterSource.choices)
    hour_start = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    rows = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["source", "hour_start"]
        constraints = [
            models.UniqueConstraint(fields=["source", "hour_start"], name="meterwindow_unique"),
            models.CheckConstraint(condition=Q(source__in=MeterSource.values), name="meterwindow_source_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.source} {self.hour_start:%Y-%m-%d %H}:00 {'closed' if self.closed_at else 'open'}"


class PriceBook(models.Model):
    """Prices in force from ``effective_from`` until the next book of the same scope (the general list in
    one currency, or one tenant's own list). Multipliers apply to the base rate of a line."""

    name = models.CharField(max_length=100)
    currency = models.CharField(max_length=3, default="USD")
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, null=True, blank=True,
                               related_name="price_books", help_text="Empty: the general price list.")
    effective_from = models.DateTimeField()
    over_quota_multiplier = models.DecimalField(max_digits=6, decimal_places=4, default="0.6000",
                                                help_text="Preemptible (over-quota) work pays base × this.")
    interactive_multiplier = models.DecimalField(max_digits=6, decimal_places=4, default="1.2500",
                                                 help_text="Interactive reservations pay base × this.")
    profiling_multiplier = models.DecimalField(max_digits=6, decimal_places=4, default="1.0000",
                                               help_text="Profiling leases (auto-tiering measuring a workload "
                                                         "on a tier) pay base × this: the profiling rate.")
    energy_per_kwh = models.DecimalField(max_digits=10, decimal_places=6, null=True, blank=True,
                                         help_text="Optional energy pass-through per kWh.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["currency", "-effective_from"]
        constraints = [
            models.UniqueConstraint(fields=["currency", "effective_from"], condition=Q(tenant__isnull=True),
                                    name="pricebook_one_general_per_start"),
            models.UniqueConstraint(fields=["tenant", "effective_from"], condition=Q(tenant__isnull=False),
                                    name="pricebook_one_tenant_per_start"),
            models.CheckConstraint(condition=Q(over_quota_multiplier__gt=0) & Q(interactive_multiplier__gt=0),
                                   name="pricebook_multipliers_positive"),
            models.CheckConstraint(condition=Q(profiling_multiplier__gt=0), name="pricebook_profiling_positive"),
            models.CheckConstraint(condition=Q(energy_per_kwh__isnull=True) | Q(energy_per_kwh__gte=0),
                                   name="pricebook_energy_nonnegative"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.currency}, from {self.effective_from:%Y-%m-%d})"


class PriceRate(models.Model):
    """A base price per hour: a whole GPU of ``tier``, one MIG instance of ``mig_profile`` (when absent,
    the whole-GPU rate × compute slices / 7), or a whole GPU's worth of shares (when absent, the
    whole-GPU rate)."""

    book = models.ForeignKey(PriceBook, on_delete=models.CASCADE, related_name="rates")
    tier = models.CharField(max_length=32)
    kind = models.CharField(max_length=8, choices=RateKind.choices, default=RateKind.WHOLE)
    mig_profile = models.CharField(max_length=32, blank=True)
    per_hour = models.DecimalField(max_digits=14, decimal_places=6)

    class Meta:
        ordering = ["book_id", "tier", "kind", "mig_profile"]
        constraints = [
            models.UniqueConstraint(fields=["book", "tier", "kind", "mig_profile"], name="pricerate_unique"),
            models.CheckConstraint(condition=Q(per_hour__gte=0), name="pricerate_nonnegative"),
            models.CheckConstraint(condition=Q(kind__in=RateKind.values), name="pricerate_kind_valid"),
            models.CheckConstraint(condition=(Q(kind=RateKind.MIG) & ~Q(mig_profile=""))
                                   | (~Q(kind=RateKind.MIG) & Q(mig_profile="")),
                                   name="pricerate_profile_iff_mig"),
        ]

    def __str__(self) -> str:
        return f"{self.tier} {self.mig_profile or self.kind}: {self.per_hour}/h"


class BillingTerms(models.Model):
    """A tenant's commercial terms from ``effective_from``: a discount on usage and a committed monthly
    minimum (a shortfall is billed as a line of its own)."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="billing_terms")
    effective_from = models.DateTimeField()
    discount_pct = models.DecimalField(max_digits=5, decimal_places=2, default=0)
    monthly_commit_minor = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["tenant_id", "-effective_from"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "effective_from"], name="billingterms_one_per_start"),
            models.CheckConstraint(condition=Q(discount_pct__gte=0) & Q(discount_pct__lte=100),
                                   name="billingterms_discount_range"),
            models.CheckConstraint(condition=Q(monthly_commit_minor__gte=0), name="billingterms_commit_nonneg"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} from {self.effective_from:%Y-%m-%d}: -{self.discount_pct}%"


class SpendCap(models.Model):
    """A monthly spend cap for a tenant (project empty) or one project: a request whose forecast would
    take the month's spend over it is refused (or only warned)."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="spend_caps")
    project = models.ForeignKey("tenants.Project", on_delete=models.CASCADE, null=True, blank=True,
                                related_name="spend_caps")
    monthly_minor = models.BigIntegerField()
    action = models.CharField(max_length=8, choices=CapAction.choices, default=CapAction.REFUSE)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant"], condition=Q(project__isnull=True),
                                    name="spendcap_one_per_tenant"),
            models.UniqueConstraint(fields=["project"], condition=Q(project__isnull=False),
                                    name="spendcap_one_per_project"),
            models.CheckConstraint(condition=Q(monthly_minor__gt=0), name="spendcap_positive"),
            models.CheckConstraint(condition=Q(action__in=CapAction.values), name="spendcap_action_valid"),
        ]

    def __str__(self) -> str:
        return f"cap {self.monthly_minor} ({self.action}) for {self.project_id or self.tenant_id}"


class Invoice(models.Model):
    """One per tenant per calendar month (UTC). A draft is recomputed by every ``invoice_run``; once
    finalized its lines and amounts never change (corrections go into a later invoice)."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="invoices")
    period = models.DateField(help_text="First day of the month billed (UTC).")
    currency = models.CharField(max_length=3)
    status = models.CharField(max_length=12, choices=InvoiceStatus.choices, default=InvoiceStatus.DRAFT)
    number = models.CharField(max_length=32, unique=True, null=True, blank=True)
    subtotal_minor = models.BigIntegerField(default=0)  # usage + energy + commit + corrections
    discount_minor = models.BigIntegerField(default=0)  # ≤ 0
    credit_minor = models.BigIntegerField(default=0)  # SLO credits, ≤ 0
    total_minor = models.BigIntegerField(default=0)
    computed_at = models.DateTimeField()
    finalized_at = models.DateTimeField(null=True, blank=True)
    paid_at = models.DateTimeField(null=True, blank=True)
    voided_at = models.DateTimeField(null=True, blank=True)
    payment_error = models.TextField(blank=True)
    stripe_invoice_id = models.CharField(max_length=64, blank=True)
    stripe_state = models.CharField(max_length=8, choices=StripeState.choices, default=StripeState.NOT_SENT,
                                    blank=True)
    stripe_attempts = models.PositiveIntegerField(default=0)
    stripe_error = models.TextField(blank=True)
    stripe_event_at = models.DateTimeField(null=True, blank=True, help_text="Newest Stripe event applied.")
    stripe_balance_transaction_id = models.CharField(
        max_length=64, blank=True, help_text="The Stripe customer balance transaction that carries the prepaid "
                                             "credit drawn by this invoice (applied by Stripe at finalization).")

    class Meta:
        ordering = ["-period", "tenant_id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "period"], name="invoice_one_per_tenant_month"),
            models.CheckConstraint(condition=Q(status__in=InvoiceStatus.values), name="invoice_status_valid"),
            models.CheckConstraint(condition=Q(period__day=1), name="invoice_period_first_of_month"),
            models.CheckConstraint(
                condition=Q(total_minor=F("subtotal_minor") + F("discount_minor") + F("credit_minor")),
                name="invoice_total_adds_up"),
            models.CheckConstraint(condition=Q(status=InvoiceStatus.DRAFT) | Q(finalized_at__isnull=False),
                                   name="invoice_finalized_has_time"),
        ]

    def __str__(self) -> str:
        return self.number or f"draft {self.tenant_id} {self.period:%Y-%m}"


class InvoiceLine(models.Model):
    """One line: usage by project × model/profile × class × over-quota, with the utilisation beside the
    allocation; or an energy, discount, committed-minimum, SLO-credit or correction line with evidence."""

    tenant_lookup = "invoice__tenant"

    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    position = models.PositiveIntegerField()
    kind = models.CharField(max_length=12, choices=LineKind.choices)
    description = models.CharField(max_length=300)
    project = models.ForeignKey("tenants.Project", on_delete=models.PROTECT, null=True, blank=True,
                                related_name="+")
    tier = models.CharField(max_length=32, blank=True)
    mig_profile = models.CharField(max_length=32, blank=True)
    workload_class = models.CharField(max_length=16, blank=True)
    over_quota = models.BooleanField(default=False)
    profiling = models.BooleanField(default=False)  # profiling leases' usage, at the profiling rate
    unit = models.CharField(max_length=40)
    quantity = models.DecimalField(max_digits=18, decimal_places=6)
    unit_price = models.DecimalField(max_digits=18, decimal_places=6)
    amount_minor = models.BigIntegerField()
    gpu_hours = models.DecimalField(max_digits=18, decimal_places=6, default=0)  # whole-GPU equivalents
    engine_active_avg = models.DecimalField(max_digits=7, decimal_places=6, null=True, blank=True)
    memory_used_avg_mib = models.DecimalField(max_digits=12, decimal_places=3, null=True, blank=True)
    idle_gpu_hours = models.DecimalField(max_digits=18, decimal_places=6, null=True, blank=True)
    evidence = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["invoice_id", "position"]
        constraints = [
            models.UniqueConstraint(fields=["invoice", "position"], name="invoiceline_position_unique"),
            models.CheckConstraint(condition=Q(kind__in=LineKind.values), name="invoiceline_kind_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.invoice_id}#{self.position} {self.description}"


class SloEvaluation(models.Model):
    """A tenant's SLO result for one month under its contract: each metric measured, the credit steps
    reached and the credit owed (as a percent of the period's charges)."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="slo_evaluations")
    contract = models.ForeignKey("tenants.SloContract", on_delete=models.PROTECT, related_name="evaluations")
    period = models.DateField()
    time_to_gpu_p95_seconds = models.DecimalField(max_digits=12, decimal_places=3, null=True)
    in_quota_requests = models.PositiveIntegerField(default=0)
    availability_pct = models.DecimalField(max_digits=7, decimal_places=3, null=True)
    preemption_notice_pct = models.DecimalField(max_digits=7, decimal_places=3, null=True)
    preemptions = models.PositiveIntegerField(default=0)
    credit_pct = models.DecimalField(max_digits=5, decimal_places=2, default=0)
    evidence = models.JSONField(default=dict)
    evaluated_at = models.DateTimeField()

    class Meta:
        ordering = ["-period", "tenant_id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "period"], name="sloevaluation_one_per_tenant_month"),
            models.CheckConstraint(condition=Q(credit_pct__gte=0) & Q(credit_pct__lte=100),
                                   name="sloevaluation_credit_range"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.period:%Y-%m}: credit {self.credit_pct}%"


class BillingAccount(models.Model):
    """The tenant's customer at the payment provider (Stripe)."""

    tenant_lookup = "tenant"

    tenant = models.OneToOneField("tenants.Tenant", on_delete=models.PROTECT, related_name="billing_account")
    stripe_customer_id = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.tenant_id} → {self.stripe_customer_id}"


class StripeEvent(models.Model):
    """A webhook event received from Stripe, once per event id (replays are recognised and ignored)."""

    event_id = models.CharField(max_length=64, unique=True)
    type = models.CharField(max_length=64)
    created = models.DateTimeField(help_text="When Stripe created the event (orders out-of-order events).")
    received_at = models.DateTimeField()
    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, null=True, blank=True, related_name="events")
    outcome = models.CharField(max_length=200, blank=True)
    payload = models.JSONField()

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.event_id} {self.type}"


# -- corrections after finalisation, payments and prepaid credits (issue 33 items 1, 2) -------------------------
# Every row below is immutable once written: triggers of migration 0008 refuse updates and deletes (a credit note
# keeps only its Stripe bookkeeping writable; a grant only its expiry notice), and the limits that keep a balance
# true (credit notes ≤ the invoice's total, a line's credits ≤ the line, refunds ≤ the payment, draws ≤ the grant).
# An invoice's balance due = total − credit notes − credits drawn − payments + refunds (billing.selectors.balances).


class CreditNote(models.Model):
    """A credit against a finalized (or paid) invoice, the whole of it or some of its lines, with a reason
    (Stripe's credit note). ``amount_minor`` is the sum of its lines (checked at commit by the database)."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="credit_notes")
    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="credit_notes")
    number = models.CharField(max_length=40, unique=True)
    currency = models.CharField(max_length=3)
    reason = models.CharField(max_length=24, choices=CreditNoteReason.choices)
    memo = models.CharField(max_length=500)
    voids_invoice = models.BooleanField(default=False, help_text="Issued by a local void of the invoice.")
    amount_minor = models.BigIntegerField()
    issued_at = models.DateTimeField()
    issued_by = models.ForeignKey("auth.User", on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    # Stripe bookkeeping (the only columns the immutability trigger lets change): pushed after its invoice is
    # (billing.services.stripe_sync.credit_note_push), as Invoice keeps stripe_invoice_id / state / attempts / error
    stripe_credit_note_id = models.CharField(max_length=64, blank=True)
    stripe_state = models.CharField(max_length=8, choices=StripeState.choices, default=StripeState.NOT_SENT,
                                    blank=True)
    stripe_attempts = models.PositiveIntegerField(default=0)
    stripe_error = models.TextField(blank=True)

    class Meta:
        ordering = ["-issued_at", "-pk"]
        constraints = [
            models.CheckConstraint(condition=Q(amount_minor__gt=0), name="creditnote_amount_positive"),
            models.CheckConstraint(condition=Q(reason__in=CreditNoteReason.values), name="creditnote_reason_valid"),
        ]

    def __str__(self) -> str:
        return self.number


class CreditNoteLine(models.Model):
    """What a credit note credits: part or all of one invoice line (``invoice_line``), or of the invoice's
    total where no line is named (a whole-invoice credit, a void)."""

    tenant_lookup = "credit_note__tenant"

    credit_note = models.ForeignKey(CreditNote, on_delete=models.PROTECT, related_name="lines")
    invoice_line = models.ForeignKey(InvoiceLine, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    description = models.CharField(max_length=300)
    amount_minor = models.BigIntegerField()

    class Meta:
        ordering = ["credit_note_id", "pk"]
        constraints = [models.CheckConstraint(condition=Q(amount_minor__gt=0), name="creditnoteline_amount_positive")]

    def __str__(self) -> str:
        return f"{self.credit_note_id}: {self.description}"


class Payment(models.Model):
    """Money received against an invoice (Stripe's ``invoice.paid``, or recorded by staff: a bank transfer)."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="payments")
    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="payments")
    currency = models.CharField(max_length=3)
    amount_minor = models.BigIntegerField()
    received_at = models.DateTimeField()
    reference = models.CharField(max_length=100, blank=True, help_text="Stripe charge/invoice id, bank reference.")
    recorded_by = models.ForeignKey("auth.User", on_delete=models.PROTECT, null=True, blank=True, related_name="+")

    class Meta:
        ordering = ["-received_at", "-pk"]
        constraints = [models.CheckConstraint(condition=Q(amount_minor__gt=0), name="payment_amount_positive")]

    def __str__(self) -> str:
        return f"payment {self.amount_minor} {self.currency} on {self.invoice_id}"


class Refund(models.Model):
    """Money given back from one payment (never more than the payment, all refunds together)."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="refunds")
    payment = models.ForeignKey(Payment, on_delete=models.PROTECT, related_name="refunds")
    amount_minor = models.BigIntegerField()
    reason = models.CharField(max_length=300)
    refunded_at = models.DateTimeField()
    reference = models.CharField(max_length=100, blank=True)
    recorded_by = models.ForeignKey("auth.User", on_delete=models.PROTECT, null=True, blank=True, related_name="+")

    class Meta:
        ordering = ["-refunded_at", "-pk"]
        constraints = [models.CheckConstraint(condition=Q(amount_minor__gt=0), name="refund_amount_positive")]

    def __str__(self) -> str:
        return f"refund {self.amount_minor} of payment {self.payment_id}"


class CreditGrant(models.Model):
    """Prepaid credit (Lago's wallet, Stripe's credit grant): ``amount_minor`` of ``currency`` that invoices
    draw down at finalisation, lowest ``priority`` first, then the soonest expiry; nothing is drawn after
    ``expires_at``. The remaining balance is the amount less its draws."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="credit_grants")
    currency = models.CharField(max_length=3)
    amount_minor = models.BigIntegerField()
    priority = models.PositiveSmallIntegerField(default=0, help_text="Lower draws first.")
    expires_at = models.DateTimeField(null=True, blank=True)
    granted_at = models.DateTimeField()
    reason = models.CharField(max_length=300)
    granted_by = models.ForeignKey("auth.User", on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    expiry_notified_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tenant_id", "priority", "expires_at", "pk"]
        constraints = [
            models.CheckConstraint(condition=Q(amount_minor__gt=0), name="creditgrant_amount_positive"),
            models.CheckConstraint(condition=Q(expires_at__isnull=True) | Q(expires_at__gt=F("granted_at")),
                                   name="creditgrant_expires_after_grant"),
        ]

    def __str__(self) -> str:
        return f"grant {self.amount_minor} {self.currency} to {self.tenant_id}"


class CreditDraw(models.Model):
    """What one invoice drew from one grant at its finalisation."""

    tenant_lookup = "grant__tenant"

    grant = models.ForeignKey(CreditGrant, on_delete=models.PROTECT, related_name="draws")
    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="credit_draws")
    amount_minor = models.BigIntegerField()
    drawn_at = models.DateTimeField()

    class Meta:
        ordering = ["invoice_id", "pk"]
        constraints = [
            models.UniqueConstraint(fields=["grant", "invoice"], name="creditdraw_once_per_grant_invoice"),
            models.CheckConstraint(condition=Q(amount_minor__gt=0), name="creditdraw_amount_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.amount_minor} from grant {self.grant_id} to invoice {self.invoice_id}"


# -- dunning (issue 33 item 7) ----------------------------------------------------------------------------------
class DunningTerms(models.Model):
    """A tenant's dunning schedule (else the settings' defaults): reminders ``reminder_days`` after a failed
    payment, new lease requests refused ``grace_days`` after it, and, only when ``stop_running_leases``, the
    running leases released then too."""

    tenant_lookup = "tenant"

    tenant = models.OneToOneField("tenants.Tenant", on_delete=models.CASCADE, related_name="dunning_terms")
    reminder_days = models.JSONField(default=list, help_text="Days after the failed payment, e.g. [1, 3, 7].")
    grace_days = models.PositiveIntegerField(default=14)
    stop_running_leases = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"dunning of {self.tenant_id}: reminders {self.reminder_days}, grace {self.grace_days} d"


class DunningCase(models.Model):
    """One unpaid invoice being dunned: opened by a failed payment, reminders on the schedule copied from the
    terms then, restricted after the grace period, resolved when the invoice is settled (every step audited
    and notified)."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="dunning_cases")
    invoice = models.OneToOneField(Invoice, on_delete=models.PROTECT, related_name="dunning")
    state = models.CharField(max_length=12, choices=DunningState.choices, default=DunningState.OPEN)
    started_at = models.DateTimeField()
    reminder_days = models.JSONField(default=list)
    reminders_sent = models.PositiveIntegerField(default=0)
    next_reminder_at = models.DateTimeField(null=True, blank=True)
    grace_ends_at = models.DateTimeField()
    stop_running_leases = models.BooleanField(default=False)
    restricted_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at"]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=DunningState.values), name="dunningcase_state_valid"),
            models.CheckConstraint(condition=~Q(state=DunningState.RESTRICTED) | Q(restricted_at__isnull=False),
                                   name="dunningcase_restricted_has_time"),
        ]
        indexes = [models.Index(fields=["tenant", "state"])]

    def __str__(self) -> str:
        return f"dunning {self.invoice_id} ({self.state})"


# -- taxes (issue 33 item 3) --------------------------------------------------------------------------------------
class TaxProfile(models.Model):
    """A tenant's tax identity: its tax id (VAT number, EIN …) printed on invoices, and whether its invoices are
    reverse-charged (no tax charged; ``legal_note`` printed, e.g. "VAT reverse charge, Art. 196 Directive
    2006/112/EC")."""

    tenant_lookup = "tenant"

    tenant = models.OneToOneField("tenants.Tenant", on_delete=models.CASCADE, related_name="tax_profile")
    tax_id = models.CharField(max_length=40, blank=True)
    reverse_charge = models.BooleanField(default=False)
    legal_note = models.CharField(max_length=300, blank=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(reverse_charge=False) | ~Q(legal_note=""),
                                              name="taxprofile_reverse_charge_has_note")]

    def __str__(self) -> str:
        return f"{self.tenant_id} tax id {self.tax_id or '—'}"


class TaxRate(models.Model):
    """A tax rate that applies to a tenant's invoices (Stripe's tax rate): ``percentage`` of the net, added
    (exclusive) or already inside the amounts (inclusive). Inactive rates tax nothing from then on; invoices
    already built keep their tax lines (a finalized one never changes)."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="tax_rates")
    jurisdiction = models.CharField(max_length=40, help_text="e.g. DE, US-CA")
    name = models.CharField(max_length=60, help_text="e.g. VAT, Sales tax")
    percentage = models.DecimalField(max_digits=7, decimal_places=4)
    inclusive = models.BooleanField(default=False)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField()
    stripe_tax_rate_id = models.CharField(max_length=64, blank=True,
                                          help_text="Its Stripe tax rate (created on first push, reused after).")

    class Meta:
        ordering = ["tenant_id", "pk"]
        constraints = [
            models.CheckConstraint(condition=Q(percentage__gte=0) & Q(percentage__lte=100),
                                   name="taxrate_percentage_range"),
            models.UniqueConstraint(fields=["tenant", "jurisdiction", "name"], condition=Q(active=True),
                                    name="taxrate_one_active_per_name"),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.jurisdiction} {self.percentage} %"


# -- wave 10: cost allocation and spend alerts (issue 33) ----------------------------------------------------
class SpendAlertRule(models.Model):
    """When a tenant (project empty) or one project is alerted about its month's spend: at each of
    ``thresholds_pct`` of its budget (``budget_minor``; empty: its spend cap's amount), on the spend and — with
    ``forecast`` — on the forecast. A scope with a cap and no rule is alerted at ``SPEND_ALERT_DEFAULT_THRESHOLDS``."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="spend_alert_rules")
    project = models.ForeignKey("tenants.Project", on_delete=models.CASCADE, null=True, blank=True,
                                related_name="spend_alert_rules")
    budget_minor = models.BigIntegerField(null=True, blank=True,
                                          help_text="Empty: the scope's spend cap is the base of the percentages.")
    thresholds_pct = ArrayField(models.PositiveSmallIntegerField(), default=list)
    forecast = models.BooleanField(default=True)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant"], condition=Q(project__isnull=True),
                                    name="spendalertrule_one_per_tenant"),
            models.UniqueConstraint(fields=["project"], condition=Q(project__isnull=False),
                                    name="spendalertrule_one_per_project"),
            models.CheckConstraint(condition=Q(budget_minor__isnull=True) | Q(budget_minor__gt=0),
                                   name="spendalertrule_budget_positive"),
            models.CheckConstraint(condition=Q(thresholds_pct__len__gte=1), name="spendalertrule_has_thresholds"),
        ]

    def __str__(self) -> str:
        return f"alerts {self.thresholds_pct} for {self.project_id or self.tenant_id}"


class SpendAlert(models.Model):
    """One alert raised: a scope's spend (or forecast) reached ``threshold_pct`` of its base in ``period``, or its
    carried-over leases' forecast passed its cap at the month boundary. Once per (scope, period, basis,
    threshold): the unique constraints make a second evaluation raise nothing. The notification outbox tells it
    (webhook ``spend.alert`` and e-mail to the tenant's admins)."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="spend_alerts")
    project = models.ForeignKey("tenants.Project", on_delete=models.CASCADE, null=True, blank=True,
                                related_name="spend_alerts")
    period = models.DateField()
    basis = models.CharField(max_length=8, choices=AlertBasis.choices)
    threshold_pct = models.PositiveSmallIntegerField()
    base_minor = models.BigIntegerField()
    amount_minor = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    message = models.CharField(max_length=300)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "period", "basis", "threshold_pct"],
                                    condition=Q(project__isnull=True), name="spendalert_once_per_tenant_period"),
            models.UniqueConstraint(fields=["project", "period", "basis", "threshold_pct"],
                                    condition=Q(project__isnull=False), name="spendalert_once_per_project_period"),
            models.CheckConstraint(condition=Q(basis__in=AlertBasis.values), name="spendalert_basis_valid"),
            models.CheckConstraint(condition=Q(period__day=1), name="spendalert_period_first_of_month"),
        ]

    def __str__(self) -> str:
        return f"{self.basis} {self.threshold_pct}% {self.period:%Y-%m} for {self.project_id or self.tenant_id}"
