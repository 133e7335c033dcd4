"""The rules of a lease request, in one place: ``lease_request`` (the writer), ``lease_preview`` and the quote (the
readers) validate with these functions, so a request the quote accepts is accepted, and refused with the same
field and words.

``request_input_check`` checks the body (shape, class, priority, duration: no database); ``request_quota_check``
checks it against the project's quota limits and the fleet (a request no node could ever hold is refused).
``lease_request`` runs the two with its own one-query project lookup (idempotency replay and quota limits in one
round trip) between them; the readers call ``request_validate``, which looks the project up through the tenant's
selectors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from agent.protocol import InvalidRequest, spec_from_json
from broker.choices import GpuKind, NodeStatus, WorkloadClass
from broker.models import Gpu
from core.errors import NotFound, PermissionDenied, QuotaExceeded, ValidationFailed
from gpus.catalogue import UnknownModel, model_get
from gpus.mig import UnknownProfile, profile_get, profiles_for
from tenants.access import Actor

MAX_COUNT = 64
_KINDS = frozenset(GpuKind.values)  # TextChoices.values builds its list on every access
# The highest priority a member may send; above it (up to 100) needs the tenant's admin or owner role.
# Priority orders requests inside one project only (the scheduler never compares it across projects), so
# this bound keeps one member from jumping every colleague's queue without an admin's say.
MEMBER_MAX_PRIORITY = 10
MAX_GPU_INDEX = 1023  # Gpu.index is a smallint; past it was a 500 ("smallint out of range")
MAX_GPU_MEMORY_MIB = 1 << 24  # 16 TiB; Gpu.memory_mib is an integer

# host CPU (milli-cores) and memory (MiB) a request may ask per GPU unit, and their upper bounds (1,024 cores, 16 TiB)
HOST_FIELDS = {"cpu_milli_per_unit": 1_024_000, "host_memory_mib_per_unit": 1 << 24}


def shape_from(gpu: object) -> dict:
    """Validate the ``gpu`` object of a request; errors name the field (``gpu.profile``)."""
    if not isinstance(gpu, dict):
        raise ValidationFailed("gpu must be an object, e.g. {\"kind\": \"mig\", \"profile\": \"1g.10gb\"}.",
                               field="gpu")
    known = {"kind", "count", "model", "profile", "milli", "memory_mib", "gang", "min_count", *HOST_FIELDS}
    for key in gpu:
        if key not in known:
            raise ValidationFailed(f"Unknown field {key!r}; known: {', '.join(sorted(known))}.", field=f"gpu.{key}")
    kind = gpu.get("kind")
    if not isinstance(kind, str) or kind not in _KINDS:  # an object or a list is unhashable
        raise ValidationFailed(f"gpu.kind must be one of {', '.join(GpuKind.values)}.", field="gpu.kind")

    def integer(name: str, default: int, low: int, high: int) -> int:
        value = gpu.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValidationFailed(f"gpu.{name} must be a whole number from {low} to {high}.", field=f"gpu.{name}")
        return value

    count = integer("count", 1, 1, MAX_COUNT)
    gang = gpu.get("gang", True)
    if not isinstance(gang, bool):
        raise ValidationFailed("gpu.gang must be true or false.", field="gpu.gang")
    model = gpu.get("model", "auto")
    if not isinstance(model, str):
        raise ValidationFailed("gpu.model must be a model code or \"auto\".", field="gpu.model")
    models: list[str] = []
    if model != "auto":
        try:
            models = [model_get(model).code]
        except UnknownModel as error:
            raise ValidationFailed(error.args[0], field="gpu.model") from None
    shape = {"kind": kind, "count": count, "gang": gang, "models": models, "profile": "", "milli": 0,
             "memory_mib": 0, "min_count": 0}
    if "min_count" in gpu:  # an elastic lease: it may be shrunk under reclaim down to min_count (docs/leasing.md)
        if kind == GpuKind.MIG:
            raise ValidationFailed("gpu.min_count does not apply to MIG slices: elastic leases are whole GPUs or "
                                   "shares.", field="gpu.min_count")
        shape["min_count"] = integer("min_count", 0, 1, count)
    # a key that does not apply to the kind is refused, not ignored (the OpenAPI document says so too)
    for name in {GpuKind.MIG: ("milli", "memory_mib"), GpuKind.SHARE: ("profile",)}.get(kind, ()):
        if name in gpu:
            raise ValidationFailed(f"gpu.{name} does not apply to kind {kind!r}.", field=f"gpu.{name}")
    if kind == GpuKind.MIG:
        profile = gpu.get("profile")
        if not isinstance(profile, str) or not profile:
            raise ValidationFailed("gpu.profile is required for a MIG slice, e.g. \"1g.10gb\".", field="gpu.profile")
        candidates = models or [m for m in ("A100-40GB", "A100-80GB", "H100-80GB", "H100-NVL-94GB", "H200-141GB")]
        offered = []
        for code in candidates:
            try:
                offered.append(profile_get(code, profile).name)
            except UnknownProfile:
                continue
        if not offered:
            if models:
                names = ", ".join(p.name for p in profiles_for(models[0])) or "none (no MIG on this model)"
                raise ValidationFailed(f"Profile {profile!r} is not offered on {models[0]}; offered: {names}.",
                                       field="gpu.profile")
            raise ValidationFailed(f"No GPU model offers MIG profile {profile!r}.", field="gpu.profile")
        shape["profile"] = offered[0]
    elif kind == GpuKind.SHARE:
        shape["milli"] = integer("milli", 0, 1, 999)
        shape["memory_mib"] = integer("memory_mib", 0, 1, 1 << 20)
    else:
        for name in ("profile", "milli"):
            if name in gpu:
                raise ValidationFailed(f"gpu.{name} does not apply to a whole GPU.", field=f"gpu.{name}")
        if "memory_mib" in gpu:
            shape["memory_mib"] = integer("memory_mib", 0, 1, 1 << 20)  # with model "auto": the need
    # host CPU and memory per unit, on the node it runs on: present in the shape only when asked, so that a
    # request without them hashes (its idempotency key) as it did before they existed
    for name, high in HOST_FIELDS.items():
        if name in gpu and (value := integer(name, 0, 0, high)):
            if not gang and count > 1:
                raise ValidationFailed(f"gpu.{name} needs gang true: units spread over several nodes cannot "
                                       "reserve one node's CPU or memory.", field=f"gpu.{name}")
            shape[name] = value
    return shape


def priority_check(actor: Actor, priority: object) -> None:
    """Priority orders work inside a project only (docs/scheduling.md); members may send up to
    ``MEMBER_MAX_PRIORITY``, admins and owners up to 100. Shared by the request and its preview."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not -100 <= priority <= 100:
        raise ValidationFailed("priority must be a whole number from -100 to 100.", field="priority")
    if priority > MEMBER_MAX_PRIORITY and not actor.can("manage"):
        raise PermissionDenied(f"A priority above {MEMBER_MAX_PRIORITY} needs the admin or owner role in tenant "
                               f"'{actor.tenant.slug}'; members may send -100 to {MEMBER_MAX_PRIORITY}.",
                               field="priority")


