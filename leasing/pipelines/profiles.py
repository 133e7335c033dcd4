"""Latency profiles: how long one batch of a model takes on a slice, and whether it fits.

A profile is a table ``(slice, batch) -> milliseconds``. Where a tenant gives measured figures they are used as
given; otherwise ``profile_for`` computes them from the architecture's layer table with a roofline per layer
(``hardware.roofline_ms``): each layer takes the longer of its FLOPs at the slice's compute and its weights plus
activations at the slice's bandwidth, plus a launch overhead; a batch adds one dispatch overhead.
"""

from __future__ import annotations

from dataclasses import dataclass

from leasing.pipelines.architectures import BYTES_FP16, Architecture
from leasing.pipelines.hardware import (
    DISPATCH_OVERHEAD_MS,
    LAYER_OVERHEAD_MS,
    Slice,
    roofline_ms,
    slices_for,
)

BATCHES = (1, 2, 4, 8, 16, 32)
CONTEXT_MIB = 512  # CUDA context and allocator slack held by any process on a GPU


@dataclass(frozen=True, slots=True)
class Candidate:
    """One way to run a stage: a slice and a batch size, with the time one batch takes there."""

    slice: Slice
    batch: int
    exec_ms: float

    @property
    def tier(self) -> str:
        return self.slice.model


def memory_mib(arch: Architecture, batch: int) -> int:
    """Weights, the largest layer's input and output for a batch, and the context."""
    largest = max((layer.in_bytes or 0) + layer.out_bytes for layer in arch.layers)
    return (arch.weight_bytes + batch * largest) // (1024 * 1024) + CONTEXT_MIB


def batch_ms(arch: Architecture, slice_: Slice, batch: int) -> float:
    total = DISPATCH_OVERHEAD_MS
    previous_out = 0
    for layer in arch.layers:
        moved = layer.params * BYTES_FP16 + batch * ((layer.in_bytes or previous_out) + layer.out_bytes)
        total += LAYER_OVERHEAD_MS + roofline_ms(layer.flops * batch, moved, slice_.tflops, slice_.bandwidth_gbps)
        previous_out = layer.out_bytes
    return total


def profile_for(arch: Architecture, models: tuple[str, ...],
                batches: tuple[int, ...] = BATCHES) -> tuple[Candidate, ...]:
    """Every (slice, batch) of ``models`` the architecture fits in, with its computed batch latency."""
    found = []
    for model in models:
        for slice_ in slices_for(model):
            for batch in batches:
                if memory_mib(arch, batch) <= slice_.memory_mib:
                    found.append(Candidate(slice_, batch, round(batch_ms(arch, slice_, batch), 4)))
    return tuple(found)
