from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.core.validators import MaxValueValidator, MinValueValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from broker.choices import GpuKind, GpuMode, LeaseState, WorkloadClass
from broker.models import Allocation, Lease, LeaseEvent
from broker.validation import HOST_FIELDS, MAX_GPU_INDEX, MAX_GPU_MEMORY_MIB
from gpus.catalogue import MODELS
from gpus.mig import profiles_for
from tenants.api.serializers import StrictSerializer

_GPU_PROPERTIES = {
    "kind": {"type": "string", "enum": list(GpuKind.values)},
    "count": {"type": "integer", "minimum": 1, "maximum": 64, "description": "GPUs or slices (default 1)"},
    "model": {"type": "string", "description": 'a model code such as "H100-80GB", or "auto" (default)'},
    "profile": {"type": "string", "description": 'MIG profile, required for kind "mig" (e.g. "1g.10gb")'},
    "milli": {"type": "integer", "minimum": 1, "maximum": 999, "description": 'share of a GPU, kind "share"'},
    "memory_mib": {"type": "integer", "minimum": 1, "maximum": 1 << 20},
    "gang": {"type": "boolean", "description": "all count devices at once or none (default true)"},
    "cpu_milli_per_unit": {"type": "integer", "minimum": 0, "maximum": HOST_FIELDS["cpu_milli_per_unit"],
                           "description": "host CPU per unit in milli-cores (1000 = one core) on the node it runs "
                                          "on, reserved while it runs; needs gang true when count > 1 "
                                          "(default 0: none)"},
    "host_memory_mib_per_unit": {"type": "integer", "minimum": 0, "maximum": HOST_FIELDS["host_memory_mib_per_unit"],
                                 "description": "host memory per unit in MiB on the node it runs on, reserved "
                                                "while it runs; needs gang true when count > 1 (default 0: none)"},
    "min_count": {"type": "integer", "minimum": 1, "maximum": 64,
                  "description": "an elastic lease (whole GPUs or shares): under reclaim it may be shrunk to no fewer "
                                 "than min_count units instead of being preempted whole; at most count"},
}
GPU_OUTPUT_SCHEMA = {"type": "object", "properties": _GPU_PROPERTIES, "required": ["kind", "count", "model", "gang"]}


def _gpu_shape(kind: str, description: str, required: tuple[str, ...] = (), **properties: dict) -> dict:
    common = {name: _GPU_PROPERTIES[name] for name in ("count", "gang")}
    if kind != "auto":  # host CPU and memory with a concrete shape (auto-tiering chooses the shape)
        common.update({name: _GPU_PROPERTIES[name] for name in HOST_FIELDS})
    return {"type": "object", "title": description, "additionalProperties": False,
            "required": ["kind", *required],
            "properties": {"kind": {"type": "string", "enum": [kind]}, **common, **properties}}


def _gpu_request_schema() -> dict:
    """The ``gpu`` object, one shape per kind (and per MIG model, whose profiles differ), exactly what
    ``broker.services.shape_from`` accepts, so a request valid by the document is never a 400."""
    models = [code for model in MODELS for code in (model.code, *model.aliases)]
    any_model = {"type": "string", "enum": ["auto", *models], "description": _GPU_PROPERTIES["model"]["description"]}
    mig_models = [model.code for model in MODELS if profiles_for(model.code)]
    every_profile = sorted({p.name for code in mig_models for p in profiles_for(code)})
    shapes = [
        _gpu_shape(GpuKind.WHOLE, "whole GPUs", model=any_model, memory_mib=_GPU_PROPERTIES["memory_mib"],
                   min_count=_GPU_PROPERTIES["min_count"]),
        _gpu_shape(GpuKind.SHARE, "a share of a GPU", ("milli", "memory_mib"), model=any_model,
                   milli=_GPU_PROPERTIES["milli"], memory_mib=_GPU_PROPERTIES["memory_mib"],
                   min_count=_GPU_PROPERTIES["min_count"]),
        _gpu_shape(GpuKind.MIG, "MIG slices on any model that offers the profile", ("profile",),
                   model={"type": "string", "enum": ["auto"]},
                   profile={"type": "string", "enum": every_profile}),
        *(_gpu_shape(GpuKind.MIG, f"MIG slices on {code}", ("model", "profile"),
                     model={"type": "string", "enum": [code]},
                     profile={"type": "string", "enum": [p.name for p in profiles_for(code)]})
          for code in mig_models),
    ]
    shapes.append(_gpu_shape(
        "auto", "the cheapest slice predicted to meet a registered workload's target (auto-tiering, "
        "docs/tiering.md); the target may be given inline", ("workload",),
        workload={"type": "string", "minLength": 1, "maxLength": 64, "description": "a workload's name"},
        target_throughput={"type": "number", "minimum": 0.001, "maximum": 1e9,
                           "description": "samples/s (tokens/s for generation); default: the workload's"},
        target_latency_ms={"type": "number", "minimum": 0.01, "maximum": 3.6e6,
                           "description": "per step; default: the workload's"}))
    return {"oneOf": shapes, "description": "what to lease: kind whole, share, mig or auto"}


