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

# -- constants --------------------------------------------------------------------------------------------
#
# Two regimes (docs/tiering.md §1):
# - ``engine``: a serving engine (TensorRT) or a step captured once and replayed as a CUDA graph: fused kernels
#   back to back, no per-operation host work. Compute efficiency from MLPerf (``calibration()``); bandwidth
#   efficiency and the cost of each fused kernel fitted on decode replayed as a CUDA graph on an H100
#   (``gpus.measured``: the rows in gpus/data/).
# - ``eager``: the framework as a tenant runs it (``model(x)``): every operation dispatched from Python (a host
#   cost each), elementwise operations unfused (their traffic added to the GEMMs'), GEMMs at the framework's
#   efficiency; the step is the longer of the host's work and the GPU's (launches are asynchronous).
# The fitted figures are ``FITTED`` (``gpus.measured.fit`` reproduces them; tests/tiering/test_measured.py checks).

REGIMES = ("engine", "eager")


@dataclass(frozen=True, slots=True)
class Constants:
    """The model's efficiencies and host costs. The defaults are the priors (the figures the model used before it
    met a measured GPU, or the plain physical guess where it had none); ``FITTED`` is what ``gpus.measured.fit``
    makes of the measured rows, and a constant no measured row constrains keeps its prior."""

    compute_efficiency: float = 0.525  # engine: share of the datasheet peak (MLPerf, ``calibration()``)
    memory_efficiency: float = 0.80  # both regimes: share of nameplate bandwidth streaming kernels reach
    kernel_seconds: float = 4e-6  # per kernel: the launch gap, ramp and tail of one kernel on the GPU
    host_seconds_per_step: float = 2e-4  # engine: the server's own work per step
    eager_compute_efficiency: float = 0.525  # eager: GEMMs and attention of the framework's kernels
    eager_conv_efficiency: float = 0.525  # eager: cuDNN convolutions (NCHW, as torchvision builds them)
    # eager: a transformer's GEMMs of this many multiply-adds (tokens × hidden², at the 16-bit peak on a whole GPU;
    # a slice with a fraction of the SMs fills with that fraction, a lower peak sooner) reach half the efficiency:
    # small GEMMs leave SMs idle
    eager_gemm_half_macs: float = 0.0
    host_seconds_per_op: float = 1e-5  # eager: Python and the dispatcher, per operation
    eager_host_seconds_per_step: float = 2e-4  # eager: the step's own host work (embedding, masks, cache object)
    workspace_mib: float = 0.0  # the framework's workspaces (cuBLAS, allocator rounding), beside the context
    # cuDNN's FP32 algorithms (no tensor cores): workspace per sample, in largest feature maps, beside the live
    # tensors (``ConvNet.live_maps``, counted from the layer shapes: nothing about a CNN's 16-bit memory is fitted)
    conv_fp32_workspace_maps: float = 0.0


# ``gpus.measured.fit(gpus.measured.load())``: the H100 rows of gpus/data/ (five architectures; docs/tiering.md §2);
# the engine's compute efficiency is ``fitted_efficiency()`` (MLPerf) with those
FITTED = Constants(compute_efficiency=0.61, memory_efficiency=0.745, kernel_seconds=5.98e-06,
                   eager_compute_efficiency=0.647,
                   eager_conv_efficiency=0.455, eager_gemm_half_macs=2e9, host_seconds_per_op=1.33e-05,
                   eager_host_seconds_per_step=0.00166, workspace_mib=41.4,
                   conv_fp32_workspace_maps=3.8)

