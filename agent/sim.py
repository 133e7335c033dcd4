"""The simulated backend: GPUs of any catalogue model in ``whole``, ``mig`` or ``shared`` mode.

Faithful where the broker depends on it: MIG placement exactly as ``gpus.mig`` rules it (start slots,
overlaps, Σ compute ≤ 7, one ``+me``), shares within 1000 milli and the GPU's memory, one whole-GPU
instance per GPU in ``whole`` mode. Every change is written to ``state_dir/sim-state.json`` (temp file,
fsync, rename) before it is answered, so a restart, even after ``kill -9``, shows the same inventory.

Memory as a real GPU's driver reports it: ``memory_total_mib`` is the catalogue's nameplate,
``memory_reserved_mib`` the driver's reservation (``reserved_mib``: recorded on a real H100, estimated for
the other models), and ``memory_mib`` = total - reserved is what whole instances and shares are sized on
and what the framebuffer readings count against. Whole and share instances carry the GPU's UUID in
``device_uuid``, MIG instances a MIG UUID; ``mig_mode`` is current = pending (a sim GPU switches at once).
``tests/agent/test_backend_conformance.py`` holds this backend and the nvml one (on a fake NVML answering
a real H100's recorded figures) to the same answers.

Telemetry: each instance replays a real utilisation/memory series (``agent.telemetry``); a GPU's power
is idle + (max − idle) × its compute-weighted activity, and its energy counter is the closed-form
integral of that power since the last change, so it only grows and needs no background thread.

Mode changes (``set_mode``) switch a GPU between ``whole``, ``mig`` and ``shared`` when it holds no
instance, and are saved like every other change.

Cold-path latency: ``create_latency_seconds`` (per instance created) and ``mode_change_latency_seconds``
(per mode actually changed) model real MIG creation and GPU reset times. The backend only counts what it
owes; the server waits it out with ``asyncio.sleep`` after the call, off the node's lock, so the change is
saved (and visible in the inventory) at once, the answer comes that much later, and other requests and
other nodes go on meanwhile. A repeat that changes nothing owes nothing.

Fault switches (for tests, over ``POST /v1/faults``): fail the next create (a device error, 503) or refuse it
(409: the device will not take it, retrying will not help), hang the next request,
drop an instance or a whole GPU as if it fell off the bus, pin an instance's activity (engine active and,
optionally, memory used) to a constant instead of its replayed series, and unpin it.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path

from agent.backend import Backend, GpuReading, InstanceReading, InstanceSpec, Readings, held_refusal
from agent.protocol import Conflict, InvalidRequest, NotFound, NotPermitted, Unavailable
from agent.telemetry import all_series, pick
from gpus.catalogue import UnknownModel, model_get
from gpus.mig import COMPUTE_SLICES, MigPlacement, UnknownProfile, layout_problem, profile_get

STATE_FILE = "sim-state.json"
# a simulated host's CPU and memory per GPU when not configured: an HGX H100 host's share (112 cores, 2 TiB
# for 8 GPUs, rounded down)
SIM_CPU_MILLI_PER_GPU = 14_000
SIM_MEMORY_MIB_PER_GPU = 256 * 1024
MAX_HOST_QUANTITY = 1 << 40
STATE_VERSION = 1
MAX_LATENCY_SECONDS = 600.0
PIN_FIELDS = ("instance", "engine_active", "fb_used_mib")
_UUID_NAMESPACE = uuid.UUID("6f1d3c52-3a57-4b8e-9d43-2b1f0f6a9c11")
_SPEC = re.compile(r"^(?P<model>[^:]+):(?P<count>\d+)(?::(?P<mode>whole|mig|shared))?$")

# The driver's framebuffer reservation (MiB): nvmlDeviceGetMemoryInfo_v2's ``reserved``, which no process can
# allocate. Recorded on a real NVIDIA H100 80GB HBM3 (driver 580.159.04, MIG disabled, idle): 480 MiB of
# 81,559 (tests/agent/data/h100_nvml.json, issue 28); on a real NVIDIA H200 (same driver, MIG disabled, idle):
# 616 MiB of 143,771 (the hwcheck report tests/agent/data/h200_hwcheck_2026-11-27.json, inventory_memory_fields).
# Every other model's reservation is estimated as the H100's fraction of the nameplate (``reserved_mib``), until
# a recording of that model replaces the estimate here.
RECORDED_RESERVED_MIB = {"H100-80GB": 480, "H200-141GB": 616}
_RECORDED_FRACTION = (480, 81_559)  # the H100's reservation / nameplate


def reserved_mib(model_code: str) -> int:
    """The driver's reservation on ``model_code`` (MiB): recorded where a real device was read, else the
    recorded H100's fraction of the nameplate, rounded half up (an L4's 23,034 MiB: 136 MiB)."""
    if model_code in RECORDED_RESERVED_MIB:
        return RECORDED_RESERVED_MIB[model_code]
    reserved, nameplate = _RECORDED_FRACTION
    return (model_get(model_code).memory_mib * reserved * 2 + nameplate) // (2 * nameplate)


def usable_mib(model_code: str) -> int:
    """What processes can allocate on ``model_code``: the nameplate less the driver's reservation."""
    return model_get(model_code).memory_mib - reserved_mib(model_code)


