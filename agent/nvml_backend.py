"""The ``nvml`` backend: real NVIDIA GPUs through NVML (the ``pynvml`` module of nvidia-ml-py).

What it guarantees:

- Importing this module never needs NVML; the library is loaded when a backend is constructed, and a node
  without it gets ``Unavailable`` with a message saying what is missing.
- A request is validated against the device as it is now (mode, the model's MIG profiles and placement
  rules from ``gpus.mig``, the shares already held) before anything changes; a refused request changes
  nothing, on the device or in the state file.
- MIG instances are created and destroyed only when ``allow_mig_changes`` is on. Off (the default), every
  MIG change is ``NotPermitted`` before any NVML call that changes something: a GPU shared with others is
  never re-partitioned.
- A MIG instance is a GPU instance plus its default compute instance, or nothing: when the second half
  fails, the first is destroyed again.
- What this agent holds is recorded in ``state_dir/nvml-state.json`` (written atomically), so a restarted
  agent knows its instances; one that disappeared from the device is reported with state ``vanished``.
- A GPU's memory is read with ``nvmlDeviceGetMemoryInfo_v2``, which reports the driver's reservation apart:
  ``memory_total_mib`` is the nameplate, ``memory_reserved_mib`` what the driver keeps, ``memory_mib`` what
  processes can have (total - reserved). Whole instances and shares are sized on ``memory_mib``, and the
  framebuffer readings count what processes use, not the reservation (as ``nvidia-smi`` does). A driver
  without the v2 call falls back to v1 (reservation unknown: 0).
- Every whole and share instance carries the GPU's UUID in ``device_uuid``; a MIG instance its MIG UUID.
- GPU mode changes (``set_mode``) that turn MIG on or off need ``allow_mig_changes``; the GPU's current mode
  again, and ``whole`` <-> ``shared`` on a GPU with MIG disabled (no device setting involved), do not. A
  change is refused (409) while the GPU holds any instance, this agent's or another's GPU instance: a GPU
  with a live instance is never reset. ``whole`` <-> ``mig`` is ``nvmlDeviceSetMigMode``; when its
  activation needs a GPU reset (which this agent never does) the answer is 409 saying so. ``shared`` is
  MIG disabled on the device (shares are MPS limits); the chosen ``whole`` or ``shared`` is kept in the
  state file, so the inventory says the same after a restart, and creates follow the mode the inventory
  shows (a whole instance needs ``whole``, a share ``shared``; a GPU never given a mode is ``whole``, or
  ``shared`` while it holds shares from an older agent), as the sim's do.

Whole GPUs and shares need no NVML change: a whole GPU is handed out by UUID, a share as MPS limits in the
instance's ``access`` environment (the MPS control daemon enforces them; this backend only records them).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import json
import logging
import math
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.backend import Backend, GpuReading, InstanceReading, InstanceSpec, Readings, held_refusal
from agent.protocol import AgentError, Conflict, InvalidRequest, NotFound, NotPermitted, Unavailable
from gpus.catalogue import MODELS, GpuModel, model_get
from gpus.mig import MigPlacement, MigProfile, UnknownProfile, layout_problem, profile_get, profiles_for

logger = logging.getLogger(__name__)

STATE_FILE = "nvml-state.json"
STATE_VERSION = 1
MIB = 2**20

NVML_MISSING = "NVML is not available: libnvidia-ml.so not found; is the NVIDIA driver installed?"
NVML_DRIVER_NOT_LOADED = "NVML is not available: the NVIDIA kernel driver is not loaded (NVML: Driver Not Loaded)"
PYNVML_MISSING = "NVML is not available: the Python package nvidia-ml-py (module pynvml) is not installed"

# The NVML GPU-instance profile *constants* (the index given to nvmlDeviceGetGpuInstanceProfileInfo; the
# profile *id* it answers is another number, e.g. 3_SLICE is id 9 on an H100) and the gpus.mig shape each is.
GI_PROFILE_SHAPES: dict[str, str] = {
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE": "1g",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1": "1g+me",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2": "1g.2s",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE": "2g",
    "NVML_GPU_INSTANCE_PROFILE_3_SLICE": "3g",
    "NVML_GPU_INSTANCE_PROFILE_4_SLICE": "4g",
    "NVML_GPU_INSTANCE_PROFILE_7_SLICE": "7g",
}
# The default compute instance of a GPU instance takes all its compute slices.
CI_PROFILE_BY_SLICES: dict[int, str] = {
    1: "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE",
    2: "NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE",
    3: "NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE",
    4: "NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE",
    6: "NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE",
    7: "NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE",
    8: "NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE",
}

# Device names that differ from the catalogue's vendor_name (PCIe and SXM variants): every token must be
# a whole word of the name, so "GH200" is not an "H200" and "A10" is not an "A100".
NAME_RULES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("H100", "NVL"), "H100-NVL-94GB"),
    (("H100", "80GB"), "H100-80GB"),
    (("H100", "PCIE"), "H100-80GB"),
    (("A100", "80GB"), "A100-80GB"),
    (("A100", "40GB"), "A100-40GB"),
    (("H200",), "H200-141GB"),
)


def model_for_device_name(name: str) -> GpuModel | None:
    """The catalogue model of an NVML device name, or None when the catalogue does not know it."""
    for model in MODELS:
        if model.vendor_name == name:
            return model
    for model in MODELS:
        if model.vendor_name.lower() == name.strip().lower():
            return model
    words = set(re.split(r"[^A-Z0-9]+", name.upper()))
    for tokens, code in NAME_RULES:
        if all(token in words for token in tokens):
            return model_get(code)
    return None


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _translate(nv: Any, error: Exception, operation: str) -> AgentError:
    """The agent error for an NVML error raised while doing ``operation``."""
    if isinstance(error, nv.NVMLError_LibraryNotFound):
        return Unavailable(NVML_MISSING)
    if isinstance(error, nv.NVMLError_DriverNotLoaded):
        return Unavailable(NVML_DRIVER_NOT_LOADED)
    if isinstance(error, nv.NVMLError_NoPermission):
        return NotPermitted(f"{operation}: NVML refused it: insufficient permissions (the agent must run as root)")
    if isinstance(error, nv.NVMLError_NotSupported):
        return InvalidRequest(f"{operation}: not supported by this GPU or driver (NVML: Not Supported)")
    if isinstance(error, nv.NVMLError_InUse):
        return Conflict(f"{operation}: the instance is in use (processes are running on it)")
    return Unavailable(f"{operation}: NVML error: {error}")


def _import_pynvml() -> Any:
    try:
        import pynvml  # lazy: importing this module must work without NVML
    except ImportError as error:
        raise Unavailable(PYNVML_MISSING) from error
    return pynvml


@dataclass(slots=True)
class _GiProfile:
    """One GPU-instance profile as this GPU's driver reports it."""

    id: int  # NVML profile id (what nvmlDeviceCreateGpuInstanceWithPlacement takes)
    shape_key: str | None  # gpus.mig shape, None for profiles the catalogue does not model (GFX, NO_ME ...)
    name: str  # our catalogue name ("3g.40gb") or NVML's without the "MIG " prefix
    slices: int  # compute slices
    instance_count: int
    memory_mib: int


