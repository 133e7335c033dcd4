"""Tenants, their projects (queues), members, API tokens, quotas and SLO contracts.

Every rule that the database can hold is a constraint here, so that two racing workers or a stray
script cannot break it: slugs and currency codes by CHECK, uniqueness per tenant, ``limit >= deserved``,
non-overlapping SLO contracts by an exclusion constraint, and the two-level quota bound (the sum of a
tenant's project quotas within the tenant quota) by a constraint trigger (migration 0002).

Each tenant-owned model names the lookup from itself to its tenant in ``tenant_lookup``; the one
scoping helper (``tenants.access.restrict``) uses it, so no view writes its own tenant filter.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import ArrayField, DateTimeRangeField, RangeBoundary, RangeOperators
from django.db import models
from django.db.models import F, Func, Q
from django.utils import timezone

from tenants.choices import CURRENCIES, PROJECT_LIMITABLE_ROLES, Role, SloMetric, TenantStatus, TokenScope

SLUG_REGEX = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


class TsTzRange(Func):
    function = "TSTZRANGE"
    output_field = DateTimeRangeField()


class Cohort(models.Model):
    """A group of tenants that lend each other their idle guaranteed capacity (Kueue's cohort; platform staff).

    A member's idle guarantee (its tenant quota's ``deserved`` less what it uses) is borrowed, over quota and
    preemptibly, by the other members only, up to its ``TenantQuota.lending_limit_gpu_milli``; capacity no
    member is guaranteed stays borrowable by every tenant. A tenant belongs to at most one cohort
    (``Tenant.cohort``); tenants in none borrow as before. docs/scheduling.md, "Cohorts, node pools and minimum
    runtime".
    """

    tenant_lookup = None  # platform data: a tenant sees its own cohort's name through its tenant, nothing else

    name = models.SlugField(max_length=63, unique=True)
    description = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.CheckConstraint(condition=Q(name__regex=SLUG_REGEX), name="cohort_name_format")]

    def __str__(self) -> str:
        return self.name


class Tenant(models.Model):
    """An organisation that leases GPU capacity and receives one invoice per month.

    A suspended tenant keeps read access but can start no new work.
    """

    tenant_lookup = ""

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=63, unique=True)
    status = models.CharField(max_length=16, choices=TenantStatus.choices, default=TenantStatus.ACTIVE)
    billing_email = models.EmailField()
    currency = models.CharField(max_length=3, default="USD")
    # cost allocation: the label keys its leases may carry (``team``, ``cost-center`` …); empty: the platform's
    # default keys (``COST_LABEL_KEYS_DEFAULT``). Set by a tenant admin (``tenant_label_keys_set``).
    label_keys = ArrayField(models.CharField(max_length=63), default=list, blank=True, db_default=[])
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # closed by its owner (``tenants.offboarding.tenant_close``): suspended for good, personal data removed,
    # financial records kept; a closed tenant is never reactivated
    closed_at = models.DateTimeField(null=True, blank=True)
    # the cohort it lends idle guarantee to and borrows from (platform staff, ``tenant_cohort_set``); null: none
    cohort = models.ForeignKey(Cohort, on_delete=models.PROTECT, null=True, blank=True, related_name="members")

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(condition=Q(slug__regex=SLUG_REGEX), name="tenant_slug_format"),
            models.CheckConstraint(condition=Q(status__in=TenantStatus.values), name="tenant_status_valid"),
            models.CheckConstraint(condition=Q(currency__in=CURRENCIES), name="tenant_currency_iso4217"),
            models.CheckConstraint(condition=Q(name__regex=r"\S"), name="tenant_name_not_blank"),
            models.CheckConstraint(condition=Q(billing_email__contains="@"), name="tenant_billing_email_format"),
        ]

    def __str__(self) -> str:
        return self.slug

    @property
    def is_active(self) -> bool:
        return self.status == TenantStatus.ACTIVE

    @property
    def allowed_label_keys(self) -> list[str]:
        """The label keys its leases may carry: its own list, else the platform's default."""
        return list(self.label_keys) or list(settings.COST_LABEL_KEYS_DEFAULT)