COMPUTE_EFFICIENCY = FITTED.compute_efficiency
MEMORY_EFFICIENCY = FITTED.memory_efficiency
KERNEL_LAUNCH_SECONDS = FITTED.kernel_seconds  # per kernel (CUDA graphs / TensorRT engines)
CONTEXT_MIB = 512  # CUDA context and library workspaces
HOST_SECONDS_PER_STEP = FITTED.host_seconds_per_step  # the framework's own work per step (engine idle meanwhile)
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
    tokens are generated against, prompt + half the output on average); ``image_size``: pixels per side;
    ``regime``: how it runs, ``engine`` (a serving engine or a CUDA graph replayed: what the model meant
    before regimes, and the default) or ``eager`` (the framework's ``model(x)``, operation by operation)."""

    architecture: str
    task: str = "inference"
    precision: str = "bf16"
    batch_size: int = 1
    seq_len: int = 512
    image_size: int = 224
    regime: str = "engine"

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
    if getattr(workload, "regime", "engine") not in REGIMES:
        problems.append(("regime", f"must be one of {', '.join(REGIMES)}"))
    return problems


@dataclass(frozen=True, slots=True)
class Work:
    """What one step of a workload asks of a GPU, independent of the GPU. ``kernels``: fused kernels (an engine or
    a replayed graph); ``ops``: operations a framework dispatches eagerly; ``eager_bytes``: the traffic of the
    elementwise operations an eager step runs unfused, beyond ``bytes_moved``; ``conv``: the FLOPs are
    convolutions."""

    flops: float
    bytes_moved: float
    memory_bytes: float
    kernels: int
    samples: float  # samples (or generated tokens) per step
    ops: int = 0
    eager_bytes: float = 0.0
    conv: bool = False
    gemm_macs: float = 0.0  # multiply-adds of one of the step's typical GEMMs (tokens × hidden²)

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes_moved


OPS_PER_CONV = 3  # eager CNNs: the convolution, its batch norm and its activation, each its own kernel
NORM_OPS = {"layer": 1, "rms": 8}  # RMSNorm written out: cast, pow, mean, add, rsqrt, mul, cast, mul
ACTIVATION_OPS = {"gelu": 1, "relu": 1, "gelu_new": 8, "silu": 2}  # silu: the activation and the gate's product
ROPE_OPS = 14  # rotate_half (two slices, neg, cat) and two multiplies and an add, for queries and keys
ATTENTION_OPS = 9  # three projections, reshapes, scaled-dot-product attention, the output projection
CACHE_OPS = 4  # decode with the library's cache: append keys and values, and the reshapes around it


def layer_ops(arch: Transformer, *, decode: bool = False) -> int:
    """Operations a framework dispatches for one transformer layer, eagerly: two norms, attention (with rotary
    embedding when the architecture has it), the MLP (a third matrix when gated) and two residual adds."""
    mlp = (3 if arch.gated else 2) + ACTIVATION_OPS[arch.activation]
    return (2 * NORM_OPS[arch.norm] + ATTENTION_OPS + (ROPE_OPS if arch.rope else 0) + mlp + 2
            + (CACHE_OPS if decode else 0))


def layer_eager_elements(arch: Transformer) -> float:
    """Elements per token one transformer layer reads and writes in unfused elementwise operations beyond what the
    fused step moves: RMSNorm's passes, rotary embedding's, the activation's (each pass reads and writes)."""
    norm = 2 * 2 * arch.hidden * (NORM_OPS[arch.norm] - 1)
    rope = 2 * (ROPE_OPS // 2) * (arch.hidden + arch.kv_dim) if arch.rope else 0
    ffn = (2 if arch.gated else 1) * arch.ffn
    act = 2 * ffn * ACTIVATION_OPS[arch.activation]
    return norm + rope + act


def work_of(workload: Workload, spec: ComputeSpec | None = None, constants: Constants | None = None) -> Work:
    """FLOPs, bytes moved, memory held and kernels launched by one step. ``spec`` decides the precision the
    GPU really runs (an FP8 model on an A100 holds BF16 weights).

    Memory is what the framework holds at the step's peak (``torch.cuda.max_memory_allocated``) plus the CUDA
    context (``CONTEXT_MIB``): the weights, the framework's workspace, and the larger of the live activations
    and, for a decoder's forward pass, the logits over the whole vocabulary for every token; generation adds
    the KV cache (and the prefill's activations that built it); a CNN holds ``ConvNet.live_maps`` of its largest
    feature map and its input image per sample, FP32 adds cuDNN's workspace (attention runs as SDPA: no
    sequence-squared score matrix)."""
    c = constants or FITTED
    arch = architecture_get(workload.architecture)
    precision = effective_precision(spec, workload.precision) if spec else workload.precision
    width = BYTES[precision]
    act = max(width, 2) if precision in ("fp8", "int8") else width  # 8-bit models keep 16-bit activations
    act = 1 if precision in ("fp8", "int8") and isinstance(arch, ConvNet) else act  # TensorRT int8 CNNs
    batch, training = workload.batch_size, workload.task == "training"
    workspace = (CONTEXT_MIB + c.workspace_mib) * 2**20
    if isinstance(arch, ConvNet):
        scale = (workload.image_size / 224) ** 2
        forward = 2 * arch.gmacs * 1e9 * scale * batch
        activations = arch.activations_m * 1e6 * scale * batch
        weights = arch.params * width
        peak_map = arch.peak_map_m * 1e6 * scale * batch
        if training:
            flops = 3 * forward
            moved = 3 * weights + arch.params * 28 + 3 * 2 * activations * act
            memory = arch.params * (2 * width + 12) + 3 * activations * act
        else:
            flops = forward
            moved = weights + 2 * activations * act
            # the live tensors at the forward pass's peak (``ConvNet.live_maps``) and the input image, per sample
            maps = arch.live_maps + (c.conv_fp32_workspace_maps if precision == "fp32" else 0.0)
            image = 3 * workload.image_size ** 2 * batch
            memory = weights + (maps * peak_map + image) * act
        ops = arch.convs * OPS_PER_CONV * (3 if training else 1)
        # eager: batch norm and activation read and write every map (an engine folds them into the convolution)
        eager = 2 * 2 * activations * act * (3 if training else 1)
        return Work(flops, moved, memory + workspace, arch.convs * (3 if training else 1), batch, ops, eager, True)
    assert isinstance(arch, Transformer)
    d, layers = arch.hidden, arch.layers
    s = arch.tokens(workload.seq_len, workload.image_size)
    head = 2 * arch.vocab * d if arch.kind == "decoder" else 0  # the LM head's matmul per token
    weights = arch.params * width
    kernels = layers * 8
    extra = 8  # embeddings, final norm, head, masks
    # per token, the MLP's live tensors: its input and output, the up (and gate) projection and the activation's
    # result; the tanh approximation written out (gelu_new) keeps two more temporaries of the MLP's width
    mlp_live = ((3 if arch.gated else 2 + (2 if arch.activation == "gelu_new" else 0)) * arch.ffn + 3 * d) * act
    if workload.task == "generation":
        # one decode step: every sequence in the batch makes one token against a context of ``s``
        flops = batch * (2 * arch.nonembedding_params + head + 4 * layers * s * d)
        kv = batch * s * layers * 2 * arch.kv_dim * act
        moved = weights + kv + batch * layers * d * 20 * act
        # the cache was built by a prefill whose live activations (not its logits: only the last token's) count
        memory = weights + kv + max(batch * s * mlp_live, batch * arch.vocab * 4)
        ops = layers * layer_ops(arch, decode=True) + extra
        eager = batch * layers * layer_eager_elements(arch) * act
        return Work(flops, moved, memory + workspace, kernels, batch, ops, eager, False, batch * d * d)
    tokens = batch * s
    forward = tokens * (2 * arch.nonembedding_params + head) + batch * 4 * layers * s * s * d
    activations = tokens * layers * d * 20 * act
    ops = layers * layer_ops(arch) + extra
    eager = tokens * layers * layer_eager_elements(arch) * act
    if training:
        flops = 3 * forward
        moved = 3 * weights + arch.params * 28 + 3 * activations
        # Korthikanti et al. 2022: s·b·h·(34 + 5·a·s/h) bytes per layer in 16-bit, without recomputation
        stored = layers * tokens * d * (34 + 5 * arch.heads * s / d) * act / 2
        memory = arch.params * (2 * width + 12) + stored + tokens * arch.vocab * 4
        return Work(flops, moved, memory + workspace, kernels * 3, batch, ops * 3, eager * 3, False, tokens * d * d)
    moved = weights + activations
    logits = tokens * arch.vocab * act if arch.kind == "decoder" else 0  # every token's logits (no cache)
    memory = weights + max(tokens * mlp_live, logits + tokens * d * act)
    return Work(forward, moved, memory + workspace, kernels, batch, ops, eager, False, tokens * d * d)


@dataclass(frozen=True, slots=True)
class Estimate:
    slice: Slice
    fits: bool
    memory_mib: int
    throughput: float  # samples/s (tokens/s for generation); 0 when it does not fit
    step_ms: float
    intensity: float
    bound: str  # "compute", "memory" or "host" (eager: the host's dispatching is longer than the GPU's work)
    engine_active: float  # 0..1, as DCGM_FI_PROF_GR_ENGINE_ACTIVE would show at full load (launch gaps and
    # the framework's host work leave the engine idle)
    achieved_tflops: float
    regime: str = "engine"


def estimate(workload: Workload, where: Slice, *, compute_efficiency: float | None = _UNSET,
             memory_efficiency: float | None = _UNSET, constants: Constants | None = None) -> Estimate:
    """One step of ``workload`` on ``where`` in the workload's regime (module docstring, docs/tiering.md §1).

    engine: ``max(FLOPs / compute, bytes / bandwidth) + kernels × kernel_seconds + host_seconds_per_step``.
    eager: the GPU runs the GEMMs (``max`` of their FLOPs at the eager efficiency and the bytes), then the unfused
    elementwise traffic, with a gap per operation; the host dispatches ``ops × host_seconds_per_op`` plus its
    step's work; the step is the longer of the two (``bound`` is ``host`` when the host's is)."""
    c = constants or FITTED
    if compute_efficiency is not None or memory_efficiency is not None:
        c = replace(c, compute_efficiency=c.compute_efficiency if compute_efficiency is None else compute_efficiency,
                    memory_efficiency=c.memory_efficiency if memory_efficiency is None else memory_efficiency)
    spec = spec_get(where.model)
    work = work_of(workload, spec, c)
    peak = peak_tflops(spec, workload.precision) * 1e12 * where.compute_fraction
    bandwidth = spec.bandwidth_gbs * 1e9 * where.bandwidth_fraction * c.memory_efficiency
    memory_mib = math.ceil(work.memory_bytes / 2**20)
    fits = memory_mib <= where.memory_mib
    if workload.regime == "eager":
        if work.conv:
            efficiency = c.eager_conv_efficiency
        else:
            # the same tiles take longer where the precision's peak is lower (FP32 fills the GPU sooner)
            half = c.eager_gemm_half_macs * where.compute_fraction * peak_tflops(spec, workload.precision) / spec.fp16
            efficiency = c.eager_compute_efficiency * work.gemm_macs / (work.gemm_macs + half)
        t_compute, t_memory = work.flops / (peak * efficiency), work.bytes_moved / bandwidth
        # a time-sliced share or MIG slice runs the same number of operations; only the GPU's part scales
        busy = max(t_compute, t_memory) + work.eager_bytes / bandwidth  # kernels running: engine activity
        gpu = busy + work.ops * c.kernel_seconds  # and the gap each operation leaves on the GPU
        host = work.ops * c.host_seconds_per_op + c.eager_host_seconds_per_step
        if where.kind == "share":  # the host waits while the other tenants' time slices run
            host = host / where.compute_fraction
        step = max(gpu, host)
        bound = "host" if host > gpu else ("compute" if t_compute >= t_memory else "memory")
    else:
        t_compute, t_memory = work.flops / (peak * c.compute_efficiency), work.bytes_moved / bandwidth
        busy = max(t_compute, t_memory)  # kernels running: what DCGM counts as engine activity
        step = busy + work.kernels * c.kernel_seconds + c.host_seconds_per_step
        bound = "compute" if t_compute >= t_memory else "memory"
    return Estimate(where, fits, memory_mib, work.samples / step if fits else 0.0, step * 1000, work.intensity,
                    bound, min(1.0, busy / step), work.flops / step / 1e12, workload.regime)


def regime_infer(workload: Workload, where: Slice, engine_active: float) -> str:
    """The regime a measured engine activity points to: the one whose predicted activity on ``where`` is nearer
    (an eager decode keeps the engine busy a fraction of the step; a replayed one nearly all of it)."""
    return min(REGIMES, key=lambda regime: (abs(estimate(replace(workload, regime=regime), where).engine_active
                                                - engine_active), regime))


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


def fitted_efficiency(points=CALIBRATION, constants: Constants | None = None) -> float:
    """The engine's compute efficiency (0.30..1.00 in steps of 0.005) with the least mean absolute log error over
    ``points`` (the other constants: ``constants``, default ``FITTED``): a grid, since memory-bound points do not
    move with it."""
    def loss(efficiency: float) -> float:
        return sum(abs(math.log(estimate(p.workload, whole(p.model), compute_efficiency=efficiency,
                                         constants=constants).throughput / p.measured)) for p in points)

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
