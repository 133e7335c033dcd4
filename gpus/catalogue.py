"""GPU models the broker knows: memory, MIG capability and the tier a quota or price refers to.

One catalogue: every model here has its MIG rows (``gpus.mig``, exactly when ``mig_capable``), its performance
row (``gpus.performance.SPECS``) and its NVML device name (``vendor_name``), unless it is ``trace_only``;
``tests/gpus/test_catalogue.py`` fails naming the model and the table that lacks it.

A *tier* is the model code (``H100-80GB``): quotas and prices are per tier, and MIG slices and shares
count toward the tier of the GPU they are carved from. This module is pure data and standard library;
the scheduling core and the agent both import it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuModel:
    """One GPU model. ``memory_mib`` is the usable framebuffer the driver reports."""

    code: str
    vendor_name: str
    memory_mib: int
    mig_capable: bool
    nvlink: bool
    aliases: tuple[str, ...] = ()
    # board power: the limit and a typical idle draw, in watts (the simulated agent's power model)
    max_power_w: int = 300
    idle_power_w: int = 40
    # a code of a replayed trace whose hardware the trace does not name: memory only, no performance row and
    # no device name an agent could report (tests/gpus/test_catalogue.py holds every other model to all rows)
    trace_only: bool = False


MODELS: tuple[GpuModel, ...] = (
    GpuModel("A100-40GB", "NVIDIA A100-SXM4-40GB", 40_960, True, True, max_power_w=400, idle_power_w=50),
    GpuModel("A100-80GB", "NVIDIA A100-SXM4-80GB", 81_920, True, True, max_power_w=400, idle_power_w=60),
    GpuModel("H100-80GB", "NVIDIA H100 80GB HBM3", 81_559, True, True, max_power_w=700, idle_power_w=70),
    GpuModel("H100-NVL-94GB", "NVIDIA H100 NVL", 95_830, True, True, max_power_w=400, idle_power_w=60),
    GpuModel("H200-141GB", "NVIDIA H200", 143_771, True, True, max_power_w=700, idle_power_w=75),
    GpuModel("L4", "NVIDIA L4", 23_034, False, False, max_power_w=72, idle_power_w=16),
    GpuModel("T4", "Tesla T4", 15_360, False, False, max_power_w=70, idle_power_w=10),
    GpuModel("V100-16GB", "Tesla V100-SXM2-16GB", 16_384, False, True, aliases=("V100M16",)),
    GpuModel("V100-32GB", "Tesla V100-SXM2-32GB", 32_768, False, True, aliases=("V100M32",)),
    GpuModel("A10", "NVIDIA A10", 23_028, False, False, max_power_w=150, idle_power_w=20),
    GpuModel("P100", "Tesla P100-PCIE-16GB", 16_384, False, False, max_power_w=250, idle_power_w=30),
    # Model codes of the Alibaba openb trace whose hardware the trace does not name.
    GpuModel("G2", "openb G2", 16_384, False, False, trace_only=True),
    GpuModel("G3", "openb G3", 32_768, False, False, trace_only=True),
)

_BY_CODE: dict[str, GpuModel] = {}
for _model in MODELS:
    for _name in (_model.code, *_model.aliases):
        _BY_CODE[_name.upper()] = _model

TIER_CODES: tuple[str, ...] = tuple(model.code for model in MODELS)


class UnknownModel(KeyError):
    pass


def model_get(code: str) -> GpuModel:
    """The model with this code or alias (case-insensitive); ``UnknownModel`` names the valid codes."""
    try:
        return _BY_CODE[code.upper()]
    except KeyError:
        raise UnknownModel(f"unknown GPU model {code!r}; known: {', '.join(TIER_CODES)}") from None