class Project(models.Model):
    """A queue inside a tenant: leases are requested for a project and counted against its quotas.

    A suspended project (platform staff, ``project_set_status``) takes no new lease requests; its running leases
    keep running and may be released, and it may be reactivated.
    """

    tenant_lookup = "tenant"
    project_lookup = "pk"  # a project-scoped token (``ApiToken.project_ids``) sees only its projects

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="projects")
    slug = models.SlugField(max_length=63)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=TenantStatus.choices, default=TenantStatus.ACTIVE,
                              db_default=TenantStatus.ACTIVE)  # rows written outside the ORM (bench COPY)
    # the project's admins opt in to idle reclaim of its interactive leases (``capacity.services.idle_opt_in_set``,
    # audited): the capacity loop then reclaims them automatically with the interactive rule's threshold, window
    # and notice, where no staff policy of the project's scope sets idle reclaim (docs/capacity.md)
    idle_reclaim_opt_in = models.BooleanField(default=False, db_default=False)
    # set by the project's admins and owners (``capacity.services.suspend_opt_out_set``, audited): the capacity loop
    # never suspends the project's idle resumable training (checkpoint, requeue); off (the default), it may, as
    # idle reclaim's mode says (docs/capacity.md, "Suspension of idle training")
    idle_suspend_opt_out = models.BooleanField(default=False, db_default=False)
    # the node pools (``broker.Node.pool``) its leases are placed in, set by a tenant admin
    # (``project_pools_set``, each a pool of the fleet); empty: any pool
    pools = ArrayField(models.CharField(max_length=63), default=list, blank=True, db_default=[])
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant_id", "slug"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "slug"], name="project_slug_unique_per_tenant"),
            models.CheckConstraint(condition=Q(slug__regex=SLUG_REGEX), name="project_slug_format"),
            models.CheckConstraint(condition=Q(name__regex=r"\S"), name="project_name_not_blank"),
            models.CheckConstraint(condition=Q(status__in=TenantStatus.values), name="project_status_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.slug}"


class Membership(models.Model):
    """A user's role in one tenant. A user may belong to several tenants.

    A member or viewer may be limited to named projects (``project_ids``, set by an admin or by the single
    sign-on's group mapping): ``tenants.access.restrict`` then narrows every project-owned query to them, as
    for a project-scoped token. Null: every project of the tenant; empty: none yet. Admins and owners always
    reach the whole tenant (the database refuses a limit on them)."""

    tenant_lookup = "tenant"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)
    # ids, not a many-to-many, for the same reasons as ApiToken.project_ids: read with the token in one query,
    # and a deleted project's id matches nothing (never widens the member's reach)
    project_ids = ArrayField(models.BigIntegerField(), null=True, blank=True)

    class Meta:
        ordering = ["tenant_id", "user_id"]
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique_user_tenant"),
            models.CheckConstraint(condition=Q(role__in=Role.values), name="membership_role_valid"),
            models.CheckConstraint(condition=Q(project_ids__isnull=True) | Q(role__in=PROJECT_LIMITABLE_ROLES),
                                   name="membership_project_limit_below_admin"),
        ]

    def __str__(self) -> str:
        return f"{self.user_id}@{self.tenant_id}:{self.role}"


