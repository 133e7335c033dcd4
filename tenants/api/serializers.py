import re

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tenants.choices import Role, TokenScope
from tenants.models import (
    ApiToken,
    Invitation,
    Membership,
    Project,
    Quota,
    SloContract,
    SloCreditStep,
    Tenant,
    TenantQuota,
)
from tenants.selectors import project_slugs


def _json_type_error(field: serializers.Field, value) -> str | None:
    """What is wrong with ``value``'s JSON type for ``field``, or None. DRF coerces (``0`` → ``"0"``,
    ``"5"`` → ``5``, ``1`` → ``True``), so a body the OpenAPI document calls invalid was accepted."""
    if value is None:
        return None  # DRF's own allow_null check answers for null
    if isinstance(field, serializers.CharField) and not isinstance(value, str):
        return "Must be a string."
    if isinstance(field, serializers.IntegerField) and (isinstance(value, bool) or not isinstance(value, int)):
        return "Must be a whole number."
    if isinstance(field, serializers.BooleanField) and not isinstance(value, bool):
        return "Must be true or false."
    return None


class StrictSerializer(serializers.Serializer):
    """Input serializer that refuses fields it does not know, naming them, and values of another JSON type
    than the document says (no coercion). Its string fields keep surrounding whitespace (``trim_whitespace``
    off in ``strict_fields``), so the document's patterns and lengths are exactly what is checked."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError({"body": ["Expected a JSON object."]})
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        wrong = {name: [message] for name, field in self.fields.items() if name in data
                 for message in [_json_type_error(field, data[name])] if message}
        if wrong:
            raise serializers.ValidationError(wrong)
        return super().to_internal_value(data)

    def get_fields(self):
        fields = super().get_fields()
        for field in fields.values():
            if isinstance(field, serializers.CharField):
                field.trim_whitespace = False
        return fields


SLUG_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"  # tenants.models.SLUG_REGEX
NAME_PATTERN = r"\S"  # a name is not blank once trimmed (the services trim it)


class TenantOutput(serializers.ModelSerializer):
    role = serializers.SerializerMethodField()
    cohort = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True,
        help_text="the cohort the tenant lends idle guarantee to and borrows from (its limits per tier are on "
                  "GET /api/v1/quotas); null: none")

    class Meta:
        model = Tenant
        fields = ["slug", "name", "status", "billing_email", "currency", "created_at", "role", "cohort"]

    def get_role(self, obj) -> str:
        return self.context["actor"].role


class TenantUpdateInput(StrictSerializer):
    name = serializers.RegexField(NAME_PATTERN, required=False, max_length=200)
    billing_email = serializers.EmailField(required=False)


POOLS_HELP = "the node pools its leases are placed in (each a pool of the fleet); empty: any pool"


class ProjectOutput(serializers.ModelSerializer):
    pools = serializers.ListField(child=serializers.CharField(), read_only=True, help_text=POOLS_HELP)

    class Meta:
        model = Project
        fields = ["slug", "name", "description", "status", "pools", "created_at"]


class ProjectCreateInput(StrictSerializer):
    slug = serializers.RegexField(SLUG_PATTERN, max_length=63,
                                  help_text="lowercase letters, digits and hyphens; not starting or ending with one")
    name = serializers.RegexField(NAME_PATTERN, max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, default="")

    def validate_slug(self, value: str) -> str:
        if not re.fullmatch(SLUG_PATTERN, value):  # RegexField searches: "$" also matches before a final "\n"
            raise serializers.ValidationError("Lowercase letters, digits and hyphens, not starting or ending with one.")
        return value


class ProjectUpdateInput(StrictSerializer):
    name = serializers.RegexField(NAME_PATTERN, required=False, max_length=200)
    description = serializers.CharField(required=False, allow_blank=True)
    pools = serializers.ListField(child=serializers.CharField(max_length=63), required=False, max_length=50,
                                  help_text=POOLS_HELP + " (tenant admins)")


class QuotaOutput(serializers.ModelSerializer):
    """With ``context["usage"]`` ((project id, tier) → in-quota / over-quota milli of live allocations)."""

    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    in_use_gpu_milli = serializers.SerializerMethodField()
    over_quota_in_use_gpu_milli = serializers.SerializerMethodField()

    class Meta:
        model = Quota
        fields = ["project", "tier", "deserved_gpu_milli", "limit_gpu_milli", "over_quota_weight",
                  "in_use_gpu_milli", "over_quota_in_use_gpu_milli"]

    def _usage(self, obj) -> dict:
        return self.context.get("usage", {}).get((obj.project_id, obj.tier), {"in_use": 0, "over": 0})

    def get_in_use_gpu_milli(self, obj) -> int:
        return self._usage(obj)["in_use"]

    def get_over_quota_in_use_gpu_milli(self, obj) -> int:
        return self._usage(obj)["over"]


class TenantQuotaOutput(serializers.ModelSerializer):
    in_use_gpu_milli = serializers.SerializerMethodField()
    over_quota_in_use_gpu_milli = serializers.SerializerMethodField()

    class Meta:
        model = TenantQuota
        fields = ["tier", "deserved_gpu_milli", "limit_gpu_milli", "in_use_gpu_milli", "over_quota_in_use_gpu_milli",
                  "lending_limit_gpu_milli", "borrowing_limit_gpu_milli"]
        extra_kwargs = {
            "lending_limit_gpu_milli": {"help_text": "in the tenant's cohort: how much of its idle guarantee the "
                                                     "other members may borrow; null: no limit"},
            "borrowing_limit_gpu_milli": {"help_text": "in the tenant's cohort: how far its use may go beyond its "
                                                       "deserved; null: no limit"},
        }

    def _sum(self, obj, key: str) -> int:
        return sum(v[key] for (_, tier), v in self.context.get("usage", {}).items() if tier == obj.tier)

    def get_in_use_gpu_milli(self, obj) -> int:
        return self._sum(obj, "in_use")

    def get_over_quota_in_use_gpu_milli(self, obj) -> int:
        return self._sum(obj, "over")


class QuotasOutput(serializers.Serializer):
    tenant = TenantQuotaOutput(many=True)
    projects = QuotaOutput(many=True)


class InvitationOutput(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug", help_text="the tenant it invites to")
    tenant_name = serializers.CharField(source="tenant.name")
    invited_by = serializers.SerializerMethodField(help_text="the inviting admin's username; null once they are gone")

    class Meta:
        model = Invitation
        fields = ["id", "tenant", "tenant_name", "username", "role", "state", "invited_by", "created_at",
                  "decided_at"]

    def get_invited_by(self, invitation: Invitation) -> str | None:
        return invitation.invited_by.get_username() if invitation.invited_by else None


class InvitationCreateInput(StrictSerializer):
    username = serializers.CharField(max_length=150, help_text="who is invited: they join when they accept")
    role = serializers.ChoiceField(choices=Role.choices, help_text="only owners invite owners")


class MembershipOutput(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username")
    email = serializers.CharField(source="user.email")
    projects = serializers.SerializerMethodField(
        help_text="The projects (slugs) a member or viewer is limited to (an empty list: none yet); null: every "
                  "project of the tenant.")

    class Meta:
        model = Membership
        fields = ["id", "username", "email", "role", "projects", "created_at"]

    @extend_schema_field(serializers.ListField(child=serializers.CharField(), allow_null=True))
    def get_projects(self, membership: Membership) -> list[str] | None:
        return project_slugs(tenant=membership.tenant, ids=membership.project_ids)


class MembershipUpdateInput(StrictSerializer):
    role = serializers.ChoiceField(choices=Role.choices, required=False, help_text="absent: nothing changes")
    projects = serializers.ListField(
        child=serializers.CharField(max_length=63), allow_null=True, required=False, max_length=1000,
        help_text="Limit a member or viewer to these projects (slugs; [] for none yet); null lifts the limit; "
                  "absent: nothing changes. Admins and owners always reach every project.")


class ApiTokenOutput(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username")
    projects = serializers.SerializerMethodField(
        help_text="The projects (slugs) the token is limited to; null: every project of the tenant.")

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "scopes", "projects", "username", "created_at", "expires_at",
                  "last_used_at", "revoked_at"]

    @extend_schema_field(serializers.ListField(child=serializers.CharField(), allow_null=True))
    def get_projects(self, token: ApiToken) -> list[str] | None:
        if token.project_ids is None:
            return None
        return list(Project.objects.filter(tenant_id=token.tenant_id, pk__in=token.project_ids)
                    .order_by("slug").values_list("slug", flat=True))


class ApiTokenCreatedOutput(ApiTokenOutput):
    token = serializers.CharField(help_text="The secret. Shown once; store it now.")

    class Meta(ApiTokenOutput.Meta):
        fields = [*ApiTokenOutput.Meta.fields, "token"]


class ApiTokenCreateInput(StrictSerializer):
    name = serializers.RegexField(NAME_PATTERN, max_length=100)
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=TokenScope.choices), min_length=1)
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    projects = serializers.ListField(
        child=serializers.RegexField(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", max_length=63), min_length=1,
        required=False, allow_null=True, default=None,
        help_text="Limit the token to these projects (slugs); absent or null: every project of the tenant.")


class SloCreditStepOutput(serializers.ModelSerializer):
    class Meta:
        model = SloCreditStep
        fields = ["metric", "threshold", "credit_pct"]


class SloContractOutput(serializers.ModelSerializer):
    credit_steps = SloCreditStepOutput(many=True)

    class Meta:
        model = SloContract
        fields = ["id", "name", "effective_from", "effective_to", "time_to_gpu_p95_seconds",
                  "availability_target_pct", "preemption_notice_seconds", "max_credit_pct", "min_runtime_seconds",
                  "credit_steps"]
