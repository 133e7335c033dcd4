"""What the predictors see of a (workload, slice) pair: the workload's static description, the slice's
hardware figures, and what was *observed* of the workload on a reference slice (throughput, peak memory,
engine activity). Predictions are ratios to the reference observation, so an architecture never seen in
training is placed by its physics (FLOPs, intensity, precision) and its own measured speed."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpus.architectures import FAMILIES, architecture_get
from gpus.performance import BYTES, TASKS, Slice, Workload, peak_tflops, spec_get, work_of

KINDS = ("whole", "mig", "share")


@dataclass(frozen=True, slots=True)
class Observation:
    """A workload measured on one slice: what a profiling lease or a running lease's telemetry gives."""

    slice: Slice
    throughput: float
    memory_mib: int
    engine_active: float


def compute_of(workload: Workload, where: Slice) -> float:
    """Peak TFLOPS the slice offers at the workload's precision."""
    return peak_tflops(spec_get(where.model), workload.precision) * where.compute_fraction


def bandwidth_of(where: Slice) -> float:
    return spec_get(where.model).bandwidth_gbs * where.bandwidth_fraction


NAMES = (
    *(f"family_{f}" for f in FAMILIES), *(f"task_{t}" for t in TASKS), "log_params", "log_flops_per_sample",
    "log_intensity", "precision_bytes", "log_batch", "log_tokens", *(f"kind_{k}" for k in KINDS),
    "log_compute_ratio", "log_bandwidth_ratio", "log_ridge", "memory_headroom", "ref_engine_active",
    "log_ref_throughput", "log_prior_ratio", "log_ref_ridge",
)


def roofline_seconds(workload: Workload, at: Slice, compute_efficiency: float = 1.0,
                     memory_efficiency: float = 1.0) -> float:
    """The roofline's busy time of one step on ``at``: datasheet peaks × the given efficiencies."""
    work = work_of(workload, spec_get(at.model))
    return max(work.flops / (compute_of(workload, at) * 1e12 * compute_efficiency),
               work.bytes_moved / (bandwidth_of(at) * 1e9 * memory_efficiency))


def prior_throughput(workload: Workload, where: Slice, reference: Observation, compute_efficiency: float = 1.0,
                     memory_efficiency: float = 1.0) -> float:
    """What ``where`` should give, from the reference measurement: its step splits into busy time (engine
    active) and idle time (launch gaps, the framework's host work); busy time scales by the roofline's ratio
    between the two slices, idle time stays. The prior the forest corrects; also the "roofline" rule."""
    samples = work_of(workload).samples
    step = samples / reference.throughput
    busy = reference.engine_active * step
    ratio = (roofline_seconds(workload, where, compute_efficiency, memory_efficiency)
             / roofline_seconds(workload, reference.slice, compute_efficiency, memory_efficiency))
    return samples / (step - busy + busy * ratio)


def prior_memory(workload: Workload, where: Slice, reference: Observation) -> float:
    """The reference's peak memory, scaled where the slice runs another precision (FP8 without FP8 cores)."""
    return reference.memory_mib * (work_of(workload, spec_get(where.model)).memory_bytes
                                   / work_of(workload, spec_get(reference.slice.model)).memory_bytes)


def features(workload: Workload, where: Slice, reference: Observation) -> list[float]:
    arch = architecture_get(workload.architecture)
    work = work_of(workload)
    compute, bandwidth = compute_of(workload, where), bandwidth_of(where)
    ridge = compute * 1e12 / (bandwidth * 1e9)  # FLOP/byte where the slice turns compute-bound
    return [
        *(1.0 if arch.kind == f else 0.0 for f in FAMILIES),
        *(1.0 if workload.task == t else 0.0 for t in TASKS),
        math.log10(arch.params), math.log10(work.flops / work.samples), math.log10(work.intensity),
        float(BYTES[workload.precision]), math.log2(workload.batch_size), math.log2(max(1, workload.seq_len)),
        *(1.0 if where.kind == k else 0.0 for k in KINDS),
        math.log(compute / compute_of(workload, reference.slice)),
        math.log(bandwidth / bandwidth_of(reference.slice)),
        math.log10(work.intensity / ridge),
        where.memory_mib / max(1, reference.memory_mib),
        reference.engine_active,
        math.log10(max(reference.throughput, 1e-9)),
        math.log(prior_throughput(workload, where, reference) / reference.throughput),
        math.log10(work.intensity / (compute_of(workload, reference.slice) * 1e12
                                     / (bandwidth_of(reference.slice) * 1e9))),
    ]