def duration_check(value: object) -> int:
    low, high = settings.LEASE_MIN_DURATION_SECONDS, settings.LEASE_MAX_DURATION_SECONDS
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationFailed(f"duration_seconds must be a whole number from {low} to {high}.",
                               field="duration_seconds")
    return value


def units_per_gpu(shape: dict, model: str) -> int:
    """How many units of the shape one GPU of ``model`` can hold at most, whatever its mode now (the capacity
    loop may switch it): a whole GPU 1, MIG instances of the profile on an empty GPU, shares 1000 // milli."""
    from gpus.mig import MigPlacement, free_starts

    if shape["kind"] == GpuKind.WHOLE:
        return 1
    if shape["kind"] == GpuKind.SHARE:
        return 1000 // max(1, shape["milli"])
    try:
        profile = profile_get(model, shape["profile"])
    except UnknownProfile:
        return 0
    layout: list = []
    while starts := free_starts(layout, profile):
        layout.append(MigPlacement(starts[0], profile))
    return len(layout)


def never_fits(shape: dict, tiers: list[str]) -> str:
    """Why no node of the fleet as it is could ever hold this request — a gang needs its units on one node,
    a spread request on all of them together — or "" (it could, or the fleet has no GPU of these models yet:
    nodes may still enrol). Single units always fit a GPU of their model."""
    from django.db.models import Count

    count = shape["count"]
    if count <= 1:
        return ""
    nodes = list(Gpu.objects.filter(lost_at__isnull=True, model__in=tiers,
                                    node__status__in=(NodeStatus.READY, NodeStatus.SILENT))
                 .values("node_id", "model").annotate(gpus=Count("pk")).order_by())
    if not nodes:
        return ""
    per_node = [row["gpus"] * units_per_gpu(shape, row["model"]) for row in nodes]
    most = max(per_node) if shape["gang"] else sum(per_node)
    if count <= most:
        return ""
    unit = {"mig": f"MIG {shape['profile']} instance", "share": f"share of {shape['milli']} milli"}.get(
        shape["kind"], "whole GPU")
    where = "one node of the fleet holds" if shape["gang"] else "the whole fleet holds"
    hint = "; ask for fewer, or gang: false to spread them over nodes" if shape["gang"] else "; ask for fewer"
    return (f"{count} x {unit} can never be placed: {where} at most {most} on {', '.join(tiers)}{hint}.")


