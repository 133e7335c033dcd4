"""The choice: the cheapest slice at the tenant's prices predicted to fit the workload's memory with headroom
and to meet its target, with the confidence of that prediction. When nothing is confident enough the
answer says so (``profile_first``): the broker then profiles before it places."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpus.performance import Slice, Workload

from .rules import MEMORY_HEADROOM, TARGET_MARGIN, fits


@dataclass(frozen=True, slots=True)
class Option:
    """A slice the tenant may get, its price per hour, what is predicted of it, and how sure."""

    slice: Slice
    price: float
    throughput: float
    memory_mib: int
    confidence: float
    # what the figure rests on: "measured", "scaled from <slice> measurement", "predicted (±X %)"; "" in the
    # benchmark, where every figure is the forest's
    basis: str = ""

    @property
    def confidence_text(self) -> str:
        """``confidence 97 %``, with what the figure rests on when known."""
        return f"confidence {self.confidence:.0%}" + (f", {self.basis}" if self.basis else "")


# Exploring: when the cheapest confident slice costs more than EXPLORE_PRICE × its price and a cheaper slice is
# plausible (confidence ≥ EXPLORE_CONFIDENCE, below the threshold), the cheaper ones are profiled first rather
# than paying for the margin for good; chosen on the calibration folds of the training architectures
# (docs/tiering.md §3).
EXPLORE_CONFIDENCE = 0.1
EXPLORE_PRICE = 0.8
MEASURED_SIGMAS = 1.0  # what a profiled measurement must clear the target by, in σ of the measurement noise


@dataclass(frozen=True, slots=True)
class Decision:
    option: Option | None  # with profile_first: the likeliest slice, or the confident one exploring would beat
    required: float
    profile_first: bool
    reason: str
    candidates: tuple[Slice, ...] = ()  # what to profile first (cheapest first), when exploring
    options: tuple[Option, ...] = ()  # every slice weighed, with its figure and what it rests on (the service's)


def measured_meets(throughput: float, required: float, noise: float) -> bool:
    """A measurement meets the target when it does with ``MEASURED_SIGMAS`` σ of run-to-run noise to spare (one run of a
    profiling lease is noisy; the target is the workload's true speed)."""
    return throughput >= required * math.exp(MEASURED_SIGMAS * noise)


def required_throughput(workload: Workload, target_throughput: float | None,
                        target_latency_ms: float | None) -> float:
    """The throughput the target needs: the throughput itself, or a step of ``batch_size`` samples (one
    token per sequence for generation) within the latency."""
    needed = target_throughput or 0.0
    if target_latency_ms:
        needed = max(needed, workload.batch_size * 1000.0 / target_latency_ms)
    return needed


def choose(options: list[Option], required: float, *, min_confidence: float = 0.8,
           headroom: float = MEMORY_HEADROOM, explore: float | None = None,
           explore_price: float | None = None) -> Decision:
    """The cheapest option that fits with ``headroom`` and whose confidence reaches ``min_confidence``. With
    ``explore``: profile first when fitting options at most ``explore_price`` × its price have a confidence
    between ``explore`` and ``min_confidence`` (``candidates``, cheapest first; ``option`` stays the confident
    choice, what to place on when none of them measures up)."""
    fitting = [o for o in options if fits(o.memory_mib, o.slice, headroom)]
    explore_price = EXPLORE_PRICE if explore_price is None else explore_price
    good = sorted((o for o in fitting if o.confidence >= min_confidence),
                  key=lambda o: (o.price, -o.confidence, o.slice.key))
    if good:
        best = good[0]
        plausible = sorted((o for o in fitting if explore is not None and explore <= o.confidence < min_confidence
                            and o.price <= explore_price * best.price), key=lambda o: (o.price, o.slice.key))
        if plausible:
            return Decision(best, required, True,
                            f"{best.slice.label} is predicted to meet {required:,.0f}/s ("
                            f"{best.confidence_text}) but cheaper slices might: "
                            f"{', '.join(o.slice.label for o in plausible[:3])}: profile first",
                            tuple(o.slice for o in plausible))
        return Decision(best, required, False,
                        f"predicted {best.throughput:,.0f}/s ≥ {required:,.0f}/s needed on {best.slice.label} "
                        f"({best.confidence_text}), {best.memory_mib} MiB of {best.slice.memory_mib}")
    if not fitting:
        return Decision(None, required, True, "no slice is predicted to hold the workload's memory")
    likeliest = max(fitting, key=lambda o: (o.confidence, o.throughput))
    return Decision(likeliest, required, True,
                    f"no slice reaches confidence {min_confidence:.0%} for {required:,.0f}/s; the likeliest is "
                    f"{likeliest.slice.label} ({likeliest.confidence_text}): profile first")


def rule_options(predicted: list[tuple[Slice, float, float, int]], required: float,
                 margin: float = TARGET_MARGIN) -> list[Option]:
    """Rules give no spread: confidence 1 when the prediction meets the target with ``margin``, else 0."""
    return [Option(s, price, t, m, 1.0 if t >= required * (1 + margin) else 0.0) for s, price, t, m in predicted]
