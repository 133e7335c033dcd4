"""Form posts turned into the same input the REST API takes, and service errors put next to their field.

The portal does not validate on its own: it shapes what the browser sent like the API's JSON body
(``{"project": ..., "gpu": {"kind": ..., ...}, ...}``) and lets the service decide. A value that is not a
number is passed on as the text that was typed, so the service's message (``gpu.count must be a whole
number from 1 to 64.``) is the one the user reads, exactly as an API client would.
"""

from __future__ import annotations

import re
import shlex
from datetime import UTC, datetime

from django.http import QueryDict

from core.errors import ApplicationError, ValidationFailed
from core.parsers import parse_integer
from tenants.services import MAX_TOKEN_LIFETIME

_INTEGER = re.compile(r"[+-]?[0-9]{1,12}")  # ASCII digits: int() also reads "١٢", and "\d" matches it

# choices for the request form (values in seconds, as the API takes them)
DURATIONS: tuple[tuple[int, str], ...] = (
    (900, "15 minutes"), (3600, "1 hour"), (4 * 3600, "4 hours"), (8 * 3600, "8 hours"), (86400, "1 day"),
    (3 * 86400, "3 days"), (7 * 86400, "7 days"), (30 * 86400, "30 days"),
)
TOKEN_LIFETIMES: tuple[tuple[str, str], ...] = (("30", "30 days"), ("90", "90 days"), ("365", "1 year"),
                                                  ("", "Never"))


def field_key(field: str | None) -> str:
    """``gpu.count`` → ``gpu_count``, ``credit_steps[1].metric`` → ``credit_steps_1_metric``: a key a
    template can look up (and an element id)."""
    if not field:
        return "__all__"
    return re.sub(r"[^A-Za-z0-9]+", "_", field).strip("_")


class FieldErrors(dict):
    """Messages by field key; ``__all__`` for those that name no field the form shows."""

    def __init__(self, error: ApplicationError | None = None, *, shown: set[str] | None = None):
        super().__init__()
        if error is not None:
            self.add(error, shown=shown)

    def add(self, error: ApplicationError, *, shown: set[str] | None = None) -> None:
        key = field_key(error.field)
        if shown is not None and key not in shown:
            key = "__all__"
        self[key] = error.message

    @property
    def general(self) -> str:
        return self.get("__all__", "")


def number(value: str | None):
    """An integer when the text is one; otherwise the text itself (the service names the field)."""
    text = (value or "").strip()
    return int(text) if _INTEGER.fullmatch(text) else text


def last_value(data: QueryDict, name: str, default: str = "") -> str:
    values = data.getlist(name)
    return values[-1] if values else default


# -- lease request ---------------------------------------------------------------------------------------
LEASE_FIELDS = {"project", "gpu", "gpu_kind", "gpu_model", "gpu_profile", "gpu_count", "gpu_min_count", "gpu_gang",
                "gpu_milli", "gpu_memory_mib", "gpu_cpu_milli_per_unit", "gpu_host_memory_mib_per_unit", "gpu_workload",
                "gpu_target_throughput", "workload_class", "priority",
                "duration_seconds", "labels",
                "workload", "workload_image", "workload_command", "workload_args", "workload_env",
                "workload_secret_env", "workload_workdir", "workload_checkpoint_dir", "workload_restart_policy",
                "workload_max_restarts", "workload_port"}
RESTART_POLICIES = (("never", "Never"), ("on-preemption", "After a preemption"),
                    ("on-failure", "After a preemption or a failure"))


def lease_field_errors(error: ApplicationError) -> FieldErrors:
    """The request form's errors: ``workload.env.NAME`` is shown under the environment box, ``workload.secret_env.
    NAME`` under the secret one."""
    for box in ("workload.env", "workload.secret_env", "labels"):
        if (error.field or "").startswith(f"{box}."):
            error.field = box
    return FieldErrors(error, shown=LEASE_FIELDS)