GPU_REQUEST_SCHEMA = _gpu_request_schema()
INVENTORY_SCHEMA = {
    "type": "object", "required": ["gpus"], "description": "the GPUs the agent found (docs/agent-protocol.md)",
    "properties": {"gpus": {"type": "array", "items": {
        "type": "object", "required": ["uuid", "index", "model", "mode", "memory_mib"],
        "properties": {"uuid": {"type": "string", "minLength": 1, "maxLength": 80},
                       "index": {"type": "integer", "minimum": 0, "maximum": MAX_GPU_INDEX},
                       "model": {"type": "string", "enum": [m.code for m in MODELS]},
                       "mode": {"type": "string", "enum": list(GpuMode.values)},
                       "memory_mib": {"type": "integer", "minimum": 1, "maximum": MAX_GPU_MEMORY_MIB},
                       "nvlink_domain": {"type": "string", "maxLength": 63,
                                         "description": "the GPU's NVLink/NVSwitch domain (\"\": none or not "
                                                        "reported); a multi-GPU lease is kept inside one"}}}},
                   "host_cpu_milli": {"type": "integer", "minimum": 0, "maximum": 1 << 40,
                                      "description": "the host's CPU in milli-cores (0 or absent: not tracked)"},
                   "host_memory_mib": {"type": "integer", "minimum": 0, "maximum": 1 << 40,
                                       "description": "the host's memory in MiB (0 or absent: not tracked)"},
                   "workload_roots": {"type": "array", "items": {"type": "string", "pattern": "^/"},
                                      "description": "where the node's workloads may name paths (<root>/<tenant>/"
                                                     "<project>); the broker refuses other paths before placing"}},
}


@extend_schema_field(GPU_REQUEST_SCHEMA)
class GpuRequestField(serializers.JSONField):
    """The ``gpu`` object of a request; ``broker.services`` validates it, naming ``gpu.<key>``."""


@extend_schema_field(INVENTORY_SCHEMA)
class InventoryField(serializers.JSONField):
    """The ``inventory`` of an enrollment; ``broker.services.node_inventory_sync`` validates each GPU."""


class BoundedIntegerField(serializers.IntegerField):
    """An integer whose documented bounds are the settings' at schema time, checked against the settings in
    force at each request (tests and deployments change them), in the service's own words, so the API and
    the portal say the same sentence for the same input."""

    def __init__(self, *, bounds, message: str, **kwargs):
        self._bounds, self._message = bounds, message
        low, high = bounds()
        super().__init__(min_value=low, max_value=high, **kwargs)
        self.validators = [v for v in self.validators if not isinstance(v, MinValueValidator | MaxValueValidator)]

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        low, high = self._bounds()
        if not low <= value <= high:
            raise serializers.ValidationError(self._message.format(low=low, high=high))
        return value


def _duration_bounds() -> tuple[int, int]:
    return settings.LEASE_MIN_DURATION_SECONDS, settings.LEASE_MAX_DURATION_SECONDS


def _duration_field(**kwargs) -> BoundedIntegerField:
    return BoundedIntegerField(bounds=_duration_bounds, **kwargs,
                               message="duration_seconds must be a whole number from {low} to {high}.")


