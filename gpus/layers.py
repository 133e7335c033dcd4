"""Layer tables of the catalogue's architectures, and the time of one layer on a slice.

The model-split planner (``pipelines.planner.splits``) cuts a model into contiguous runs of layers, so it needs
the model layer by layer: parameters, FLOPs per sample (a multiply-add counts 2) and the activation each layer
hands to the next, per sample. This module derives them from the same architectures (``gpus.architectures``)
and the same arithmetic as ``gpus.performance.work_of``, so a whole model costs the same here as there:

- a transformer: an embedding (or, for a vision transformer, the patch projection), one block per layer with
  ``2 * layer_params * tokens + 4 * tokens^2 * hidden`` FLOPs (projections and attention, as ``work_of``), and for
  a decoder the output head (``2 * vocab * hidden`` per token; a tied head is a second copy of the embedding on
  the GPU that runs it);
- a ResNet (50/101/152): the stem, each bottleneck block from its convolutions (He et al. 2016, Table 1;
  torchvision puts the stride on the 3×3), and the classifier. Their totals land within a few per cent of
  the catalogue's published parameters and multiply-accumulates (``tests/pipelines`` checks). The other
  convolutional networks of the catalogue have only published totals, so they have no layer table.

``layer_ms`` is the roofline of ``gpus.performance.estimate`` for one layer: the longer of its FLOPs at the
slice's calibrated compute and its bytes at the slice's calibrated bandwidth, plus the kernels' launches.
Standard library and ``gpus`` only.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpus.architectures import ARCHITECTURES, ConvNet, Transformer, architecture_get
from gpus.performance import (
    BYTES,
    COMPUTE_EFFICIENCY,
    CONTEXT_MIB,
    HOST_SECONDS_PER_STEP,
    KERNEL_LAUNCH_SECONDS,
    MEMORY_EFFICIENCY,
    Slice,
    peak_tflops,
    spec_get,
    whole,
)

KERNELS_PER_BLOCK = 8  # as ``gpus.performance.work_of``: a transformer layer launches 8 kernels
STEP_OVERHEAD_MS = HOST_SECONDS_PER_STEP * 1000.0  # the framework's work per batch on each GPU
LAYER_CONTEXT_MIB = CONTEXT_MIB  # a process on a GPU holds its CUDA context besides weights and activations


@dataclass(frozen=True, slots=True)
class Layer:
    """One layer (or block) of a model: parameters, FLOPs per sample, the activation it hands on per sample
    (bytes) and the one it reads (0: the previous layer's ``out_bytes``), and the kernels it launches."""

    name: str
    params: int
    flops: float
    out_bytes: int
    in_bytes: int = 0
    kernels: int = 1


class NoLayerTable(KeyError):
    """The architecture is not in the catalogue, or the catalogue has only its published totals."""


RESNET_BLOCKS = {"resnet-50": (3, 4, 6, 3), "resnet-101": (3, 4, 23, 3), "resnet-152": (3, 8, 36, 3)}


def layered() -> tuple[str, ...]:
    """The catalogue's architectures that have a layer table."""
    return tuple(name for name, arch in ARCHITECTURES.items()
                 if isinstance(arch, Transformer) or name in RESNET_BLOCKS)


def layers_of(name: str, *, seq_len: int = 512, image_size: int = 224, precision: str = "fp16") -> tuple[Layer, ...]:
    """The layer table of the catalogue's architecture ``name``, one sample of ``seq_len`` tokens or an image of
    ``image_size`` pixels a side, activations in ``precision`` (8-bit models keep 16-bit activations)."""
    try:
        arch = architecture_get(name)
    except KeyError as error:
        raise NoLayerTable(error.args[0]) from None
    act = max(BYTES[precision], 2)
    if isinstance(arch, Transformer):
        return _transformer(arch, seq_len, image_size, act)
    if arch.name in RESNET_BLOCKS:
        return _resnet(arch, image_size, act)
    assert isinstance(arch, ConvNet)
    raise NoLayerTable(f"{arch.name} has only published totals, no layer table; layer tables: {', '.join(layered())}")


def _transformer(arch: Transformer, seq_len: int, image_size: int, act: int) -> tuple[Layer, ...]:
    d = arch.hidden
    tokens = arch.tokens(seq_len, image_size)
    hidden_out = tokens * d * act
    if arch.kind == "vit":
        patch = 3 * arch.patch * arch.patch * d
        embed = Layer("patch_embed", arch.embedding_params, 2.0 * patch * (tokens - 1), hidden_out,
                      image_size * image_size * 3 * act)
    else:
        embed = Layer("embed", arch.vocab * d, 0.0, hidden_out, tokens * 4)
    table = [embed]
    for index in range(arch.layers):
        flops = 2.0 * arch.layer_params * tokens + 4.0 * tokens * tokens * d
        table.append(Layer(f"block{index}", arch.layer_params, flops, hidden_out, kernels=KERNELS_PER_BLOCK))
    if arch.kind == "decoder":
        table.append(Layer("head", arch.vocab * d, 2.0 * arch.vocab * d * tokens, tokens * arch.vocab * act))
    return tuple(table)


def _conv(side_out: int, k: int, c_in: int, c_out: int) -> tuple[int, float]:
    params = k * k * c_in * c_out
    return params, 2.0 * side_out * side_out * params


def _resnet(arch: ConvNet, image: int, act: int, classes: int = 1000) -> tuple[Layer, ...]:
    table: list[Layer] = []
    side = image // 2
    params, flops = _conv(side, 7, 3, 64)
    side //= 2  # max pool
    table.append(Layer("stem", params + 2 * 64, flops, side * side * 64 * act, image * image * 3 * act, kernels=3))
    c_in = 64
    for stage, count in enumerate(RESNET_BLOCKS[arch.name]):
        mid = 64 * 2 ** stage
        out = mid * 4
        for block in range(count):
            stride = 2 if block == 0 and stage > 0 else 1
            side_out = side // stride
            p1 = c_in * mid
            f1 = 2.0 * side * side * p1  # the 1x1 before the strided 3x3 runs at the input's size
            p2, f2 = _conv(side_out, 3, mid, mid)
            p3, f3 = _conv(side_out, 1, mid, out)
            params, flops = p1 + p2 + p3 + 2 * (mid * 2 + out), f1 + f2 + f3
            kernels = 3
            if block == 0:
                pd, fd = _conv(side_out, 1, c_in, out)
                params, flops, kernels = params + pd + 2 * out, flops + fd, 4
            table.append(Layer(f"layer{stage + 1}.{block}", params, flops, side_out * side_out * out * act,
                               kernels=kernels))
            c_in, side = out, side_out
    table.append(Layer("fc", c_in * classes + classes, 2.0 * c_in * classes, classes * act))
    return tuple(table)


def layer_ms(layer: Layer, where: Slice | str, *, batch: int = 1, in_bytes: int | None = None,
             precision: str = "fp16") -> float:
    """Milliseconds of ``layer`` for a batch on ``where`` (a slice or a model code: the whole GPU): the roofline
    of ``gpus.performance.estimate`` with its calibrated efficiencies, plus the layer's kernel launches. It moves
    its weights once and its input and output for each sample (``in_bytes``: the input when the layer does not
    name it)."""
    where = whole(where) if isinstance(where, str) else where
    spec = spec_get(where.model)
    read = layer.in_bytes or (in_bytes or 0)
    moved = layer.params * BYTES[precision] + batch * (read + layer.out_bytes)
    compute = peak_tflops(spec, precision) * 1e12 * where.compute_fraction * COMPUTE_EFFICIENCY
    bandwidth = spec.bandwidth_gbs * 1e9 * where.bandwidth_fraction * MEMORY_EFFICIENCY
    busy = max(layer.flops * batch / compute, moved / bandwidth)
    return (busy + layer.kernels * KERNEL_LAUNCH_SECONDS) * 1000.0