def labels_input(text: str) -> dict | None:
    """The form's labels line, ``team=vision, cost-center=cc-42``, as the API's ``labels`` object (None: empty)."""
    labels: dict[str, str] = {}
    for item in (part.strip() for part in (text or "").replace("\n", ",").split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValidationFailed(f"{item!r} is not key=value (e.g. team=vision).", field="labels")
        labels[key.strip()] = value.strip()
    return labels or None


def lease_request_input(data: QueryDict) -> dict:
    """The API body of ``POST /api/v1/leases`` from the request form: only the keys of the chosen kind."""
    kind = data.get("gpu.kind", "").strip()
    gpu: dict = {"kind": kind}
    if kind == "auto":  # auto-tiering: a registered workload, its target inline when typed (docs/tiering.md)
        gpu["workload"] = data.get("gpu.workload", "").strip()
        target = data.get("gpu.target_throughput", "").strip()
        if target:
            try:
                gpu["target_throughput"] = float(target)
            except ValueError:
                raise ValidationFailed("gpu.target_throughput must be a number (samples/s).",
                                       field="gpu.target_throughput") from None
        gpu["gang"] = last_value(data, "gpu.gang", "true") == "true"
        workload_class = data.get("workload_class", "training").strip()
        return _with_labels(data, {
            "project": data.get("project", "").strip(), "gpu": gpu, "workload_class": workload_class,
            "priority": number(data.get("priority", "0") or "0"),
            "duration_seconds": number(data.get("duration_seconds", "3600")),
            "workload": workload_input(data, interactive=workload_class == "interactive")})
    model = data.get("gpu.model", "auto").strip() or "auto"
    if model != "auto":
        gpu["model"] = model
    if data.get("gpu.count", "").strip():
        gpu["count"] = number(data.get("gpu.count"))
    if kind in ("whole", "share") and data.get("gpu.min_count", "").strip():  # an elastic lease (docs/leasing.md)
        gpu["min_count"] = number(data.get("gpu.min_count"))
    gang = last_value(data, "gpu.gang", "true")
    gpu["gang"] = gang == "true"
    memory = data.get("gpu.memory_mib", "").strip()
    if kind == "mig":
        gpu["profile"] = data.get("gpu.profile", "").strip()
    elif kind == "share":
        gpu["milli"] = number(data.get("gpu.milli"))
        gpu["memory_mib"] = number(memory)
    elif kind == "whole" and memory:
        gpu["memory_mib"] = number(memory)
    for name in ("cpu_milli_per_unit", "host_memory_mib_per_unit"):  # host CPU and memory per unit (advanced)
        if data.get(f"gpu.{name}", "").strip():
            gpu[name] = number(data.get(f"gpu.{name}"))
    workload_class = data.get("workload_class", "training").strip()
    return _with_labels(data, {
        "project": data.get("project", "").strip(),
        "gpu": gpu,
        "workload_class": workload_class,
        "priority": number(data.get("priority", "0") or "0"),
        "duration_seconds": number(data.get("duration_seconds", "3600")),
        "workload": workload_input(data, interactive=workload_class == "interactive"),
    })


def _with_labels(data: QueryDict, body: dict) -> dict:
    labels = labels_input(data.get("labels", ""))
    return {**body, "labels": labels} if labels else body


def workload_given(data, errors: dict) -> bool:
    """Whether the form's workload part holds anything (typed, or an error under it): it is shown open."""
    return (any(key.startswith("workload_") and key != "workload_class" for key in errors)
            or any(data.get(f"workload.{name}", "").strip()
                   for name in ("image", "command", "args", "env", "secret_env", "workdir", "checkpoint_dir",
                                "port"))
            or data.get("workload.restart_policy", "never") not in ("", "never"))


def _words(data: QueryDict, name: str) -> list[str]:
    """A line split like a shell would (quotes group, no expansion); an error names the field."""
    try:
        return shlex.split(data.get(name, ""))
    except ValueError as error:
        raise ValidationFailed(f"{name} cannot be split into words: {error}.", field=name) from None


def workload_input(data: QueryDict, *, interactive: bool) -> dict | None:
    """The request's optional ``workload`` from the form's workload fields; None when they are all left as
    they come (a bare lease). Only the shaping happens here; ``broker.validation.workload_check`` decides
    (a missing command, a path outside the allowed roots, a name the platform sets all come back naming
    ``workload.<field>``). The port is the interactive class's only, like the kind's fields are the kind's."""
    workload: dict = {}
    image = data.get("workload.image", "").strip()
    if image:  # a container image (nodes whose runtime is docker or podman); the command then overrides its entrypoint
        workload["image"] = image
    for name in ("command", "args"):
        words = _words(data, f"workload.{name}")
        if words:
            workload[name] = words
    for name in ("env", "secret_env"):  # secret_env: write-only, the page never shows it back (templates)
        env = {}
        for number_, line in enumerate(data.get(f"workload.{name}", "").splitlines(), start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, equals, value = line.partition("=")
            if not equals:
                raise ValidationFailed(f"workload.{name} line {number_} is not NAME=value.", field=f"workload.{name}")
            env[key.strip()] = value
        if env:
            workload[name] = env
    for name in ("workdir", "checkpoint_dir"):
        value = data.get(f"workload.{name}", "").strip()
        if value:
            workload[name] = value
    policy = data.get("workload.restart_policy", "never").strip() or "never"
    if policy != "never":
        workload["restart_policy"] = policy
    if policy == "on-failure" and data.get("workload.max_restarts", "").strip():
        workload["max_restarts"] = number(data.get("workload.max_restarts"))
    if interactive and data.get("workload.port", "").strip():
        workload["port"] = number(data.get("workload.port"))
    return workload or None


# -- API tokens ------------------------------------------------------------------------------------------
def token_create_input(data: QueryDict, *, now: datetime) -> dict:
    from datetime import timedelta

    days = data.get("expires_in_days", "").strip()
    expires_at = None
    if days:
        expires_at = now + timedelta(days=parse_integer(days, field="expires_at", low=1, high=MAX_TOKEN_LIFETIME.days,
                                                        what="a number of days from now"))
    projects = [slug for slug in data.getlist("projects") if slug]
    return {"name": data.get("name", ""), "scopes": data.getlist("scopes"), "expires_at": expires_at,
            "projects": projects or None}  # none ticked: every project of the tenant


# -- platform staff: quotas and SLO contracts -------------------------------------------------------------
def quota_input(data: QueryDict, *, with_weight: bool) -> dict:
    values = {"tier": data.get("tier", "").strip(),
              "deserved_gpu_milli": number(data.get("deserved_gpu_milli")),
              "limit_gpu_milli": number(data.get("limit_gpu_milli"))}
    if with_weight:
        values["over_quota_weight"] = number(data.get("over_quota_weight", "1"))
    return values


def _moment(text: str, field: str, *, required: bool) -> datetime | None:
    text = (text or "").strip()
    if not text:
        if required:
            raise ValidationFailed(f"{field} is required.", field=field)
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValidationFailed(f"{field} must be a date and time (YYYY-MM-DD HH:MM, UTC).", field=field) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


SLO_STEP_ROWS = 4


def slo_contract_input(data: QueryDict) -> tuple[dict, list[int]]:
    """The values ``slo_contract_save`` takes, and the form row of each credit step (blank rows are left
    out, so the service's ``credit_steps[1]`` may be the form's third row)."""
    steps, rows = [], []
    for row in range(SLO_STEP_ROWS):
        metric = data.get(f"step-{row}-metric", "").strip()
        threshold = data.get(f"step-{row}-threshold", "").strip()
        credit = data.get(f"step-{row}-credit_pct", "").strip()
        if metric or threshold or credit:
            steps.append({"metric": metric, "threshold": threshold, "credit_pct": credit})
            rows.append(row)
    return {
        "name": data.get("name", ""),
        "effective_from": _moment(data.get("effective_from", ""), "effective_from", required=True),
        "effective_to": _moment(data.get("effective_to", ""), "effective_to", required=False),
        "time_to_gpu_p95_seconds": number(data.get("time_to_gpu_p95_seconds")),
        "availability_target_pct": data.get("availability_target_pct", "").strip(),
        "preemption_notice_seconds": number(data.get("preemption_notice_seconds")),
        "max_credit_pct": data.get("max_credit_pct", "100").strip() or "100",
        # empty: the platform's minimum runtime (null)
        "min_runtime_seconds": number(data.get("min_runtime_seconds")) if (data.get("min_runtime_seconds") or ""
                                                                            ).strip() else None,
        "credit_steps": steps,
    }, rows


def slo_step_field(field: str | None, rows: list[int]) -> str | None:
    """``credit_steps[1].metric`` → ``step-<form row>-metric``."""
    match = re.match(r"^credit_steps\[(\d+)\]\.(\w+)$", field or "")
    if match and int(match.group(1)) < len(rows):
        return f"step-{rows[int(match.group(1))]}-{match.group(2)}"
    return field


# -- platform staff: capacity policies --------------------------------------------------------------------
def policy_input(data: QueryDict) -> tuple[str, dict]:
    """(scope, values) for ``capacity.services.policy_set`` from the policy form: a mode left empty inherits, a
    number left empty inherits (null), idle rules as JSON (empty: the built-in rules)."""
    import json

    from capacity.selectors import MODE_FIELDS, NUMBER_FIELDS

    values: dict = {name: data.get(name, "").strip() for name in MODE_FIELDS if name in data}
    for name in NUMBER_FIELDS:
        if name in data:
            text = data.get(name, "").strip()
            values[name] = number(text) if text else None
    if "idle_rules" in data:
        text = data.get("idle_rules", "").strip()
        try:
            values["idle_rules"] = json.loads(text) if text else {}
        except ValueError as error:
            raise ValidationFailed(f"idle_rules is not JSON: {error}.", field="idle_rules") from error
    return data.get("scope", "").strip(), values


# -- money: spend caps (tenant admins), billing terms and price books (platform staff) ----------------------------
def money_minor(text: str | None, currency: str, field: str) -> int:
    """An amount typed in major units (``1,250.50``) → integer minor units of ``currency``; an error naming
    ``field`` when it is not an amount the currency can hold (JPY has no decimals). The services check the
    range."""
    from decimal import Decimal, InvalidOperation

    from billing.core.pricing import minor_exponent, to_minor

    raw = (text or "").strip().replace(",", "").replace("_", "")
    try:
        amount = Decimal(raw)
    except InvalidOperation:
        raise ValidationFailed(f"{field} must be an amount in {currency}, e.g. 1250.00.", field=field) from None
    places = minor_exponent(currency)
    if not amount.is_finite() or amount != amount.quantize(Decimal(1).scaleb(-places)) or abs(amount) >= 10**13:
        raise ValidationFailed(f"{field} must be an amount in {currency} with at most {places} decimals.",
                               field=field)
    return to_minor(amount, currency)


def spend_cap_input(data: QueryDict, *, currency: str) -> dict:
    """``spend_cap_create`` / ``spend_cap_update`` values from a Budgets row (the amount in major units)."""
    return {"monthly_minor": money_minor(data.get("monthly"), currency, "monthly_minor"),
            "action": data.get("action", "").strip()}


def billing_terms_input(data: QueryDict, *, currency: str) -> dict:
    """``billing_terms_set`` values from the staff tenant page's terms form (the commitment in major units)."""
    commit = data.get("monthly_commit", "").strip() or "0"
    return {"period": data.get("period", "").strip(), "discount_pct": data.get("discount_pct", "").strip() or "0",
            "monthly_commit_minor": money_minor(commit, currency, "monthly_commit_minor")}


RATE_ROW = re.compile(r"^rate-(\d{1,3})-(tier|kind|mig_profile|per_hour)$")


def price_book_input(data: QueryDict, *, create: bool) -> tuple[dict, list[int]]:
    """The values ``price_book_create`` (``create``) or ``price_book_update`` take from the price-book form, and
    the form row of each rate (blank rows are left out: the service's ``rates[1]`` may be the form's third row).
    A row is blank when it names no model and no price."""
    rows: list[int] = []
    rates = []
    for row in sorted({int(m.group(1)) for key in data if (m := RATE_ROW.match(key))}):
        tier = data.get(f"rate-{row}-tier", "").strip()
        per_hour = data.get(f"rate-{row}-per_hour", "").strip()
        if not tier and not per_hour:
            continue
        rates.append({"tier": tier, "kind": data.get(f"rate-{row}-kind", "whole").strip() or "whole",
                      "mig_profile": data.get(f"rate-{row}-mig_profile", "").strip(), "per_hour": per_hour})
        rows.append(row)
    values: dict = {
        "name": data.get("name", ""),
        "effective_from": _moment(data.get("effective_from", ""), "effective_from", required=True),
        "over_quota_multiplier": data.get("over_quota_multiplier", "").strip(),
        "interactive_multiplier": data.get("interactive_multiplier", "").strip(),
        "energy_per_kwh": data.get("energy_per_kwh", "").strip() or None,
        "rates": rates,
    }
    if "profiling_multiplier" in data:  # the profiling rate (a form without it keeps the book's, or 1 when new)
        values["profiling_multiplier"] = data.get("profiling_multiplier", "").strip()
    if create:
        values["currency"] = data.get("currency", "").strip()
        values["tenant"] = data.get("tenant", "").strip()
    return values, rows


def rate_field(field: str | None, rows: list[int]) -> str | None:
    """``rates[1].per_hour`` → ``rate-<form row>-per_hour``; ``rates[1]`` → ``rate-<row>-tier``."""
    match = re.match(r"^rates\[(\d+)\](?:\.(\w+))?$", field or "")
    if match and int(match.group(1)) < len(rows):
        return f"rate-{rows[int(match.group(1))]}-{match.group(2) or 'tier'}"
    return field


# -- credit notes (staff invoice page) -----------------------------------------------------------------------------
def credit_note_input(data: QueryDict, *, positions: list[int], currency: str) -> tuple[dict, dict[str, str]]:
    """The credit note form as ``credit_note_issue``'s arguments: ``scope=lines`` (an amount per invoice line, blank
    lines left out) or ``scope=whole`` (``amount`` of the whole invoice), ``reason`` and ``memo``. The second value
    maps the service's field names (``lines[0].amount_minor``) to the form's (``line_3``)."""
    values: dict = {"reason": last_value(data, "reason"), "memo": last_value(data, "memo")}
    names = {"amount_minor": "amount"}
    if last_value(data, "scope") == "lines":
        lines = []
        for position in positions:
            text = last_value(data, f"line_{position}").strip()
            if text:
                names[f"lines[{len(lines)}].amount_minor"] = f"line_{position}"
                names[f"lines[{len(lines)}].position"] = f"line_{position}"
                lines.append({"position": position,
                              "amount_minor": money_minor(text, currency, f"line_{position}")})
        if not lines:
            raise ValidationFailed("Give an amount for at least one line.", field="lines")
        values["lines"] = lines
    else:
        values["amount_minor"] = money_minor(last_value(data, "amount"), currency, "amount")
    return values, names