def nvlink_domains(gpus: list[tuple[str, int, str]], size: int | None) -> list[str]:
    """The NVLink domain of each simulated GPU, by index (``gpus`` as ``parse_gpu_specs`` gives them). ``size``
    None: each group of an NVLink model (the catalogue's ``nvlink``) is one domain (an 8-GPU HGX board: one
    NVSwitch domain), a PCIe model's GPUs none (""); ``size`` N: an NVLink group split into domains of N GPUs
    (``--nvlink-domain-size 4``: two domains of 4 on an 8-GPU node); 0: no NVLink anywhere. Names are
    ``nvl<k>``, numbered within the node (the scheduler compares domains within a node)."""
    out: list[str] = []
    number = 0
    for model, count, _mode in gpus:
        if size == 0 or not model_get(model).nvlink:
            out.extend([""] * count)
            continue
        width = size or count
        for position in range(count):
            out.append(f"nvl{number + position // width}")
        number += -(-count // width)
    return out


def parse_gpu_specs(text: str) -> list[tuple[str, int, str]]:
    """``"h100-80gb:8:mig,l4:2"`` → [("H100-80GB", 8, "mig"), ("L4", 2, "whole")]; errors name the part."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = _SPEC.match(part)
        if not match:
            raise ValueError(f"GPU spec {part!r}: expected MODEL:COUNT[:whole|mig|shared]")
        try:
            model = model_get(match["model"])
        except UnknownModel as error:
            raise ValueError(f"GPU spec {part!r}: {error.args[0]}") from None
        mode = match["mode"] or "whole"
        if mode == "mig" and not model.mig_capable:
            raise ValueError(f"GPU spec {part!r}: {model.code} has no MIG")
        count = int(match["count"])
        if not 1 <= count <= 64:
            raise ValueError(f"GPU spec {part!r}: count must be 1..64")
        out.append((model.code, count, mode))
    if not out:
        raise ValueError("no GPUs given (e.g. --gpus h100-80gb:8:mig)")
    return out


class SimBackend(Backend):
    name = "sim"

    def __init__(self, state_dir: Path, node_id: str, gpus: list[tuple[str, int, str]], *, clock=time.time,
                 create_latency_seconds: float = 0.0, mode_change_latency_seconds: float = 0.0,
                 allow_mig_changes: bool = True, nvlink_domain_size: int | None = None, host_cpu_milli: int = 0,
                 host_memory_mib: int = 0):
        for name, value in (("create_latency_seconds", create_latency_seconds),
                            ("mode_change_latency_seconds", mode_change_latency_seconds)):
            if not 0 <= value <= MAX_LATENCY_SECONDS:
                raise ValueError(f"{name} must be 0..{MAX_LATENCY_SECONDS} seconds, got {value}")
        self.create_latency_seconds = float(create_latency_seconds)
        self.mode_change_latency_seconds = float(mode_change_latency_seconds)
        # as the nvml backend's knob (off on a default real node): MIG on/off and MIG instances refused 403
        self.allow_mig_changes = bool(allow_mig_changes)
        # topology and host (not kept in the state file: they follow the configuration at every start)
        if nvlink_domain_size is not None and not 0 <= nvlink_domain_size <= 64:
            raise ValueError(f"nvlink_domain_size must be 0..64 GPUs, got {nvlink_domain_size}")
        for name, value in (("host_cpu_milli", host_cpu_milli), ("host_memory_mib", host_memory_mib)):
            if not 0 <= value <= MAX_HOST_QUANTITY:
                raise ValueError(f"{name} must be 0..{MAX_HOST_QUANTITY}, got {value}")
        self.nvlink_domain_size = nvlink_domain_size
        self._domains = nvlink_domains(gpus, nvlink_domain_size)
        per_gpu = sum(count for _, count, _ in gpus)
        self.host_cpu_milli = host_cpu_milli or SIM_CPU_MILLI_PER_GPU * per_gpu
        self.host_memory_mib = host_memory_mib or SIM_MEMORY_MIB_PER_GPU * per_gpu
        self._owed_seconds = 0.0  # modelled device time of the changes made since the last take_latency()
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.node_id = node_id
        self.clock = clock
        self.fail_next_create = ""  # a reason: the next create fails with it
        self.refuse_next_create = ""  # a reason: the next create is refused (409) with it
        self.hang_seconds = 0.0  # the server sleeps this long before the next request (one-shot)
        self._save_deferred = False  # inside create_many: one save at its end
        self._unsaved = False
        path = self.state_dir / STATE_FILE
        if path.exists():
            self.state = json.loads(path.read_text())
            if self.state.get("version") != STATE_VERSION or self.state.get("node_id") != node_id:
                raise ValueError(f"{path} belongs to another node or version; move it away to start afresh")
        else:
            now = self.clock()
            self.state = {"version": STATE_VERSION, "node_id": node_id, "gpus": [], "instances": {}}
            index = 0
            for model, count, mode in gpus:
                for _ in range(count):
                    gpu_uuid = f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_id}/{index}')}"
                    self.state["gpus"].append({"index": index, "uuid": gpu_uuid, "model": model, "mode": mode,
                                               "lost": False, "energy_mj": 0.0, "energy_at": now})
                    index += 1
            self._save()
        self._by_uuid = {gpu["uuid"]: gpu for gpu in self.state["gpus"]}

    def host(self) -> dict:
        """The simulated host's CPU (milli-cores) and memory (MiB): as configured, else per GPU
        (``SIM_CPU_MILLI_PER_GPU``, ``SIM_MEMORY_MIB_PER_GPU``, an HGX H100's share of its host)."""
        return {"cpu_milli": self.host_cpu_milli, "memory_mib": self.host_memory_mib}

    # -- persistence --------------------------------------------------------------------------------
    def create_many(self, specs: dict[str, InstanceSpec]) -> dict[str, dict]:
        """As ``Backend.create_many``, with one save (one fsync) for the whole call, before it returns."""
        self._save_deferred, self._unsaved = True, False
        try:
            return super().create_many(specs)
        finally:
            self._save_deferred = False
            if self._unsaved:
                self._save()

    def _save(self) -> None:
        if self._save_deferred:
            self._unsaved = True
            return
        path = self.state_dir / STATE_FILE
        temporary = path.with_suffix(".tmp")
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(self.state, handle, separators=(",", ":"), sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        directory = os.open(self.state_dir, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    # -- inventory ----------------------------------------------------------------------------------
    def _instances_on(self, gpu_uuid: str) -> list[dict]:
        return [item for item in self.state["instances"].values() if item["gpu"] == gpu_uuid]

    def inventory(self) -> dict:
        gpus = []
        for gpu in self.state["gpus"]:
            if gpu["lost"]:
                continue
            model = model_get(gpu["model"])
            mig_now = "enabled" if gpu["mode"] == "mig" else "disabled"
            entry = {"index": gpu["index"], "uuid": gpu["uuid"], "model": gpu["model"], "name": model.vendor_name,
                     "memory_mib": usable_mib(gpu["model"]), "memory_total_mib": model.memory_mib,
                     "memory_reserved_mib": reserved_mib(gpu["model"]), "mig_capable": model.mig_capable,
                     "mig_mode": {"current": mig_now, "pending": mig_now} if model.mig_capable else None,
                     "mode": gpu["mode"], "mig_layout": [],
                     "nvlink_domain": self._domains[gpu["index"]] if gpu["index"] < len(self._domains) else ""}
            held = self._instances_on(gpu["uuid"])
            if gpu["mode"] == "mig":
                entry["mig_layout"] = sorted(
                    ({"gpu_instance_id": i["gpu_instance_id"], "profile": i["profile"], "start": i["start"],
                      "size": profile_get(gpu["model"], i["profile"]).memory_slots, "device_uuid": i["device_uuid"]}
                     for i in held), key=lambda x: x["start"])
            if gpu["mode"] == "shared":
                entry["shares"] = {"milli_used": sum(i["milli"] for i in held),
                                   "memory_used_mib": sum(i["memory_mib"] for i in held)}
            gpus.append(entry)
        instances = sorted((self._public(item) for item in self.state["instances"].values()),
                           key=lambda x: x["allocation_id"])
        return {"gpus": gpus, "instances": instances}

    @staticmethod
    def _public(item: dict) -> dict:
        return {key: value for key, value in item.items() if not key.startswith("_")}

    # -- create ---------------------------------------------------------------------------------------
    def create(self, allocation_id: str, spec: InstanceSpec) -> tuple[dict, bool]:
        existing = self.state["instances"].get(allocation_id)
        if existing is not None:
            if existing["_spec"] != spec.to_json():
                raise Conflict(f"allocation {allocation_id!r} already has an instance with another spec: "
                               f"{json.dumps(existing['_spec'], sort_keys=True)}", field="allocation_id")
            return self._public(existing), False
        gpu = self._by_uuid.get(spec.gpu)
        if gpu is None or gpu["lost"]:
            raise InvalidRequest(f"no GPU {spec.gpu!r} on node {self.node_id}", field="gpu")
        wanted_mode = {"whole": "whole", "mig": "mig", "share": "shared"}[spec.kind]
        if gpu["mode"] != wanted_mode:
            raise InvalidRequest(f"GPU {gpu['index']} is in {gpu['mode']} mode; a {spec.kind} instance needs "
                                 f"{wanted_mode} mode", field="kind")
        model = model_get(gpu["model"])
        held = self._instances_on(gpu["uuid"])
        record = {"allocation_id": allocation_id, "kind": spec.kind, "gpu": gpu["uuid"], "gpu_index": gpu["index"],
                  "profile": "", "start": None, "milli": 0, "memory_mib": 0, "gpu_instance_id": None,
                  "compute_instance_id": None, "device_uuid": gpu["uuid"], "notice": None, "state": "active"}
        if spec.kind == "mig" and not self.allow_mig_changes:
            raise NotPermitted("MIG changes are disabled on this agent (allow_mig_changes is off): "
                               f"not creating {spec.profile} at slot {spec.start} on GPU {gpu['uuid']}", field="kind")
        if spec.kind == "mig":
            try:
                profile = profile_get(model.code, spec.profile)
            except UnknownProfile as error:
                raise InvalidRequest(error.args[0], field="profile") from None
            layout = [MigPlacement(i["start"], profile_get(model.code, i["profile"])) for i in held]
            wanted = MigPlacement(spec.start, profile)
            problem = layout_problem((*layout, wanted))
            if spec.start in profile.starts:
                for other, placed in zip(held, layout, strict=True):
                    if placed.slot_mask & wanted.slot_mask:
                        slots = (f"memory slot {spec.start} overlaps" if wanted.end - spec.start == 1
                                 else f"memory slots {spec.start}-{wanted.end - 1} overlap")
                        problem = (f"{slots} {other['profile']} at slot {other['start']} "
                                   f"(allocation {other['allocation_id']!r})")
                        break
            if problem:
                raise InvalidRequest(f"cannot place {profile.name} at slot {spec.start} on GPU {gpu['index']}: "
                                     f"{problem}", field="start")
            used_ids = {i["gpu_instance_id"] for i in held}
            gi_id = next(n for n in range(1, 15) if n not in used_ids)
            record.update(profile=profile.name, start=spec.start, memory_mib=profile.memory_mib,
                          milli=profile.gpu_milli, gpu_instance_id=gi_id, compute_instance_id=0,
                          device_uuid=f"MIG-{uuid.uuid5(_UUID_NAMESPACE, gpu['uuid'] + '/' + allocation_id)}")
        elif spec.kind == "share":
            milli = sum(i["milli"] for i in held) + spec.milli
            memory = sum(i["memory_mib"] for i in held) + spec.memory_mib
            usable = usable_mib(model.code)  # shares are sized on what processes can have, not the nameplate
            if milli > 1000:
                raise InvalidRequest(f"GPU {gpu['index']} has {1000 - milli + spec.milli} milli free; asked "
                                     f"{spec.milli}", field="milli")
            if memory > usable:
                raise InvalidRequest(f"GPU {gpu['index']} has {usable - memory + spec.memory_mib} MiB "
                                     f"free; asked {spec.memory_mib}", field="memory_mib")
            record.update(milli=spec.milli, memory_mib=spec.memory_mib)
        else:
            if held:
                raise Conflict(f"GPU {gpu['index']} is held by allocation {held[0]['allocation_id']!r}", field="gpu")
            record.update(milli=1000, memory_mib=usable_mib(model.code))
        if self.fail_next_create:
            reason, self.fail_next_create = self.fail_next_create, ""
            raise Unavailable(f"create failed on GPU {gpu['index']}: {reason}")
        if self.refuse_next_create:
            reason, self.refuse_next_create = self.refuse_next_create, ""
            raise Conflict(f"create refused on GPU {gpu['index']}: {reason}", field="gpu")
        record["access"] = _access(record)
        now = self.clock()
        self._settle_energy(gpu, now)
        series, offset = pick(allocation_id)
        record.update(created_at=now, _spec=spec.to_json(), _series=series, _offset=offset)
        self.state["instances"][allocation_id] = record
        self._save()
        self._owed_seconds += self.create_latency_seconds
        return self._public(record), True

    # -- modes ----------------------------------------------------------------------------------------
    def set_mode(self, gpu_uuid: str, mode: str) -> dict:
        gpu = self._by_uuid.get(gpu_uuid)
        if gpu is None or gpu["lost"]:
            raise NotFound(f"no GPU {gpu_uuid!r} on node {self.node_id}", field="gpu")
        if gpu["mode"] == mode:
            return self.gpu(gpu_uuid)
        model = model_get(gpu["model"])
        if mode == "mig" and not model.mig_capable:
            raise InvalidRequest(f"{model.code} offers no MIG: GPU {gpu['index']} can be whole or shared",
                                 field="mode")
        if (mode == "mig") != (gpu["mode"] == "mig") and not self.allow_mig_changes:
            raise NotPermitted("MIG changes are disabled on this agent (allow_mig_changes is off): "
                               f"not changing GPU {gpu['uuid']} from {gpu['mode']} to {mode} mode", field="mode")
        held = sorted(i["allocation_id"] for i in self._instances_on(gpu_uuid))
        if held:
            raise held_refusal(str(gpu["index"]), mode, held)
        self._settle_energy(gpu, self.clock())
        gpu["mode"] = mode
        self._save()
        self._owed_seconds += self.mode_change_latency_seconds
        return self.gpu(gpu_uuid)

    def take_latency(self) -> float:
        """The modelled device time of the changes since the last call (the server waits it out)."""
        owed, self._owed_seconds = self._owed_seconds, 0.0
        return owed

    # -- destroy / notice -------------------------------------------------------------------------------
    def destroy(self, allocation_id: str) -> bool:
        record = self.state["instances"].get(allocation_id)
        if record is None:
            return False
        gpu = self._by_uuid[record["gpu"]]
        if record["kind"] == "mig" and not self.allow_mig_changes:
            raise NotPermitted("MIG changes are disabled on this agent (allow_mig_changes is off): "
                               f"not destroying GPU instance {record['gpu_instance_id']} on GPU {gpu['uuid']}",
                               field="allocation_id")
        self._settle_energy(gpu, self.clock())
        del self.state["instances"][allocation_id]
        self._save()
        return True

    def notice(self, allocation_id: str, deadline: float, reason: str) -> dict:
        record = self.state["instances"].get(allocation_id)
        if record is None:
            raise NotFound(f"no instance for allocation {allocation_id!r}", field="allocation_id")
        record["notice"] = {"deadline": deadline, "reason": reason}
        self._save()
        return self._public(record)

    # -- faults -----------------------------------------------------------------------------------------
    def apply_faults(self, faults: dict) -> dict:
        """``{"fail_next_create": reason, "refuse_next_create": reason, "hang_seconds": s, "drop_instance": id,
        "drop_gpu": uuid,
        "pin_activity": {"instance": id, "engine_active": 0..1, "fb_used_mib": n}, "unpin_activity": id}``.
        Every switch is checked before any is applied: a refused call changes nothing."""
        known = {"fail_next_create", "refuse_next_create", "hang_seconds", "drop_instance", "drop_gpu", "pin_activity",
                 "unpin_activity"}
        for key in faults:
            if key not in known:
                raise InvalidRequest(f"unknown fault {key!r}; known: {', '.join(sorted(known))}", field=key)
        hang = faults.get("hang_seconds")
        if "hang_seconds" in faults and (not isinstance(hang, int | float) or isinstance(hang, bool)
                                         or not 0 <= hang <= 600):
            raise InvalidRequest("hang_seconds must be a number 0..600", field="hang_seconds")
        pin = self._pin_request(faults["pin_activity"]) if "pin_activity" in faults else None
        unpin = self._instance_named(faults, "unpin_activity") if "unpin_activity" in faults else None
        dropped = self._instance_named(faults, "drop_instance") if "drop_instance" in faults else None
        lost = None
        if "drop_gpu" in faults:
            if not isinstance(faults["drop_gpu"], str):
                raise InvalidRequest("drop_gpu must be a GPU's UUID", field="drop_gpu")
            lost = self._by_uuid.get(faults["drop_gpu"])
            if lost is None:
                raise NotFound(f"no GPU {faults['drop_gpu']!r}", field="drop_gpu")

        if "fail_next_create" in faults:
            self.fail_next_create = str(faults["fail_next_create"] or "injected fault")
        if "refuse_next_create" in faults:
            self.refuse_next_create = str(faults["refuse_next_create"] or "injected refusal")
        if "hang_seconds" in faults:
            self.hang_seconds = float(hang)
        now = self.clock()
        if unpin is not None:
            self._settle_energy(self._by_uuid[unpin["gpu"]], now)  # the energy so far follows the pin
            unpin.pop("_pin", None)
        if pin is not None:
            record, values = pin
            self._settle_energy(self._by_uuid[record["gpu"]], now)  # the energy so far follows the old activity
            record["_pin"] = values
        if dropped is not None:
            # the instance vanishes as if its GPU instance were destroyed behind the agent's back
            self._settle_energy(self._by_uuid[dropped["gpu"]], now)
            del self.state["instances"][dropped["allocation_id"]]
        if lost is not None:
            self._settle_energy(lost, now)
            lost["lost"] = True  # fell off the bus: the GPU and its instances vanish
            for allocation_id in [i["allocation_id"] for i in self._instances_on(lost["uuid"])]:
                del self.state["instances"][allocation_id]
        self._save()
        pinned = {i["allocation_id"]: i["_pin"] for i in self.state["instances"].values() if i.get("_pin")}
        return {"fail_next_create": self.fail_next_create, "refuse_next_create": self.refuse_next_create,
                "hang_seconds": self.hang_seconds,
                "pinned": dict(sorted(pinned.items()))}

    def _instance_named(self, faults: dict, key: str) -> dict:
        value = faults[key]
        if not isinstance(value, str):
            raise InvalidRequest(f"{key} must be the allocation id of an instance", field=key)
        record = self.state["instances"].get(value)
        if record is None:
            raise NotFound(f"{key}: no instance {value!r} on node {self.node_id}", field=key)
        return record

    def _pin_request(self, body: object) -> tuple[dict, dict]:
        """The instance and the constant activity of a valid ``pin_activity``; errors name the field."""
        if not isinstance(body, dict):
            raise InvalidRequest("pin_activity must be an object: {\"instance\": allocation id, "
                                 "\"engine_active\": 0..1, \"fb_used_mib\": MiB (optional)}", field="pin_activity")
        unknown = sorted(set(body) - set(PIN_FIELDS))
        if unknown:
            raise InvalidRequest(f"unknown field {unknown[0]!r} in pin_activity; known: {', '.join(PIN_FIELDS)}",
                                 field=f"pin_activity.{unknown[0]}")
        allocation_id = body.get("instance")
        if not isinstance(allocation_id, str) or not allocation_id:
            raise InvalidRequest("pin_activity.instance must be the allocation id of an instance",
                                 field="pin_activity.instance")
        record = self.state["instances"].get(allocation_id)
        if record is None:
            raise NotFound(f"pin_activity: no instance {allocation_id!r} on node {self.node_id}",
                           field="pin_activity.instance")
        engine = body.get("engine_active")
        if not isinstance(engine, int | float) or isinstance(engine, bool) or not 0 <= engine <= 1:
            raise InvalidRequest("pin_activity.engine_active must be a number 0..1 (the ratio of the instance's "
                                 "own capacity)", field="pin_activity.engine_active")
        memory = body.get("fb_used_mib")
        if memory is not None and (not isinstance(memory, int) or isinstance(memory, bool)
                                   or not 0 <= memory <= record["memory_mib"]):
            raise InvalidRequest(f"pin_activity.fb_used_mib must be an integer 0..{record['memory_mib']} (the "
                                 f"memory of instance {allocation_id!r}, MiB)", field="pin_activity.fb_used_mib")
        return record, {"engine_active": float(engine), "fb_used_mib": memory}

    def perf_load(self, allocation_ids: list[str], perf: dict) -> float:
        """The performance model's workload ``perf`` (``agent.protocol.perf_from_json``) runs on these
        instances: each one's engine activity and framebuffer follow ``gpus.performance.estimate`` of it on
        the instance's slice (a workload that does not fit holds the whole memory and computes nothing, as one
        that died of an out-of-memory error). Returns the throughput of the whole workload (samples/s; tokens/s
        for generation): the sum over its instances, 0 when any does not hold it."""
        from gpus.performance import Workload, estimate

        workload = Workload(**perf)
        total, now = 0.0, self.clock()
        records = [self._instance_named({"instance": a}, "instance") for a in allocation_ids]
        for record in records:
            truth = estimate(workload, _slice_of(record, self._by_uuid[record["gpu"]]["model"]))
            self._settle_energy(self._by_uuid[record["gpu"]], now)  # the energy so far follows the old activity
            if truth.fits:
                record["_pin"] = {"engine_active": round(truth.engine_active, 4),
                                  "fb_used_mib": min(truth.memory_mib, record["memory_mib"])}
                total += truth.throughput
            else:
                record["_pin"] = {"engine_active": 0.0, "fb_used_mib": record["memory_mib"]}
        self._save()
        fits = all(r["_pin"]["engine_active"] > 0 for r in records)
        return total if fits else 0.0

    def take_hang(self) -> float:
        hang, self.hang_seconds = self.hang_seconds, 0.0
        return hang

    # -- telemetry --------------------------------------------------------------------------------------
    def _activity(self, record: dict, at: float) -> tuple[float, float]:
        """(utilisation 0..1 of the instance's own capacity, memory used MiB) at time ``at``: the replayed
        series, or the constants it is pinned to (``pin_activity``)."""
        series = all_series()[record["_series"]]
        phase = at - record["created_at"] + record["_offset"]
        util, memory = series.util(phase) / 100, series.memory_fraction(phase) * record["memory_mib"]
        pin = record.get("_pin")
        if pin:
            util = pin["engine_active"]
            memory = memory if pin["fb_used_mib"] is None else pin["fb_used_mib"]
        return util, memory

    @staticmethod
    def _weight(record: dict) -> float:
        """The instance's share of its GPU's compute."""
        if record["kind"] == "mig":
            return _compute_slices(record) / COMPUTE_SLICES
        return record["milli"] / 1000

    def _energy_since(self, gpu: dict, at: float) -> float:
        """Energy (mJ) the GPU used from its last settlement to ``at``: closed form, no sampling."""
        start = gpu["energy_at"]
        if at <= start:
            return 0.0
        model = model_get(gpu["model"])
        busy = 0.0  # ∫ Σ weight × util(t) dt, util in 0..1
        for record in self._instances_on(gpu["uuid"]):
            since = max(start, record["created_at"])
            if record.get("_pin"):  # constant since the last settlement (a pin change settles the GPU)
                busy += self._weight(record) * record["_pin"]["engine_active"] * max(0.0, at - since)
                continue
            series = all_series()[record["_series"]]
            origin = record["created_at"] - record["_offset"]
            busy += self._weight(record) * series.util_integral(since - origin, at - origin) / 100
        joules = model.idle_power_w * (at - start) + (model.max_power_w - model.idle_power_w) * busy
        return joules * 1000

    def _settle_energy(self, gpu: dict, at: float) -> None:
        """Fold the energy up to ``at`` into the GPU's counter before its set of instances changes."""
        if at > gpu["energy_at"]:
            gpu["energy_mj"] += self._energy_since(gpu, at)
            gpu["energy_at"] = at

    def readings(self, now: float) -> Readings:
        gpus: list[GpuReading] = []
        instances: list[InstanceReading] = []
        for gpu in self.state["gpus"]:
            if gpu["lost"]:
                continue
            model = model_get(gpu["model"])
            held = self._instances_on(gpu["uuid"])
            load = 0.0
            used = 0.0
            for record in held:
                util, memory = self._activity(record, now)
                load += self._weight(record) * util
                used += memory
                if gpu["mode"] != "whole":
                    instances.append(InstanceReading(
                        gpu["index"], gpu["uuid"], gpu["model"], record["allocation_id"], round(util, 4),
                        int(memory), record["memory_mib"] - int(memory),
                        gpu_instance_id=record["gpu_instance_id"], profile=record["profile"]))
            power = model.idle_power_w + (model.max_power_w - model.idle_power_w) * load
            energy = int(gpu["energy_mj"] + self._energy_since(gpu, max(now, gpu["energy_at"])))
            whole = gpu["mode"] == "whole"
            holder = held[0]["allocation_id"] if whole and held else ""
            gpus.append(GpuReading(
                gpu["index"], gpu["uuid"], gpu["model"], round(power, 1), energy,
                None if gpu["mode"] == "mig" else round(load * 100, 1),
                int(used) if whole else None, usable_mib(model.code) - int(used) if whole else None, holder))
        return Readings(gpus, instances)

    def close(self) -> None:
        self._save()


def _slice_of(record: dict, model: str):
    """The performance model's slice of an instance: a whole GPU, its MIG profile, or a share with its own
    memory cap."""
    from dataclasses import replace

    from gpus.performance import mig, share, whole

    if record["kind"] == "mig":
        return mig(model, record["profile"])
    if record["kind"] == "share":
        return replace(share(model, record["milli"]), memory_mib=record["memory_mib"])
    return whole(model)


def _compute_slices(record: dict) -> int:
    return int(record["profile"].split("g", 1)[0])


def _access(record: dict) -> dict:
    """What the holder's container needs to see its device (as a device plugin would inject it)."""
    access = {"CUDA_VISIBLE_DEVICES": record["device_uuid"]}
    if record["kind"] == "share":
        access["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, -(-record["milli"] // 10)))
        access["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={record['memory_mib']}M"
    return access


__all__ = ["RECORDED_RESERVED_MIB", "SimBackend", "nvlink_domains", "parse_gpu_specs", "reserved_mib", "usable_mib"]