class ApiToken(models.Model):
    """A bearer token acting for one member in one tenant.

    The secret is shown once at creation; only its SHA-256 is stored, and the ``prefix`` is kept for
    display and lookup. A token's power is the member's current role, narrowed by its scopes
    (``read`` alone never writes). Revocation and expiry take effect on the next request.
    """

    tenant_lookup = "tenant"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_tokens")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64, unique=True)
    scopes = ArrayField(models.CharField(max_length=8, choices=TokenScope.choices), size=2)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # the projects the token may reach (their ids; ``tenants.access.restrict`` narrows every project-owned
    # query to them); null: every project of the tenant. Ids, not a many-to-many: the one-query token lookup
    # reads them with the token, and a deleted project's id matches nothing (never widens the token)
    project_ids = ArrayField(models.BigIntegerField(), null=True, blank=True)

    class Meta:
        ordering = ["tenant_id", "-created_at", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(scopes__contained_by=TokenScope.values) & Q(scopes__len__gte=1),
                name="apitoken_scopes_valid",
            ),
            models.CheckConstraint(condition=Q(secret_hash__regex=r"^[0-9a-f]{64}$"), name="apitoken_hash_sha256"),
            models.CheckConstraint(condition=Q(prefix__regex=r"^[a-z0-9]{8,16}$"), name="apitoken_prefix_format"),
            models.CheckConstraint(
                condition=Q(expires_at__isnull=True) | Q(expires_at__gt=F("created_at")),
                name="apitoken_expires_after_creation",
            ),
            models.CheckConstraint(
                condition=Q(revoked_at__isnull=True) | Q(revoked_at__gte=F("created_at")),
                name="apitoken_revoked_after_creation",
            ),
            models.CheckConstraint(condition=Q(name__regex=r"\S"), name="apitoken_name_not_blank"),
            models.CheckConstraint(condition=Q(project_ids__isnull=True) | Q(project_ids__len__gte=1),
                                   name="apitoken_project_ids_not_empty"),
        ]

    def __str__(self) -> str:
        return f"{self.prefix} ({self.name})"


