"""The nvml backend against a fake NVML: an H100 in MIG mode and an L4, behind the same functions,
return types (the real pynvml ctypes structures and opaque handle pointers) and error classes as pynvml.

There is no GPU here, so the fake stands in for the device; it enforces what the real library does where
the backend could get it wrong (handle types, a placement passed by reference, GPU-instance profile ids
that are not the profile constants, overlapping placements refused, a GPU instance with a compute
instance in use).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import sys
import threading
import types
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pynvml
import pytest
from aiohttp import web

from agent import nvml_check
from agent.backend import InstanceSpec
from agent.nvml_backend import NVML_MISSING, PYNVML_MISSING, STATE_FILE, NvmlBackend, model_for_device_name
from agent.protocol import AgentClient, AgentHTTPError, Conflict, InvalidRequest, NotFound, NotPermitted, Unavailable
from agent.server import AgentNode, node_app
from tests.support.agents import SECRET
from tests.support.processes import free_port

MIB = 2**20
H100 = "GPU-11111111-1111-1111-1111-111111111111"
L4 = "GPU-22222222-2222-2222-2222-222222222222"
CHANGING = {
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlComputeInstanceDestroy",
    "nvmlGpuInstanceDestroy",
    "nvmlDeviceSetMigMode",
}

# An H100 80GB as `nvidia-smi mig -lgip` shows it: profile constant -> (profile id, compute slices,
# instances per GPU, memory MiB, valid starts, memory slots, name).
H100_GI_PROFILES = {
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: (19, 1, 7, 9_984, (0, 1, 2, 3, 4, 5, 6), 1, "MIG 1g.10gb"),
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: (20, 1, 1, 9_984, (0, 1, 2, 3, 4, 5, 6), 1, "MIG 1g.10gb+me"),
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: (15, 1, 4, 20_096, (0, 2, 4, 6), 2, "MIG 1g.20gb"),
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE: (14, 2, 3, 20_096, (0, 2, 4), 2, "MIG 2g.20gb"),
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: (9, 3, 2, 40_320, (0, 4), 4, "MIG 3g.40gb"),
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE: (5, 4, 1, 40_320, (0,), 4, "MIG 4g.40gb"),
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE: (0, 7, 1, 81_152, (0,), 8, "MIG 7g.80gb"),
}
CI_SLICES = {
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
}


@dataclass
class FakeCi:
    id: int
    profile_id: int
    mig_index: int
    uuid: str
    used_mib: int = 1_024


@dataclass
class FakeGi:
    id: int
    profile: int  # the profile constant
    start: int
    cis: dict[int, FakeCi] = field(default_factory=dict)


@dataclass
class FakeGpu:
    name: str
    uuid: str
    memory_mib: int
    mig: bool | None  # None: the GPU has no MIG
    mig_pending: bool | None = None  # a MIG mode set but not active yet (None: as mig)
    activation: int = pynvml.NVML_SUCCESS  # what nvmlDeviceSetMigMode's activation answers
    profiles: dict = field(default_factory=dict)
    gis: dict[int, FakeGi] = field(default_factory=dict)
    power_mw: int = 312_500
    energy_mj: int = 123_456_789
    util_pct: int = 40
    used_mib: int = 2_000  # what processes use (nvidia-smi's figure); v1 adds the reservation to it
    reserved_mib: int = 0  # the driver's reservation (nvmlMemory_v2_t.reserved)
    memory_v2: bool = True  # the driver has nvmlDeviceGetMemoryInfo_v2
    not_supported: set[str] = field(default_factory=set)
    # topology: its PCI bus id, the remote bus id of each NVLink link ("": the link is down; a bus id no GPU has: an
    # NVSwitch), and its GPU fabric registration ((cluster UUID bytes, clique id), None: no fabric)
    bus_id: str = ""
    nvlinks: list[str] = field(default_factory=list)
    fabric: tuple[bytes, int] | None = None
    processes: list[int] = field(default_factory=list)  # pids of its compute processes


def _ptr(kind, address: int):
    return ctypes.cast(ctypes.c_void_p(address), kind)


def _address(handle, kind) -> int:
    assert isinstance(handle, kind), f"expected a {kind.__name__} handle, got {handle!r}"
    return ctypes.cast(handle, ctypes.c_void_p).value


def _referenced(ref, kind):
    """What a ``byref()`` or ``pointer()`` argument points at (C takes these arguments as pointers)."""
    target = ref._obj if type(ref).__name__ == "CArgObject" else getattr(ref, "contents", None)
    if not isinstance(target, kind):
        raise TypeError(f"expected a pointer to {kind.__name__} (byref), got {ref!r}: C takes a pointer here")
    return target


class FakeNvml:
    """The pynvml functions the backend calls. Constants, ctypes types and NVMLError classes are pynvml's."""

    def __init__(self, gpus: list[FakeGpu], *, driver: str = "550.54.15"):
        self.gpus = gpus
        self.driver = driver
        self.calls: list[tuple[str, dict]] = []
        self.fail: dict[str, type[pynvml.NVMLError]] = {}
        self.initialised = False
        # a slow driver: nvmlDeviceGetPowerUsage sets ``slow_entered`` and waits for ``slow_release``
        self.slow_entered: threading.Event | None = None
        self.slow_release: threading.Event | None = None

    def __getattr__(self, name):
        if name.startswith(("NVML_", "NVMLError", "c_nvml", "nvmlMemory_v")):
            return getattr(pynvml, name)
        raise AttributeError(f"the fake has no {name}: add it if the backend needs it")

    def changes(self) -> list[tuple[str, dict]]:
        return [call for call in self.calls if call[0] in CHANGING]

    def _call(self, name: str, gpu: FakeGpu | None = None, **details):
        self.calls.append((name, details))
        if name in self.fail:
            raise self.fail[name]()
        if gpu is not None and name in gpu.not_supported:
            raise pynvml.NVMLError_NotSupported()

    # handles: a GPU 0x1000 * (i + 1), its MIG devices + 0x10 * (index + 1); GPU instances
    # 0x100000 * (i + 1) + 0x100 * (id + 1); compute instances that + ci id + 1
    def _device(self, handle) -> tuple[FakeGpu, FakeCi | None, FakeGi | None]:
        address = _address(handle, pynvml.c_nvmlDevice_t)
        gpu = self.gpus[address // 0x1000 - 1]
        mig_index = (address % 0x1000) // 0x10 - 1
        if mig_index < 0:
            return gpu, None, None
        for gi in gpu.gis.values():
            for ci in gi.cis.values():
                if ci.mig_index == mig_index:
                    return gpu, ci, gi
        raise pynvml.NVMLError_InvalidArgument()

    def _gi(self, handle) -> tuple[int, FakeGpu, FakeGi]:
        address = _address(handle, pynvml.c_nvmlGpuInstance_t)
        index = address // 0x100000 - 1
        gi = self.gpus[index].gis.get((address % 0x100000) // 0x100 - 1)
        if gi is None:
            raise pynvml.NVMLError_InvalidArgument()
        return index, self.gpus[index], gi

    def _ci(self, handle) -> tuple[FakeGpu, FakeGi, FakeCi]:
        address = _address(handle, pynvml.c_nvmlComputeInstance_t)
        _, gpu, gi = self._gi(_ptr(pynvml.c_nvmlGpuInstance_t, address & ~0xFF))
        ci = gi.cis.get((address & 0xFF) - 1)
        if ci is None:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu, gi, ci

    @staticmethod
    def _gi_handle(index: int, gi_id: int):
        return _ptr(pynvml.c_nvmlGpuInstance_t, 0x100000 * (index + 1) + 0x100 * (gi_id + 1))

    # --- library and system ---
    def nvmlInit(self):
        self._call("nvmlInit")
        self.initialised = True

    def nvmlShutdown(self):
        self._call("nvmlShutdown")
        self.initialised = False

    def nvmlSystemGetDriverVersion(self):
        self._call("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetNVMLVersion(self):
        self._call("nvmlSystemGetNVMLVersion")
        return f"12.{self.driver}"

    # --- devices ---
    def nvmlDeviceGetCount(self):
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._call("nvmlDeviceGetHandleByIndex")
        return _ptr(pynvml.c_nvmlDevice_t, 0x1000 * (index + 1))

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self._call("nvmlDeviceGetHandleByUUID")
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        index = next((i for i, gpu in enumerate(self.gpus) if gpu.uuid == uuid), None)
        if index is None:
            raise pynvml.NVMLError_NotFound()
        return _ptr(pynvml.c_nvmlDevice_t, 0x1000 * (index + 1))

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        gpu, _, _ = self._device(handle)
        self._call("nvmlDeviceGetComputeRunningProcesses", gpu)
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=1 << 30) for pid in gpu.processes]

    def nvmlDeviceGetName(self, handle):
        gpu, _, _ = self._device(handle)
        self._call("nvmlDeviceGetName", gpu)
        return gpu.name

    def nvmlDeviceGetUUID(self, handle):
        gpu, ci, _ = self._device(handle)
        self._call("nvmlDeviceGetUUID", gpu)
        return ci.uuid if ci else gpu.uuid

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        """v1 (no ``version``) counts the driver's reservation as used, as the real call does (480 MiB on an
        idle H100); v2 (``version=nvmlMemory_v2``) reports it apart. A driver without v2 has no such symbol."""
        gpu, ci, gi = self._device(handle)
        self._call("nvmlDeviceGetMemoryInfo", gpu, version=version)
        if ci is not None:
            total, used, reserved = gpu.profiles[gi.profile][3], ci.used_mib, 0
        else:
            total, used, reserved = gpu.memory_mib, gpu.used_mib, gpu.reserved_mib
        free = total - reserved - used
        if not version:
            return pynvml.c_nvmlMemory_t(total * MIB, free * MIB, (used + reserved) * MIB)
        if not gpu.memory_v2:
            raise pynvml.NVMLError_FunctionNotFound()
        assert version == pynvml.nvmlMemory_v2, f"unknown nvmlMemory version {version:#x}"
        return pynvml.c_nvmlMemory_v2_t(version, total * MIB, reserved * MIB, free * MIB, used * MIB)

    def nvmlDeviceGetPciInfo(self, handle):
        gpu, _, _ = self._device(handle)
        self._call("nvmlDeviceGetPciInfo", gpu)
        if not gpu.bus_id:
            raise pynvml.NVMLError_NotSupported()
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.bus_id.encode()
        return info

    def nvmlDeviceGetNvLinkState(self, handle, link):
        gpu, _, _ = self._device(handle)
        self._call("nvmlDeviceGetNvLinkState", gpu, link=link)
        if not gpu.nvlinks:
            raise pynvml.NVMLError_NotSupported()
        if link >= len(gpu.nvlinks):
            raise pynvml.NVMLError_InvalidArgument()
        return pynvml.NVML_FEATURE_ENABLED if gpu.nvlinks[link] else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle, link):
        gpu, _, _ = self._device(handle)
        self._call("nvmlDeviceGetNvLinkRemotePciInfo", gpu, link=link)
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.nvlinks[link].encode()
        return info

    def nvmlDeviceGetGpuFabricInfo(self, handle):
        gpu, _, _ = self._device(handle)
        self._call("nvmlDeviceGetGpuFabricInfo", gpu)
        if gpu.fabric is None:
            raise pynvml.NVMLError_NotSupported()
        info = pynvml.c_nvmlGpuFabricInfo_t()
        ctypes.memmove(info.clusterUuid, gpu.fabric[0], 16)
        info.status, info.cliqueId = pynvml.NVML_SUCCESS, gpu.fabric[1]
        info.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        return info

    def nvmlDeviceGetPowerUsage(self, handle):
        gpu, _, _ = self._device(handle)
        self._call("nvmlDeviceGetPowerUsage", gpu)
        if self.slow_release is not None:
            self.slow_entered.set()
            self.slow_release.wait(10)
        return gpu.power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        gpu, _, _ = self._device(handle)
        self._call("nvmlDeviceGetTotalEnergyConsumption", gpu)
        return gpu.energy_mj

    def nvmlDeviceGetUtilizationRates(self, handle):
        gpu, _, _ = self._device(handle)
        self._call("nvmlDeviceGetUtilizationRates", gpu)
        if gpu.mig:
            raise pynvml.NVMLError_NotSupported()
        return pynvml.c_nvmlUtilization_t(gpu.util_pct, 10)

    # --- MIG: reading ---
    def nvmlDeviceGetMigMode(self, device):
        gpu, _, _ = self._device(device)
        self._call("nvmlDeviceGetMigMode", gpu)
        if gpu.mig is None:
            raise pynvml.NVMLError_NotSupported()
        pending = gpu.mig if gpu.mig_pending is None else gpu.mig_pending
        return [pynvml.NVML_DEVICE_MIG_ENABLE if on else pynvml.NVML_DEVICE_MIG_DISABLE for on in (gpu.mig, pending)]

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device, profile, version=2):
        gpu, _, _ = self._device(device)
        self._call("nvmlDeviceGetGpuInstanceProfileInfo", gpu)
        if not gpu.mig or profile not in gpu.profiles:
            raise pynvml.NVMLError_NotSupported()
        profile_id, slices, count, memory_mib, _, _, name = gpu.profiles[profile]
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id, info.sliceCount, info.instanceCount, info.memorySizeMB = profile_id, slices, count, memory_mib
        info.name = name.encode()
        return info

    def nvmlDeviceGetGpuInstances(self, device, profileId, gpuInstancesRef, countRef):
        gpu, _, _ = self._device(device)
        self._call("nvmlDeviceGetGpuInstances", gpu)
        count = _referenced(countRef, ctypes.c_uint)
        index = self.gpus.index(gpu)
        found = [gi for gi in gpu.gis.values() if gpu.profiles[gi.profile][0] == profileId]
        if len(gpuInstancesRef) < len(found):
            raise pynvml.NVMLError_InsufficientSize()
        for slot, gi in enumerate(found):
            gpuInstancesRef[slot] = self._gi_handle(index, gi.id)
        count.value = len(found)
        return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceGetInfo(self, gpuInstance):
        index, gpu, gi = self._gi(gpuInstance)
        self._call("nvmlGpuInstanceGetInfo", gpu)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.device = _ptr(pynvml.c_nvmlDevice_t, 0x1000 * (index + 1))
        info.id, info.profileId = gi.id, gpu.profiles[gi.profile][0]
        info.placement = pynvml.c_nvmlGpuInstancePlacement_t(gi.start, gpu.profiles[gi.profile][5])
        return info

    def nvmlDeviceGetGpuInstanceById(self, device, gpuInstanceId):
        gpu, _, _ = self._device(device)
        self._call("nvmlDeviceGetGpuInstanceById", gpu)
        if gpuInstanceId not in gpu.gis:
            raise pynvml.NVMLError_NotFound()
        return self._gi_handle(self.gpus.index(gpu), gpuInstanceId)

    def nvmlGpuInstanceGetComputeInstanceById(self, gpuInstance, computeInstanceId):
        _, gpu, gi = self._gi(gpuInstance)
        self._call("nvmlGpuInstanceGetComputeInstanceById", gpu)
        if computeInstanceId not in gi.cis:
            raise pynvml.NVMLError_NotFound()
        return _ptr(
            pynvml.c_nvmlComputeInstance_t, _address(gpuInstance, pynvml.c_nvmlGpuInstance_t) + computeInstanceId + 1
        )

    def nvmlComputeInstanceGetInfo(self, computeInstance):
        gpu, _, ci = self._ci(computeInstance)
        self._call("nvmlComputeInstanceGetInfo", gpu)
        info = pynvml.c_nvmlComputeInstanceInfo_t()
        info.id, info.profileId = ci.id, ci.profile_id
        return info

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, device, profile, engProfile, version=2):
        _, gpu, gi = self._gi(device)  # pynvml names it device; it takes the GPU instance
        self._call("nvmlGpuInstanceGetComputeInstanceProfileInfo", gpu)
        if profile not in CI_SLICES or CI_SLICES[profile] > gpu.profiles[gi.profile][1]:
            raise pynvml.NVMLError_NotSupported()
        assert engProfile == pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.id, info.sliceCount = profile, CI_SLICES[profile]
        return info

    def nvmlDeviceGetMaxMigDeviceCount(self, device):
        gpu, _, _ = self._device(device)
        self._call("nvmlDeviceGetMaxMigDeviceCount", gpu)
        return 7 if gpu.mig is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device, index):
        gpu, _, _ = self._device(device)
        self._call("nvmlDeviceGetMigDeviceHandleByIndex", gpu)
        if not any(ci.mig_index == index for gi in gpu.gis.values() for ci in gi.cis.values()):
            raise pynvml.NVMLError_NotFound()
        return _ptr(pynvml.c_nvmlDevice_t, 0x1000 * (self.gpus.index(gpu) + 1) + 0x10 * (index + 1))

    def nvmlDeviceGetGpuInstanceId(self, device):
        gpu, _, gi = self._device(device)
        self._call("nvmlDeviceGetGpuInstanceId", gpu)
        if gi is None:
            raise pynvml.NVMLError_InvalidArgument()
        return gi.id

    def nvmlDeviceGetComputeInstanceId(self, device):
        gpu, ci, _ = self._device(device)
        self._call("nvmlDeviceGetComputeInstanceId", gpu)
        if ci is None:
            raise pynvml.NVMLError_InvalidArgument()
        return ci.id

    # --- MIG: changing ---
    def nvmlDeviceSetMigMode(self, device, mode):
        gpu, _, _ = self._device(device)
        self._call("nvmlDeviceSetMigMode", gpu, device=gpu.uuid, mode=mode)
        if gpu.mig is None:
            raise pynvml.NVMLError_NotSupported()
        enable = mode == pynvml.NVML_DEVICE_MIG_ENABLE
        if not enable and gpu.gis:
            raise pynvml.NVMLError_InUse()  # GPU instances must go first
        gpu.mig_pending = enable
        if gpu.activation == pynvml.NVML_SUCCESS:
            gpu.mig, gpu.mig_pending = enable, None
        return gpu.activation

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device, profileId, placement):
        gpu, _, _ = self._device(device)
        placement = _referenced(placement, pynvml.c_nvmlGpuInstancePlacement_t)
        self._call(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            gpu,
            device=gpu.uuid,
            profile_id=profileId,
            start=placement.start,
            size=placement.size,
        )
        constant = next((c for c, p in gpu.profiles.items() if p[0] == profileId), None)
        if constant is None:
            raise pynvml.NVMLError_InvalidArgument()
        _, _, count, _, starts, slots, _ = gpu.profiles[constant]
        if placement.start not in starts or placement.size != slots:
            raise pynvml.NVMLError_InvalidArgument()
        wanted = ((1 << slots) - 1) << placement.start
        used = 0
        for gi in gpu.gis.values():
            used |= ((1 << gpu.profiles[gi.profile][5]) - 1) << gi.start
        if used & wanted or sum(gi.profile == constant for gi in gpu.gis.values()) >= count:
            raise pynvml.NVMLError_InsufficientResources()
        gi_id = min(set(range(1, 15)) - set(gpu.gis))
        gpu.gis[gi_id] = FakeGi(gi_id, constant, placement.start)
        return self._gi_handle(self.gpus.index(gpu), gi_id)

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance, profileId):
        index, gpu, gi = self._gi(gpuInstance)
        self._call("nvmlGpuInstanceCreateComputeInstance", gpu, gi=gi.id, profile_id=profileId)
        if CI_SLICES.get(profileId) != gpu.profiles[gi.profile][1]:
            raise pynvml.NVMLError_InvalidArgument()  # the fake only makes a GI's default CI
        mig_index = min(set(range(7)) - {ci.mig_index for g in gpu.gis.values() for ci in g.cis.values()})
        ci = FakeCi(len(gi.cis), profileId, mig_index, f"MIG-{index}{gi.id:03d}aaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
        gi.cis[ci.id] = ci
        return _ptr(pynvml.c_nvmlComputeInstance_t, _address(gpuInstance, pynvml.c_nvmlGpuInstance_t) + ci.id + 1)

    def nvmlComputeInstanceDestroy(self, computeInstance):
        gpu, gi, ci = self._ci(computeInstance)
        self._call("nvmlComputeInstanceDestroy", gpu, gi=gi.id, ci=ci.id)
        del gi.cis[ci.id]
        return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceDestroy(self, gpuInstance):
        _, gpu, gi = self._gi(gpuInstance)
        self._call("nvmlGpuInstanceDestroy", gpu, gi=gi.id)
        if gi.cis:
            raise pynvml.NVMLError_InUse()
        del gpu.gis[gi.id]
        return pynvml.NVML_SUCCESS


def h100(**changes) -> FakeGpu:
    """An H100 in MIG mode holding someone else's instances: a 3g.40gb at slot 4 (with its compute
    instance) and a bare 2g.20gb at slot 2. Slots 0-1 and two compute slices are free."""
    gpu = FakeGpu("NVIDIA H100 80GB HBM3", H100, 81_559, True, profiles=dict(H100_GI_PROFILES))
    three = FakeGi(2, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 4)
    three.cis[0] = FakeCi(
        0, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 0, "MIG-0c0ffee0-0000-0000-0000-000000000002"
    )
    gpu.gis = {2: three, 5: FakeGi(5, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 2)}
    for name, value in changes.items():
        setattr(gpu, name, value)
    return gpu


RECORDING = json.loads((Path(__file__).parent / "data" / "h100_nvml.json").read_text())
RECORDED_H100 = "GPU-4a2f7c10-9e3b-4d51-8c2a-0b6e1f5d3a97"  # the recording keeps no UUID: this one is made up


def recorded_h100(*, load: bool = False) -> FakeGpu:
    """The real H100 of issue 28 as NVML answered (tests/agent/data/h100_nvml.json): MIG capable and
    disabled, 81,559 MiB nameplate of which the driver reserves 480; idle, or under the recorded load."""
    memory = RECORDING["memory"]
    used = memory["load" if load else "idle"]["v2_used_mib"]
    return FakeGpu(RECORDING["device"]["name"], RECORDED_H100, memory["total_mib"], False,
                   profiles=dict(H100_GI_PROFILES), reserved_mib=memory["reserved_mib"], used_mib=used)


def recorded_nvml(*, load: bool = False) -> FakeNvml:
    """A fake NVML answering with the recorded H100's figures and driver version."""
    return FakeNvml([recorded_h100(load=load)], driver=RECORDING["device"]["driver"])


def l4(**changes) -> FakeGpu:
    gpu = FakeGpu("NVIDIA L4", L4, 23_034, None, power_mw=35_250, energy_mj=5_000, util_pct=40, used_mib=4_000)
    for name, value in changes.items():
        setattr(gpu, name, value)
    return gpu


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml([h100(), l4()])


@pytest.fixture
def backend(fake, tmp_path):
    backend = NvmlBackend(tmp_path, "node-a", allow_mig_changes=True, nvml=fake)
    yield backend
    backend.close()


def mig(profile: str, start: int) -> InstanceSpec:
    return InstanceSpec("mig", H100, profile=profile, start=start)


def layout(fake: FakeNvml) -> set[tuple[int, int, int]]:
    """The H100's GPU instances as (id, profile constant, start)."""
    return {(gi.id, gi.profile, gi.start) for gi in fake.gpus[0].gis.values()}


# --- inventory and models ---


def test_nvml_backend_inventory_lists_gpus_with_the_mig_layout_in_catalogue_names(backend):
    inventory = backend.inventory()

    h100_gpu, l4_gpu = inventory["gpus"]
    assert h100_gpu == {
        "index": 0,
        "uuid": H100,
        "model": "H100-80GB",
        "name": "NVIDIA H100 80GB HBM3",
        "memory_mib": 81_559,
        "memory_total_mib": 81_559,
        "memory_reserved_mib": 0,
        "mig_capable": True,
        "mig_mode": {"current": "enabled", "pending": "enabled"},
        "mode": "mig",
        "nvlink_domain": "",  # the fake answers no NVLink call: a PCIe node
        "mig_layout": [
            {"gpu_instance_id": 5, "profile": "2g.20gb", "start": 2, "size": 2, "device_uuid": ""},
            {
                "gpu_instance_id": 2,
                "profile": "3g.40gb",
                "start": 4,
                "size": 4,
                "device_uuid": "MIG-0c0ffee0-0000-0000-0000-000000000002",
            },
        ],
    }
    assert l4_gpu == {
        "index": 1,
        "uuid": L4,
        "model": "L4",
        "name": "NVIDIA L4",
        "memory_mib": 23_034,
        "memory_total_mib": 23_034,
        "memory_reserved_mib": 0,
        "mig_capable": False,
        "mig_mode": None,
        "mode": "whole",
        "mig_layout": [],
        "nvlink_domain": "",
    }
    assert inventory["instances"] == []


def test_nvml_backend_inventory_names_the_profiles_the_catalogue_does_not_model(tmp_path):
    gpu = h100(gis={})
    gpu.profiles[pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME] = (21, 1, 7, 9_984, (0, 1), 1, "MIG 1g.10gb-me")
    gpu.gis = {9: FakeGi(9, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, 0)}
    backend = NvmlBackend(tmp_path, "node-a", allow_mig_changes=True, nvml=FakeNvml([gpu]))

    assert backend.inventory()["gpus"][0]["mig_layout"] == [
        {"gpu_instance_id": 9, "profile": "1g.10gb-me", "start": 0, "size": 1, "device_uuid": ""}
    ]
    with pytest.raises(InvalidRequest) as refused:
        backend.create("a1", mig("1g.10gb", 0))  # its memory slot is taken all the same
    assert refused.value.field == "start"
    assert "overlaps" in refused.value.message


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA H100 PCIe", "H100-80GB"),
        ("NVIDIA H100 NVL", "H100-NVL-94GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA H200 NVL", "H200-141GB"),
        ("nvidia l4", "L4"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_nvml_backend_maps_device_names_to_catalogue_models(name, code):
    model = model_for_device_name(name)
    assert (model.code if model else None) == code


def test_nvml_backend_lists_an_unknown_gpu_under_its_own_name(tmp_path):
    unknown = l4(name="NVIDIA Future X1", uuid="GPU-33333333-3333-3333-3333-333333333333")
    backend = NvmlBackend(tmp_path, "node-a", nvml=FakeNvml([unknown]))

    (gpu,) = backend.inventory()["gpus"]
    assert (gpu["model"], gpu["name"], gpu["mig_capable"], gpu["mode"]) == (
        "NVIDIA Future X1",
        "NVIDIA Future X1",
        False,
        "whole",
    )


# --- NVML missing ---


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (pynvml.NVMLError_LibraryNotFound, NVML_MISSING),
        (pynvml.NVMLError_DriverNotLoaded, "NVML is not available: the NVIDIA kernel driver is not loaded"),
    ],
)
def test_nvml_backend_without_the_library_is_unavailable(tmp_path, error, message):
    fake = FakeNvml([l4()])
    fake.fail["nvmlInit"] = error

    with pytest.raises(Unavailable) as unavailable:
        NvmlBackend(tmp_path, "node-a", nvml=fake)
    assert unavailable.value.message.startswith(message)
    assert unavailable.value.status == 503
    assert NVML_MISSING == "NVML is not available: libnvidia-ml.so not found; is the NVIDIA driver installed?"


