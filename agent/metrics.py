"""``/metrics``: Prometheus text format with dcgm-exporter's metric names and labels.

Which series exist, so that sums never double-count:

- ``DCGM_FI_DEV_POWER_USAGE`` (W) and ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ, counter): one series
  per physical GPU, never per MIG instance or share (no ``GPU_I_ID``, ``allocation_id`` empty).
- ``DCGM_FI_DEV_GPU_UTIL`` (%): whole and shared GPUs (not reported on MIG-mode GPUs, as on real ones).
- ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (ratio): one series per consumer — a whole GPU, a MIG instance
  (``GPU_I_ID``, ``GPU_I_PROFILE``) or a share — relative to that consumer's own capacity.
- ``DCGM_FI_DEV_FB_USED`` / ``DCGM_FI_DEV_FB_FREE`` (MiB): per consumer as well — a whole GPU, or each
  MIG instance / share within its own memory; MIG and shared GPUs have no GPU-level memory series, so
  summing per GPU counts each MiB once.

Every series has ``gpu``, ``UUID`` (the parent GPU), ``device``, ``modelName``, ``Hostname``,
``GPU_I_ID``, ``GPU_I_PROFILE`` and ``allocation_id`` (empty where none).
"""

from __future__ import annotations

from agent.backend import Readings

FAMILIES = (
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(readings: Readings, hostname: str, *, extra: list[str] | None = None) -> str:
    series: dict[str, list[str]] = {name: [] for name, _, _ in FAMILIES}
    host = _escape(hostname)

    def labels(index: int, uuid: str, model: str, gi_id, profile: str, allocation: str) -> str:
        return (f'gpu="{index}",UUID="{_escape(uuid)}",device="nvidia{index}",modelName="{_escape(model)}",'
                f'Hostname="{host}",GPU_I_ID="{"" if gi_id is None else gi_id}",GPU_I_PROFILE="{_escape(profile)}",'
                f'allocation_id="{_escape(allocation)}"')

    for gpu in readings.gpus:
        common = labels(gpu.index, gpu.uuid, gpu.model, None, "", "")
        series["DCGM_FI_DEV_POWER_USAGE"].append(f"{{{common}}} {gpu.power_w}")
        series["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].append(f"{{{common}}} {gpu.energy_mj}")
        if gpu.util_pct is None:
            continue  # MIG mode: per-instance series only
        own = labels(gpu.index, gpu.uuid, gpu.model, None, "", gpu.allocation_id)
        series["DCGM_FI_DEV_GPU_UTIL"].append(f"{{{own}}} {gpu.util_pct}")
        if gpu.fb_used_mib is not None:  # a whole GPU (held or idle) is its own consumer
            series["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].append(f"{{{own}}} {round(gpu.util_pct / 100, 4)}")
            series["DCGM_FI_DEV_FB_USED"].append(f"{{{own}}} {gpu.fb_used_mib}")
            series["DCGM_FI_DEV_FB_FREE"].append(f"{{{own}}} {gpu.fb_free_mib}")
    for item in readings.instances:
        own = labels(item.gpu_index, item.gpu_uuid, item.model, item.gpu_instance_id, item.profile,
                     item.allocation_id)
        series["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].append(f"{{{own}}} {item.engine_active}")
        series["DCGM_FI_DEV_FB_USED"].append(f"{{{own}}} {item.fb_used_mib}")
        series["DCGM_FI_DEV_FB_FREE"].append(f"{{{own}}} {item.fb_free_mib}")
    lines: list[str] = []
    for name, kind, text in FAMILIES:
        if not series[name]:
            continue
        lines.append(f"# HELP {name} {text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(name + row for row in series[name])
    lines.extend(extra or [])
    return "\n".join(lines) + "\n"
