from django.db import models


class TenantStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    SUSPENDED = "suspended", "Suspended"


class Role(models.TextChoices):
    """Roles inside one tenant, from most to least powerful."""

    OWNER = "owner", "Owner"
    ADMIN = "admin", "Admin"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"


ROLE_RANK = {Role.VIEWER: 0, Role.MEMBER: 1, Role.ADMIN: 2, Role.OWNER: 3}
# the roles a membership may be limited to named projects in; admins and owners manage the whole tenant
PROJECT_LIMITABLE_ROLES = [Role.VIEWER.value, Role.MEMBER.value]


class TokenScope(models.TextChoices):
    READ = "read", "Read"
    WRITE = "write", "Write"


class SloMetric(models.TextChoices):
    """What a credit step of an SLO contract is measured on.

    ``time_to_gpu_p95``: p95 seconds from request to ACTIVE of in-quota requests; credit when above the
    step's threshold. ``availability``: percent of ACTIVE lease time not lost involuntarily; credit
    when below. ``preemption_notice``: percent of preemptions that gave the full notice; credit when
    below.
    """

    TIME_TO_GPU_P95 = "time_to_gpu_p95", "Time to GPU, p95 (seconds)"
    AVAILABILITY = "availability", "Availability of active leases (%)"
    PREEMPTION_NOTICE = "preemption_notice", "Preemptions with full notice (%)"


# ISO 4217 codes accepted for billing. Amounts are stored in each currency's minor unit.
CURRENCIES = ("USD", "EUR", "GBP", "CHF", "JPY", "CAD", "AUD", "SEK", "NOK", "DKK", "SGD", "INR", "CNY")
