"""The loop's settings per scope (``CapacityPolicy``): checked here (the scope exists, every mode and number
in range, idle rules per reclaim class), written and audited in one transaction."""

from __future__ import annotations

from django.db import transaction

from capacity.choices import LoopMode
from capacity.models import CapacityPolicy
from capacity.selectors import MODE_FIELDS, NUMBER_FIELDS
from capacity.services.common import _audit
from core.errors import ValidationFailed

IDLE_CLASSES = ("interactive", "inference", "training", "over-quota", "resumable-training")
RULE_KEYS = {"enabled": bool, "threshold_permille": int, "window_seconds": int, "notice_seconds": int}


def _clean_scope(scope: object) -> str:
    from gpus.catalogue import UnknownModel, model_get
    from tenants.models import Project

    if not isinstance(scope, str):
        raise ValidationFailed("scope must be a string: \"\", \"pool:<model>\" or \"project:<id>\".", field="scope")
    if scope == "":
        return scope
    kind, _, rest = scope.partition(":")
    if kind == "pool":
        try:
            model_get(rest)
        except UnknownModel as error:
            raise ValidationFailed(f"scope: {error}", field="scope") from error
        return scope
    if (kind == "project" and rest.isascii() and rest.isdigit() and len(rest) < 19
            and Project.objects.filter(pk=int(rest)).exists()):
        return scope
    raise ValidationFailed("scope must be \"\" (the default), \"pool:<GPU model>\" or \"project:<id of a project>\".",
                           field="scope")


def _clean_rules(raw: object) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValidationFailed("idle_rules must be an object keyed by class.", field="idle_rules")
    out = {}
    for name, rule in raw.items():
        if name not in IDLE_CLASSES:
            raise ValidationFailed(f"idle_rules: unknown class {name!r}; one of {', '.join(IDLE_CLASSES)}.",
                                   field=f"idle_rules.{name}")
        if not isinstance(rule, dict):
            raise ValidationFailed("each idle rule is an object.", field=f"idle_rules.{name}")
        clean = {}
        for key, value in rule.items():
            kind = RULE_KEYS.get(key)
            if kind is None:
                raise ValidationFailed(f"unknown key {key!r}; one of {', '.join(RULE_KEYS)}.",
                                       field=f"idle_rules.{name}.{key}")
            if (kind is bool and not isinstance(value, bool)) or (kind is int and (
                    isinstance(value, bool) or not isinstance(value, int))):
                raise ValidationFailed(f"{key} must be {'true or false' if kind is bool else 'an integer'}.",
                                       field=f"idle_rules.{name}.{key}")
            if kind is int and not (0 <= value <= (1000 if key == "threshold_permille" else 30 * 86_400)):
                raise ValidationFailed(f"{key} is out of range.", field=f"idle_rules.{name}.{key}")
            if key == "window_seconds" and value < 1:
                raise ValidationFailed("window_seconds must be at least 1.", field=f"idle_rules.{name}.{key}")
            clean[key] = value
        out[name] = clean
    return out


def policy_set(*, scope: object, values: dict, by_user=None) -> CapacityPolicy:
    """Create or change the policy of a scope; fields not given keep their value (null: inherit). Audited."""
    scope = _clean_scope(scope)
    clean: dict = {}
    for name, value in values.items():
        if name in MODE_FIELDS:
            if value not in ("", None, *LoopMode.values):
                raise ValidationFailed(f"{name} must be one of off, advise, auto (or empty: inherit).", field=name)
            clean[name] = value or ""
        elif name in NUMBER_FIELDS:
            bad = isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 86_400 * 30
            if value is not None and bad:
                raise ValidationFailed(f"{name} must be an integer between 0 and 2592000 (or null: inherit).",
                                       field=name)
            clean[name] = value
        elif name == "idle_rules":
            clean[name] = _clean_rules(value)
        else:
            raise ValidationFailed(f"unknown field {name!r}.", field=name)
    with transaction.atomic():
        policy, _ = CapacityPolicy.objects.select_for_update().get_or_create(scope=scope)
        for name, value in clean.items():
            setattr(policy, name, value)
        policy.save()
        _audit("capacity_policy.set", by_user, dict(clean), target=f"capacity_policy:{scope or 'default'}")
    return policy


def policy_delete(*, policy: CapacityPolicy, by_user=None) -> None:
    """Delete a scope's policy (never the default's). Audited."""
    if policy.scope == "":
        raise ValidationFailed("The default policy cannot be deleted; set its fields to empty to inherit the "
                               "built-in defaults.", field="scope")
    with transaction.atomic():
        _audit("capacity_policy.delete", by_user, {}, target=f"capacity_policy:{policy.scope}")
        policy.delete()
