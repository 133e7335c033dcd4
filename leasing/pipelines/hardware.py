"""What a GPU (or a slice of one) can do, for the latency models of the two planners.

Peak dense FP16 tensor throughput and memory bandwidth from the vendors' datasheets (SXM parts where a
model has several forms; sparsity figures halved to dense). A MIG slice gets the compute of its slices (of 7)
and the bandwidth of its memory slots (of 8); a time-sliced share gets its milli of both. Standard library and
``gpus`` only.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpus.catalogue import model_get
from gpus.mig import COMPUTE_SLICES, MEMORY_SLOTS, profiles_for

# model code -> (dense FP16 tensor TFLOPS, memory bandwidth GB/s), datasheet figures
PEAKS: dict[str, tuple[float, float]] = {
    "A100-40GB": (312.0, 1555.0),
    "A100-80GB": (312.0, 2039.0),
    "H100-80GB": (989.0, 3350.0),
    "H100-NVL-94GB": (835.0, 3900.0),
    "H200-141GB": (989.0, 4800.0),
    "L4": (121.0, 300.0),
    "T4": (65.0, 320.0),
    "A10": (125.0, 600.0),
    "V100-16GB": (125.0, 900.0),
    "V100-32GB": (125.0, 900.0),
    "P100": (18.7, 732.0),
}
# The share of the peak a well-shaped inference kernel reaches (cuBLAS GEMMs reach 60-80 % of the tensor peak;
# whole networks less); one figure for every model keeps the comparison between slices fair.
COMPUTE_EFFICIENCY = 0.5
BANDWIDTH_EFFICIENCY = 0.8
# per layer launch and per batch dispatch overheads (ms)
LAYER_OVERHEAD_MS = 0.01
DISPATCH_OVERHEAD_MS = 0.3
# links between GPUs (GB/s, and a fixed latency per transfer in ms)
NVLINK_GBPS = 300.0
PCIE_GBPS = 25.0
NETWORK_GBPS = 12.5  # 100 Gb/s Ethernet / InfiniBand EDR
NETWORK_LATENCY_MS = 0.05
INTRA_LATENCY_MS = 0.01


class UnknownHardware(KeyError):
    pass


@dataclass(frozen=True, slots=True)
class Slice:
    """A unit a stage can run on: a whole GPU, a MIG profile or a time-sliced share of a model."""

    model: str
    kind: str  # "whole" | "mig" | "share"
    profile: str = ""  # MIG profile name
    milli: int = 1000  # GPU units counted by quotas and prices (a 3g slice: 428)
    memory_mib: int = 0
    compute_fraction: float = 1.0
    bandwidth_fraction: float = 1.0

    @property
    def key(self) -> str:
        if self.kind == "mig":
            return f"{self.model}/mig/{self.profile}"
        if self.kind == "share":
            return f"{self.model}/share/{self.milli}"
        return f"{self.model}/whole"

    @property
    def tflops(self) -> float:
        return peaks(self.model)[0] * self.compute_fraction

    @property
    def bandwidth_gbps(self) -> float:
        return peaks(self.model)[1] * self.bandwidth_fraction


def peaks(model: str) -> tuple[float, float]:
    code = model_get(model).code
    if code not in PEAKS:
        raise UnknownHardware(f"no throughput figures for {code}; known: {', '.join(sorted(PEAKS))}")
    return PEAKS[code]


def whole(model: str) -> Slice:
    code = model_get(model).code
    return Slice(code, "whole", milli=1000, memory_mib=model_get(code).memory_mib)


def mig(model: str, profile: str) -> Slice:
    code = model_get(model).code
    for candidate in profiles_for(code):
        if candidate.name == profile:
            return Slice(code, "mig", profile, candidate.gpu_milli, candidate.memory_mib,
                         candidate.compute_slices / COMPUTE_SLICES, candidate.memory_slots / MEMORY_SLOTS)
    raise UnknownHardware(f"profile {profile!r} is not offered on {code}")


def share(model: str, milli: int) -> Slice:
    code = model_get(model).code
    if not 1 <= milli <= 1000:
        raise UnknownHardware(f"a share is 1..1000 milli, not {milli}")
    memory = model_get(code).memory_mib * milli // 1000
    return Slice(code, "share", milli=milli, memory_mib=memory, compute_fraction=milli / 1000,
                 bandwidth_fraction=milli / 1000)


def slices_for(model: str, shares: tuple[int, ...] = (250, 500)) -> tuple[Slice, ...]:
    """Every slice a stage may take on ``model``: MIG profiles (no media-extension or 1g.2s variants: same
    compute as their plain kin), else the shares listed; and the whole GPU."""
    code = model_get(model).code
    found = [mig(code, p.name) for p in profiles_for(code)
             if not p.shape.media_extensions and p.shape.key != "1g.2s" and p.compute_slices < COMPUTE_SLICES]
    if not found:
        found = [share(code, milli) for milli in shares]
    found.append(whole(code))
    return tuple(found)


def roofline_ms(flops: float, bytes_moved: float, tflops: float, bandwidth_gbps: float) -> float:
    """Time of one kernel that does ``flops`` and moves ``bytes_moved``: the slower of compute and memory."""
    compute = flops / (tflops * 1e12 * COMPUTE_EFFICIENCY)
    memory = bytes_moved / (bandwidth_gbps * 1e9 * BANDWIDTH_EFFICIENCY)
    return max(compute, memory) * 1000.0
