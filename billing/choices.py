from django.db import models


class InvoiceStatus(models.TextChoices):
    """Draft (recomputed by every run) → finalized (immutable, sent) → paid | void."""

    DRAFT = "draft", "Draft"
    FINALIZED = "finalized", "Finalized"
    PAID = "paid", "Paid"
    VOID = "void", "Void"


class LineKind(models.TextChoices):
    USAGE = "usage", "GPU usage"
    ENERGY = "energy", "Energy pass-through"
    DISCOUNT = "discount", "Discount"
    COMMIT = "commit", "Committed-use minimum"
    SLO_CREDIT = "slo_credit", "SLO credit"
    CORRECTION = "correction", "Correction of an earlier invoice"
    TAX = "tax", "Tax"


class RateKind(models.TextChoices):
    """What a price-book rate is per hour of: a whole GPU, one MIG instance of a profile, or the
    equivalent of one whole GPU in shares (a 250-milli share costs a quarter of it)."""

    WHOLE = "whole", "Whole GPU-hour"
    MIG = "mig", "MIG instance-hour"
    SHARE = "share", "Shared GPU-hour (per 1000 milli)"


class StripeState(models.TextChoices):
    NOT_SENT = "", "Not sent"
    SENDING = "sending", "Sending"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed (will retry)"


class CapAction(models.TextChoices):
    REFUSE = "refuse", "Refuse requests over the cap"
    WARN = "warn", "Warn only"


class MeterSource(models.TextChoices):
    ALLOCATION = "allocation", "Allocation (lease events)"
    UTILISATION = "utilisation", "Utilisation (Prometheus)"


class CreditNoteReason(models.TextChoices):
    """Why a finalized invoice is credited: Stripe's ``credit_note.reason`` values."""

    DUPLICATE = "duplicate", "Duplicate charge"
    FRAUDULENT = "fraudulent", "Fraudulent charge"
    ORDER_CHANGE = "order_change", "Order change (a void, a corrected price)"
    PRODUCT_UNSATISFACTORY = "product_unsatisfactory", "Service unsatisfactory"


class DunningState(models.TextChoices):
    """OPEN: a payment failed, reminders go out on the terms' schedule. RESTRICTED: the grace period passed, the
    tenant's new lease requests are refused. RESOLVED: the invoice was settled (paid, credited or voided)."""

    OPEN = "open", "Reminding"
    RESTRICTED = "restricted", "Restricted (new requests refused)"
    RESOLVED = "resolved", "Resolved"


class AlertBasis(models.TextChoices):
    """What a spend alert measured: the month's metered spend, its forecast (spend + the live leases to their end),
    or the month-boundary check of the leases carried into a new month against its cap."""

    SPENT = "spent", "Spend"
    FORECAST = "forecast", "Forecast"
    BOUNDARY = "boundary", "Carried-over leases at the month boundary"