class TenantQuota(models.Model):
    """The tenant-level bound per GPU tier. The sum of the tenant's project ``deserved`` stays within
    this ``deserved``, and no project ``limit`` exceeds this ``limit`` (constraint trigger)."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="tenant_quotas")
    tier = models.CharField(max_length=32)
    deserved_gpu_milli = models.PositiveBigIntegerField()
    limit_gpu_milli = models.PositiveBigIntegerField()
    # within its cohort (``Tenant.cohort``; read only there): how much of its idle guarantee the other members may
    # borrow, and how far its own use may go beyond ``deserved``; null: no limit
    lending_limit_gpu_milli = models.PositiveBigIntegerField(null=True, blank=True)
    borrowing_limit_gpu_milli = models.PositiveBigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["tenant_id", "tier"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "tier"], name="tenantquota_unique_tier"),
            models.CheckConstraint(condition=Q(limit_gpu_milli__gte=F("deserved_gpu_milli")),
                                   name="tenantquota_limit_gte_deserved"),
            models.CheckConstraint(condition=Q(tier__regex=r"^[A-Za-z0-9][A-Za-z0-9.-]*$"),
                                   name="tenantquota_tier_format"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.tier}"


class Quota(models.Model):
    """A project's share of one GPU tier, in milli-GPU (a whole GPU is 1000, a 3g MIG slice 3000/7).

    ``deserved`` is guaranteed and non-preemptible, ``limit`` is never exceeded, and
    ``over_quota_weight`` is the project's weight when idle capacity is divided among over-quota
    demand (0: the project never borrows).
    """

    tenant_lookup = "project__tenant"
    project_lookup = "project"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="quotas")
    tier = models.CharField(max_length=32)
    deserved_gpu_milli = models.PositiveBigIntegerField()
    limit_gpu_milli = models.PositiveBigIntegerField()
    over_quota_weight = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["project_id", "tier"]
        constraints = [
            models.UniqueConstraint(fields=["project", "tier"], name="quota_unique_project_tier"),
            models.CheckConstraint(condition=Q(limit_gpu_milli__gte=F("deserved_gpu_milli")),
                                   name="quota_limit_gte_deserved"),
            models.CheckConstraint(condition=Q(over_quota_weight__lte=1000), name="quota_weight_range"),
            models.CheckConstraint(condition=Q(tier__regex=r"^[A-Za-z0-9][A-Za-z0-9.-]*$"),
                                   name="quota_tier_format"),
        ]

    def __str__(self) -> str:
        return f"{self.project_id}:{self.tier}"


class SloContract(models.Model):
    """Service-level targets a tenant buys for a period, with the credits owed when they are missed.

    Contracts of one tenant never overlap in time (exclusion constraint); ``effective_to`` null means
    open-ended.
    """

    tenant_lookup = "tenant"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="slo_contracts")
    name = models.CharField(max_length=100)
    effective_from = models.DateTimeField()
    effective_to = models.DateTimeField(null=True, blank=True)
    time_to_gpu_p95_seconds = models.PositiveIntegerField(help_text="In-quota requests: p95 request→ACTIVE.")
    availability_target_pct = models.DecimalField(max_digits=6, decimal_places=3)
    preemption_notice_seconds = models.PositiveIntegerField(help_text="Minimum notice before preemption.")
    max_credit_pct = models.DecimalField(max_digits=5, decimal_places=2, default=100)
    # seconds the tenant's over-quota leases run before the scheduler may reclaim them while the contract is in
    # force; null: the platform's ``LEASE_MIN_RUNTIME_SECONDS``
    min_runtime_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text="Over-quota leases are not reclaimed before this runtime; empty: the "
                                         "platform's minimum runtime.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant_id", "effective_from"]
        constraints = [
            models.CheckConstraint(
                condition=Q(effective_to__isnull=True) | Q(effective_to__gt=F("effective_from")),
                name="slocontract_period_ordered",
            ),
            models.CheckConstraint(
                condition=Q(availability_target_pct__gt=0) & Q(availability_target_pct__lte=100),
                name="slocontract_availability_pct_range",
            ),
            models.CheckConstraint(condition=Q(time_to_gpu_p95_seconds__gt=0), name="slocontract_ttg_positive"),
            models.CheckConstraint(
                condition=Q(max_credit_pct__gt=0) & Q(max_credit_pct__lte=100), name="slocontract_max_credit_range"
            ),
            ExclusionConstraint(
                name="slocontract_no_overlap_per_tenant",
                violation_error_message="The period overlaps another SLO contract of this tenant: end that one "
                                        "first (effective to) or start this one after it.",
                expressions=[
                    (TsTzRange("effective_from", "effective_to", RangeBoundary()), RangeOperators.OVERLAPS),
                    ("tenant", RangeOperators.EQUAL),
                ],
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.name}"


class SloCreditStep(models.Model):
    """One step of a contract's credit schedule: when ``metric`` crosses ``threshold`` (above it for
    time-to-GPU seconds, below it for percentages) the tenant is credited ``credit_pct`` of the period's
    charges. The largest step reached per metric applies; the sum is capped by ``max_credit_pct``."""

    tenant_lookup = "contract__tenant"

    contract = models.ForeignKey(SloContract, on_delete=models.CASCADE, related_name="credit_steps")
    metric = models.CharField(max_length=24, choices=SloMetric.choices)
    threshold = models.DecimalField(max_digits=10, decimal_places=3)
    credit_pct = models.DecimalField(max_digits=5, decimal_places=2)

    class Meta:
        ordering = ["contract_id", "metric", "threshold"]
        constraints = [
            models.UniqueConstraint(fields=["contract", "metric", "threshold"], name="slocreditstep_unique"),
            models.CheckConstraint(condition=Q(metric__in=SloMetric.values), name="slocreditstep_metric_valid"),
            models.CheckConstraint(condition=Q(threshold__gte=0), name="slocreditstep_threshold_nonnegative"),
            models.CheckConstraint(
                condition=Q(credit_pct__gt=0) & Q(credit_pct__lte=100), name="slocreditstep_credit_range"
            ),
            models.CheckConstraint(
                condition=Q(metric=SloMetric.TIME_TO_GPU_P95) | Q(threshold__lte=100),
                name="slocreditstep_pct_threshold_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.metric}<{self.threshold}:{self.credit_pct}%"



class AuditEvent(models.Model):
    """Append-only record of a change made by a service: who, what, when. A trigger refuses UPDATE always and
    DELETE except inside the retention purge (``tenants.retention``: migration 0006), so history cannot be
    rewritten."""

    tenant_lookup = "tenant"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, null=True, related_name="audit_events")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, related_name="+")
    action = models.CharField(max_length=64)
    target = models.CharField(max_length=200)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tenant", "-created_at"], name="auditevent_tenant_time"),
                   models.Index(fields=["created_at"], name="auditevent_time")]  # the retention purge

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M} {self.action} {self.target}"


# --- sign-in: single sign-on (OpenID Connect) and the second factor (issue 34; tenants/sso.py, tenants/otp.py) ---


class TenantSignIn(models.Model):
    """How one tenant's members sign in: its OpenID Connect provider (issuer, client, the e-mail domains it
    vouches for, the role a new member gets and the group claims that map to roles), whether local passwords
    still work for its members, whether they need a second factor. The client secret is kept sealed
    (``tenants.sealing``) and never shown again. The database refuses SSO without an issuer and a client, and a
    switch-off of local passwords without SSO (the members would have no way in)."""

    tenant_lookup = "tenant"

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="sign_in")
    sso_enabled = models.BooleanField(default=False)
    provider_name = models.CharField(max_length=100, blank=True, help_text='Shown as "Sign in with <name>".')
    issuer = models.URLField(max_length=300, blank=True)
    client_id = models.CharField(max_length=200, blank=True)
    client_secret_sealed = models.TextField(blank=True)
    allowed_email_domains = ArrayField(models.CharField(max_length=253), default=list, blank=True)
    default_role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    group_roles = models.JSONField(default=dict, blank=True, help_text='{"group claim value": "role"}')
    # {"group claim value": [project id, ...]}: when set, a member or viewer signing in through SSO reaches the
    # projects of their mapped groups only (``Membership.project_ids``); empty: SSO leaves project limits alone
    group_projects = models.JSONField(default=dict, blank=True,
                                      help_text='{"group claim value": [project id, ...]}')
    local_passwords_disabled = models.BooleanField(default=False)
    totp_required = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(default_role__in=Role.values), name="signin_default_role_valid"),
            models.CheckConstraint(
                condition=Q(sso_enabled=False) | (~Q(issuer="") & ~Q(client_id="") & ~Q(client_secret_sealed="")),
                name="signin_sso_needs_provider"),
            models.CheckConstraint(condition=Q(local_passwords_disabled=False) | Q(sso_enabled=True),
                                   name="signin_passwords_off_needs_sso"),
        ]

    def __str__(self) -> str:
        return f"sign-in of {self.tenant_id}"


class SsoIdentity(models.Model):
    """Which account an identity provider's subject signs in as (``tenants.sso.sso_member_sign_in``): made at
    that subject's first single sign-on, and from then on the only way the provider reaches an account. An
    existing account is linked by its e-mail address only when taking it over gives the provider nothing it does
    not already hold: a member of the signing-in tenant and of no other, never platform staff (docs/security.md).
    Deleted with the user, and when a closure pseudonymises them."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identities")
    issuer = models.URLField(max_length=300)
    subject = models.CharField(max_length=255)
    tenant = models.ForeignKey(Tenant, on_delete=models.SET_NULL, null=True, blank=True, related_name="+",
                               help_text="the tenant whose provider made the link (a record; not a rule)")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="ssoidentity_one_per_subject")]

    def __str__(self) -> str:
        return f"{self.issuer} {self.subject}"


