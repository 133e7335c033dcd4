"""A stand-in for ``pynvml`` (nvidia-ml-py) in child processes of the hardware-check test: one H100 80GB HBM3 with
MIG disabled, as NVML answers for it, read from the JSON file named by ``$FAKE_GPU_STATE`` (which the test and
``fake_gpu/nvidia-smi`` share). Put this directory first on ``PYTHONPATH`` to use it.

There is no GPU on the test machine; this fake answers the read-only calls the nvml backend and ``agent.hwcheck``
make on a GPU in whole mode (identity, memory, MIG mode, power, energy, utilisation, compute processes, versions)
and raises ``NVMLError_NotSupported`` for any other device call, as NVML does for what a device does not offer.
The figures are an idle H100's as a real one reported them (docs: issue 28): 81,559 MiB total, 480 MiB
reserved by the driver, about 70 W at idle.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_IN_USE = 19
NVML_ERROR_RESET_REQUIRED = 16
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_GPU_INSTANCE_PROFILE_COUNT = 0
nvmlMemory_v2 = 0x02000028


class NVMLError(Exception):
    def __init__(self, value: int = 999):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {NVML_ERROR_NOT_SUPPORTED: "Not Supported"}.get(self.value, f"NVML error {self.value}")


class NVMLError_NotSupported(NVMLError):
    def __init__(self, value: int = NVML_ERROR_NOT_SUPPORTED):
        super().__init__(value)


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_DriverNotLoaded(NVMLError):
    pass


class NVMLError_NoPermission(NVMLError):
    pass


class NVMLError_InUse(NVMLError):
    pass


class NVMLError_InvalidArgument(NVMLError):
    pass


class NVMLError_NotFound(NVMLError):
    pass


MIB = 2**20


def _state() -> dict:
    with open(os.environ["FAKE_GPU_STATE"]) as handle:
        return json.load(handle)


def _gpu(handle) -> dict:
    return _state()["gpus"][handle.index]


def nvmlInit():
    _state()


def nvmlShutdown():
    pass


def nvmlSystemGetDriverVersion():
    return _state()["driver"]


def nvmlSystemGetNVMLVersion():
    return "12." + _state()["driver"]


def nvmlDeviceGetCount():
    return len(_state()["gpus"])


def nvmlDeviceGetHandleByIndex(index):
    if not 0 <= index < nvmlDeviceGetCount():
        raise NVMLError_InvalidArgument(2)
    return SimpleNamespace(index=index)


def nvmlDeviceGetHandleByUUID(uuid):
    for index, gpu in enumerate(_state()["gpus"]):
        if gpu["uuid"] == uuid:
            return SimpleNamespace(index=index)
    raise NVMLError_NotFound(6)


def nvmlDeviceGetName(handle):
    return _gpu(handle)["name"]


def nvmlDeviceGetUUID(handle):
    return _gpu(handle)["uuid"]


def nvmlDeviceGetMemoryInfo(handle, version=None):
    gpu = _gpu(handle)
    total, reserved, used = gpu["memory_total_mib"], gpu["memory_reserved_mib"], gpu["memory_used_mib"]
    if version == nvmlMemory_v2:  # used without the driver's reservation, as the v2 call reports it
        return SimpleNamespace(version=version, total=total * MIB, reserved=reserved * MIB, used=used * MIB,
                               free=(total - reserved - used) * MIB)
    return SimpleNamespace(total=total * MIB, used=(reserved + used) * MIB, free=(total - reserved - used) * MIB)


def nvmlDeviceGetMigMode(handle):
    return [_gpu(handle)["mig"], _gpu(handle)["mig"]]


def nvmlDeviceGetPowerUsage(handle):
    return int(_gpu(handle)["power_w"] * 1000)


def nvmlDeviceGetTotalEnergyConsumption(handle):
    return int(_gpu(handle)["energy_mj"])


def nvmlDeviceGetUtilizationRates(handle):
    return SimpleNamespace(gpu=_gpu(handle)["util_pct"], memory=0)


def nvmlDeviceGetComputeRunningProcesses(handle):
    return [SimpleNamespace(pid=pid, usedGpuMemory=0) for pid in _gpu(handle)["compute_pids"]]


def __getattr__(name: str):
    if name.startswith("nvmlDevice") or name.startswith("nvmlGpuInstance"):
        def not_supported(*_args, **_kwargs):
            raise NVMLError_NotSupported()

        return not_supported
    raise AttributeError(name)
