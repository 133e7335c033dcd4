"""The performance model: a roofline over the catalogue's figures and a workload's arithmetic intensity.

For a workload (an architecture from ``gpus.architectures``, a task, a precision, a batch and a sequence or
image size) on a *slice* (a whole GPU, a MIG profile or a time-sliced share) it estimates, per step:

- FLOPs and bytes moved to and from device memory, so the arithmetic intensity (FLOP per byte);
- the step time ``max(FLOPs / compute, bytes / bandwidth) + launch overhead``, where compute is the peak of
  the precision × the slice's compute fraction × an efficiency, and bandwidth likewise;
- throughput (samples/s; tokens/s for generation), step latency, peak framebuffer, and the engine activity
  a DCGM exporter would show.

The efficiency is *calibrated* against published per-GPU MLPerf Inference results (``CALIBRATION``): the
compute efficiency is the geometric mean of measured ÷ modelled-at-peak, and ``calibration()`` reports the
error of the model at that efficiency on each point, in sample and leave-one-out (docs/tiering.md §2).

Peak figures are NVIDIA's datasheets, dense (no 2:4 sparsity). Standard library only: the simulated agent
and the broker both import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from gpus.architectures import ConvNet, Transformer, architecture_get
from gpus.catalogue import model_get
from gpus.mig import MEMORY_SLOTS, profiles_for

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")
TASKS = ("training", "inference", "generation")
BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True, slots=True)
class ComputeSpec:
    """Dense peak throughput (TFLOPS / TOPS) per precision class and memory bandwidth (GB/s)."""

    code: str
    fp32: float
    tf32: float | None  # TF32 tensor cores (Ampere and later)
    fp16: float  # FP16/BF16 tensor cores
    fp8: float | None  # FP8 tensor cores (Hopper, Ada)
    int8: float | None  # INT8 tensor cores
    bandwidth_gbs: float
    bf16: bool = True  # BF16 supported (Volta and Turing have FP16 only)


SPECS: dict[str, ComputeSpec] = {s.code: s for s in (
    # A100 SXM4 datasheet: 19.5 FP32, 156 TF32, 312 BF16, 624 INT8; 1,555 GB/s (40GB), 2,039 GB/s (80GB)
    ComputeSpec("A100-40GB", 19.5, 156.0, 312.0, None, 624.0, 1555.0),
    ComputeSpec("A100-80GB", 19.5, 156.0, 312.0, None, 624.0, 2039.0),
    # H100 SXM5 datasheet: 67 FP32, 494.7 TF32, 989.4 BF16, 1,978.9 FP8/INT8; 3.35 TB/s
    ComputeSpec("H100-80GB", 67.0, 494.7, 989.4, 1978.9, 1978.9, 3350.0),
    # H100 NVL (per GPU): 60 FP32, 417.5 TF32, 835.5 BF16, 1,670.5 FP8/INT8; 3.9 TB/s
    ComputeSpec("H100-NVL-94GB", 60.0, 417.5, 835.5, 1670.5, 1670.5, 3900.0),
    # H200: the H100 SXM's compute with 4.8 TB/s
    ComputeSpec("H200-141GB", 67.0, 494.7, 989.4, 1978.9, 1978.9, 4800.0),
    # L4: 30.3 FP32, 60 TF32, 121 BF16, 242.5 FP8/INT8; 300 GB/s
    ComputeSpec("L4", 30.3, 60.0, 121.0, 242.5, 242.5, 300.0),
    # A10: 31.2 FP32, 62.5 TF32, 125 BF16, 250 INT8; 600 GB/s
    ComputeSpec("A10", 31.2, 62.5, 125.0, None, 250.0, 600.0),
    # T4: 8.1 FP32, 65 FP16, 130 INT8; 320 GB/s
    ComputeSpec("T4", 8.1, None, 65.0, None, 130.0, 320.0, bf16=False),
    # V100 SXM2: 15.7 FP32, 125 FP16 tensor; 900 GB/s
    ComputeSpec("V100-16GB", 15.7, None, 125.0, None, None, 900.0, bf16=False),
    ComputeSpec("V100-32GB", 15.7, None, 125.0, None, None, 900.0, bf16=False),
    # P100 PCIe: 9.3 FP32, 18.7 FP16; 732 GB/s
    ComputeSpec("P100", 9.3, None, 18.7, None, None, 732.0, bf16=False),
)}

# Calibrated (see ``calibration()``): the share of the datasheet peak that tuned kernels reach on a whole
# GPU, and of the nameplate bandwidth that streaming kernels reach.
COMPUTE_EFFICIENCY = 0.525
MEMORY_EFFICIENCY = 0.80
KERNEL_LAUNCH_SECONDS = 4e-6  # per kernel (CUDA graphs / TensorRT engines)
CONTEXT_MIB = 512  # CUDA context and library workspaces
HOST_SECONDS_PER_STEP = 2e-4  # the framework's own work per step (engine idle meanwhile)
# ``None`` keeps the calibrated figure; ``calibration()`` passes trial values.
_UNSET = None


def spec_get(code: str) -> ComputeSpec:
    model = model_get(code)
    try:
        return SPECS[model.code]
    except KeyError:
        raise KeyError(f"no compute figures for {model.code}; known: {', '.join(SPECS)}") from None


def effective_precision(spec: ComputeSpec, precision: str) -> str:
    """The precision the GPU really runs: FP8 without FP8 cores runs as BF16/FP16, INT8 without INT8 cores
    as FP16, TF32 without TF32 as FP32, BF16 without BF16 as FP16."""
    if precision == "fp8" and spec.fp8 is None:
        return "bf16" if spec.bf16 else "fp16"
    if precision == "int8" and spec.int8 is None:
        return "fp16"
    if precision == "tf32" and spec.tf32 is None:
        return "fp32"
    if precision == "bf16" and not spec.bf16:
        return "fp16"
    return precision


def peak_tflops(spec: ComputeSpec, precision: str) -> float:
    precision = effective_precision(spec, precision)
    return {"fp32": spec.fp32, "tf32": spec.tf32, "bf16": spec.fp16, "fp16": spec.fp16, "fp8": spec.fp8,
            "int8": spec.int8}[precision]


# -- slices -----------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Slice:
    """What a lease gets: a whole GPU, a MIG profile or a share (``milli`` of the GPU's time)."""

    model: str
    kind: str  # "whole", "mig", "share"
    profile: str = ""
    milli: int = 1000
    memory_mib: int = 0
    compute_fraction: float = 1.0
    bandwidth_fraction: float = 1.0

    @property
    def label(self) -> str:
        if self.kind == "mig":
            return f"{self.model} {self.profile}"
        if self.kind == "share":
            return f"{self.model} share {self.milli}m"
        return self.model

    @property
    def key(self) -> str:
        """A stable name: ``H100-80GB``, ``H100-80GB/mig/3g.40gb``, ``L4/share/500``."""
        if self.kind == "mig":
            return f"{self.model}/mig/{self.profile}"
        if self.kind == "share":
            return f"{self.model}/share/{self.milli}"
        return self.model


def whole(model: str) -> Slice:
    gpu = model_get(model)
    return Slice(gpu.code, "whole", memory_mib=gpu.memory_mib)


def mig(model: str, profile_name: str) -> Slice:
    gpu = model_get(model)
    for profile in profiles_for(gpu.code):
        if profile.name == profile_name:
            return Slice(gpu.code, "mig", profile.name, profile.gpu_milli, profile.memory_mib,
                         profile.compute_slices / 7, profile.shape.memory_slots / MEMORY_SLOTS)
    raise KeyError(f"{gpu.code} has no MIG profile {profile_name!r}")


def share(model: str, milli: int) -> Slice:
    """A time-sliced share: its part of the GPU's time (so of compute and bandwidth) and as much memory."""
    gpu = model_get(model)
    if not 1 <= milli <= 1000:
        raise ValueError("milli must be 1..1000")
    return Slice(gpu.code, "share", "", milli, gpu.memory_mib * milli // 1000, milli / 1000, milli / 1000)


def slice_from_key(key: str) -> Slice:
    parts = key.split("/")
    if len(parts) == 1:
        return whole(parts[0])
    if len(parts) == 3 and parts[1] == "mig":
        return mig(parts[0], parts[2])
    if len(parts) == 3 and parts[1] == "share" and parts[2].isascii() and parts[2].isdigit():
        return share(parts[0], int(parts[2]))
    raise KeyError(f"not a slice: {key!r} (MODEL, MODEL/mig/PROFILE or MODEL/share/MILLI)")


def slices_for(model: str, *, shares: tuple[int, ...] = (250, 500)) -> list[Slice]:
    """The whole GPU, its MIG profiles without media extensions, and a few shares."""
    gpu = model_get(model)
    out = [whole(gpu.code)]
    if gpu.mig_capable:
        out += [mig(gpu.code, p.name) for p in profiles_for(gpu.code)
                if not p.shape.media_extensions and p.shape.key != "7g"]
    out += [share(gpu.code, milli) for milli in shares]
    return out


# -- workloads --------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Workload:
    """One workload as a tenant registers it. ``seq_len``: tokens per sample (generation: the context the
    tokens are generated against, prompt + half the output on average); ``image_size``: pixels per side."""

    architecture: str
    task: str = "inference"
    precision: str = "bf16"
    batch_size: int = 1
    seq_len: int = 512
    image_size: int = 224

    def __post_init__(self) -> None:
        problems = workload_problems(self)
        if problems:
            field, message = problems[0]
            raise ValueError(f"{field}: {message}")

    @property
    def unit(self) -> str:
        return "tokens/s" if self.task == "generation" else "samples/s"


def workload_problems(workload) -> list[tuple[str, str]]:
    """(field, message) for each thing wrong with a workload definition; empty when it is sound."""
    problems = []
    try:
        arch = architecture_get(workload.architecture)
    except KeyError as error:
        return [("architecture", error.args[0])]
    if workload.task not in TASKS:
        problems.append(("task", f"must be one of {', '.join(TASKS)}"))
    if workload.precision not in PRECISIONS:
        problems.append(("precision", f"must be one of {', '.join(PRECISIONS)}"))
    if workload.task == "training" and workload.precision in ("fp8", "int8"):
        problems.append(("precision", "training runs in fp32, tf32, bf16 or fp16 (fp8/int8 are for inference)"))
    if workload.task == "generation" and getattr(arch, "kind", "") != "decoder":
        problems.append(("task", f"generation needs a decoder; {arch.name} is {arch.kind}"))
    if not isinstance(workload.batch_size, int) or not 1 <= workload.batch_size <= 4096:
        problems.append(("batch_size", "must be an integer 1..4096"))
    if not isinstance(workload.seq_len, int) or not 1 <= workload.seq_len <= 131072:
        problems.append(("seq_len", "must be an integer 1..131072"))
    if not isinstance(workload.image_size, int) or not 32 <= workload.image_size <= 2048:
        problems.append(("image_size", "must be an integer 32..2048"))
    return problems


@dataclass(frozen=True, slots=True)
class Work:
    """What one step of a workload asks of a GPU, independent of the GPU."""

    flops: float
    bytes_moved: float
    memory_bytes: float
    kernels: int
    samples: float  # samples (or generated tokens) per step

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes_moved


def work_of(workload: Workload, spec: ComputeSpec | None = None) -> Work:
    """FLOPs, bytes moved, memory held and kernels launched by one step. ``spec`` decides the precision the
    GPU really runs (an FP8 model on an A100 holds BF16 weights)."""
    arch = architecture_get(workload.architecture)
    precision = effective_precision(spec, workload.precision) if spec else workload.precision
    width = BYTES[precision]
    act = max(width, 2) if precision in ("fp8", "int8") else width  # 8-bit models keep 16-bit activations
    act = 1 if precision in ("fp8", "int8") and isinstance(arch, ConvNet) else act  # TensorRT int8 CNNs
    batch, training = workload.batch_size, workload.task == "training"
    if isinstance(arch, ConvNet):
        scale = (workload.image_size / 224) ** 2
        forward = 2 * arch.gmacs * 1e9 * scale * batch
        activations = arch.activations_m * 1e6 * scale * batch
        weights = arch.params * width
        layers = 50
        if training:
            flops = 3 * forward
            moved = 3 * weights + arch.params * 28 + 3 * 2 * activations * act
            memory = arch.params * (2 * width + 12) + 3 * activations * act
        else:
            flops = forward
            moved = weights + 2 * activations * act
            memory = weights + 2 * activations * act / max(1, batch) * min(batch, 4)
        return Work(flops, moved, memory + CONTEXT_MIB * 2**20, layers * (3 if training else 1), batch)
    assert isinstance(arch, Transformer)
    d, layers = arch.hidden, arch.layers
    s = arch.tokens(workload.seq_len, workload.image_size)
    head = 2 * arch.vocab * d if arch.kind == "decoder" else 0  # the LM head's matmul per token
    weights = arch.params * width
    kernels = layers * 8
    if workload.task == "generation":
        # one decode step: every sequence in the batch makes one token against a context of ``s``
        flops = batch * (2 * arch.nonembedding_params + head + 4 * layers * s * d)
        kv = batch * s * layers * 2 * arch.kv_dim * act
        moved = weights + kv + batch * layers * d * 20 * act
        memory = weights + kv + batch * 4 * max(arch.ffn, arch.vocab) * act
        return Work(flops, moved, memory + CONTEXT_MIB * 2**20, kernels, batch)
    tokens = batch * s
    forward = tokens * (2 * arch.nonembedding_params + head) + batch * 4 * layers * s * s * d
    activations = tokens * layers * d * 20 * act
    if training:
        flops = 3 * forward
        moved = 3 * weights + arch.params * 28 + 3 * activations
        # Korthikanti et al. 2022: s·b·h·(34 + 5·a·s/h) bytes per layer in 16-bit, without recomputation
        stored = layers * tokens * d * (34 + 5 * arch.heads * s / d) * act / 2
        memory = arch.params * (2 * width + 12) + stored + tokens * arch.vocab * 4
        return Work(flops, moved, memory + CONTEXT_MIB * 2**20, kernels * 3, batch)
    moved = weights + activations
    memory = weights + tokens * max(arch.ffn, 4 * d) * act * 2 + batch * arch.heads * s * s * act
    return Work(forward, moved, memory + CONTEXT_MIB * 2**20, kernels, batch)


@dataclass(frozen=True, slots=True)
class Estimate:
    slice: Slice
    fits: bool
    memory_mib: int
    throughput: float  # samples/s (tokens/s for generation); 0 when it does not fit
    step_ms: float
    intensity: float
    bound: str  # "compute" or "memory"
    engine_active: float  # 0..1, as DCGM_FI_PROF_GR_ENGINE_ACTIVE would show at full load (launch gaps and
    # the framework's host work leave the engine idle)
    achieved_tflops: float


def estimate(workload: Workload, where: Slice, *, compute_efficiency: float | None = _UNSET,
             memory_efficiency: float | None = _UNSET) -> Estimate:
    spec = spec_get(where.model)
    work = work_of(workload, spec)
    ce = COMPUTE_EFFICIENCY if compute_efficiency is None else compute_efficiency
    me = MEMORY_EFFICIENCY if memory_efficiency is None else memory_efficiency
    compute = peak_tflops(spec, workload.precision) * 1e12 * where.compute_fraction * ce
    bandwidth = spec.bandwidth_gbs * 1e9 * where.bandwidth_fraction * me
    t_compute, t_memory = work.flops / compute, work.bytes_moved / bandwidth
    busy = max(t_compute, t_memory)  # kernels running: what DCGM counts as engine activity
    step = busy + work.kernels * KERNEL_LAUNCH_SECONDS + HOST_SECONDS_PER_STEP
    memory_mib = math.ceil(work.memory_bytes / 2**20)
    fits = memory_mib <= where.memory_mib
    return Estimate(where, fits, memory_mib, work.samples / step if fits else 0.0, step * 1000, work.intensity,
                    "compute" if t_compute >= t_memory else "memory", busy / step, work.flops / step / 1e12)


# -- calibration ------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CalibrationPoint:
    benchmark: str
    model: str
    workload: Workload
    measured: float  # samples/s (MLPerf Offline, one GPU)
    source: str


_V30 = "mlcommons/inference_results_v3.0 closed/NVIDIA/results"
_V31 = "mlcommons/inference_results_v3.1 closed/NVIDIA/results"
# MLPerf BERT feeds SQuAD v1.1 at up to 384 tokens with padding removed; 54 % of a 384-token batch is padding
# (Zeng et al., "Boosting distributed training performance of the unpadded BERT model", OpenReview
# 3nzKUh9a4M), so a sample is 177 tokens on average.
_BERT = Workload("bert-large", "inference", "int8", 256, 177)
_RESNET = Workload("resnet-50", "inference", "int8", 256)
CALIBRATION: tuple[CalibrationPoint, ...] = (
    CalibrationPoint("ResNet-50 Offline", "H100-80GB", _RESNET, 91825.7,
                     f"{_V30}/DGX-H100_H100-SXM-80GBx1_TRT/resnet50/Offline"),
    CalibrationPoint("ResNet-50 Offline", "A100-80GB", _RESNET, 42379.3,
                     f"{_V30}/DGX-A100_A100-SXM-80GBx1_TRT/resnet50/Offline"),
    CalibrationPoint("ResNet-50 Offline", "L4", _RESNET, 13157.8, f"{_V30}/L4x1_TRT/resnet50/Offline"),
    CalibrationPoint("BERT-99 Offline", "H100-80GB", _BERT, 9102.26,
                     f"{_V31}/DGX-H100_H100-SXM-80GBx1_TRT/bert-99/Offline"),
    CalibrationPoint("BERT-99 Offline", "A100-80GB", _BERT, 3590.46,
                     f"{_V30}/DGX-A100_A100-SXM-80GBx1_TRT/bert-99/Offline"),
    CalibrationPoint("BERT-99 Offline", "L4", _BERT, 1032.08, f"{_V30}/L4x1_TRT/bert-99/Offline"),
)
# GPT-J-99 Offline (v3.1, FP8): H100 13.0687 and L4 1.30094 samples/s. The dataset's token counts per sample
# are not in a source we can cite, so only the ratio between the two GPUs is compared (decode is bound by
# memory bandwidth, and the ratio does not depend on the tokens per sample).
GPTJ_RATIO = ("GPT-J-99 Offline H100 ÷ L4", 13.0687 / 1.30094,
              f"{_V31}/DGX-H100_H100-SXM-80GBx1_TRT/gptj-99/Offline and {_V31}/L4x1_TRT/gptj-99/Offline")


def fitted_efficiency(points=CALIBRATION) -> float:
    """The compute efficiency (0.30..1.00 in steps of 0.005) with the least mean absolute log error over
    ``points``: a grid, since memory-bound points do not move with it."""
    def loss(efficiency: float) -> float:
        return sum(abs(math.log(estimate(p.workload, whole(p.model), compute_efficiency=efficiency).throughput
                                / p.measured)) for p in points)

    return min((round(0.30 + 0.005 * step, 3) for step in range(141)), key=loss)


def calibration() -> dict:
    """Per point: measured, modelled (at ``COMPUTE_EFFICIENCY``), and the error in sample and when the
    efficiency is fitted without that point (leave-one-out); the mean absolute errors; the GPT-J ratio."""
    rows = []
    for index, point in enumerate(CALIBRATION):
        modelled = estimate(point.workload, whole(point.model)).throughput
        others = CALIBRATION[:index] + CALIBRATION[index + 1:]
        loo = estimate(point.workload, whole(point.model), compute_efficiency=fitted_efficiency(others)).throughput
        rows.append({"benchmark": point.benchmark, "gpu": point.model, "measured": point.measured,
                     "modelled": round(modelled, 1), "error": round(modelled / point.measured - 1, 4),
                     "loo_error": round(loo / point.measured - 1, 4), "source": point.source})
    decode = Workload("gpt-j-6b", "generation", "fp8", 16, 1024)
    ratio = estimate(decode, whole("H100-80GB")).throughput / estimate(decode, whole("L4")).throughput
    return {"compute_efficiency": COMPUTE_EFFICIENCY, "fitted": round(fitted_efficiency(), 4),
            "memory_efficiency": MEMORY_EFFICIENCY, "points": rows,
            "mape": round(sum(abs(r["error"]) for r in rows) / len(rows), 4),
            "loo_mape": round(sum(abs(r["loo_error"]) for r in rows) / len(rows), 4),
            "gptj_ratio": {"what": GPTJ_RATIO[0], "measured": round(GPTJ_RATIO[1], 3), "modelled": round(ratio, 3),
                           "error": round(ratio / GPTJ_RATIO[1] - 1, 4), "source": GPTJ_RATIO[2]}}


def with_batch(workload: Workload, batch_size: int) -> Workload:
    return replace(workload, batch_size=batch_size)