def quota_units(shape: dict, tier: str) -> int:
    if shape["kind"] == GpuKind.WHOLE:
        per = 1000
    elif shape["kind"] == GpuKind.MIG:
        per = profile_get(tier, shape["profile"]).gpu_milli
    else:
        per = shape["milli"]
    return per * shape["count"]


@dataclass(frozen=True)
class RequestInput:
    """A request body that passed ``request_input_check``: ``shape`` is ``shape_from(gpu)``."""

    project: str
    shape: dict
    workload_class: str
    priority: int
    duration_seconds: int


def request_input_check(*, actor: Actor, project: object, gpu: object, workload_class: object, priority: object,
                        duration_seconds: object) -> RequestInput:
    """The body's own rules (no database): the project is a slug, ``gpu`` a valid shape, the class known, the
    priority within the actor's role, the duration within the deployment's bounds. Errors name the field."""
    if not isinstance(project, str):
        raise ValidationFailed("project must be a project slug.", field="project")
    shape = shape_from(gpu)
    if workload_class not in WorkloadClass.values:
        raise ValidationFailed(f"workload_class must be one of {', '.join(WorkloadClass.values)}.",
                               field="workload_class")
    priority_check(actor, priority)
    duration_check(duration_seconds)
    return RequestInput(project, shape, str(workload_class), priority, duration_seconds)


def request_quota_check(*, request: RequestInput, limits: dict[str, int]) -> dict[str, int]:
    """The models whose project quota limit (``limits``: model → milli-GPU) admits the request, each with the
    units it would count (in the request's order: its models, else every model with a quota); refused with
    ``QuotaExceeded`` when none does, and with ``ValidationFailed`` on ``gpu.count`` when no node of the fleet
    could ever hold it on those models."""
    shape = request.shape
    tiers = shape["models"] or sorted(limits)
    fitting: dict[str, int] = {}
    for tier in tiers:
        if tier not in limits:
            continue
        try:
            units = quota_units(shape, tier)
        except UnknownProfile:  # the profile does not exist on this model
            continue
        if units <= limits[tier]:
            fitting[tier] = units
    if not fitting:
        wanted = ", ".join(tiers) or "any model"
        raise QuotaExceeded(f"Project {request.project!r} has no quota on {wanted} whose limit allows this "
                            "request.", field="gpu")
    never = never_fits(shape, list(fitting))
    if never:
        raise ValidationFailed(never, field="gpu.count")
    return fitting