class Invitation(models.Model):
    """An admin's invitation of a user, by username, to the tenant with a role: the user becomes a member only
    when they accept it (``tenants.services.invitation_accept``), never on the admin's word alone. Recorded
    whether or not a user of that name exists yet (the inviter learns nothing of other tenants' users from it);
    the user of that name sees it, in the portal (``/invitations``) and the API (``/api/v1/invitations``)."""

    tenant_lookup = "tenant"

    class State(models.TextChoices):
        PENDING = "pending"
        ACCEPTED = "accepted"
        DECLINED = "declined"
        REVOKED = "revoked"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    username = models.CharField(max_length=150)
    role = models.CharField(max_length=16, choices=Role.choices)
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="+")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    created_at = models.DateTimeField(default=timezone.now)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tenant_id", "-created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "username"], condition=Q(state="pending"),
                                    name="invitation_one_pending_per_username"),
            models.CheckConstraint(condition=Q(role__in=Role.values), name="invitation_role_valid"),
            models.CheckConstraint(condition=Q(state__in=["pending", "accepted", "declined", "revoked"]),
                                   name="invitation_state_valid"),
            models.CheckConstraint(condition=Q(username__regex=r"\S"), name="invitation_username_not_blank"),
        ]

    def __str__(self) -> str:
        return f"{self.username} to {self.tenant_id} as {self.role} ({self.state})"