@dataclass(slots=True)
class _MigDevice:
    handle: Any
    uuid: str


@dataclass(slots=True)
class _MigView:
    """A MIG GPU's GPU instances now: the inventory's ``mig_layout``, the same as ``gpus.mig`` placements
    (profiles the catalogue knows), the memory slots of the others, and the MIG devices by (GI, CI)."""

    layout: list[dict] = field(default_factory=list)
    placements: list[MigPlacement] = field(default_factory=list)
    other_slots_mask: int = 0
    devices: dict[tuple[int, int], _MigDevice] = field(default_factory=dict)


@dataclass(slots=True)
class _Gpu:
    """What does not change while the agent runs: index, handle, identity, model, memory."""

    index: int
    handle: Any
    uuid: str
    name: str
    model: GpuModel | None
    memory_total_mib: int  # the nameplate (nvmlMemory_v2_t.total)
    memory_reserved_mib: int  # the driver's reservation (nvmlMemory_v2_t.reserved): no process gets it
    gi_profiles: dict[int, _GiProfile] | None = None  # by NVML profile id, read once
    nvlink_domain: str = ""  # ``_nvlink_domains``: "" when it has no NVLink (or NVML cannot say)

    @property
    def model_code(self) -> str:
        return self.model.code if self.model else self.name

    @property
    def memory_mib(self) -> int:
        """What processes can allocate: the nameplate less the driver's reservation."""
        return self.memory_total_mib - self.memory_reserved_mib

    def catalogue_profile(self, shape_key: str | None) -> MigProfile | None:
        if self.model is None or shape_key is None:
            return None
        return next((p for p in profiles_for(self.model.code) if p.shape.key == shape_key), None)