@dataclass(frozen=True)
class ValidRequest:
    """What ``request_validate`` found: the checked body, the project and the models that admit it (with the
    units each would count)."""

    input: RequestInput
    project: object  # tenants.models.Project
    fitting: dict[str, int]
    quotas: dict  # model → tenants.models.Quota of the project


def request_validate(*, actor: Actor, project: object, gpu: object, workload_class: object, priority: object,
                     duration_seconds: object) -> ValidRequest:
    """Both checks, the project looked up as the actor sees it (``NotFound`` on ``project``): for the preview and
    the quote, which must refuse exactly what ``lease_request`` refuses."""
    from tenants.selectors import project_get, quota_list

    checked = request_input_check(actor=actor, project=project, gpu=gpu, workload_class=workload_class,
                                  priority=priority, duration_seconds=duration_seconds)
    target = project_get(actor=actor, slug=checked.project)
    quotas = {quota.tier: quota for quota in quota_list(actor=actor, project=target)}
    limits = {tier: quota.limit_gpu_milli for tier, quota in quotas.items()}
    return ValidRequest(checked, target, request_quota_check(request=checked, limits=limits), quotas)


# -- cost allocation labels -----------------------------------------------------------------------------------
MAX_LABELS = 10
LABEL_VALUE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.:/@+-]{0,62}$")


def labels_check(labels: object, *, allowed: list[str]) -> dict[str, str]:
    """A lease's cost allocation labels (issue 33): a JSON object of at most ``MAX_LABELS`` entries whose keys are
    among the tenant's ``allowed`` keys and whose values are 1 to 63 characters (letters, digits, space and
    ``_ . : / @ + -``, starting with a letter or digit). Errors name ``labels.<key>``."""
    if labels is None:
        return {}
    if not isinstance(labels, dict):
        raise ValidationFailed('labels must be a JSON object of key → value, e.g. {"team": "vision"}.',
                               field="labels")
    if len(labels) > MAX_LABELS:
        raise ValidationFailed(f"labels has at most {MAX_LABELS} entries.", field="labels")
    for key, value in labels.items():
        if key not in allowed:
            raise ValidationFailed(f"Label key {key!r} is not allowed in this tenant; allowed: "
                                   f"{', '.join(allowed) or 'none'}.", field=f"labels.{key}"[:80])
        if not isinstance(value, str) or not LABEL_VALUE_RE.match(value):
            raise ValidationFailed(f"The value of label {key!r} must be 1 to 63 characters: letters, digits, space "
                                   "and _ . : / @ + -, starting with a letter or digit.", field=f"labels.{key}")
    return {key: labels[key] for key in sorted(labels)}


# -- workloads ------------------------------------------------------------------------------------------------
WORKLOAD_TOP_FIELDS = ("command", "image", "args", "env", "secret_env", "scope", "workdir", "checkpoint_dir",
                       "restart_policy", "max_restarts", "port")


def workload_scope(*, tenant_slug: str, project: object) -> str:
    """Where a workload of this tenant's project may name paths: ``<tenant>/<project>`` under each root of
    ``WORKLOAD_ALLOWED_ROOTS`` (never another tenant's or project's directory, never a root itself). A project
    that is not a slug cannot exist: 404 on ``project``, as the request's lookup would answer."""
    from tenants.models import SLUG_REGEX

    if not isinstance(project, str) or not re.match(SLUG_REGEX, project):
        raise NotFound(f"No project {project!r} in this tenant.", field="project")
    return f"{tenant_slug}/{project}"


def workload_check(value: object, shape: dict, *, scope: str) -> dict | None:
    """``workload_split``'s spec: what is stored and shown (``secret_env`` as its names only)."""
    return workload_split(value, shape, scope=scope)[0]