class SshKey(models.Model):
    """A user's SSH public key: how they reach their leases through the broker's SSH gateway
    (``broker.ssh_gateway``; docs/leasing.md, "SSH"). The key is the user's, not a tenant's: it reaches the leases
    the user may use in any tenant of theirs, as their session would. Only the public half is ever given; its
    SHA-256 fingerprint (OpenSSH's ``SHA256:…``) is unique, so a key names one user."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ssh_keys")
    name = models.CharField(max_length=100)
    public_key = models.TextField()  # "<algorithm> <base64>" (the comment is dropped)
    fingerprint = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["user_id", "-created_at", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(fingerprint__regex=r"^SHA256:[A-Za-z0-9+/]{43}$"),
                                   name="sshkey_fingerprint_format"),
            models.CheckConstraint(condition=Q(name__regex=r"\S"), name="sshkey_name_not_blank"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.fingerprint})"


class TotpDevice(models.Model):
    """A user's authenticator app (TOTP, RFC 6238: SHA-1, 6 digits, 30 s). The secret is sealed at rest; it
    counts only once ``confirmed_at`` is set (the user proved the app shows the right codes). ``last_timestep``
    refuses a code used again (replay)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="totp_device")
    secret_sealed = models.TextField()
    confirmed_at = models.DateTimeField(null=True, blank=True)
    last_timestep = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"TOTP of {self.user_id}"


class RecoveryCode(models.Model):
    """One single-use recovery code of a user's second factor: only its SHA-256 is stored (the code is random,
    48 bits, shown once); ``used_at`` set when spent."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="recovery_codes")
    code_hash = models.CharField(max_length=64)
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "code_hash"], name="recoverycode_unique_per_user"),
            models.CheckConstraint(condition=Q(code_hash__regex=r"^[0-9a-f]{64}$"), name="recoverycode_hash_sha256"),
        ]

    def __str__(self) -> str:
        return f"recovery code of {self.user_id}"


class TenantExport(models.Model):
    """A zip of everything a tenant owns (``tenants.offboarding``): members, projects, leases, usage, invoices
    with their PDFs, audit events, and a manifest with each file's SHA-256. Built by a Celery task after the
    request commits; downloadable by the tenant's owners. ``state`` moves pending → ready | failed, once."""

    tenant_lookup = "tenant"

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="exports")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True,
                                     related_name="+")
    state = models.CharField(max_length=8, choices=State.choices, default=State.PENDING)
    requested_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    size_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    sha256 = models.CharField(max_length=64, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=["pending", "ready", "failed"]),
                                   name="tenantexport_state_valid"),
            models.CheckConstraint(condition=Q(state="pending") | Q(finished_at__isnull=False),
                                   name="tenantexport_finished_has_time"),
        ]

    def __str__(self) -> str:
        return f"export {self.pk} of {self.tenant_id} ({self.state})"