class NvmlBackend(Backend):
    """The node's NVIDIA GPUs through NVML. ``nvml`` replaces the ``pynvml`` module (tests inject a fake)."""

    name = "nvml"

    def __init__(self, state_dir: Path, hostname: str, *, allow_mig_changes: bool = False, nvml: Any = None):
        self.state_dir = Path(state_dir)
        self.hostname = hostname
        self.allow_mig_changes = allow_mig_changes
        self.nvml = nvml if nvml is not None else _import_pynvml()
        self._state_path = self.state_dir / STATE_FILE
        self._open = False
        with self._errors("initialising NVML"):
            self.nvml.nvmlInit()
        self._open = True
        try:
            self._gpus = self._discover()
            self._instances, self._modes = self._load()
        except BaseException:
            self.close()
            raise
        self._by_uuid = {gpu.uuid: gpu for gpu in self._gpus}

    # --- the Backend interface -------------------------------------------------------------------------

    def inventory(self) -> dict:
        gpus = []
        views: dict[str, _MigView | None] = {}  # None: not in MIG mode
        for gpu in self._gpus:
            mig_mode = self._mig_mode(gpu)
            view = self._mig_view(gpu) if mig_mode is not None and mig_mode[0] else None
            views[gpu.uuid] = view
            mode = "mig" if view is not None else self._plain_mode(gpu)
            entry = {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "model": gpu.model_code,
                "name": gpu.name,
                "memory_mib": gpu.memory_mib,
                "memory_total_mib": gpu.memory_total_mib,
                "memory_reserved_mib": gpu.memory_reserved_mib,
                "mig_capable": bool(gpu.model and gpu.model.mig_capable),
                "mig_mode": _mig_mode_json(mig_mode),
                "mode": mode,
                "mig_layout": view.layout if view is not None else [],
                "nvlink_domain": gpu.nvlink_domain,
            }
            if mode == "shared":
                held = [i for i in self._instances.values() if i["gpu"] == gpu.uuid and i["kind"] == "share"]
                entry["shares"] = {"milli_used": sum(i["milli"] for i in held),
                                   "memory_used_mib": sum(i["memory_mib"] for i in held)}
            gpus.append(entry)
        instances = []
        for allocation_id in sorted(self._instances):
            instance = copy.deepcopy(self._instances[allocation_id])
            if not self._still_there(instance, views):
                instance["state"] = "vanished"
            instances.append(instance)
        return {"gpus": gpus, "instances": instances}

    def create(self, allocation_id: str, spec: InstanceSpec) -> tuple[dict, bool]:
        existing = self._instances.get(allocation_id)
        if existing is not None:
            if _spec_of(existing).to_json() == spec.to_json():
                return copy.deepcopy(existing), False
            raise Conflict(
                f"allocation {allocation_id!r} already holds another instance ({_spec_of(existing).to_json()})",
                field="allocation_id",
            )
        gpu = self._by_uuid.get(spec.gpu)
        if gpu is None:
            known = ", ".join(self._by_uuid) or "none"
            raise InvalidRequest(f"no GPU {spec.gpu!r} on {self.hostname}; GPUs: {known}", field="gpu")
        if spec.kind == "mig":
            instance = self._create_mig(allocation_id, gpu, spec)
        else:
            instance = self._create_plain(allocation_id, gpu, spec)
        self._instances[allocation_id] = instance
        try:
            self._save()
        except OSError as error:
            del self._instances[allocation_id]
            if spec.kind == "mig":
                self._undo_mig(gpu, instance["gpu_instance_id"], instance["compute_instance_id"])
            raise Unavailable(f"could not write the state file {self._state_path}: {error}") from error
        return copy.deepcopy(instance), True

    def destroy(self, allocation_id: str) -> bool:
        instance = self._instances.get(allocation_id)
        if instance is None:
            return False
        gpu = self._by_uuid.get(instance["gpu"])
        if instance["kind"] == "mig" and gpu is not None:
            self._destroy_mig(gpu, instance)
        del self._instances[allocation_id]
        try:
            self._save()
        except OSError as error:
            raise Unavailable(f"could not write the state file {self._state_path}: {error}") from error
        return True

    def notice(self, allocation_id: str, deadline: float, reason: str) -> dict:
        instance = self._instances.get(allocation_id)
        if instance is None:
            raise NotFound(f"no instance for allocation {allocation_id!r}", field="allocation_id")
        instance["notice"] = {"deadline": deadline, "reason": reason}
        try:
            self._save()
        except OSError as error:
            raise Unavailable(f"could not write the state file {self._state_path}: {error}") from error
        return copy.deepcopy(instance)

    def compute_pids(self, gpu_uuid: str) -> set[int]:
        """The pids NVML lists as compute processes on the GPU (and, where the binding has it, as MPS clients):
        pids of the driver's view (the node's PID namespace; an agent in another one sees other numbers, and
        ``WorkloadManager`` only kills those that are its workload's processes). Empty when NVML cannot say."""
        gpu = self._by_uuid.get(gpu_uuid)
        if gpu is None:
            return set()
        found: set[int] = set()
        for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses"):
            query = getattr(self.nvml, name, None)
            if query is None:
                continue
            try:
                found |= {int(p.pid) for p in query(gpu.handle)}
            except Exception:  # NVML errors (not supported, GPU lost): what the other call says still counts
                logger.debug("%s on GPU %s failed", name, gpu_uuid, exc_info=True)
        return found

    def set_mode(self, gpu_uuid: str, mode: str) -> dict:
        gpu = self._by_uuid.get(gpu_uuid)
        if gpu is None:
            known = ", ".join(self._by_uuid) or "none"
            raise NotFound(f"no GPU {gpu_uuid!r} on {self.hostname}; GPUs: {known}", field="gpu")
        if mode == "mig" and not (gpu.model and gpu.model.mig_capable):
            raise InvalidRequest(f"{gpu.model_code} offers no MIG: GPU {gpu.uuid} can be whole or shared", field="mode")
        mig_now = self._mig_enabled(gpu)  # a read: nothing changes on the device before the checks below
        current = "mig" if mig_now else self._plain_mode(gpu)
        if current == mode:
            return self.gpu(gpu_uuid)
        if (mode == "mig") != mig_now and not self.allow_mig_changes:
            # whole <-> shared is the agent's own record (MIG stays disabled): only a MIG switch needs the knob
            raise NotPermitted(
                "MIG changes are disabled on this agent (allow_mig_changes is off): "
                f"not changing GPU {gpu.uuid} from {current} to {mode} mode",
                field="mode",
            )
        held = sorted(i["allocation_id"] for i in self._instances.values() if i["gpu"] == gpu.uuid)
        if held:
            raise held_refusal(gpu.uuid, mode, held)
        if mig_now:
            others = sorted(entry["gpu_instance_id"] for entry in self._mig_view(gpu).layout)
            if others:
                raise Conflict(
                    f"GPU {gpu.uuid} holds GPU instance(s) {', '.join(map(str, others))} that this agent did not "
                    f"make; its mode cannot change to {mode} until they are destroyed",
                    field="gpu",
                )
        if (mode == "mig") != mig_now:
            self._switch_mig(gpu, enable=mode == "mig")
        previous = self._modes.get(gpu.uuid)
        if mode == "mig":
            self._modes.pop(gpu.uuid, None)
        else:
            self._modes[gpu.uuid] = mode
        try:
            self._save()
        except OSError as error:
            if previous is None:
                self._modes.pop(gpu.uuid, None)
            else:
                self._modes[gpu.uuid] = previous
            raise Unavailable(f"could not write the state file {self._state_path}: {error}") from error
        return self.gpu(gpu_uuid)

    def readings(self, now: float) -> Readings:
        """One sample. A field NVML cannot give (Not Supported, or an error) reads 0 or None; one failing
        call never fails the whole read."""
        nv = self.nvml
        gpu_readings: list[GpuReading] = []
        instance_readings: list[InstanceReading] = []
        for gpu in self._gpus:
            held = [i for i in self._instances.values() if i["gpu"] == gpu.uuid]
            mig_mode = self._read(gpu, "MIG mode", nv.nvmlDeviceGetMigMode, gpu.handle, default=None)
            mig = bool(mig_mode) and mig_mode[0] == nv.NVML_DEVICE_MIG_ENABLE
            power_mw = self._read(gpu, "power", nv.nvmlDeviceGetPowerUsage, gpu.handle, default=0)
            energy_mj = self._read(gpu, "energy", nv.nvmlDeviceGetTotalEnergyConsumption, gpu.handle, default=0)
            util_pct = fb_used_mib = fb_free_mib = None
            if not mig:
                # A MIG-mode GPU reports neither utilisation nor framebuffer for the whole device.
                rates = self._read(gpu, "utilisation", nv.nvmlDeviceGetUtilizationRates, gpu.handle, default=None)
                util_pct = float(rates.gpu) if rates is not None else None
                memory = self._read(gpu, "memory", self._memory_info, gpu.handle, default=None)
                if memory is not None:
                    fb_used_mib, fb_free_mib = memory.used // MIB, memory.free // MIB
            holder = next((i["allocation_id"] for i in held if i["kind"] == "whole" and not mig), "")
            shares = [] if mig else [i for i in held if i["kind"] == "share"]
            gpu_fb = (None, None) if shares else (fb_used_mib, fb_free_mib)  # memory per consumer (metrics.py)
            gpu_readings.append(
                GpuReading(
                    index=gpu.index,
                    uuid=gpu.uuid,
                    model=gpu.model_code,
                    power_w=power_mw / 1000,
                    energy_mj=int(energy_mj),
                    util_pct=util_pct,
                    fb_used_mib=gpu_fb[0],
                    fb_free_mib=gpu_fb[1],
                    allocation_id=holder,
                )
            )
            if mig:
                instance_readings.extend(self._mig_readings(gpu, [i for i in held if i["kind"] == "mig"]))
            else:
                instance_readings.extend(self._share_readings(gpu, shares, util_pct, fb_used_mib))
        return Readings(gpus=gpu_readings, instances=instance_readings)

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as error:
            logger.warning("nvmlShutdown failed: %s", error)

    def versions(self) -> dict:
        """The driver's and NVML's versions (read-only)."""
        with self._errors("reading the driver version"):
            return {
                "driver": _text(self.nvml.nvmlSystemGetDriverVersion()),
                "nvml": _text(self.nvml.nvmlSystemGetNVMLVersion()),
            }

    # --- modes ------------------------------------------------------------------------------------------

    def _plain_mode(self, gpu: _Gpu) -> str:
        """``whole`` or ``shared`` of a GPU with MIG disabled: as last set, else as its instances show."""
        recorded = self._modes.get(gpu.uuid)
        if recorded in ("whole", "shared"):
            return recorded
        held = [i for i in self._instances.values() if i["gpu"] == gpu.uuid]
        return "shared" if any(i["kind"] == "share" for i in held) else "whole"

    def _switch_mig(self, gpu: _Gpu, *, enable: bool) -> None:
        """Enable or disable MIG; an activation that needs a GPU reset (or an idle GPU) is ``Conflict``: the
        agent never resets a GPU. The device's handle is looked up again afterwards, as NVML asks."""
        nv = self.nvml
        wanted = nv.NVML_DEVICE_MIG_ENABLE if enable else nv.NVML_DEVICE_MIG_DISABLE
        verb = "enabling" if enable else "disabling"
        with self._errors(f"{verb} MIG on GPU {gpu.uuid}"):
            status = nv.nvmlDeviceSetMigMode(gpu.handle, wanted)
        if status != nv.NVML_SUCCESS:
            raise _pending_refusal(nv, gpu, verb, status)
        with self._errors(f"looking up GPU {gpu.uuid} again after {verb} MIG"):
            gpu.handle = nv.nvmlDeviceGetHandleByUUID(gpu.uuid)
            current, _pending = nv.nvmlDeviceGetMigMode(gpu.handle)
        if current != wanted:
            raise _pending_refusal(nv, gpu, verb, nv.NVML_ERROR_RESET_REQUIRED)
        gpu.gi_profiles = None  # read again in the new mode

    # --- creating and destroying ------------------------------------------------------------------------

    def _create_plain(self, allocation_id: str, gpu: _Gpu, spec: InstanceSpec) -> dict:
        """A whole GPU or a share: validated and recorded; nothing changes on the device."""
        if self._mig_enabled(gpu):
            raise InvalidRequest(
                f"GPU {gpu.uuid} ({gpu.model_code}) is in MIG mode; it takes kind 'mig' only", field="kind"
            )
        current = self._plain_mode(gpu)  # what the inventory shows, as the sim's mode
        wanted = "shared" if spec.kind == "share" else "whole"
        if current != wanted:
            raise InvalidRequest(
                f"GPU {gpu.uuid} is in {current} mode; a {spec.kind} instance needs {wanted} mode", field="kind"
            )
        held = [i for i in self._instances.values() if i["gpu"] == gpu.uuid]
        if any(i["kind"] == "whole" for i in held):
            holder = next(i["allocation_id"] for i in held if i["kind"] == "whole")
            raise Conflict(f"GPU {gpu.uuid} is held whole by allocation {holder!r}", field="gpu")
        access = {"CUDA_VISIBLE_DEVICES": gpu.uuid}
        if spec.kind == "whole":
            if held:
                raise Conflict(f"GPU {gpu.uuid} has {len(held)} share(s); it cannot be leased whole", field="gpu")
            return _instance(allocation_id, spec, gpu, milli=1000, memory_mib=gpu.memory_mib, access=access,
                             device_uuid=gpu.uuid)
        milli_held = sum(i["milli"] for i in held)
        if milli_held + spec.milli > 1000:
            raise InvalidRequest(
                f"the share does not fit: GPU {gpu.uuid} has {1000 - milli_held} milli free, {spec.milli} asked",
                field="milli",
            )
        memory_held = sum(i["memory_mib"] for i in held)
        if memory_held + spec.memory_mib > gpu.memory_mib:
            raise InvalidRequest(
                f"the share does not fit: GPU {gpu.uuid} has {gpu.memory_mib - memory_held} MiB free, "
                f"{spec.memory_mib} asked",
                field="memory_mib",
            )
        # Enforced by the MPS control daemon on the node when the client starts with these variables.
        access["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(math.ceil(spec.milli / 10))
        access["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={spec.memory_mib}M"
        return _instance(allocation_id, spec, gpu, milli=spec.milli, memory_mib=spec.memory_mib, access=access,
                         device_uuid=gpu.uuid)

    def _create_mig(self, allocation_id: str, gpu: _Gpu, spec: InstanceSpec) -> dict:
        nv = self.nvml
        if not self._mig_enabled(gpu):  # a read; a MIG request on a GPU not in MIG mode is wrong either way
            raise InvalidRequest(
                f"GPU {gpu.uuid} ({gpu.model_code}) is not in MIG mode (mode {self._plain_mode(gpu)}); it takes "
                "kind 'whole' or 'share'",
                field="kind",
            )
        if not self.allow_mig_changes:
            raise NotPermitted(
                "MIG changes are disabled on this agent (allow_mig_changes is off): "
                f"not creating {spec.profile} at slot {spec.start} on GPU {gpu.uuid}",
                field="kind",
            )
        try:
            profile = profile_get(gpu.model_code, spec.profile)
        except UnknownProfile as error:
            raise InvalidRequest(str(error.args[0]), field="profile") from None
        gi_profile = next((p for p in self._gi_profiles(gpu).values() if p.shape_key == profile.shape.key), None)
        if gi_profile is None:
            raise InvalidRequest(f"profile {profile.name} is not offered by this GPU's driver", field="profile")
        view = self._mig_view(gpu)
        wanted = MigPlacement(spec.start, profile)
        problem = layout_problem([*view.placements, wanted])
        if problem is None and view.other_slots_mask & wanted.slot_mask:
            problem = f"{profile.name} at slot {spec.start} overlaps another instance"
        if problem is not None:
            raise InvalidRequest(problem, field="start")

        what = f"creating GPU instance {profile.name} at slot {spec.start} on GPU {gpu.uuid}"
        # pynvml passes the placement straight to C, which takes a pointer: it must go by reference.
        placement = nv.c_nvmlGpuInstancePlacement_t(spec.start, profile.memory_slots)
        with self._errors(what):
            gpu_instance = nv.nvmlDeviceCreateGpuInstanceWithPlacement(
                gpu.handle, gi_profile.id, ctypes.byref(placement)
            )
        compute_instance = None
        try:
            with self._errors(f"creating the compute instance of {profile.name} on GPU {gpu.uuid}"):
                ci_profile = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gpu_instance,
                    getattr(nv, CI_PROFILE_BY_SLICES[gi_profile.slices]),
                    nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                )
                compute_instance = nv.nvmlGpuInstanceCreateComputeInstance(gpu_instance, ci_profile.id)
                gi_id = nv.nvmlGpuInstanceGetInfo(gpu_instance).id
                ci_id = nv.nvmlComputeInstanceGetInfo(compute_instance).id
                device = self._mig_devices(gpu).get((gi_id, ci_id))
            if device is None:
                raise Unavailable(f"the MIG device of GPU instance {gi_id} did not appear on GPU {gpu.uuid}")
        except BaseException:
            self._undo_handles(gpu_instance, compute_instance)
            raise
        return _instance(
            allocation_id,
            spec,
            gpu,
            profile=profile.name,
            start=spec.start,
            milli=profile.gpu_milli,
            memory_mib=gi_profile.memory_mib or profile.memory_mib,
            gpu_instance_id=gi_id,
            compute_instance_id=ci_id,
            device_uuid=device.uuid,
            access={"CUDA_VISIBLE_DEVICES": device.uuid},
        )

    def _undo_handles(self, gpu_instance: Any, compute_instance: Any) -> None:
        """Destroy what a failed create made (best effort: the original error is what the caller sees)."""
        nv = self.nvml
        try:
            if compute_instance is not None:
                nv.nvmlComputeInstanceDestroy(compute_instance)
            nv.nvmlGpuInstanceDestroy(gpu_instance)
        except nv.NVMLError as error:
            logger.error("could not destroy a half-made MIG instance: %s", error)

    def _undo_mig(self, gpu: _Gpu, gi_id: int, ci_id: int) -> None:
        nv = self.nvml
        try:
            gpu_instance = nv.nvmlDeviceGetGpuInstanceById(gpu.handle, gi_id)
            compute_instance = nv.nvmlGpuInstanceGetComputeInstanceById(gpu_instance, ci_id)
        except nv.NVMLError as error:
            logger.error("could not find GPU instance %s to undo it: %s", gi_id, error)
            return
        self._undo_handles(gpu_instance, compute_instance)

    def _destroy_mig(self, gpu: _Gpu, instance: dict) -> None:
        """Destroy the compute instance, then the GPU instance; one already gone is fine. A GPU instance
        whose id now names another placement or profile is someone else's and is left alone."""
        nv = self.nvml
        gi_id, ci_id = instance["gpu_instance_id"], instance["compute_instance_id"]
        with self._errors(f"looking up GPU instance {gi_id} on GPU {gpu.uuid}"):
            try:
                gpu_instance = nv.nvmlDeviceGetGpuInstanceById(gpu.handle, gi_id)
            except nv.NVMLError_NotFound:
                return
            info = nv.nvmlGpuInstanceGetInfo(gpu_instance)
        profile = self._gi_profiles(gpu).get(info.profileId)
        if info.placement.start != instance["start"] or profile is None or profile.name != instance["profile"]:
            return
        if not self.allow_mig_changes:
            raise NotPermitted(
                "MIG changes are disabled on this agent (allow_mig_changes is off): "
                f"not destroying GPU instance {gi_id} on GPU {gpu.uuid}",
                field="allocation_id",
            )
        with self._errors(f"destroying compute instance {ci_id} of GPU instance {gi_id} on GPU {gpu.uuid}"):
            try:
                compute_instance = nv.nvmlGpuInstanceGetComputeInstanceById(gpu_instance, ci_id)
            except nv.NVMLError_NotFound:
                compute_instance = None
            if compute_instance is not None:
                nv.nvmlComputeInstanceDestroy(compute_instance)
        with self._errors(f"destroying GPU instance {gi_id} on GPU {gpu.uuid}"):
            nv.nvmlGpuInstanceDestroy(gpu_instance)

    # --- reading the device -----------------------------------------------------------------------------

    def _discover(self) -> list[_Gpu]:
        nv = self.nvml
        gpus = []
        with self._errors("listing the GPUs"):
            for index in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                name = _text(nv.nvmlDeviceGetName(handle))
                model = model_for_device_name(name)
                try:
                    memory = self._memory_info(handle)
                except nv.NVMLError_NotSupported:
                    total_mib, reserved_mib = (model.memory_mib if model else 0), 0
                else:
                    total_mib = memory.total // MIB
                    reserved_mib = total_mib - (memory.total - memory.reserved) // MIB
                gpus.append(_Gpu(index, handle, _text(nv.nvmlDeviceGetUUID(handle)), name, model, total_mib,
                                 reserved_mib))
        for gpu, domain in zip(gpus, self._nvlink_domains(gpus), strict=True):
            gpu.nvlink_domain = domain
        return gpus

    def _nvlink_domains(self, gpus: list[_Gpu]) -> list[str]:
        """Each GPU's NVLink domain (read once: the wiring does not change while the agent runs), every NVML call
        guarded (a driver or GPU without it answers ""):

        1. the GPU fabric (``nvmlDeviceGetGpuFabricInfo``; NVSwitch systems with a fabric manager, multi-node
           NVLink): a GPU whose registration completed is in ``fabric:<cluster UUID>/<clique id>``, the same name
           on every node of that NVLink domain;
        2. else its NVLink links (``nvmlDeviceGetNvLinkState`` per link, ``nvmlDeviceGetNvLinkRemotePciInfo``):
           GPUs of this node joined by active links, directly or through a switch (a remote that is no GPU of
           this node: an NVSwitch), form one domain, ``<hostname>/nvlink<lowest index>``;
        3. no active link: "" (PCIe only)."""
        nv = self.nvml
        domains = [self._fabric_domain(gpu) for gpu in gpus]
        if all(domains):
            return domains
        bus_ids: dict[str, int] = {}
        for position, gpu in enumerate(gpus):
            bus = self._guarded(lambda handle=gpu.handle: _text(nv.nvmlDeviceGetPciInfo(handle).busId))
            if bus:
                bus_ids[bus.lower()] = position
        parent = list(range(len(gpus)))

        def root(item: int) -> int:
            while parent[item] != item:
                parent[item] = parent[parent[item]]
                item = parent[item]
            return item

        switched: list[int] = []
        linked: set[int] = set()
        max_links = getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)
        max_links = max_links if isinstance(max_links, int) else 18
        enabled = getattr(nv, "NVML_FEATURE_ENABLED", 1)
        for position, gpu in enumerate(gpus):
            if domains[position]:
                continue
            for link in range(max_links):
                state = self._guarded(lambda handle=gpu.handle, link=link: nv.nvmlDeviceGetNvLinkState(handle, link))
                if state is None:
                    break  # no such link (or no NVLink at all): the links are numbered from 0
                if state != enabled:
                    continue
                remote = self._guarded(lambda handle=gpu.handle, link=link: _text(
                    nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
                if not remote:
                    continue
                linked.add(position)
                peer = bus_ids.get(remote.lower())
                if peer is None:
                    switched.append(position)  # an NVSwitch (or a GPU of another node): one domain per node
                else:
                    linked.add(peer)
                    parent[root(peer)] = root(position)
        for position in switched[1:]:
            parent[root(position)] = root(switched[0])
        lowest: dict[int, int] = {}
        for position in sorted(linked):
            lowest.setdefault(root(position), gpus[position].index)
        return [domains[position] or (f"{self.hostname}/nvlink{lowest[root(position)]}"[:63]
                                      if position in linked else "")
                for position in range(len(gpus))]

    def _fabric_domain(self, gpu: _Gpu) -> str:
        nv = self.nvml
        info = self._guarded(lambda: nv.nvmlDeviceGetGpuFabricInfo(gpu.handle))
        completed = getattr(nv, "NVML_GPU_FABRIC_STATE_COMPLETED", None)
        if info is None or completed is None or getattr(info, "state", None) != completed:
            return ""
        if getattr(info, "status", 0) != getattr(nv, "NVML_SUCCESS", 0):
            return ""
        cluster = bytes(getattr(info, "clusterUuid", b"") or b"")
        if not cluster.strip(b"\0"):
            return ""
        return f"fabric:{cluster.hex()}/{getattr(info, 'cliqueId', 0)}"[:63]

    def _guarded(self, call: Callable[[], Any]) -> Any:
        """``call()``, or None when NVML does not support it, lacks the function or fails (topology is
        optional: a node without it is placed as before)."""
        try:
            return call()
        except self.nvml.NVMLError:
            return None
        except (AttributeError, TypeError, ValueError):  # an older pynvml without the function or structure
            return None

    def _memory_info(self, handle: Any) -> Any:
        """``nvmlDeviceGetMemoryInfo_v2`` (``total``, ``reserved``, ``free``, ``used``; ``used`` without the
        driver's reservation), or v1 where the driver lacks v2, with ``reserved`` 0 (v1 counts the reservation
        as used: 480 MiB on an idle H100). Raises NVML errors as they are."""
        nv = self.nvml
        try:
            return nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
        except nv.NVMLError_FunctionNotFound:
            v1 = nv.nvmlDeviceGetMemoryInfo(handle)
            memory = nv.c_nvmlMemory_v2_t()
            memory.total, memory.reserved, memory.free, memory.used = v1.total, 0, v1.free, v1.used
            return memory

    def _mig_mode(self, gpu: _Gpu) -> tuple[bool, bool] | None:
        """(MIG enabled now, MIG enabled after the next reset), or None for a GPU without MIG."""
        nv = self.nvml
        with self._errors(f"reading the MIG mode of GPU {gpu.uuid}"):
            try:
                current, pending = nv.nvmlDeviceGetMigMode(gpu.handle)
            except nv.NVMLError_NotSupported:  # a GPU without MIG
                return None
        return current == nv.NVML_DEVICE_MIG_ENABLE, pending == nv.NVML_DEVICE_MIG_ENABLE

    def _mig_enabled(self, gpu: _Gpu) -> bool:
        mig_mode = self._mig_mode(gpu)
        return mig_mode is not None and mig_mode[0]

    def _gi_profiles(self, gpu: _Gpu) -> dict[int, _GiProfile]:
        """The GPU-instance profiles the driver offers on this GPU, by NVML profile id."""
        if gpu.gi_profiles:
            return gpu.gi_profiles
        nv = self.nvml
        shape_by_constant = {getattr(nv, name): key for name, key in GI_PROFILE_SHAPES.items() if hasattr(nv, name)}
        profiles = {}
        with self._errors(f"reading the MIG profiles of GPU {gpu.uuid}"):
            for constant in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
                try:
                    info = nv.nvmlDeviceGetGpuInstanceProfileInfo(gpu.handle, constant)
                except (nv.NVMLError_NotSupported, nv.NVMLError_InvalidArgument, nv.NVMLError_NotFound):
                    continue  # not offered on this GPU
                shape_key = shape_by_constant.get(constant)
                ours = gpu.catalogue_profile(shape_key)
                name = ours.name if ours else _text(info.name).removeprefix("MIG ") or f"nvml-profile-{info.id}"
                profiles[info.id] = _GiProfile(
                    info.id, shape_key if ours else None, name, info.sliceCount, info.instanceCount, info.memorySizeMB
                )
        gpu.gi_profiles = profiles
        return profiles

    def _mig_devices(self, gpu: _Gpu) -> dict[tuple[int, int], _MigDevice]:
        """The MIG devices (one per compute instance) by (GPU instance id, compute instance id). Raises
        NVML errors as they are."""
        nv = self.nvml
        devices = {}
        for index in range(nv.nvmlDeviceGetMaxMigDeviceCount(gpu.handle)):
            try:
                handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, index)
            except (nv.NVMLError_NotFound, nv.NVMLError_InvalidArgument):
                continue  # no MIG device at this index
            key = (nv.nvmlDeviceGetGpuInstanceId(handle), nv.nvmlDeviceGetComputeInstanceId(handle))
            devices[key] = _MigDevice(handle, _text(nv.nvmlDeviceGetUUID(handle)))
        return devices

    def _mig_view(self, gpu: _Gpu) -> _MigView:
        """Every GPU instance on the GPU, ours or not, walking each profile the driver offers."""
        nv = self.nvml
        view = _MigView()
        profiles = self._gi_profiles(gpu)
        with self._errors(f"reading the MIG instances of GPU {gpu.uuid}"):
            view.devices = self._mig_devices(gpu)
            for profile in profiles.values():
                handles = (nv.c_nvmlGpuInstance_t * max(profile.instance_count, 1))()
                count = ctypes.c_uint(0)
                nv.nvmlDeviceGetGpuInstances(gpu.handle, profile.id, handles, ctypes.byref(count))
                for handle in handles[: count.value]:
                    info = nv.nvmlGpuInstanceGetInfo(handle)
                    start, size = info.placement.start, info.placement.size
                    uuids = sorted((ci, d.uuid) for (gi, ci), d in view.devices.items() if gi == info.id)
                    view.layout.append(
                        {
                            "gpu_instance_id": info.id,
                            "profile": profile.name,
                            "start": start,
                            "size": size,
                            "device_uuid": uuids[0][1] if uuids else "",
                        }
                    )
                    ours = gpu.catalogue_profile(profile.shape_key)
                    if ours is not None:
                        view.placements.append(MigPlacement(start, ours))
                    else:
                        view.other_slots_mask |= ((1 << size) - 1) << start
        view.layout.sort(key=lambda entry: (entry["start"], entry["gpu_instance_id"]))
        return view

    def _still_there(self, instance: dict, views: dict[str, _MigView | None]) -> bool:
        if instance["gpu"] not in views:
            return False
        view = views[instance["gpu"]]
        if instance["kind"] != "mig":
            return view is None
        if view is None:
            return False
        key = (instance["gpu_instance_id"], instance["compute_instance_id"])
        same_gi = any(
            entry["gpu_instance_id"] == key[0]
            and entry["start"] == instance["start"]
            and entry["profile"] == instance["profile"]
            for entry in view.layout
        )
        return same_gi and key in view.devices

    def _mig_readings(self, gpu: _Gpu, instances: list[dict]) -> list[InstanceReading]:
        if not instances:
            return []
        devices = self._read(gpu, "MIG devices", self._mig_devices, gpu, default={})
        out = []
        for instance in instances:
            device = devices.get((instance["gpu_instance_id"], instance["compute_instance_id"]))
            if device is None:
                continue  # vanished
            memory = self._read(gpu, "MIG memory", self._memory_info, device.handle, default=None)
            out.append(
                InstanceReading(
                    gpu_index=gpu.index,
                    gpu_uuid=gpu.uuid,
                    model=gpu.model_code,
                    allocation_id=instance["allocation_id"],
                    # NVML has no per-MIG-instance utilisation; it needs DCGM's profiling metrics
                    # (DCGM_FI_PROF_GR_ENGINE_ACTIVE), which this backend does not read.
                    engine_active=0.0,
                    fb_used_mib=memory.used // MIB if memory is not None else 0,
                    fb_free_mib=memory.free // MIB if memory is not None else 0,
                    gpu_instance_id=instance["gpu_instance_id"],
                    profile=instance["profile"],
                )
            )
        return out

    def _share_readings(
        self, gpu: _Gpu, shares: list[dict], util_pct: float | None, fb_used_mib: int | None
    ) -> list[InstanceReading]:
        # NVML cannot tell which MPS client uses what, so both figures are estimates: the GPU's utilisation
        # and used memory split among the shares in proportion to their milli and memory caps. Engine
        # activity is relative to the share's own capacity (its milli), as for every consumer.
        milli_total = sum(s["milli"] for s in shares) or 1
        memory_total = sum(s["memory_mib"] for s in shares) or 1
        out = []
        for share in shares:
            engine = min(1.0, (util_pct or 0.0) / 100 * 1000 / milli_total)
            used = min(share["memory_mib"], (fb_used_mib or 0) * share["memory_mib"] // memory_total)
            out.append(
                InstanceReading(
                    gpu_index=gpu.index,
                    gpu_uuid=gpu.uuid,
                    model=gpu.model_code,
                    allocation_id=share["allocation_id"],
                    engine_active=round(engine, 4),
                    fb_used_mib=used,
                    fb_free_mib=share["memory_mib"] - used,
                )
            )
        return out

    def _read(self, gpu: _Gpu, what: str, fn: Callable[..., Any], *args: Any, default: Any) -> Any:
        """One telemetry field: ``default`` when NVML does not support it or fails."""
        try:
            return fn(*args)
        except self.nvml.NVMLError_NotSupported:
            return default
        except self.nvml.NVMLError as error:
            logger.warning("reading %s of GPU %s failed: %s", what, gpu.uuid, error)
            return default

    @contextlib.contextmanager
    def _errors(self, operation: str) -> Iterator[None]:
        try:
            yield
        except self.nvml.NVMLError as error:
            raise _translate(self.nvml, error, operation) from error

    # --- the state file ---------------------------------------------------------------------------------

    def _load(self) -> tuple[dict[str, dict], dict[str, str]]:
        """(instances by allocation id, the ``whole``/``shared`` mode chosen per GPU UUID)."""
        try:
            text = self._state_path.read_text()
        except FileNotFoundError:
            return {}, {}
        except OSError as error:
            raise Unavailable(f"cannot read the state file {self._state_path}: {error}") from error
        try:
            data = json.loads(text)
            instances = data["instances"]
            modes = data.get("modes", {})  # absent in files written before mode changes existed
            if not isinstance(instances, dict):
                raise TypeError("instances is not an object")
            if not isinstance(modes, dict) or not set(modes.values()) <= {"whole", "shared"}:
                raise TypeError("modes is not an object of GPU UUID: whole | shared")
        except (ValueError, KeyError, TypeError) as error:
            raise Unavailable(f"the state file {self._state_path} is not valid: {error}") from error
        return instances, modes

    def _save(self) -> None:
        """Write the state file atomically: a temporary file, fsync, then rename over the old one."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        payload = {"version": STATE_VERSION, "hostname": self.hostname, "instances": self._instances,
                   "modes": self._modes}
        descriptor, temporary = tempfile.mkstemp(dir=self.state_dir, prefix=f".{STATE_FILE}.", suffix=".tmp")
        try:
            with os.fdopen(descriptor, "w") as stream:
                json.dump(payload, stream, indent=2, sort_keys=True)
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(temporary, self._state_path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise
        directory = os.open(self.state_dir, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def _instance(
    allocation_id: str,
    spec: InstanceSpec,
    gpu: _Gpu,
    *,
    milli: int,
    memory_mib: int,
    access: dict[str, str],
    profile: str = "",
    start: int | None = None,
    gpu_instance_id: int | None = None,
    compute_instance_id: int | None = None,
    device_uuid: str = "",
) -> dict:
    return {
        "allocation_id": allocation_id,
        "kind": spec.kind,
        "gpu": gpu.uuid,
        "gpu_index": gpu.index,
        "profile": profile,
        "start": start,
        "milli": milli,
        "memory_mib": memory_mib,
        "gpu_instance_id": gpu_instance_id,
        "compute_instance_id": compute_instance_id,
        "device_uuid": device_uuid,
        "created_at": time.time(),
        "notice": None,
        "access": access,
        "state": "active",
    }


def _mig_mode_json(mig_mode: tuple[bool, bool] | None) -> dict | None:
    """The inventory's ``mig_mode``: ``{"current": "enabled" | "disabled", "pending": ...}``, None without MIG."""
    if mig_mode is None:
        return None
    current, pending = mig_mode
    return {"current": "enabled" if current else "disabled", "pending": "enabled" if pending else "disabled"}


def _pending_refusal(nv: Any, gpu: _Gpu, verb: str, status: int) -> Conflict:
    """The refusal when NVML accepted a MIG mode change but could not activate it (``status`` is the
    activation's NVML return code): the mode is pending until the GPU is reset, which the agent never does."""
    if status == nv.NVML_ERROR_IN_USE:
        why = "the GPU is in use (processes or a client such as the persistence daemon hold it)"
        then = "stop them and ask again, or reset the GPU"
    else:
        why = f"activation needs a GPU reset (NVML: {nv.NVMLError(status)})"
        then = f"drain it and reset it by hand (nvidia-smi -r -i {gpu.index}, or reboot), then ask again"
    return Conflict(
        f"{verb} MIG on GPU {gpu.uuid} is pending: {why}; the agent does not reset GPUs: {then}", field="gpu"
    )


def _spec_of(instance: dict) -> InstanceSpec:
    """The request an instance was made from (``to_json`` keeps only the fields of its kind)."""
    return InstanceSpec(
        kind=instance["kind"],
        gpu=instance["gpu"],
        profile=instance["profile"] or "",
        start=instance["start"] if instance["start"] is not None else -1,
        milli=instance["milli"],
        memory_mib=instance["memory_mib"],
    )