def workload_split(value: object, shape: dict, *, scope: str) -> tuple[dict | None, dict[str, str]]:
    """A lease's optional workload, checked by the same rules the agent applies (``agent.workloads``) with
    the roots of ``WORKLOAD_ALLOWED_ROOTS`` narrowed to ``scope`` (``workload_scope``); a refusal names the
    field as ``workload.<field>``. A workload runs on one node: a lease of several devices must be a gang (same
    node). Returns the spec to store and show — ``secret_env`` replaced by the sorted list of its names — and
    the secret values apart (sealed by ``broker.workload_secrets``, never stored or shown in clear)."""
    if value is None:
        return None, {}
    if not isinstance(value, dict):
        raise ValidationFailed("workload must be an object (command or image, args, env, ...).", field="workload")
    for name in ("instances", "restart_count", "host_port", "scope"):
        if name not in value:
            continue
        raise ValidationFailed(f"workload.{name} is set by the broker.", field=f"workload.{name}")
    for name, ask in (("cpu_milli", "gpu.cpu_milli_per_unit"), ("memory_mib", "gpu.host_memory_mib_per_unit")):
        if name in value:  # the node gets the lease's host ask (per unit × its units there) from the broker
            raise ValidationFailed(f"workload.{name} is set by the broker from {ask}: ask for the host CPU and "
                                   "memory per unit there.", field=f"workload.{name}")
    if shape["count"] > 1 and not shape["gang"]:
        raise ValidationFailed("A workload runs on one node: a lease of several devices needs gang: true.",
                               field="workload")
    try:
        spec = spec_from_json({**value, "instances": ["lease"], "scope": scope},
                              [Path(root) for root in settings.WORKLOAD_ALLOWED_ROOTS])
    except InvalidRequest as error:
        raise ValidationFailed(error.message, field=f"workload.{error.field}") from None
    workload_node_roots_check(spec, shape, scope=scope)
    checked = {name: spec[name] for name in WORKLOAD_TOP_FIELDS}
    checked["secret_env"] = sorted(spec["secret_env"])
    if spec["perf"] is not None:  # simulated nodes: the performance model's workload (docs/tiering.md)
        checked["perf"] = spec["perf"]
    return checked, spec["secret_env"]


def workload_node_roots_check(spec: dict, shape: dict, *, scope: str) -> None:
    """The workload's paths against the roots the nodes themselves accept (their inventory's ``workload_roots``,
    ``Node.workload_roots``): a node refuses a path outside ``<root>/<scope>`` of its roots, so a request (and
    its preview) whose path no node of an allowed model accepts is refused here, naming the field, rather
    than placed, started and failed. Nodes whose agent reports no roots are not judged (an older agent)."""
    paths = [(name, spec[name]) for name in ("workdir", "checkpoint_dir") if spec[name]]
    if not paths:
        return
    node_roots = list(Gpu.objects.filter(model__in=shape["models"], lost_at__isnull=True, node__cordoned=False,
                                         node__status=NodeStatus.READY, node__workload_roots__isnull=False)
                      .values_list("node__workload_roots", flat=True).distinct())
    if not node_roots:
        return

    def accepts(roots: list[str], value: str) -> bool:
        return any(Path(value) == Path(root) / scope or Path(value).is_relative_to(Path(root) / scope)
                   for root in roots)

    if any(all(accepts(roots, value) for _, value in paths) for roots in node_roots):
        return  # one node accepts them all (a workload runs on one node)
    name, value = next(((n, v) for n, v in paths if not any(accepts(r, v) for r in node_roots)), paths[0])
    every = sorted({root for roots in node_roots for root in roots})
    allowed = ", ".join(f"{root}/{scope}" for root in every) or "(none: the nodes run no workloads)"
    raise ValidationFailed(f"workload.{name} {value!r} is outside what the nodes of {'/'.join(shape['models'])} "
                           f"accept: {allowed}", field=f"workload.{name}")