class LeaseCreateInput(StrictSerializer):
    project = serializers.CharField(max_length=63, help_text="a project slug (unknown: 404)")
    gpu = GpuRequestField(help_text='{"kind": "mig", "profile": "1g.10gb"} | {"kind": "whole", "count": 2, '
                                          '"model": "H100-80GB"} | {"kind": "share", "milli": 250, "memory_mib": 8192}')
    workload_class = serializers.ChoiceField(choices=WorkloadClass.choices, default=WorkloadClass.TRAINING)
    priority = BoundedIntegerField(default=0, bounds=lambda: (-100, 100),
                                   message="priority must be a whole number from {low} to {high}.")
    duration_seconds = _duration_field(default=3600)
    workload = serializers.JSONField(
        required=False, allow_null=True,
        help_text='what the lease runs once placed (optional): {"command": ["python", "train.py"], "args": [], '
                  '"env": {}, "secret_env": {"HF_TOKEN": "…"}, "workdir": "/srv/gpubroker/<tenant>/<project>/...", '
                  '"checkpoint_dir": "/srv/gpubroker/<tenant>/<project>/...", '
                  '"restart_policy": "never" | "on-preemption" | "on-failure", "max_restarts": 3, "port": 8888} '
                  '(or "image" on container nodes); errors name workload.<field>. secret_env is write-only: the '
                  'workload gets it in its environment, no answer shows more than its names; an env name that '
                  'looks like a credential (TOKEN, SECRET, PASSWORD, KEY …) is refused, pointing to secret_env. '
                  'Paths lie under the project\'s own directory, <root>/<tenant>/<project>')
    labels = serializers.DictField(
        child=serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9 _.:/@+-]{0,62}$", max_length=63), required=False,
        allow_empty=True,
        help_text='cost allocation labels (optional), e.g. {"team": "vision", "cost-center": "cc-42"}: keys the '
                  'tenant allows (GET /api/v1/label-keys), at most 10; copied into the usage rows, so usage and '
                  'invoices break down by them; errors name labels.<key>')


_LEASE_CREATE_FIELDS = frozenset({"project", "gpu", "workload_class", "priority", "duration_seconds", "workload"})
_WORKLOAD_CLASSES = {str(value): value for value, _ in WorkloadClass.choices}  # ChoiceField's own mapping