def test_nvml_backend_without_pynvml_is_unavailable(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError

    with pytest.raises(Unavailable) as unavailable:
        NvmlBackend(tmp_path, "node-a")
    assert unavailable.value.message == PYNVML_MISSING


# --- MIG create and destroy ---


def test_nvml_backend_creates_and_destroys_a_mig_instance(backend, fake, tmp_path):
    before = layout(fake)

    instance, created = backend.create("a1", mig("2g.20gb", 0))

    assert created
    assert fake.changes() == [
        (
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            {"device": H100, "profile_id": 14, "start": 0, "size": 2},  # 14: the 2g profile id, not 2_SLICE (1)
        ),
        (
            "nvmlGpuInstanceCreateComputeInstance",
            {"gi": 1, "profile_id": pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE},
        ),
    ]
    device_uuid = fake.gpus[0].gis[1].cis[0].uuid
    assert instance | {"created_at": 0} == {
        "allocation_id": "a1",
        "kind": "mig",
        "gpu": H100,
        "gpu_index": 0,
        "profile": "2g.20gb",
        "start": 0,
        "milli": 285,
        "memory_mib": 20_096,
        "gpu_instance_id": 1,
        "compute_instance_id": 0,
        "device_uuid": device_uuid,
        "created_at": 0,
        "notice": None,
        "access": {"CUDA_VISIBLE_DEVICES": device_uuid},
        "state": "active",
    }
    inventory = backend.inventory()
    assert inventory["instances"] == [instance]
    assert {"gpu_instance_id": 1, "profile": "2g.20gb", "start": 0, "size": 2, "device_uuid": device_uuid} in (
        inventory["gpus"][0]["mig_layout"]
    )
    assert json.loads((tmp_path / STATE_FILE).read_text())["instances"] == {"a1": instance}

    fake.calls.clear()
    assert backend.destroy("a1") is True
    assert [name for name, _ in fake.changes()] == ["nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy"]
    assert layout(fake) == before
    assert backend.inventory()["instances"] == []
    assert backend.destroy("a1") is False


def test_nvml_backend_destroys_the_gpu_instance_when_its_compute_instance_fails(backend, fake, tmp_path):
    before = layout(fake)
    fake.fail["nvmlGpuInstanceCreateComputeInstance"] = pynvml.NVMLError_InsufficientResources

    with pytest.raises(Unavailable) as failed:
        backend.create("a1", mig("2g.20gb", 0))

    assert "compute instance" in failed.value.message
    assert [name for name, _ in fake.changes()] == [
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        "nvmlGpuInstanceCreateComputeInstance",
        "nvmlGpuInstanceDestroy",
    ]
    assert layout(fake) == before
    assert backend.inventory()["instances"] == []
    assert not (tmp_path / STATE_FILE).exists()


def test_nvml_backend_makes_no_mig_change_when_mig_changes_are_off(fake, tmp_path):
    backend = NvmlBackend(tmp_path, "node-a", nvml=fake)  # allow_mig_changes defaults to off
    fake.calls.clear()

    with pytest.raises(NotPermitted) as refused:
        backend.create("a1", mig("2g.20gb", 0))

    assert refused.value.status == 403
    assert refused.value.message.startswith("MIG changes are disabled on this agent (allow_mig_changes is off)")
    assert fake.changes() == []
    assert backend.inventory()["instances"] == []


def test_nvml_backend_does_not_destroy_mig_instances_when_mig_changes_are_off(backend, fake, tmp_path):
    backend.create("a1", mig("2g.20gb", 0))
    backend.close()
    locked = NvmlBackend(tmp_path, "node-a", nvml=fake)
    fake.calls.clear()

    with pytest.raises(NotPermitted):
        locked.destroy("a1")

    assert fake.changes() == []
    assert 1 in fake.gpus[0].gis
    assert [i["allocation_id"] for i in locked.inventory()["instances"]] == ["a1"]


# --- idempotency, conflicts, bad requests ---


def test_nvml_backend_create_is_idempotent_and_another_spec_conflicts(backend, fake):
    first, _ = backend.create("a1", mig("2g.20gb", 0))
    fake.calls.clear()

    again, created = backend.create("a1", mig("2g.20gb", 0))
    assert (again, created) == (first, False)
    assert fake.changes() == []

    with pytest.raises(Conflict) as conflict:
        backend.create("a1", mig("1g.20gb", 0))
    assert conflict.value.field == "allocation_id"
    assert fake.changes() == []


@pytest.mark.parametrize(
    ("spec", "error_field", "words"),
    [
        (InstanceSpec("whole", "GPU-nope"), "gpu", "no GPU 'GPU-nope'"),
        (InstanceSpec("mig", L4, profile="1g.10gb", start=0), "kind", "is not in MIG mode"),
        (InstanceSpec("whole", H100), "kind", "is in MIG mode"),
        (InstanceSpec("share", H100, milli=100, memory_mib=1_000), "kind", "is in MIG mode"),
        (mig("5g.50gb", 0), "profile", "profile '5g.50gb' is not offered on H100-80GB; offered: 1g.10gb"),
        (mig("3g.40gb", 2), "start", "3g.40gb cannot start at slot 2 (valid: 0, 4)"),
        (mig("1g.10gb", 3), "start", "overlaps another instance"),
        (mig("1g.10gb", 7), "start", "1g.10gb cannot start at slot 7"),
        (mig("3g.40gb", 0), "start", "overlaps another instance"),
        (InstanceSpec("share", L4, milli=100, memory_mib=1_000), "kind", "is in whole mode; a share instance needs"),
    ],
)
def test_nvml_backend_refuses_a_bad_request_and_changes_nothing(backend, fake, tmp_path, spec, error_field, words):
    before = layout(fake)

    with pytest.raises(InvalidRequest) as refused:
        backend.create("a1", spec)

    assert refused.value.field == error_field
    assert words in refused.value.message
    assert fake.changes() == []
    assert layout(fake) == before
    assert backend.inventory()["instances"] == []
    assert not (tmp_path / STATE_FILE).exists()


def test_nvml_backend_shares_fit_in_the_gpu_and_exclude_a_whole_lease(backend, fake):
    backend.set_mode(L4, "shared")
    share, _ = backend.create("s1", InstanceSpec("share", L4, milli=600, memory_mib=20_000))
    assert share["access"] == {
        "CUDA_VISIBLE_DEVICES": L4,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "60",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20000M",
    }
    assert backend.inventory()["gpus"][1]["mode"] == "shared"

    with pytest.raises(InvalidRequest) as too_much:
        backend.create("s2", InstanceSpec("share", L4, milli=401, memory_mib=1_000))
    assert too_much.value.field == "milli"
    with pytest.raises(InvalidRequest) as too_big:
        backend.create("s2", InstanceSpec("share", L4, milli=100, memory_mib=3_035))
    assert too_big.value.field == "memory_mib"
    assert "has 3034 MiB free" in too_big.value.message
    with pytest.raises(InvalidRequest) as shared:
        backend.create("w1", InstanceSpec("whole", L4))
    assert shared.value.field == "kind"
    assert [i["allocation_id"] for i in backend.inventory()["instances"]] == ["s1"]

    backend.destroy("s1")
    backend.set_mode(L4, "whole")
    whole, _ = backend.create("w1", InstanceSpec("whole", L4))
    assert whole["access"] == {"CUDA_VISIBLE_DEVICES": L4}
    with pytest.raises(InvalidRequest) as held_whole:
        backend.create("s1", InstanceSpec("share", L4, milli=100, memory_mib=100))
    assert held_whole.value.field == "kind"
    assert fake.changes() == []


# --- NVML errors ---


@pytest.mark.parametrize(
    ("error", "agent_error", "words"),
    [
        (pynvml.NVMLError_NoPermission, NotPermitted, "insufficient permissions"),
        (pynvml.NVMLError_NotSupported, InvalidRequest, "creating GPU instance 2g.20gb at slot 0"),
        (pynvml.NVMLError_GpuIsLost, Unavailable, "NVML error: GPU is lost"),
    ],
)
def test_nvml_backend_maps_nvml_errors(backend, fake, error, agent_error, words):
    fake.fail["nvmlDeviceCreateGpuInstanceWithPlacement"] = error

    with pytest.raises(agent_error) as failed:
        backend.create("a1", mig("2g.20gb", 0))

    assert type(failed.value) is agent_error
    assert words in failed.value.message
    assert backend.inventory()["instances"] == []


def test_nvml_backend_keeps_an_instance_whose_gpu_instance_is_in_use(backend, fake):
    backend.create("a1", mig("2g.20gb", 0))
    fake.fail["nvmlComputeInstanceDestroy"] = pynvml.NVMLError_InUse

    with pytest.raises(Conflict):
        backend.destroy("a1")
    assert [i["allocation_id"] for i in backend.inventory()["instances"]] == ["a1"]


def test_nvml_backend_compute_pids_are_nvmls_processes_on_the_gpu_and_none_when_it_cannot_say(backend, fake):
    """What the agent's eviction of a device given back (agent.workloads ``_evict``) asks NVML: the GPU's compute
    processes; an NVML error or an unknown GPU is no process (the descriptors are still looked at)."""
    fake.gpus[1].processes = [4242, 4343]
    assert backend.compute_pids(L4) == {4242, 4343}
    assert backend.compute_pids(H100) == set()
    assert backend.compute_pids("GPU-nowhere") == set()
    fake.fail["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVMLError_NotSupported
    assert backend.compute_pids(L4) == set()


# --- state across restarts, vanished instances, notices ---


def test_nvml_backend_restart_keeps_instances_and_notices(backend, fake, tmp_path):
    backend.create("a1", mig("2g.20gb", 0))
    backend.create("w1", InstanceSpec("whole", L4))
    noticed = backend.notice("w1", deadline=1_700_000_000.0, reason="preempted by a higher priority")
    assert noticed["notice"] == {"deadline": 1_700_000_000.0, "reason": "preempted by a higher priority"}
    held = backend.inventory()["instances"]
    backend.close()

    restarted = NvmlBackend(tmp_path, "node-a", nvml=fake)

    assert restarted.inventory()["instances"] == held
    assert restarted.create("a1", mig("2g.20gb", 0)) == (held[0], False)
    assert [p for p in tmp_path.iterdir()] == [tmp_path / STATE_FILE]  # no temporary file left behind


def test_nvml_backend_reports_an_instance_gone_from_the_device_as_vanished(backend, fake):
    backend.create("a1", mig("2g.20gb", 0))
    del fake.gpus[0].gis[1]  # someone destroyed it behind the agent's back

    (instance,) = backend.inventory()["instances"]
    assert instance["state"] == "vanished"
    assert backend.readings(0.0).instances == []
    assert backend.destroy("a1") is True
    assert backend.inventory()["instances"] == []


def test_nvml_backend_notice_on_an_unknown_allocation_is_not_found(backend):
    with pytest.raises(NotFound):
        backend.notice("nope", deadline=1.0, reason="x")


# --- readings ---


def test_nvml_backend_readings_give_gpu_power_and_energy_and_instance_memory(backend, fake):
    backend.create("a1", mig("2g.20gb", 0))
    backend.set_mode(L4, "shared")
    backend.create("s1", InstanceSpec("share", L4, milli=250, memory_mib=8_000))
    backend.create("s2", InstanceSpec("share", L4, milli=750, memory_mib=8_000))

    readings = backend.readings(1_700_000_000.0)

    h100_reading, l4_reading = readings.gpus
    assert (h100_reading.power_w, h100_reading.energy_mj) == (312.5, 123_456_789)
    assert (h100_reading.util_pct, h100_reading.fb_used_mib, h100_reading.fb_free_mib) == (None, None, None)
    assert (l4_reading.power_w, l4_reading.util_pct) == (35.25, 40.0)
    # a GPU with shares reports memory per share only (the metrics never count a MiB twice)
    assert (l4_reading.fb_used_mib, l4_reading.fb_free_mib) == (None, None)
    mig_reading, s1, s2 = readings.instances
    assert (mig_reading.allocation_id, mig_reading.gpu_instance_id, mig_reading.profile) == ("a1", 1, "2g.20gb")
    assert (mig_reading.fb_used_mib, mig_reading.fb_free_mib, mig_reading.engine_active) == (1_024, 19_072, 0.0)
    # the GPU's 40 % split by milli: each share at 40 % of its own capacity
    assert (s1.allocation_id, s1.engine_active, s1.fb_used_mib, s1.fb_free_mib) == ("s1", 0.4, 2_000, 6_000)
    assert (s2.allocation_id, s2.engine_active) == ("s2", 0.4)
    assert all("power_w" not in asdict(reading) for reading in readings.instances)
    json.dumps(readings.to_json())


def test_nvml_backend_readings_report_a_field_nvml_does_not_support_as_zero(tmp_path):
    fake = FakeNvml([l4(not_supported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption"})])
    backend = NvmlBackend(tmp_path, "node-a", nvml=fake)
    backend.create("w1", InstanceSpec("whole", L4))

    (reading,) = backend.readings(0.0).gpus

    assert (reading.power_w, reading.energy_mj, reading.util_pct) == (0.0, 0, 40.0)
    assert reading.allocation_id == "w1"


# --- the read-only check command ---


def test_nvml_check_prints_inventory_and_readings_without_changing_anything(fake, capsys):
    assert nvml_check.main([], nvml=fake) == 0

    report = json.loads(capsys.readouterr().out)
    assert (report["driver"], report["nvml"]) == ("550.54.15", "12.550.54.15")
    assert [gpu["model"] for gpu in report["inventory"]["gpus"]] == ["H100-80GB", "L4"]
    assert report["readings"]["gpus"][0]["power_w"] == 312.5
    assert fake.changes() == []
    assert not fake.initialised


def test_nvml_check_exits_2_when_nvml_is_missing(capsys):
    fake = FakeNvml([])
    fake.fail["nvmlInit"] = pynvml.NVMLError_LibraryNotFound

    assert nvml_check.main([], nvml=fake) == 2
    assert capsys.readouterr().err.strip() == NVML_MISSING


# --- GPU mode changes ---


def test_nvml_backend_enables_mig_then_disables_it_once_the_gpu_is_empty(tmp_path):
    fake = FakeNvml([h100(mig=False, gis={}), l4()])
    backend = NvmlBackend(tmp_path, "node-a", allow_mig_changes=True, nvml=fake)
    assert backend.inventory()["gpus"][0]["mode"] == "whole"

    entry = backend.set_mode(H100, "mig")

    assert fake.changes() == [("nvmlDeviceSetMigMode", {"device": H100, "mode": pynvml.NVML_DEVICE_MIG_ENABLE})]
    assert (entry["uuid"], entry["mode"], entry["mig_layout"]) == (H100, "mig", [])
    assert entry == backend.inventory()["gpus"][0]
    fake.calls.clear()
    assert backend.set_mode(H100, "mig") == entry  # the same mode again: nothing to do
    assert fake.changes() == []

    backend.create("a1", mig("3g.40gb", 4))  # a MIG instance fits now
    fake.calls.clear()
    with pytest.raises(Conflict) as held:
        backend.set_mode(H100, "whole")
    assert (held.value.status, held.value.field) == (409, "gpu")
    assert "holds instance(s) a1" in held.value.message
    assert fake.changes() == [] and fake.gpus[0].mig is True

    backend.destroy("a1")
    fake.calls.clear()
    entry = backend.set_mode(H100, "whole")
    assert fake.changes() == [("nvmlDeviceSetMigMode", {"device": H100, "mode": pynvml.NVML_DEVICE_MIG_DISABLE})]
    assert (entry["mode"], fake.gpus[0].mig) == ("whole", False)
    whole, _ = backend.create("w1", InstanceSpec("whole", H100))  # and a whole lease fits again
    assert whole["gpu"] == H100
    backend.close()


@pytest.mark.parametrize(
    ("gpu_uuid", "mode", "error", "error_field", "words"),
    [
        ("GPU-nope", "whole", NotFound, "gpu", "no GPU 'GPU-nope' on node-a"),
        (L4, "mig", InvalidRequest, "mode", "L4 offers no MIG"),
        # the H100 holds two GPU instances this agent did not make (ids 2 and 5): never reset under them
        (H100, "whole", Conflict, "gpu", "holds GPU instance(s) 2, 5 that this agent did not make"),
        (H100, "shared", Conflict, "gpu", "holds GPU instance(s) 2, 5"),
    ],
)
def test_nvml_backend_refuses_a_mode_change_and_changes_nothing(
    backend, fake, tmp_path, gpu_uuid, mode, error, error_field, words
):
    before = backend.inventory()

    with pytest.raises(error) as refused:
        backend.set_mode(gpu_uuid, mode)

    assert refused.value.field == error_field
    assert words in refused.value.message
    assert fake.changes() == []
    assert backend.inventory() == before
    assert not (tmp_path / STATE_FILE).exists()


def test_nvml_backend_switches_no_mig_mode_when_mig_changes_are_off(fake, tmp_path):
    backend = NvmlBackend(tmp_path, "node-a", nvml=fake)
    fake.calls.clear()

    for gpu_uuid, mode in ((H100, "whole"), (H100, "shared")):
        with pytest.raises(NotPermitted) as refused:
            backend.set_mode(gpu_uuid, mode)
        assert refused.value.status == 403
        assert refused.value.message.startswith("MIG changes are disabled on this agent (allow_mig_changes is off)")
        assert "from mig to" in refused.value.message

    assert fake.changes() == []  # refused before any NVML change
    assert [g["mode"] for g in backend.inventory()["gpus"]] == ["mig", "whole"]
    assert not (tmp_path / STATE_FILE).exists()


def test_nvml_backend_changes_the_current_mode_and_whole_shared_when_mig_changes_are_off(fake, tmp_path):
    """Issue 28, defect 3: on a default real node (MIG changes off) the capacity loop's switch was refused
    403 though no device setting is involved: the current mode again, and whole <-> shared with MIG off."""
    backend = NvmlBackend(tmp_path, "node-a", nvml=fake)
    fake.calls.clear()

    assert backend.set_mode(H100, "mig")["mode"] == "mig"  # the current mode: nothing to do
    assert backend.set_mode(L4, "whole")["mode"] == "whole"
    assert backend.set_mode(L4, "shared")["mode"] == "shared"
    backend.create("s1", InstanceSpec("share", L4, milli=500, memory_mib=4_000))
    with pytest.raises(Conflict):
        backend.set_mode(L4, "whole")  # still refused while it holds a share
    backend.destroy("s1")
    assert backend.set_mode(L4, "whole")["mode"] == "whole"

    assert fake.changes() == []  # no device setting changed
    assert json.loads((tmp_path / STATE_FILE).read_text())["modes"] == {L4: "whole"}
    backend.close()


@pytest.mark.parametrize(
    ("activation", "words"),
    [
        (pynvml.NVML_ERROR_RESET_REQUIRED, "activation needs a GPU reset"),
        (pynvml.NVML_ERROR_IN_USE, "the GPU is in use"),
    ],
)
def test_nvml_backend_refuses_a_mig_mode_change_that_waits_for_a_reset(tmp_path, activation, words):
    fake = FakeNvml([h100(mig=False, gis={}, activation=activation)])
    backend = NvmlBackend(tmp_path, "node-a", allow_mig_changes=True, nvml=fake)

    with pytest.raises(Conflict) as pending:
        backend.set_mode(H100, "mig")

    message = pending.value.message
    assert message.startswith(f"enabling MIG on GPU {H100} is pending: {words}")
    assert "the agent does not reset GPUs" in message
    assert pending.value.field == "gpu"
    assert backend.inventory()["gpus"][0]["mode"] == "whole"  # still what the device runs
    # the inventory shows the switch pending until the reset, as nvidia-smi's "MIG M. Pending" does
    assert backend.inventory()["gpus"][0]["mig_mode"] == {"current": "disabled", "pending": "enabled"}
    assert not (tmp_path / STATE_FILE).exists()


def test_nvml_backend_shared_mode_is_kept_across_a_restart_and_creates_follow_it(backend, fake, tmp_path):
    entry = backend.set_mode(L4, "shared")

    assert entry["mode"] == "shared"
    assert fake.changes() == []  # MIG stays off: shares are MPS limits, no device change
    with pytest.raises(InvalidRequest) as refused:
        backend.create("w1", InstanceSpec("whole", L4))
    assert refused.value.field == "kind"
    assert "is in shared mode; a whole instance needs whole mode" in refused.value.message
    backend.create("s1", InstanceSpec("share", L4, milli=500, memory_mib=4_000))
    backend.close()

    restarted = NvmlBackend(tmp_path, "node-a", allow_mig_changes=True, nvml=fake)
    assert restarted.inventory()["gpus"][1]["mode"] == "shared"
    with pytest.raises(Conflict):
        restarted.set_mode(L4, "whole")  # s1 is still there
    restarted.destroy("s1")
    assert restarted.set_mode(L4, "whole")["mode"] == "whole"  # no shares left, yet "whole" is what was asked
    restarted.close()

    again = NvmlBackend(tmp_path, "node-a", nvml=fake)
    assert again.inventory()["gpus"][1]["mode"] == "whole"
    assert json.loads((tmp_path / STATE_FILE).read_text())["modes"] == {L4: "whole"}
    again.close()


def test_nvml_backend_reads_a_state_file_from_before_mode_changes(fake, tmp_path):
    (tmp_path / STATE_FILE).write_text(json.dumps({"version": 1, "hostname": "node-a", "instances": {}}))

    backend = NvmlBackend(tmp_path, "node-a", nvml=fake)

    assert [g["mode"] for g in backend.inventory()["gpus"]] == ["mig", "whole"]
    backend.close()


@contextlib.contextmanager
def served(backend: NvmlBackend) -> Iterator[AgentClient]:
    """The agent's HTTP server (``agent.server.node_app``) on loopback in a thread, over ``backend``."""
    port = free_port()
    node = AgentNode("node-a", backend, SECRET, "node-a")
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(node_app(node))
    listening = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        listening.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert listening.wait(10)
    try:
        yield AgentClient(f"http://127.0.0.1:{port}", "node-a", SECRET, retries=0)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.run_until_complete(runner.cleanup())  # closes the backend
        loop.close()


def test_nvml_backend_mode_changes_over_http(fake, tmp_path):
    with served(NvmlBackend(tmp_path, "node-a", allow_mig_changes=True, nvml=fake)) as client:
        with pytest.raises(AgentHTTPError) as held:
            client.set_gpu_mode(H100, "whole")  # someone else's GPU instances 2 and 5
        assert (held.value.status, held.value.problem["field"]) == (409, "gpu")
        with pytest.raises(AgentHTTPError) as no_mig:
            client.set_gpu_mode(L4, "mig")
        assert (no_mig.value.status, no_mig.value.problem["field"]) == (422, "mode")
        assert fake.changes() == []

        entry = client.set_gpu_mode(L4, "shared")
        assert entry == client.inventory()["gpus"][1] and entry["mode"] == "shared"

    with served(NvmlBackend(tmp_path, "node-a", nvml=fake)) as client:  # restarted, MIG changes off
        assert client.inventory()["gpus"][1]["mode"] == "shared"
        assert client.set_gpu_mode(L4, "whole")["mode"] == "whole"  # no device setting: allowed
        with pytest.raises(AgentHTTPError) as off:
            client.set_gpu_mode(H100, "whole")  # MIG off: a device setting
        assert off.value.status == 403
        assert off.value.problem["type"].endswith("/not_permitted")
    assert not fake.initialised


# --- issue 28: what a real H100 (driver 580.159.04, MIG disabled, MIG changes off) showed ---


def test_recorded_nvml_answers_v1_as_the_real_h100_did():
    """The recorded fake reproduces the v1 figures the agent printed on the real GPU (its reservation counted
    as used) and the v2 ones nvidia-smi and CUDA agree with; the recording adds up."""
    memory = RECORDING["memory"]
    assert memory["total_mib"] - memory["reserved_mib"] == memory["cuda_allocatable_mib"] == 81_079
    for load, state in ((False, "idle"), (True, "load")):
        nv = recorded_nvml(load=load)
        handle = nv.nvmlDeviceGetHandleByIndex(0)
        v1 = nv.nvmlDeviceGetMemoryInfo(handle)
        v2 = nv.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        assert v1.used // MIB == memory[state]["v1_used_mib"]  # 480 idle, 5,806 under load
        assert (v2.total // MIB, v2.reserved // MIB, v2.used // MIB) == (
            81_559, 480, memory[state]["v2_used_mib"])
        assert abs(v2.used // MIB - memory[state]["nvidia_smi_used_mib"]) <= 1
        assert (v2.used + v2.free) // MIB == 81_079


def test_nvml_backend_gives_whole_and_share_instances_the_gpus_uuid(tmp_path):
    """Defect 1: NVML left device_uuid empty for whole and share instances (the sim set the GPU's UUID), so
    the container runtime built ``--device nvidia.com/gpu=`` with no device."""
    backend = NvmlBackend(tmp_path, "h100-node", nvml=recorded_nvml())

    whole, _ = backend.create("w1", InstanceSpec("whole", RECORDED_H100))
    assert (whole["device_uuid"], whole["access"]["CUDA_VISIBLE_DEVICES"]) == (RECORDED_H100, RECORDED_H100)
    backend.destroy("w1")
    backend.set_mode(RECORDED_H100, "shared")
    share, _ = backend.create("s1", InstanceSpec("share", RECORDED_H100, milli=500, memory_mib=8_000))
    assert share["device_uuid"] == RECORDED_H100
    assert backend.inventory()["instances"][0]["device_uuid"] == RECORDED_H100
    backend.close()


def test_nvml_backend_reports_usable_memory_apart_from_the_drivers_reservation(tmp_path):
    """Defect 2: v1 nvmlDeviceGetMemoryInfo counts the driver's 480 MiB as used: the agent read an idle H100
    480 MiB used (nvidia-smi: 0), 5,806 under load (nvidia-smi: 5,327), and sized shares on 81,559 MiB
    where CUDA can allocate 81,079."""
    backend = NvmlBackend(tmp_path, "h100-node", nvml=recorded_nvml())

    (gpu,) = backend.inventory()["gpus"]
    assert (gpu["memory_total_mib"], gpu["memory_reserved_mib"], gpu["memory_mib"]) == (81_559, 480, 81_079)
    (idle,) = backend.readings(0.0).gpus
    assert (idle.fb_used_mib, idle.fb_free_mib) == (0, 81_079)
    whole, _ = backend.create("w1", InstanceSpec("whole", RECORDED_H100))
    assert whole["memory_mib"] == 81_079
    backend.destroy("w1")

    backend.set_mode(RECORDED_H100, "shared")
    with pytest.raises(InvalidRequest) as too_big:
        backend.create("s1", InstanceSpec("share", RECORDED_H100, milli=500, memory_mib=81_080))
    assert (too_big.value.field, "has 81079 MiB free" in too_big.value.message) == ("memory_mib", True)
    backend.create("s1", InstanceSpec("share", RECORDED_H100, milli=500, memory_mib=81_079))  # exactly fits
    backend.close()

    loaded = NvmlBackend(tmp_path / "load", "h100-node", nvml=recorded_nvml(load=True))
    loaded.create("w1", InstanceSpec("whole", RECORDED_H100))
    (busy,) = loaded.readings(0.0).gpus
    assert (busy.fb_used_mib, busy.fb_used_mib + busy.fb_free_mib) == (5_326, 81_079)  # nvidia-smi: 5,327
    loaded.close()


def test_nvml_backend_falls_back_to_v1_memory_on_a_driver_without_v2(tmp_path):
    gpu = recorded_h100()
    gpu.memory_v2 = False
    backend = NvmlBackend(tmp_path, "old-driver", nvml=FakeNvml([gpu]))

    (entry,) = backend.inventory()["gpus"]
    assert (entry["memory_total_mib"], entry["memory_reserved_mib"], entry["memory_mib"]) == (81_559, 0, 81_559)
    (reading,) = backend.readings(0.0).gpus
    assert reading.fb_used_mib == 480  # v1 cannot tell the reservation apart
    backend.close()


def test_nvml_backend_switches_whole_and_shared_on_a_default_real_node(tmp_path):
    """Defect 3: the mode a GPU is in, and whole <-> shared (no device setting), were refused 403 with MIG
    changes off, so the capacity loop's switch failed on a default real node. Over HTTP, as the broker asks."""
    fake = recorded_nvml()
    with served(NvmlBackend(tmp_path, "node-a", nvml=fake)) as client:
        assert client.set_gpu_mode(RECORDED_H100, "whole")["mode"] == "whole"
        assert client.set_gpu_mode(RECORDED_H100, "shared")["mode"] == "shared"
        assert client.inventory()["gpus"][0]["mode"] == "shared"
        assert client.set_gpu_mode(RECORDED_H100, "whole")["mode"] == "whole"
        with pytest.raises(AgentHTTPError) as mig:
            client.set_gpu_mode(RECORDED_H100, "mig")  # enabling MIG is a device setting: still refused
        assert (mig.value.status, mig.value.problem["field"]) == (403, "mode")
    assert fake.changes() == []


def test_nvml_metrics_do_not_stall_the_agent_while_nvml_is_slow(tmp_path):
    """Defect 4: ``/metrics`` read NVML on the event loop, so one slow driver call stalled every request."""
    fake = recorded_nvml()
    fake.slow_entered, fake.slow_release = threading.Event(), threading.Event()
    with served(NvmlBackend(tmp_path, "node-a", nvml=fake)) as client:
        scrape: dict[str, str] = {}

        def get_metrics() -> None:
            with urllib.request.urlopen(f"{client.base_url}/metrics", timeout=20) as answer:
                scrape["text"] = answer.read().decode()

        scraper = threading.Thread(target=get_metrics)
        scraper.start()
        try:
            assert fake.slow_entered.wait(10), "the scrape never reached NVML"
            with urllib.request.urlopen(f"{client.base_url}/healthz", timeout=2) as answer:
                assert json.loads(answer.read())["status"] == "ok"  # answered while NVML is still busy
            assert "text" not in scrape
        finally:
            fake.slow_release.set()
            scraper.join(20)
        assert f'UUID="{RECORDED_H100}"' in scrape["text"]
        assert "DCGM_FI_DEV_FB_FREE" in scrape["text"] and "} 81079" in scrape["text"]


# --- topology: NVLink domains ---------------------------------------------------------------------------


def _h100(number: int, **topology) -> FakeGpu:
    return FakeGpu("NVIDIA H100 80GB HBM3", f"GPU-topo-{number}", 81_559, False, **topology)


def test_nvml_backend_nvlink_domains_from_links(tmp_path):
    """GPUs 0-1 joined by a link, 2-3 by another, 4 with its links down: two domains and none, named by the node
    and the lowest index; GPUs 5-6 both on an NVSwitch (a remote bus id no GPU has): one domain of their own."""
    bus = [f"00000000:{0x10 + n:02X}:00.0" for n in range(7)]
    switch = "00000000:F0:00.0"
    gpus = [_h100(0, bus_id=bus[0], nvlinks=[bus[1], ""]), _h100(1, bus_id=bus[1], nvlinks=[bus[0].lower()]),
            _h100(2, bus_id=bus[2], nvlinks=["", bus[3]]), _h100(3, bus_id=bus[3], nvlinks=[bus[2]]),
            _h100(4, bus_id=bus[4], nvlinks=["", ""]), _h100(5, bus_id=bus[5], nvlinks=[switch]),
            _h100(6, bus_id=bus[6], nvlinks=[switch, switch])]
    backend = NvmlBackend(tmp_path, "node-a", nvml=FakeNvml(gpus))
    domains = [gpu["nvlink_domain"] for gpu in backend.inventory()["gpus"]]
    assert domains == ["node-a/nvlink0", "node-a/nvlink0", "node-a/nvlink2", "node-a/nvlink2", "",
                       "node-a/nvlink5", "node-a/nvlink5"]


def test_nvml_backend_nvlink_domain_from_fabric_and_absent(tmp_path):
    """A GPU registered with the fabric is in its clique (the same name on every node of the domain); a driver that
    supports none of the calls (the recorded H100, a PCIe card) answers "" for every GPU, and the agent starts."""
    uuid = bytes(range(1, 17))
    gpus = [_h100(0, fabric=(uuid, 7)), _h100(1, fabric=(uuid, 7))]
    backend = NvmlBackend(tmp_path / "a", "node-a", nvml=FakeNvml(gpus))
    assert {gpu["nvlink_domain"] for gpu in backend.inventory()["gpus"]} == {f"fabric:{uuid.hex()}/7"}
    plain = NvmlBackend(tmp_path / "b", "node-b", nvml=FakeNvml([_h100(0), _h100(1)]))
    assert [gpu["nvlink_domain"] for gpu in plain.inventory()["gpus"]] == ["", ""]
