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
    # a generation stage (an LLM answering): the time to its first token (the prompt's prefill) and the tokens
    # per second each sequence then gets; ``exec_ms`` is the whole answer, prefill + every decode step
    ttft_ms: float | None = None
    tokens_per_s: float | None = None

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


PROMPT_TOKENS = 512
OUTPUT_TOKENS = 128


def generation_profile_for(architecture: str, models: tuple[str, ...], batches: tuple[int, ...] = BATCHES, *,
                           prompt_tokens: int = PROMPT_TOKENS, output_tokens: int = OUTPUT_TOKENS
                           ) -> tuple[Candidate, ...]:
    """A generation stage (a decoder answering ``output_tokens`` after a ``prompt_tokens`` prompt), not one forward
    pass (issue 29): per (slice, batch) the time to first token is the prompt's prefill (one forward over the
    prompt, ``task="inference"``), then one decode step per output token (``task="generation"``, against the
    prompt and half the output on average, as tiering models it); a batch's answer takes prefill + output_tokens
    decode steps. Both must fit. ``tokens_per_s`` is what one sequence gets while decoding."""
    arch = architecture_get(architecture)
    if getattr(arch, "kind", "") != "decoder":
        raise ValueError(f"generation needs a decoder; {arch.name} is {getattr(arch, 'kind', 'a convnet')}")
    found = []
    for model in models:
        for slice_ in slices_for(model):
            for batch in batches:
                prefill = estimate(Workload(arch.name, "inference", PRECISION, batch, prompt_tokens, 224), slice_)
                decode = estimate(Workload(arch.name, "generation", PRECISION, batch,
                                           prompt_tokens + output_tokens // 2, 224), slice_)
                if not (prefill.fits and decode.fits) or decode.step_ms <= 0:
                    continue
                total = prefill.step_ms + output_tokens * decode.step_ms
                found.append(Candidate(slice_, batch, round(total, 4), ttft_ms=round(prefill.step_ms, 4),
                                       tokens_per_s=round(1000.0 / decode.step_ms, 2)))
    return tuple(found)
