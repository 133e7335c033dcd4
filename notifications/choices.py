from django.db import models


class EventKind(models.TextChoices):
    """What a tenant can subscribe to. Lease kinds come from ``broker.models.LeaseEvent`` rows (the outbox), but
    ``lease.expiring``, which ``leases_expiring_notify`` makes from the clock; ``advice`` from
    ``notification_emit`` (the capacity loop); ``spend.alert`` from billing's spend alerts and
    ``usage.lease_hour`` (CloudEvents 1.0) from the metered usage rows, both told by their own outbox runs."""

    LEASE_NOTICE = "lease.notice", "Notice given (preemption or reclaim deadline)"
    LEASE_PREEMPTED = "lease.preempted", "Preempted and back in the queue"
    LEASE_REQUEUED = "lease.requeued", "Back in the queue (provisioning did not finish)"
    LEASE_ACTIVE = "lease.active", "Active"
    LEASE_EXPIRING = "lease.expiring", "Ends soon (LEASE_EXPIRING_NOTICE_SECONDS before its end)"
    LEASE_RELEASED = "lease.released", "Released"
    LEASE_EXPIRED = "lease.expired", "Expired"
    LEASE_FAILED = "lease.failed", "Failed"
    ADVICE = "advice", "Advice"
    CREDIT_EXPIRING = "credit.expiring", "Prepaid credit expires soon (BILLING_CREDIT_EXPIRY_NOTICE_DAYS)"
    DUNNING_REMINDER = "dunning.reminder", "An invoice's payment failed: a reminder"
    DUNNING_RESTRICTED = "dunning.restricted", "Unpaid past the grace period: new lease requests are refused"
    DUNNING_RESOLVED = "dunning.resolved", "The unpaid invoice was settled: requests are admitted again"
    SPEND_ALERT = "spend.alert", "Spend alert (a threshold of a cap or budget reached)"
    USAGE_LEASE_HOUR = "usage.lease_hour", "Usage: one metered lease-hour (a CloudEvent)"


# what the lease holder is e-mailed about (unless they opted out)
EMAIL_KINDS = frozenset({EventKind.LEASE_NOTICE, EventKind.LEASE_PREEMPTED, EventKind.LEASE_FAILED,
                         EventKind.LEASE_EXPIRING})


class Channel(models.TextChoices):
    WEBHOOK = "webhook", "Webhook"
    EMAIL = "email", "E-mail"


class DeliveryStatus(models.TextChoices):
    """PENDING: to be sent at ``next_attempt_at`` (again, after a failure that may pass). SUCCEEDED: the
    receiver answered 2xx (e-mail: handed to the mail backend). FAILED: given up."""

    PENDING = "pending", "Pending"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
