"""Latency profiles: how long one batch of a stage's model takes on a slice, and whether it fits.

A profile is a table ``(slice, batch) -> milliseconds``. Where a tenant gives measured figures they are used as
given; otherwise ``profile_for`` asks the performance model auto-tiering uses (``gpus.performance.estimate``: the
roofline over the catalogue's datasheet peaks, calibrated against MLPerf Inference results) for each slice of
each GPU model (``gpus.performance.slices_for``: the whole GPU, its MIG profiles, time-sliced shares) and batch
size, inference in FP16. One catalogue of architectures and one performance model serve tiering and the
planners alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpus.architectures import architecture_get
from gpus.performance import Slice, Workload, estimate, slices_for

BATCHES = (1, 2, 4, 8, 16, 32)
PRECISION = "fp16"


@dataclass(frozen=True, slots=True)
class Candidate:
    """One way to run a stage: a slice and a batch size, with the time one batch takes there."""

    slice: Slice
    batch: int
    exec_ms: float

    @property
    def tier(self) -> str:
        return self.slice.model


def profile_for(architecture: str, models: tuple[str, ...], batches: tuple[int, ...] = BATCHES, *,
                seq_len: int = 512, image_size: int = 224) -> tuple[Candidate, ...]:
    """Every (slice, batch) of ``models`` the architecture fits in, with the performance model's step time.
    ``architecture`` is a name of ``gpus.architectures`` (``KeyError`` otherwise)."""
    name = architecture_get(architecture).name
    workloads = [Workload(name, "inference", PRECISION, batch, seq_len, image_size) for batch in batches]
    found = []
    for model in models:
        for slice_ in slices_for(model):
            for workload in workloads:
                guess = estimate(workload, slice_)
                if guess.fits:
                    found.append(Candidate(slice_, workload.batch_size, round(guess.step_ms, 4)))
    return tuple(found)
