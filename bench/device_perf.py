"""Measure the performance model's cases on whatever GPU this runs on: eager and replayed as a CUDA graph.

The method of gpus/data/README.md (the H100 rows the model is fitted on), so that another GPU's rows can join
them (``gpus.measured.load_results``) and check or refit the model:

- models built from the architectures' published figures (``gpus.architectures``) with random weights, on the
  device, in the case's precision, ``torch.inference_mode()``: transformers from the Hugging Face ``*Config``
  classes when ``transformers`` is installed, resnet-50 from torchvision; a decoder of exactly the
  architecture's per-layer matrices (fused QKV, output, gated or plain MLP, RMSNorm or LayerNorm, rotary
  embedding, SDPA over a full cache, LM head) for decode replayed as a graph (``graph``) and run eagerly
  (``own-eager``);
- ``eager``: ``model(x)``; decode with the library's dynamic cache, cropped back after each step so every step
  sees ``seq`` tokens; ``graph``: the same step captured once as a CUDA graph and replayed;
- ``step_s``: the median over timed groups (each about ``--group-seconds``, synchronised, after a warm-up group)
  of the time per step; ``spread`` = (max − min) ÷ median; ``peak_mib``: ``torch.cuda.max_memory_allocated``
  (without the CUDA context), eager rows only.

MIG: where MIG is **already** enabled, each MIG device NVML lists is measured too, one subprocess per device
(``CUDA_VISIBLE_DEVICES=MIG-…``); this script never enables or changes MIG. Its rows carry the slice key
(``H100-80GB/mig/3g.40gb``).

``--dry-run`` needs no torch and no GPU: it runs the same case list, timing loop and results file with a
stand-in step (pure Python whose work grows with the case), so the logic is tested here
(tests/tiering/test_device_perf.py); its rows say ``"dry_run": true``. Torch is imported only for a real run.

    python bench/device_perf.py --json bench/results/device_perf.json          # on a GPU machine
    python bench/device_perf.py --dry-run --quick --json /tmp/device_perf.json  # anywhere
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# run as ``python bench/device_perf.py``, bench/ is sys.path[0] and its profile.py hides the standard library's
# (which torch and transformers import through cProfile): only the repository's root goes on the path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpus.architectures import ConvNet, Transformer, architecture_get  # noqa: E402
from gpus.catalogue import MODELS  # noqa: E402

# the cases of gpus/data/ (architecture, task, precision, batches, seq); graph: also replayed as a CUDA graph
CASES = (
    ("resnet-50", "inference", "fp16", (1, 32, 256), 512, True),
    ("bert-base", "inference", "bf16", (1, 32, 256), 128, True),
    ("gpt2", "inference", "bf16", (1, 8, 32), 512, True),
    ("gpt2", "generation", "bf16", (1, 16, 64), 512, True),
    ("tinyllama-1.1b", "inference", "bf16", (1, 8, 32), 512, False),
    ("tinyllama-1.1b", "generation", "bf16", (1, 16, 64), 512, True),
    ("llama-2-7b", "inference", "bf16", (1, 8), 256, False),
    ("llama-2-7b", "generation", "bf16", (1, 16), 512, True),
    ("bert-base", "inference", "fp32", (32,), 128, False),
    ("resnet-50", "inference", "fp32", (256,), 512, False),
)
# architectures the model's constants were NOT fitted on (gpus/data/ holds only the five above): measured with
# ``--held-out`` to check its predictions where it has never seen a row
HELD_OUT = (
    ("bert-large", "inference", "bf16", (1, 32), 128, True),
    ("vit-b-16", "inference", "bf16", (1, 32, 256), 197, True),
    ("resnet-101", "inference", "fp16", (1, 64), 512, True),
    ("mobilenet-v2", "inference", "fp16", (1, 64), 512, False),
    ("gpt2-medium", "inference", "bf16", (8,), 512, False),
    ("gpt2-medium", "generation", "bf16", (1, 16), 512, True),
    ("qwen2-0.5b", "inference", "bf16", (8,), 512, False),
    ("qwen2-0.5b", "generation", "bf16", (1, 16, 64), 512, True),
    ("opt-1.3b", "inference", "bf16", (8,), 512, False),
    ("opt-1.3b", "generation", "bf16", (1, 16), 512, True),
    ("mistral-7b", "inference", "bf16", (8,), 256, False),
    ("mistral-7b", "generation", "bf16", (1, 16), 512, True),
    ("distilbert-base", "inference", "bf16", (1, 32), 128, True),
    ("roberta-large", "inference", "bf16", (32,), 128, False),
    ("vit-l-16", "inference", "bf16", (1, 64), 197, True),
    ("resnet-18", "inference", "fp16", (1, 64, 256), 512, True),
    ("resnet-152", "inference", "fp16", (1, 64), 512, True),
    ("vgg-16", "inference", "fp16", (1, 64), 512, False),
    ("densenet-121", "inference", "fp16", (1, 64), 512, False),
    ("convnext-tiny", "inference", "fp16", (1, 64), 512, False),
    ("efficientnet-b0", "inference", "fp16", (1, 64), 512, False),
    ("gpt2-large", "generation", "bf16", (1, 16), 512, True),
    ("gpt2-xl", "inference", "bf16", (8,), 512, False),
    ("gpt2-xl", "generation", "bf16", (1, 16), 512, True),
    ("phi-2", "inference", "bf16", (8,), 512, False),
    ("phi-2", "generation", "bf16", (1, 16), 512, True),
    ("llama-3-8b", "inference", "bf16", (1, 8), 256, False),
    ("llama-3-8b", "generation", "bf16", (1, 16, 64), 512, True),
    ("opt-6.7b", "generation", "bf16", (1, 16), 512, True),
    ("gpt-j-6b", "generation", "bf16", (1, 16), 512, True),
    ("llama-2-13b", "inference", "bf16", (8,), 256, False),
    ("llama-2-13b", "generation", "bf16", (1, 16), 512, True),
)
QUICK = (("gpt2", "generation", "bf16", (1, 16), 128, True), ("bert-base", "inference", "bf16", (1, 8), 128, True),
         ("resnet-50", "inference", "fp16", (1, 8), 512, True))
COLUMNS = ("arch", "task", "precision", "batch", "seq", "image", "mode", "step_s", "throughput", "peak_mib", "spread")


@dataclass(frozen=True, slots=True)
class Case:
    arch: str
    task: str
    precision: str
    batch: int
    seq: int
    mode: str  # eager, graph, own-eager
    image: int = 224


def cases(quick: bool = False, held_out: bool = False) -> list[Case]:
    """The case list: each (architecture, task, precision, batch) eagerly; decode also replayed as a graph and
    run eagerly on the own decoder; inference replayed as a graph where the table says so. ``held_out`` appends
    the architectures the model was not fitted on."""
    out = []
    for arch, task, precision, batches, seq, graph in (QUICK if quick else CASES + (HELD_OUT if held_out else ())):
        architecture_get(arch)  # a typo fails here, not on the GPU
        for batch in batches:
            out.append(Case(arch, task, precision, batch, seq, "eager"))
            if graph and (task == "generation" or batch <= 32):
                out.append(Case(arch, task, precision, batch, seq, "graph"))
            if task == "generation" and batch == 1:
                out.append(Case(arch, task, precision, batch, seq, "own-eager"))
    return out


def time_steps(step, synchronize, *, group_seconds: float, groups: int, clock=time.perf_counter) -> tuple[float, float]:
    """(median seconds per step, spread) over ``groups`` timed groups of about ``group_seconds`` each, after one
    warm-up group; each group is synchronised before and after."""
    def run(count: int) -> float:
        synchronize()
        began = clock()
        for _ in range(count):
            step()
        synchronize()
        return clock() - began

    once = max(run(1), 1e-7)
    count = max(1, int(group_seconds / once))
    run(count)  # warm-up
    per_step = [run(count) / count for _ in range(groups)]
    median = statistics.median(per_step)
    return median, (max(per_step) - min(per_step)) / median


# -- the dry run: the same loop with a stand-in step -------------------------------------------------------------

def dry_step(case: Case):
    """A pure-Python step whose work grows with the case (layers × batch), so the timing loop measures something."""
    arch = architecture_get(case.arch)
    layers = arch.layers if isinstance(arch, Transformer) else arch.convs
    work = layers * case.batch * (1 if case.mode == "graph" else 3)

    def step():
        total = 0
        for value in range(work):
            total += value * value
        return total

    return step


# -- the real run (torch, imported here only) ---------------------------------------------------------------------

@contextlib.contextmanager
def default_dtype(torch, dtype):
    """Parameters created in ``dtype`` (a 13B model built in fp32 and then cast would need 78 GB at once)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _dtype(torch, precision: str):
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def own_decoder(torch, arch: Transformer, dtype, device):
    """A decoder of exactly the architecture's per-layer matrices; ``step(tokens, cache_k, cache_v)`` runs one
    decode step against a full cache (SDPA over all of it)."""
    nn, functional = torch.nn, torch.nn.functional
    d, heads, kv_heads = arch.hidden, arch.heads, arch.kv_heads
    head_dim = d // heads

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            if arch.norm == "rms":
                return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * self.weight
            return functional.layer_norm(x, (d,), self.weight)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = Norm(), Norm()
            self.qkv = nn.Linear(d, d + 2 * arch.kv_dim, bias=False)
            self.out = nn.Linear(d, d, bias=False)
            self.up = nn.Linear(d, (2 if arch.gated else 1) * arch.ffn, bias=False)
            self.down = nn.Linear(arch.ffn, d, bias=False)

        def forward(self, x, cache_k, cache_v, cos, sin):
            b = x.shape[0]
            q, k, v = self.qkv(self.norm1(x)).split((d, arch.kv_dim, arch.kv_dim), dim=-1)
            q = q.view(b, 1, heads, head_dim).transpose(1, 2)
            k = k.view(b, 1, kv_heads, head_dim).transpose(1, 2)
            if arch.rope:
                q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            cache_k[:, :, -1:].copy_(k)
            cache_v[:, :, -1:].copy_(v.view(b, 1, kv_heads, head_dim).transpose(1, 2))
            attention = functional.scaled_dot_product_attention(q, cache_k, cache_v, enable_gqa=kv_heads != heads)
            x = x + self.out(attention.transpose(1, 2).reshape(b, 1, d))
            hidden = self.up(self.norm2(x))
            if arch.gated:
                gate, up = hidden.chunk(2, dim=-1)
                hidden = functional.silu(gate) * up
            else:
                hidden = functional.gelu(hidden)
            return x + self.down(hidden)

    def rotate(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(arch.vocab, d)
            self.layers = nn.ModuleList(Layer() for _ in range(arch.layers))
            self.norm = Norm()
            self.head = nn.Linear(d, arch.vocab, bias=False)

        def forward(self, tokens, caches, cos, sin):
            x = self.embed(tokens)
            for layer, (cache_k, cache_v) in zip(self.layers, caches, strict=True):
                x = layer(x, cache_k, cache_v, cos, sin)
            return self.head(self.norm(x))

    with torch.device(device), default_dtype(torch, dtype):
        return Decoder().to(dtype=dtype).eval()


def library_model(torch, arch, task: str, dtype, device, seq: int):
    """The framework's model from its published configuration (random weights), or None when the library or a
    config class for the architecture is missing here."""
    if isinstance(arch, ConvNet):
        try:
            import torchvision
        except ImportError:
            return None
        import types

        # torchvision's builders: resnet101, vgg16, densenet121, but mobilenet_v2 (mobilenetv2 is a module)
        builder = next((b for name in (arch.name.replace("-", ""), arch.name.replace("-", "_"))
                        if callable(b := getattr(torchvision.models, name, None))
                        and not isinstance(b, types.ModuleType)), None)
        if builder is None:
            return None
        with torch.device(device), default_dtype(torch, dtype):  # created on the device, as gpus/data/'s method says
            return builder(weights=None).to(dtype=dtype).eval()
    try:
        import transformers
    except ImportError:
        return None
    common = {"vocab_size": arch.vocab, "num_hidden_layers": arch.layers, "hidden_size": arch.hidden,
              "num_attention_heads": arch.heads, "intermediate_size": arch.ffn, "attn_implementation": "sdpa"}
    if arch.kind == "encoder":
        config = transformers.BertConfig(**common, max_position_embeddings=max(512, seq))
        with torch.device(device), default_dtype(torch, dtype):
            return transformers.AutoModel.from_config(config).to(dtype=dtype).eval()
    if arch.kind == "vit":
        config = transformers.ViTConfig(hidden_size=arch.hidden, num_hidden_layers=arch.layers,
                                        num_attention_heads=arch.heads, intermediate_size=arch.ffn,
                                        image_size=224, patch_size=arch.patch, attn_implementation="sdpa")
        with torch.device(device), default_dtype(torch, dtype):
            return transformers.ViTModel(config, add_pooling_layer=False).to(dtype=dtype).eval()
    if arch.name.startswith("gpt2"):
        config = transformers.GPT2Config(vocab_size=arch.vocab, n_layer=arch.layers, n_embd=arch.hidden,
                                         n_head=arch.heads, n_positions=max(1024, seq + 8),
                                         attn_implementation="sdpa")
    elif arch.name.startswith("phi"):
        config = transformers.PhiConfig(**common, max_position_embeddings=max(2048, seq + 8),
                                        tie_word_embeddings=arch.tied)
    elif arch.name.startswith("gpt-j"):
        config = transformers.GPTJConfig(vocab_size=arch.vocab, n_layer=arch.layers, n_embd=arch.hidden,
                                         n_head=arch.heads, n_inner=arch.ffn, rotary_dim=64,
                                         n_positions=max(2048, seq + 8), tie_word_embeddings=arch.tied,
                                         attn_implementation="eager")  # the library has no SDPA path for GPT-J
    elif arch.name.startswith("qwen2"):
        config = transformers.Qwen2Config(**common, num_key_value_heads=arch.kv_heads,
                                          max_position_embeddings=max(2048, seq + 8), tie_word_embeddings=arch.tied)
    elif arch.name.startswith("opt"):
        config = transformers.OPTConfig(vocab_size=arch.vocab, num_hidden_layers=arch.layers, hidden_size=arch.hidden,
                                        ffn_dim=arch.ffn, num_attention_heads=arch.heads,
                                        word_embed_proj_dim=arch.hidden, max_position_embeddings=max(2048, seq + 8),
                                        attn_implementation="sdpa")
    elif arch.norm == "rms" and arch.gated:
        config = transformers.LlamaConfig(**common, num_key_value_heads=arch.kv_heads,
                                          max_position_embeddings=max(2048, seq + 8),
                                          tie_word_embeddings=arch.tied)
    else:
        return None
    # created on the device, in its precision: a 7B model initialised on the host takes minutes
    with torch.device(device), default_dtype(torch, dtype):
        return transformers.AutoModelForCausalLM.from_config(config).to(dtype=dtype).eval()


def measure(case: Case, args, torch) -> dict | None:
    """One case on the current device: its row, or None when this machine cannot build it (no library)."""
    device = torch.device(args.device)
    dtype = _dtype(torch, case.precision)
    arch = architecture_get(case.arch)
    cuda = device.type == "cuda"
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        release(torch)  # what the case before left (its workspaces), before the peak is counted
        # fp32 rows are true fp32 (gpus/data/'s method): cuDNN would otherwise run convolutions in TF32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = case.precision != "fp32"

    def built():  # the peak counts from here: the weights and the step, not the model's construction
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    with torch.inference_mode():
        if case.task == "generation" and case.mode in ("graph", "own-eager"):
            model = cached(("own", case.arch, case.precision, str(device)),
                           lambda: own_decoder(torch, arch, dtype, device), torch)
            built()
            head_dim = arch.hidden // arch.heads
            caches = [(torch.randn(case.batch, arch.kv_heads, case.seq, head_dim, device=device, dtype=dtype),
                       torch.randn(case.batch, arch.kv_heads, case.seq, head_dim, device=device, dtype=dtype))
                      for _ in range(arch.layers)]
            tokens = torch.randint(0, arch.vocab, (case.batch, 1), device=device)
            cos = torch.ones(1, 1, 1, head_dim, device=device, dtype=dtype)
            sin = torch.zeros(1, 1, 1, head_dim, device=device, dtype=dtype)

            def step():
                return model(tokens, caches, cos, sin)
        else:
            # inference and generation of a decoder share one model (AutoModelForCausalLM of the same config); its
            # positions are max(2048, seq + 8), so one model serves every seq up to 2040
            model = cached(("library", case.arch, case.precision, str(device), case.seq > 2040),
                           lambda: library_model(torch, arch, case.task, dtype, device, case.seq), torch)
            if model is None:
                return None
            built()
            if isinstance(arch, ConvNet):
                inputs = {"x": torch.randn(case.batch, 3, case.image, case.image, device=device, dtype=dtype)}
            elif arch.kind == "vit":
                inputs = {"pixel_values": torch.randn(case.batch, 3, case.image, case.image, device=device,
                                                      dtype=dtype)}
            else:
                inputs = {"input_ids": torch.randint(0, arch.vocab, (case.batch, case.seq), device=device)}
            if case.task == "generation":
                import transformers

                cache = transformers.DynamicCache()
                model(**inputs, past_key_values=cache, use_cache=True, logits_to_keep=1)
                token = {"input_ids": inputs["input_ids"][:, :1]}

                def step():
                    model(**token, past_key_values=cache, use_cache=True)
                    cache.crop(case.seq)  # every step sees seq tokens
            elif isinstance(arch, ConvNet):
                def step():
                    return model(inputs["x"])
            elif arch.kind == "vit":
                def step():
                    return model(**inputs)
            else:
                def step():
                    return model(**inputs, use_cache=False) if arch.kind == "decoder" else model(**inputs)
        if case.mode == "graph":
            if not cuda:
                return None
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            measured = graph.replay
        else:
            measured = step
        step_s, spread = time_steps(measured, synchronize, group_seconds=args.group_seconds, groups=args.groups)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda and case.mode == "eager" else None
    return row_of(case, step_s, spread, peak)


_CACHE: dict = {}


def cached(key, build, torch=None):
    """The model of ``key`` (built once while consecutive cases share it; the one before is dropped first and
    collected, since a library's model holds reference cycles, so at most one model holds device memory). Beside
    it, what the device held before it was built (``baseline()``): what earlier cases left allocated (the cuBLAS
    and cuDNN workspaces of their streams), which a fresh process would not count."""
    if key not in _CACHE:
        _CACHE.clear()
        gc.collect()
        if torch is not None:
            release(torch)
        _CACHE[key] = build()
    return _CACHE[key]


def release(torch) -> None:
    """Give back what earlier cases left allocated, so a case's peak counts what a fresh process would: the
    cuBLAS workspaces of every stream used so far (each graph capture's side stream gets its own, and they stay
    allocated: 1 GiB after a few dozen cases), then the allocator's cached blocks."""
    if not torch.cuda.is_available():
        return
    torch.cuda.synchronize()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()


def ceilings(torch) -> dict:
    """What this GPU reaches in this run, beside the cases (gpus/data/'s method): an 8192³ bf16 matmul in TFLOP/s
    and a 1 GiB device-to-device copy in TB/s counting bytes read and written; each the median of 5 timed groups."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    matmul_s, _ = time_steps(lambda: a @ b, torch.cuda.synchronize, group_seconds=0.2, groups=5)
    source = torch.empty(2**30, device="cuda", dtype=torch.uint8)
    target = torch.empty_like(source)
    copy_s, _ = time_steps(lambda: target.copy_(source), torch.cuda.synchronize, group_seconds=0.2, groups=5)
    return {"matmul_bf16_tflops": round(2 * n**3 / matmul_s / 1e12, 1),
            "copy_tb_s": round(2 * 2**30 / copy_s / 1e12, 3)}


def row_of(case: Case, step_s: float, spread: float, peak_mib: float | None) -> dict:
    # six significant digits, not decimals: a dry run's steps are sub-microsecond
    return {"arch": case.arch, "task": case.task, "precision": case.precision, "batch": case.batch, "seq": case.seq,
            "image": case.image, "mode": case.mode, "step_s": float(f"{step_s:.6g}"),
            "throughput": float(f"{case.batch / step_s:.6g}"),
            "peak_mib": None if peak_mib is None else round(peak_mib, 3), "spread": round(spread, 6)}


# -- devices ----------------------------------------------------------------------------------------------------

def model_code(name: str) -> str:
    """The catalogue's code of an NVML device name (``NVIDIA H100 80GB HBM3`` → ``H100-80GB``), else the name."""
    for model in MODELS:
        if model.vendor_name == name or name.startswith(model.vendor_name):
            return model.code
    return name


def mig_devices() -> list[tuple[str, str]]:
    """(MIG device UUID, slice key) of every MIG device NVML lists, where MIG is already enabled; empty where
    nvidia-smi is missing or MIG is off. Reads only: ``nvidia-smi -L``."""
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_mig_listing(listing)


def parse_mig_listing(listing: str) -> list[tuple[str, str]]:
    """``nvidia-smi -L`` → (MIG UUID, slice key), e.g. ``MIG 3g.40gb Device 0: (UUID: MIG-…)`` under ``GPU 0:
    NVIDIA H100 80GB HBM3 (UUID: GPU-…)`` → ``("MIG-…", "H100-80GB/mig/3g.40gb")``."""
    out, gpu = [], ""
    for line in listing.splitlines():
        line = line.strip()
        if line.startswith("GPU "):
            gpu = model_code(line.split(":", 1)[1].split("(UUID")[0].strip())
        elif line.startswith("MIG ") and "UUID: " in line:
            profile = line.split()[1]
            out.append((line.split("UUID: ", 1)[1].rstrip(")"), f"{gpu}/mig/{profile}"))
    return out


def run(args) -> dict:
    """Every case on this device (or the dry run's stand-in), then each MIG device in a subprocess of its own."""
    rows, skipped = [], []
    if args.dry_run:
        for case in cases(args.quick, args.held_out):
            step_s, spread = time_steps(dry_step(case), lambda: None, group_seconds=args.group_seconds,
                                        groups=args.groups)
            rows.append({**row_of(case, step_s, spread, None), "slice": "dry-run", "dry_run": True})
        return {"device": "dry run (no torch, no GPU)", "slice": "dry-run", "rows": rows, "skipped": skipped}
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: use --device cpu or --dry-run")
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    key = args.slice or model_code(name)
    began = time.monotonic()
    extra = {"torch": torch.__version__, "cuda": getattr(torch.version, "cuda", None)}
    if args.device == "cuda":
        try:
            extra["ceilings"] = ceilings(torch)
            torch.cuda.empty_cache()  # the ceilings' tensors went with the function
            print(f"{key} ceilings: {extra['ceilings']}", flush=True)
        except Exception as error:  # noqa: BLE001 - a ceiling that fails must not cost the cases
            extra["ceilings"] = {"error": repr(error)[:300]}
    for case in cases(args.quick, args.held_out):
        if (args.only_modes and case.mode not in args.only_modes) or (args.only_archs
                                                                       and case.arch not in args.only_archs):
            continue
        if args.budget_seconds and time.monotonic() - began > args.budget_seconds:
            skipped.append({**asdict(case), "why": f"not reached in --budget-seconds {args.budget_seconds:g}"})
            continue
        out_of_memory = torch.cuda.OutOfMemoryError if args.device == "cuda" else MemoryError
        try:
            row = measure(case, args, torch)
        except out_of_memory:
            row, reason = None, "out of memory"
            _CACHE.clear()
        except Exception as error:  # noqa: BLE001 - one case that breaks (a library's API) must not cost the rest
            row, reason = None, f"failed: {error!r}"[:400]
            _CACHE.clear()
        else:
            reason = "not buildable here (library missing, or graph without CUDA)"
        if row is None:
            skipped.append({**asdict(case), "why": reason})
            print(f"{key} {case.arch} {case.task} {case.precision} b{case.batch} {case.mode}: skipped, {reason}",
                  flush=True)
        else:
            rows.append({**row, "slice": key})
            print(f"{key} {case.arch} {case.task} {case.precision} b{case.batch} {case.mode}: "
                  f"{row['step_s'] * 1000:.3f} ms, {row['throughput']:,.1f}/s", flush=True)
        if args.progress:  # what is measured so far survives a run cut short
            args.progress({"device": name, "slice": key, "rows": rows, "skipped": skipped, **extra})
    _CACHE.clear()
    if args.device == "cuda" and not args.slice:
        for uuid, mig_key in mig_devices():
            left = max(30.0, args.budget_seconds - (time.monotonic() - began))
            child = subprocess.run([sys.executable, __file__, "--slice", mig_key, "--stdout-json",
                                    *(["--quick"] if args.quick else []), *(["--held-out"] if args.held_out else []),
                                    *(["--budget-seconds", f"{left:.0f}"] if args.budget_seconds else [])],
                                   env={**os.environ, "CUDA_VISIBLE_DEVICES": uuid}, capture_output=True, text=True,
                                   check=False)
            if child.returncode == 0:
                found = json.loads(child.stdout.strip().splitlines()[-1])
                rows += found["rows"]
                skipped += found["skipped"]
            else:
                skipped.append({"slice": mig_key, "why": child.stderr.strip()[-400:]})
    return {"device": name, "slice": key, "rows": rows, "skipped": skipped, **extra}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="no torch, no GPU: the loop with a stand-in step")
    parser.add_argument("--quick", action="store_true", help="three small cases")
    parser.add_argument("--held-out", action="store_true",
                        help="also the architectures the model was not fitted on (HELD_OUT)")
    parser.add_argument("--budget-seconds", type=float, default=0,
                        help="start no case after this many seconds (those left are listed as skipped); 0: no bound")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--group-seconds", type=float, default=0.2)
    parser.add_argument("--groups", type=int, default=5)
    parser.add_argument("--only-modes", nargs="*", choices=("eager", "graph", "own-eager"))
    parser.add_argument("--only-archs", nargs="*", help="only these architectures' cases")
    parser.add_argument("--slice", help="(internal) the slice key of this process's device: a MIG device")
    parser.add_argument("--stdout-json", action="store_true", help="(internal) print the figures as JSON")
    parser.add_argument("--json", type=Path, help="write the results file here (bench.record's format)")
    args = parser.parse_args(argv)
    if args.dry_run and args.group_seconds == 0.2:
        args.group_seconds = 0.005
    settings = {k: v for k, v in vars(args).items() if k != "json"}
    args.progress = None
    if args.json and not args.stdout_json:
        from bench.record import write

        def progress(partial):
            write(args.json.stem, {**partial, "partial": True}, settings=settings, directory=args.json.parent)

        args.progress = progress
    result = run(args)
    if args.stdout_json:
        print(json.dumps(result))
        return 0
    for row in result["rows"]:
        print(f"{row['slice']} {row['arch']} {row['task']} {row['precision']} b{row['batch']} {row['mode']}: "
              f"{row['step_s'] * 1000:.3f} ms, {row['throughput']:,.1f}/s, spread {row['spread']:.1%}")
    print(f"{len(result['rows'])} rows, {len(result['skipped'])} skipped")
    if args.json:
        from bench.record import write

        write(args.json.stem, result, settings=settings, directory=args.json.parent)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
