"""Every rule the database holds is refused by the database itself, bypassing the services."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction

from tenants.models import (
    ApiToken,
    AuditEvent,
    Membership,
    Project,
    Quota,
    SloContract,
    SloCreditStep,
    Tenant,
    TenantQuota,
)
from tests.factories import make_project, make_tenant, make_user

T0 = datetime(2026, 1, 1, tzinfo=UTC)
HASH = "a" * 64


def _refused(constraint: str, create) -> None:
    with pytest.raises(IntegrityError) as info, transaction.atomic():
        create()
    diag = getattr(info.value.__cause__, "diag", None)
    assert constraint in (str(info.value) + " " + str(getattr(diag, "constraint_name", "")))


def _tenant_kwargs(**overrides):
    return {"name": "X", "slug": "x", "billing_email": "b@x.example", "currency": "USD", **overrides}


@pytest.mark.parametrize(
    ("constraint", "overrides"),
    [
        ("tenant_slug_format", {"slug": "Bad_Slug"}),
        ("tenant_slug_format", {"slug": "-lead"}),
        ("tenant_status_valid", {"status": "deleted"}),
        ("tenant_currency_iso4217", {"currency": "usd"}),
        ("tenant_currency_iso4217", {"currency": "XXX"}),
        ("tenant_name_not_blank", {"name": "   "}),
        ("tenant_billing_email_format", {"billing_email": "nobody"}),
    ],
)
def test_constraints_tenant_refused(db, constraint, overrides):
    _refused(constraint, lambda: Tenant.objects.create(**_tenant_kwargs(**overrides)))


def test_constraints_tenant_slug_unique(db):
    make_tenant("acme")
    _refused("tenants_tenant_slug_key", lambda: Tenant.objects.create(**_tenant_kwargs(slug="acme")))


def test_constraints_project_rules(db):
    acme, globex = make_tenant("acme"), make_tenant("globex")
    make_project(acme, "vision")
    _refused("project_slug_unique_per_tenant", lambda: Project.objects.create(tenant=acme, slug="vision", name="V"))
    make_project(globex, "vision")  # the same slug in another tenant is fine
    _refused("project_slug_format", lambda: Project.objects.create(tenant=acme, slug="Vision!", name="V"))
    _refused("project_name_not_blank", lambda: Project.objects.create(tenant=acme, slug="v2", name=" "))


def test_constraints_project_cannot_move_tenant(db):
    acme, globex = make_tenant("acme"), make_tenant("globex")
    project = make_project(acme, "vision")
    _refused("project_tenant_immutable", lambda: Project.objects.filter(pk=project.pk).update(tenant=globex))


def test_constraints_membership_rules(db):
    acme = make_tenant("acme")
    user = make_user("alice")
    Membership.objects.create(user=user, tenant=acme, role="owner")
    _refused("membership_unique_user_tenant", lambda: Membership.objects.create(user=user, tenant=acme))
    other = make_user("bob")
    _refused("membership_role_valid", lambda: Membership.objects.create(user=other, tenant=acme, role="god"))


@pytest.mark.parametrize(
    ("constraint", "overrides"),
    [
        ("apitoken_scopes_valid", {"scopes": []}),
        ("apitoken_scopes_valid", {"scopes": ["admin"]}),
        ("apitoken_hash_sha256", {"secret_hash": "plaintext-secret"}),
        ("apitoken_prefix_format", {"prefix": "AB"}),
        ("apitoken_expires_after_creation", {"expires_at": T0 - timedelta(seconds=1)}),
        ("apitoken_revoked_after_creation", {"revoked_at": T0 - timedelta(seconds=1)}),
        ("apitoken_name_not_blank", {"name": ""}),
    ],
)
def test_constraints_api_token_refused(db, constraint, overrides):
    acme, user = make_tenant("acme"), make_user("alice")
    kwargs = {"tenant": acme, "user": user, "name": "t", "prefix": "abcdefghij", "secret_hash": HASH,
              "scopes": ["read"], "created_at": T0, **overrides}
    _refused(constraint, lambda: ApiToken.objects.create(**kwargs))


def test_constraints_api_token_prefix_and_hash_unique(db):
    acme, user = make_tenant("acme"), make_user("alice")
    base = {"tenant": acme, "user": user, "name": "t", "scopes": ["read"], "created_at": T0}
    ApiToken.objects.create(prefix="abcdefghij", secret_hash=HASH, **base)
    _refused("prefix", lambda: ApiToken.objects.create(prefix="abcdefghij", secret_hash="b" * 64, **base))
    _refused("secret_hash", lambda: ApiToken.objects.create(prefix="bbcdefghij", secret_hash=HASH, **base))


def test_constraints_quota_rules(db):
    acme = make_tenant("acme")
    project = make_project(acme, "vision")
    TenantQuota.objects.create(tenant=acme, tier="H100-80GB", deserved_gpu_milli=4000, limit_gpu_milli=8000)
    _refused("tenantquota_limit_gte_deserved", lambda: TenantQuota.objects.create(
        tenant=acme, tier="L4", deserved_gpu_milli=2000, limit_gpu_milli=1000))
    _refused("tenantquota_unique_tier", lambda: TenantQuota.objects.create(
        tenant=acme, tier="H100-80GB", deserved_gpu_milli=1, limit_gpu_milli=1))
    _refused("tenantquota_tier_format", lambda: TenantQuota.objects.create(
        tenant=acme, tier="", deserved_gpu_milli=1, limit_gpu_milli=1))
    _refused("quota_limit_gte_deserved", lambda: Quota.objects.create(
        project=project, tier="H100-80GB", deserved_gpu_milli=2000, limit_gpu_milli=1000))
    _refused("quota_weight_range", lambda: Quota.objects.create(
        project=project, tier="H100-80GB", deserved_gpu_milli=0, limit_gpu_milli=0, over_quota_weight=5000))
    _refused("quota_deserved_gpu_milli_check", lambda: Quota.objects.create(
        project=project, tier="H100-80GB", deserved_gpu_milli=-1, limit_gpu_milli=0))
    Quota.objects.create(project=project, tier="H100-80GB", deserved_gpu_milli=1000, limit_gpu_milli=2000)
    _refused("quota_unique_project_tier", lambda: Quota.objects.create(
        project=project, tier="H100-80GB", deserved_gpu_milli=0, limit_gpu_milli=0))


def test_constraints_quota_sum_bounded_by_tenant_quota(db):
    """The two-level bound holds even for writes that bypass the services."""
    acme = make_tenant("acme")
    vision, llm = make_project(acme, "vision"), make_project(acme, "llm")
    bound = TenantQuota.objects.create(tenant=acme, tier="H100-80GB", deserved_gpu_milli=4000, limit_gpu_milli=8000)
    Quota.objects.create(project=vision, tier="H100-80GB", deserved_gpu_milli=3000, limit_gpu_milli=8000)
    _refused("quota_within_tenant_quota", lambda: Quota.objects.create(
        project=llm, tier="H100-80GB", deserved_gpu_milli=1001, limit_gpu_milli=2000))
    _refused("quota_within_tenant_quota", lambda: Quota.objects.create(
        project=llm, tier="H100-80GB", deserved_gpu_milli=0, limit_gpu_milli=8001))
    _refused("quota_within_tenant_quota", lambda: Quota.objects.create(
        project=llm, tier="L4", deserved_gpu_milli=0, limit_gpu_milli=0))  # no tenant quota for L4
    Quota.objects.create(project=llm, tier="H100-80GB", deserved_gpu_milli=1000, limit_gpu_milli=2000)
    # Lowering or deleting the tenant bound below what projects hold is refused too.
    _refused("quota_within_tenant_quota",
             lambda: TenantQuota.objects.filter(pk=bound.pk).update(deserved_gpu_milli=3999))
    _refused("quota_within_tenant_quota",
             lambda: TenantQuota.objects.filter(pk=bound.pk).update(limit_gpu_milli=7999))
    _refused("quota_within_tenant_quota", lambda: TenantQuota.objects.filter(pk=bound.pk).delete())


def test_constraints_slo_contract_rules(db):
    acme = make_tenant("acme")
    base = {"tenant": acme, "name": "S", "time_to_gpu_p95_seconds": 60, "availability_target_pct": Decimal("99.5"),
            "preemption_notice_seconds": 120}
    _refused("slocontract_period_ordered", lambda: SloContract.objects.create(
        effective_from=T0, effective_to=T0, **base))
    _refused("slocontract_availability_pct_range", lambda: SloContract.objects.create(
        effective_from=T0, **{**base, "availability_target_pct": Decimal("100.5")}))
    _refused("slocontract_ttg_positive", lambda: SloContract.objects.create(
        effective_from=T0, **{**base, "time_to_gpu_p95_seconds": 0}))
    _refused("slocontract_max_credit_range", lambda: SloContract.objects.create(
        effective_from=T0, max_credit_pct=Decimal(0), **base))
    first = SloContract.objects.create(effective_from=T0, effective_to=T0 + timedelta(days=30), **base)
    _refused("slocontract_no_overlap_per_tenant", lambda: SloContract.objects.create(
        effective_from=T0 + timedelta(days=29), **base))
    SloContract.objects.create(effective_from=T0 + timedelta(days=30), **base)  # adjacent is fine
    _refused("slocreditstep_credit_range", lambda: SloCreditStep.objects.create(
        contract=first, metric="availability", threshold=Decimal("99"), credit_pct=Decimal("0")))
    _refused("slocreditstep_metric_valid", lambda: SloCreditStep.objects.create(
        contract=first, metric="latency", threshold=Decimal("1"), credit_pct=Decimal("10")))
    _refused("slocreditstep_pct_threshold_range", lambda: SloCreditStep.objects.create(
        contract=first, metric="availability", threshold=Decimal("101"), credit_pct=Decimal("10")))
    _refused("slocreditstep_threshold_nonnegative", lambda: SloCreditStep.objects.create(
        contract=first, metric="time_to_gpu_p95", threshold=Decimal("-1"), credit_pct=Decimal("10")))
    SloCreditStep.objects.create(contract=first, metric="availability", threshold=Decimal("99"), credit_pct=10)
    _refused("slocreditstep_unique", lambda: SloCreditStep.objects.create(
        contract=first, metric="availability", threshold=Decimal("99"), credit_pct=20))


def test_constraints_audit_events_are_append_only(db):
    acme = make_tenant("acme")  # writes a tenant.create audit event
    event = AuditEvent.objects.get(tenant=acme, action="tenant.create")
    _refused("tenants_auditevent_append_only", lambda: AuditEvent.objects.filter(pk=event.pk).update(target="x"))
    _refused("tenants_auditevent_append_only", lambda: AuditEvent.objects.filter(pk=event.pk).delete())
