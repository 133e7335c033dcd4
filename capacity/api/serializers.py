from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from capacity import presenters
from capacity.choices import AdjustmentKind, AdjustmentState, LoopMode
from capacity.models import Adjustment, CapacityPolicy
from capacity.selectors import MODE_FIELDS, NUMBER_FIELDS
from capacity.services import IDLE_CLASSES
from tenants.api.serializers import StrictSerializer

MAX_POLICY_SECONDS = 30 * 86_400  # capacity.services.policy_set's bound for every number
SCOPE_HELP = '"" (the default), "pool:<GPU model>" (mode switch, MIG layout, warm pool) or "project:<project id>" ' \
             "(idle reclaim, right-sizing, quota advice)"
FREE_OBJECT = {"type": "object", "additionalProperties": True}
IDLE_RULE_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "enabled": {"type": "boolean"},
        "threshold_permille": {"type": "integer", "minimum": 0, "maximum": 1000,
                               "description": "idle below this engine activity (per mille)"},
        "window_seconds": {"type": "integer", "minimum": 1, "maximum": MAX_POLICY_SECONDS},
        "notice_seconds": {"type": "integer", "minimum": 0, "maximum": MAX_POLICY_SECONDS},
    },
}
IDLE_RULES_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "description": "per reclaim class; a key left out keeps the built-in rule",
    "properties": {name: IDLE_RULE_SCHEMA for name in IDLE_CLASSES},
}


@extend_schema_field(FREE_OBJECT)
class ObjectField(serializers.JSONField):
    """The planner's own JSON (change, evidence, effect): documented in docs/capacity.md, kind by kind."""


@extend_schema_field(IDLE_RULES_SCHEMA)
class IdleRulesField(serializers.JSONField):
    """Checked by ``capacity.services.policy_set``, which names the offending ``idle_rules.<class>.<key>``."""


# -- adjustments -------------------------------------------------------------------------------------------
class MoneyOutput(serializers.Serializer):
    minor = serializers.IntegerField(help_text="integer minor units (cents); negative = a cost")
    currency = serializers.CharField(help_text='ISO 4217; "" where nothing was priced')
    formatted = serializers.CharField(help_text='e.g. "12.50 USD"; "" where nothing was priced')


class ExpectedGainOutput(serializers.Serializer):
    gpu_hours = serializers.DecimalField(max_digits=18, decimal_places=2,
                                         help_text="GPU-seconds ÷ 3600, two decimals; negative = a cost")
    money = MoneyOutput()
    priced_with = serializers.CharField(help_text='the price book the money was priced at where not the general '
                                                  'one (a tenant\'s own book); "" for the general book')
    time_to_gpu_seconds = serializers.IntegerField()


class AdjustmentOutput(serializers.ModelSerializer):
    kind = serializers.ChoiceField(choices=AdjustmentKind.choices)
    state = serializers.ChoiceField(choices=AdjustmentState.choices)
    mode = serializers.ChoiceField(choices=LoopMode.choices, help_text="the policy's mode when it was proposed")
    change = ObjectField()
    evidence = ObjectField()
    effect = ObjectField(allow_null=True, help_text="measured after it was applied (null until then)")
    expected_gain = serializers.SerializerMethodField()
    risk = serializers.ListField(child=serializers.IntegerField(),
                                 help_text="ids of the leases it touches (a tenant sees only its own here; a drain's "
                                           "reason and outcome count another tenant's leases without naming them)")
    lease = serializers.IntegerField(source="lease_id", allow_null=True)
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)

    class Meta:
        model = Adjustment
        fields = ["id", "kind", "target", "state", "mode", "reason", "change", "evidence", "expected_gain", "risk",
                  "lease", "project", "proposed_at", "decided_at", "applied_by", "finished_at", "outcome", "effect"]

    @extend_schema_field(ExpectedGainOutput)
    def get_expected_gain(self, obj) -> dict:
        return ExpectedGainOutput(presenters.expected_gain(obj)).data

    def to_representation(self, instance) -> dict:
        """As the reader may read it: ``context["viewer_tenant"]``, the reading tenant's id (absent or None for
        staff), sees another tenant's leases in a drain counted, not named (``presenters.seen_by``)."""
        data = super().to_representation(instance)
        data.update(presenters.seen_by(instance, self.context.get("viewer_tenant")))
        return data


class AdjustmentRejectInput(StrictSerializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="",
                                   help_text="kept on the adjustment's outcome and in the audit log")


# -- policies ----------------------------------------------------------------------------------------------
MODE_SCHEMA = {"type": "string", "enum": [*LoopMode.values, None], "nullable": True,
               "description": "null: inherit (the default scope's mode, then the built-in default)"}
# inline (not a component): the six kinds share one choice set under six names
MODES_SCHEMA = {"type": "object", "additionalProperties": False,
                "description": "the mode of each kind in this scope: off | advise | auto, null: inherit",
                "properties": {name: MODE_SCHEMA for name in MODE_FIELDS}}


