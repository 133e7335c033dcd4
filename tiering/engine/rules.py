"""Rules only: the workload's memory measured on the reference slice must fit the candidate with headroom,
and its reference throughput scaled by the ratio of peak compute must meet the target with a margin. The
classic rule of thumb; it knows nothing of memory bandwidth, so it is wrong where a workload is memory-bound."""

from __future__ import annotations

from gpus.performance import Slice, Workload

from .features import Observation, compute_of

MEMORY_HEADROOM = 0.10
TARGET_MARGIN = 0.10


def predict(workload: Workload, where: Slice, reference: Observation) -> tuple[float, int]:
    """(throughput, peak memory MiB) the rules expect on ``where``."""
    ratio = compute_of(workload, where) / compute_of(workload, reference.slice)
    return reference.throughput * ratio, reference.memory_mib


def fits(memory_mib: float, where: Slice, headroom: float = MEMORY_HEADROOM) -> bool:
    return memory_mib * (1 + headroom) <= where.memory_mib