def lease_create_parse(data) -> dict:
    """``LeaseCreateInput``'s validated data for ``data`` (a parsed JSON body), without building a serializer
    for the common body whose every value is plainly valid: a ``Serializer`` deep-copies its declared fields for
    each instance and runs each through DRF's generic validation, which cost about a third of a millisecond per
    lease request. Anything else — a missing, unknown, null, mistyped, out-of-range or unusual value — goes to
    the serializer itself, so every error (and its problem+json naming the field) is the serializer's. A test
    checks that both give the same result for a corpus of bodies, valid and not."""
    if type(data) is dict and data.keys() <= _LEASE_CREATE_FIELDS:
        project, gpu = data.get("project"), data.get("gpu")
        workload_class = data.get("workload_class", WorkloadClass.TRAINING.value)
        priority, duration = data.get("priority", 0), data.get("duration_seconds", 3600)
        low, high = _duration_bounds()
        if (type(project) is str and 0 < len(project) <= 63 and project.isascii() and "\x00" not in project
                and type(gpu) is dict and type(workload_class) is str and workload_class in _WORKLOAD_CLASSES
                and type(priority) is int and -100 <= priority <= 100
                and type(duration) is int and low <= duration <= high
                and (data.get("workload") is None or type(data.get("workload")) is dict)):
            parsed = {"project": project, "gpu": gpu,
                      "workload_class": _WORKLOAD_CLASSES[workload_class] if "workload_class" in data
                      else WorkloadClass.TRAINING,
                      "priority": priority, "duration_seconds": duration}
            if "workload" in data:
                parsed["workload"] = data["workload"]
            return parsed
    serializer = LeaseCreateInput(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


class LeaseRenewInput(StrictSerializer):
    duration_seconds = _duration_field()


class DeviceOutput(serializers.ModelSerializer):
    node = serializers.CharField(source="gpu.node.node_id")
    gpu_uuid = serializers.CharField(source="gpu.uuid")
    gpu_index = serializers.IntegerField(source="gpu.index")
    model = serializers.CharField(source="tier")
    instance_id = serializers.CharField()
    share_enforcement = serializers.SerializerMethodField(
        help_text="a share only (else null): mps (its limits enforced by the GPU's MPS control daemon) or none "
                  "(environment variables the workload may ignore; see the lease's share_enforcement.reason)")

    class Meta:
        model = Allocation
        fields = ["instance_id", "node", "gpu_uuid", "gpu_index", "model", "kind", "mig_profile", "mig_start",
                  "milli", "memory_mib", "state", "device_uuid", "gpu_instance_id", "access", "share_enforcement"]

    def get_share_enforcement(self, obj) -> str | None:
        return obj.gpu.share_enforcement if obj.kind == GpuKind.SHARE else None


class EventOutput(serializers.ModelSerializer):
    class Meta:
        model = LeaseEvent
        fields = ["at", "from_state", "to_state", "reason", "actor"]


class LeaseOutput(serializers.ModelSerializer):
    project = serializers.CharField(source="project.slug")
    gpu = serializers.SerializerMethodField()
    estimated_start = serializers.SerializerMethodField(
        help_text="While queued: when the last schedule cycle estimated it starts, counting on the running leases "
                  "leaving at their expiry (docs/scheduling.md, \"Estimated start times\"); null when not queued or "
                  "when no estimate could be made (work without an end ahead of it, a shape the fleet cannot hold)")

    class Meta:
        model = Lease
        fields = ["id", "project", "state", "reason", "decision", "queue_position", "estimated_start", "gpu",
                  "workload_class", "priority", "duration_seconds", "tier", "over_quota", "guarantee_covered",
                  "requested_at", "active_at", "ends_at", "notice_deadline", "finished_at", "labels"]
        extra_kwargs = {"labels": {"help_text": "cost allocation labels set at the request"},
                        "guarantee_covered": {"help_text": "Whether the project's guarantee covered the request when "
                                                           "the scheduler first saw it, counting the project's own "
                                                           "requests ahead of it; only covered leases are time-to-GPU "
                                                           "samples of the SLO (docs/billing.md, \"SLO evaluation\"). "
                                                           "Null until a schedule cycle has seen it."},
                        "decision": {"help_text": "How the GPU shape was chosen when the request let the broker "
                                                  "choose it (gpu kind auto: the slice, its prediction and "
                                                  "confidence); kept for the lease's life, unlike reason, "
                                                  "which follows its state. Empty otherwise."}}

    @extend_schema_field({"type": "string", "format": "date-time", "nullable": True})
    def get_estimated_start(self, obj) -> str | None:
        if obj.state != LeaseState.QUEUED or obj.estimated_start is None:
            return None
        return _DATETIME.to_representation(obj.estimated_start)

    @extend_schema_field(GPU_OUTPUT_SCHEMA)
    def get_gpu(self, obj) -> dict:
        shape = {"kind": obj.kind, "count": obj.count, "model": obj.models_allowed[0] if obj.models_allowed else "auto",
                 "gang": obj.gang}
        if obj.profile:
            shape["profile"] = obj.profile
        if obj.milli:
            shape["milli"] = obj.milli
        if obj.memory_mib:
            shape["memory_mib"] = obj.memory_mib
        if obj.cpu_milli_per_unit:
            shape["cpu_milli_per_unit"] = obj.cpu_milli_per_unit
        if obj.host_memory_mib_per_unit:
            shape["host_memory_mib_per_unit"] = obj.host_memory_mib_per_unit
        if obj.min_count:
            shape["min_count"] = obj.min_count
        return shape

    def to_representation(self, instance) -> dict:
        """The fields above, written out: a ModelSerializer builds its fields anew for every instance, which
        cost more than the rest of answering a lease request. The declared fields still describe the
        schema; a test checks that this gives exactly what DRF's generic rendering gives."""
        moment = _DATETIME.to_representation
        return {
            "id": instance.pk, "project": instance.project.slug, "state": str(instance.state),
            "reason": instance.reason, "decision": instance.decision, "queue_position": instance.queue_position,
            "estimated_start": self.get_estimated_start(instance), "gpu": self.get_gpu(instance),
            "workload_class": str(instance.workload_class), "priority": instance.priority,
            "duration_seconds": instance.duration_seconds, "tier": instance.tier, "over_quota": instance.over_quota,
            "guarantee_covered": instance.guarantee_covered,
            **{name: moment(value) if value is not None else None for name, value in (
                ("requested_at", instance.requested_at), ("active_at", instance.active_at),
                ("ends_at", instance.ends_at), ("notice_deadline", instance.notice_deadline),
                ("finished_at", instance.finished_at))},
            "labels": instance.labels,
        }


_DATETIME = serializers.DateTimeField()  # DRF's own formatting of a moment (ISO 8601, UTC as "Z")


WORKLOAD_OUTPUT_SCHEMA = {
    "type": "object", "nullable": True,
    "properties": {"spec": {"type": "object", "additionalProperties": True,
                            "description": "the workload as requested; secret_env as the list of its names only "
                                           "(the values are never shown)"},
                   "state": {"type": "string"}, "node": {"type": "string", "nullable": True},
                   "restart_count": {"type": "integer"}, "placements": {"type": "integer"},
                   "exit_code": {"type": "integer", "nullable": True}, "signal": {"type": "integer", "nullable": True},
                   "started_at": {"type": "string", "format": "date-time", "nullable": True},
                   "ended_at": {"type": "string", "format": "date-time", "nullable": True},
                   "endpoint": {"type": "string", "nullable": True,
                                "description": "node host:host port of an interactive workload while it runs "
                                               "(the host port allocated on its node)"},
                   "failed_runs": {"type": "integer"},
                   "avoid_nodes": {"type": "array", "items": {"type": "string"}},
                   "history": {"type": "array", "items": {"type": "object", "properties": {
                       "placement": {"type": "integer"}, "node": {"type": "string"},
                       "host_port": {"type": "integer", "nullable": True}, "state": {"type": "string"},
                       "started_at": {"type": "string", "format": "date-time"},
                       "ended_at": {"type": "string", "format": "date-time", "nullable": True},
                       "failed_runs": {"type": "integer"}, "log_kept": {"type": "boolean"}}}}}}


def workload_output(lease) -> dict | None:
    """The lease's workload (None without one): its definition and what its runs did."""
    try:
        workload = lease.workload
    except ObjectDoesNotExist:
        return None
    moment = _DATETIME.to_representation
    return {"spec": workload.spec, "state": workload.state,
            "node": workload.node.node_id if workload.node else None, "restart_count": workload.restart_count,
            "placements": workload.placements, "exit_code": workload.exit_code, "signal": workload.signal,
            "started_at": moment(workload.started_at) if workload.started_at else None,
            "ended_at": moment(workload.ended_at) if workload.ended_at else None, "endpoint": workload.endpoint,
            "failed_runs": workload.failed_runs, "avoid_nodes": list(lease.avoid_nodes),
            "history": [{"placement": p.number, "node": p.node_name, "host_port": p.host_port, "state": p.state,
                         "started_at": moment(p.started_at), "ended_at": moment(p.ended_at) if p.ended_at else None,
                         "failed_runs": p.failed_runs, "log_kept": p.log_kept_at is not None}
                        for p in workload.placement_rows.order_by("number")]}


SHARE_ENFORCEMENT_SCHEMA = {
    "type": "object", "nullable": True,
    "description": "a lease with shares only (else null): whether their compute and memory limits hold — mps when "
                   "every share's GPU runs an MPS control daemon, none otherwise, with the reason (docs/leasing.md)",
    "properties": {"mode": {"type": "string", "enum": ["mps", "none"]}, "reason": {"type": "string"}}}


ACCESS_OUTPUT_SCHEMA = {"type": "array", "items": {"type": "object", "properties": {
    "node": {"type": "string"}, "host": {"type": "string", "description": "the host to reach the node by"},
    "devices": {"type": "array", "items": {"type": "string"}, "description": "instance ids, in env's order"},
    "ready": {"type": "boolean", "description": "every device created (env complete)"},
    "env": {"type": "object", "additionalProperties": {"type": "string"},
            "description": "one environment for a process using all the lease's devices on this node: "
                           "CUDA_VISIBLE_DEVICES lists every device (comma-separated), shares add their MPS limits"},
    "share_enforcement": {"type": "string", "nullable": True, "enum": ["mps", "none", None],
                          "description": "whether the limits of the shares on this node hold (share_enforcement_of; "
                                         "null: no share)"},
    "share_enforcement_text": {"type": "string", "nullable": True, "description": "why (or why not)"},
    "share_limits": {"type": "array", "items": {"type": "object", "properties": {
        "instance_id": {"type": "string"}, "milli": {"type": "integer"}, "memory_mib": {"type": "integer"}}}},
    "isolation": {"type": "string", "description": "the node's workload isolation as it reports it, or unknown"},
    "interactive": {"type": "object", "nullable": True, "description": (
        "a workload with a port: where the broker's interactive proxy reaches it (HTTP and WebSocket, your token or "
        "portal session required; docs/leasing.md \"Interactive access\"); null otherwise or when no proxy is set"),
        "properties": {"url": {"type": "string", "format": "uri"}, "websocket_url": {"type": "string"},
                       "port": {"type": "integer"}, "running": {"type": "boolean"}, "how": {"type": "string"}}},
    "ssh": {"type": "object", "nullable": True, "description": (
        "a lease with a workload: the command that opens a shell beside it through the broker's SSH gateway, with "
        "an SSH key you registered (docs/leasing.md \"SSH\"); null otherwise or when no gateway is set"),
        "properties": {"command": {"type": "string"}, "running": {"type": "boolean"}, "how": {"type": "string"}}}}}}


class LeaseDetailOutput(LeaseOutput):
    devices = serializers.SerializerMethodField()
    events = EventOutput(many=True)
    workload = serializers.SerializerMethodField()
    share_enforcement = serializers.SerializerMethodField()
    access = serializers.SerializerMethodField()

    class Meta(LeaseOutput.Meta):
        fields = [*LeaseOutput.Meta.fields, "devices", "share_enforcement", "events", "workload", "access"]

    @extend_schema_field(SHARE_ENFORCEMENT_SCHEMA)
    def get_share_enforcement(self, obj) -> dict | None:
        from broker.selectors import share_enforcement_of

        return share_enforcement_of([a for a in obj.allocations.all() if a.freed_at is None])

    @extend_schema_field(ACCESS_OUTPUT_SCHEMA)
    def get_access(self, obj) -> list:
        """Per node: how to reach it, the one environment for all the lease's devices there, what is enforced."""
        from broker.selectors import lease_access

        return lease_access(lease=obj) if obj.state in ("active", "preempted") else []

    @extend_schema_field(WORKLOAD_OUTPUT_SCHEMA)
    def get_workload(self, obj) -> dict | None:
        return workload_output(obj)

    def to_representation(self, instance) -> dict:
        return serializers.ModelSerializer.to_representation(self, instance)  # devices and events too

    @extend_schema_field(DeviceOutput(many=True))
    def get_devices(self, obj) -> list:
        live = [a for a in obj.allocations.all() if a.freed_at is None]
        devices = DeviceOutput(live, many=True).data
        if obj.access_extra:  # what the app that asked for the lease adds (a model split's layer range)
            for device in devices:
                device["access"] = {**device["access"], **obj.access_extra}
        return devices


class EnrollInput(StrictSerializer):
    node_id = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    token = serializers.CharField(max_length=200, required=False, allow_blank=True)  # not when signed by the node
    enrollment_id = serializers.RegexField(
        r"^[A-Za-z0-9_-]{16,128}$", required=False,
        help_text="random, chosen by the agent and kept until it has an answer: the same token and id again, "
                  "before the node first signs with its secret, get the same answer (a lost 201 is asked for again)")
    address = serializers.URLField(max_length=300)
    hostname = serializers.CharField(max_length=255, required=False, allow_blank=True)
    agent_version = serializers.CharField(max_length=32, required=False, allow_blank=True)
    protocol = serializers.CharField(max_length=8, required=False)
    inventory = InventoryField()


class EnrolledOutput(serializers.Serializer):
    node_id = serializers.CharField()
    secret = serializers.CharField(help_text="the node's signing secret; shown once")
    heartbeat_seconds = serializers.IntegerField()


class HeartbeatOutput(serializers.Serializer):
    heartbeat_seconds = serializers.IntegerField()