@extend_schema_field({**MODES_SCHEMA, "required": list(MODE_FIELDS)})
class ModesOutputField(serializers.Field):
    def __init__(self, **kwargs):
        super().__init__(source="*", read_only=True, **kwargs)

    def to_representation(self, value) -> dict:
        return {name: getattr(value, name) or None for name in MODE_FIELDS}  # stored "" = inherit


@extend_schema_field(MODES_SCHEMA)
class ModesInputField(serializers.JSONField):
    """Only the kinds given change; each error names ``modes.<kind>``."""

    def to_internal_value(self, data) -> dict:
        if not isinstance(data, dict):
            raise serializers.ValidationError("Expected an object keyed by kind.")
        errors = {}
        for name, value in data.items():
            if name not in MODE_FIELDS:
                errors[name] = [f"Unknown kind; one of {', '.join(MODE_FIELDS)}."]
            elif value is not None and value not in LoopMode.values:
                errors[name] = [f"Must be one of {', '.join(LoopMode.values)}, or null (inherit)."]
        if errors:
            raise serializers.ValidationError(errors)
        return dict(data)


def _number_field(**kwargs) -> serializers.IntegerField:
    return serializers.IntegerField(min_value=0, max_value=MAX_POLICY_SECONDS, allow_null=True, **kwargs,
                                    help_text="null: inherit")


class PolicyOutput(serializers.ModelSerializer):
    modes = ModesOutputField()
    idle_rules = IdleRulesField()

    class Meta:
        model = CapacityPolicy
        fields = ["id", "scope", "modes", "idle_rules", *NUMBER_FIELDS, "updated_at"]


class PolicyUpdateInput(StrictSerializer):
    """Fields left out keep their value; null sets a field back to inherit."""

    modes = ModesInputField(required=False)
    idle_rules = IdleRulesField(required=False, allow_null=True)
    warm_target_p95_seconds = _number_field(required=False)
    cold_provision_seconds = _number_field(required=False)
    warm_min_arrivals = _number_field(required=False)
    mode_hold_seconds = _number_field(required=False)


class PolicyCreateInput(PolicyUpdateInput):
    scope = serializers.CharField(max_length=80, allow_blank=True, help_text=SCOPE_HELP)


def policy_values(data: dict) -> dict:
    """The validated input as ``capacity.services.policy_set`` takes it (modes flattened)."""
    values = {name: value for name, value in data.items() if name not in ("modes", "scope")}
    return {**values, **data.get("modes", {})}


# -- the fleet ---------------------------------------------------------------------------------------------
class WarmCountOutput(serializers.Serializer):
    profile = serializers.CharField()
    ready = serializers.IntegerField()
    creating = serializers.IntegerField()


class PoolOutput(serializers.Serializer):
    model = serializers.CharField()
    gpus = serializers.IntegerField()
    modes = serializers.DictField(child=serializers.IntegerField(), help_text="GPUs per mode (whole, mig, shared)")
    changing = serializers.IntegerField(help_text="GPUs closed to the scheduler while their mode changes")
    warm = WarmCountOutput(many=True)


class WarmInstanceOutput(serializers.Serializer):
    id = serializers.IntegerField(source="pk")
    node = serializers.CharField(source="gpu.node.node_id")
    gpu_index = serializers.IntegerField(source="gpu.index")
    model = serializers.CharField(source="gpu.model")
    profile = serializers.CharField(source="mig_profile")
    start = serializers.IntegerField(source="mig_start", allow_null=True)
    state = serializers.CharField()
    created_at = serializers.DateTimeField(allow_null=True)
    warm_at = serializers.DateTimeField(allow_null=True)


class HoldingPoolOutput(serializers.Serializer):
    model = serializers.CharField()
    profile = serializers.CharField()
    members = serializers.IntegerField()
    gpu_hours = serializers.DecimalField(max_digits=18, decimal_places=2)
    cost_minor = serializers.IntegerField(allow_null=True, help_text="null: the general price book has no price")


class HoldingOutput(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    currency = serializers.CharField()
    gpu_hours = serializers.DecimalField(max_digits=18, decimal_places=2)
    cost_minor = serializers.IntegerField(help_text="the priced pools' cost")
    priced = serializers.BooleanField(help_text="false: the general price book has no price for some pool")
    pools = HoldingPoolOutput(many=True)


class FleetOutput(serializers.Serializer):
    pools = PoolOutput(many=True)
    warm_instances = WarmInstanceOutput(many=True)
    warm_holding = HoldingOutput(help_text="what warm pools cost the platform this month (held by nobody)")
    recent = AdjustmentOutput(many=True, help_text="the loop's last 20 adjustments")


class PlanRunOutput(serializers.Serializer):
    """``capacity.services.plan_run``'s counts; ``skipped`` alone when another run held the planner's lock."""

    proposed = serializers.IntegerField(required=False, help_text="adjustments open after the run")
    new = serializers.IntegerField(required=False)
    expired = serializers.IntegerField(required=False)
    applied = serializers.IntegerField(required=False, help_text="auto-mode adjustments applied")
    failed = serializers.IntegerField(required=False)
    drained = serializers.IntegerField(required=False, help_text="mode switches finished after a drain")
    measured = serializers.IntegerField(required=False, help_text="effects measured")
    interrupted = serializers.IntegerField(required=False,
                                           help_text="rows left applying by a stopped process, now failed")
    prometheus = serializers.CharField(required=False, help_text='"ok", or why utilisation was not read')
    skipped = serializers.IntegerField(required=False, help_text="1: another run was in progress")


# -- a project's idle reclaim opt-in -----------------------------------------------------------------------------
class IdleRuleOutput(serializers.Serializer):
    enabled = serializers.BooleanField(help_text="false: platform staff switched the interactive rule off")
    threshold_permille = serializers.IntegerField(help_text="idle below this mean engine activity (per mille)")
    window_seconds = serializers.IntegerField(help_text="over this trailing window")
    notice_seconds = serializers.IntegerField(help_text="between the notice and the release")


class IdleOptInEstimateOutput(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    interactive_gpu_hours = serializers.DecimalField(max_digits=18, decimal_places=6,
                                                     help_text="in-quota interactive lease-hours held (GPU-hours)")
    measured_gpu_hours = serializers.DecimalField(max_digits=18, decimal_places=6,
                                                  help_text="of those, the hours with a metered engine activity")
    idle_gpu_hours = serializers.DecimalField(max_digits=18, decimal_places=6,
                                              help_text="of those, the hours whose mean was under the threshold")
    saving = serializers.SerializerMethodField(help_text="the idle hours at the tenant's price book in force now; "
                                                         "null where no book prices them")
    price_book = serializers.CharField(help_text='"" where no book is in force')

    @extend_schema_field(MoneyOutput(allow_null=True))
    def get_saving(self, obj) -> dict | None:
        if obj.saving_minor is None:
            return None
        return {"minor": obj.saving_minor, "currency": obj.currency,
                "formatted": presenters.money_text(obj.saving_minor, obj.currency)}


class SuspendOutput(serializers.Serializer):
    opt_out = serializers.BooleanField(help_text="true: the loop never suspends the project's idle training")
    mode = serializers.ChoiceField(choices=LoopMode.choices,
                                   help_text="what the loop does now with the project's idle resumable training "
                                             "(off: never suspended; advise: proposed; auto: suspended)")
    rule = IdleRuleOutput(help_text="the resumable-training rule in force (enabled false while opted out)")
    notice = serializers.CharField(help_text="what happens to an idle resumable training lease, in words")


class IdleOptInOutput(serializers.Serializer):
    project = serializers.CharField(source="project.slug")
    opt_in = serializers.BooleanField()
    mode = serializers.ChoiceField(choices=LoopMode.choices,
                                   help_text="what the loop does now with the project's idle interactive leases")
    mode_opted_in = serializers.ChoiceField(choices=LoopMode.choices, help_text="what it does once opted in")
    mode_opted_out = serializers.ChoiceField(choices=LoopMode.choices, help_text="what it does without the opt-in")
    staff_mode = serializers.ChoiceField(choices=LoopMode.choices, allow_null=True,
                                         help_text="a staff policy of the project's scope sets idle reclaim: it wins "
                                                   "(null: none)")
    rule = IdleRuleOutput(help_text="the interactive class's rule the reclaim follows")
    notice = serializers.CharField(help_text="what happens to an idle interactive lease, in words")
    estimate = IdleOptInEstimateOutput(allow_null=True, help_text="null: no estimate (see estimate_note)")
    estimate_note = serializers.CharField(help_text="how the estimate was made, or why there is none")
    suspend = SuspendOutput(help_text="suspension of idle training that can resume from a checkpoint: its "
                                      "opt-out, mode, rule and notice")

    def to_representation(self, instance) -> dict:
        data = super().to_representation(instance)
        data["staff_mode"] = instance.staff_mode or None
        return data


class IdleOptInInput(StrictSerializer):
    """A project's opt-in to idle reclaim of its interactive leases, and its opt-out of the suspension of its idle
    resumable training (admins and owners): either or both; a field left out stays as it is (an empty body changes
    nothing and answers the project's state)."""

    opt_in = serializers.BooleanField(required=False,
                                      help_text="true: reclaim the project's idle interactive leases automatically "
                                                "(and suspend its idle resumable training automatically)")
    suspend_opt_out = serializers.BooleanField(required=False,
                                               help_text="true: never suspend the project's idle training")

