"""Layer tables of real model architectures, computed from their published configurations (no downloads).

Each layer carries its parameters, its FLOPs per sample (a multiply-add counts 2) and the size of what it
hands to the next layer per sample (FP16). Convolutions: ``2 * H_out * W_out * k^2 * C_in * C_out``;
transformer blocks: ``2 * params * tokens`` for the projections plus ``4 * tokens^2 * d`` for attention.
The totals match the published figures to a few per cent (ResNet-50: 25.6 M parameters, 4.1 GMAC;
BERT-base: 110 M; Llama-2-7B: 6.7 B), which ``tests/pipelines`` checks.
"""

from __future__ import annotations

from dataclasses import dataclass

BYTES_FP16 = 2


@dataclass(frozen=True, slots=True)
class Layer:
    name: str
    params: int
    flops: float  # per sample
    out_bytes: int  # activation handed to the next layer, per sample
    in_bytes: int = 0  # activation it reads, per sample (0: the previous layer's out_bytes)


@dataclass(frozen=True, slots=True)
class Architecture:
    name: str
    layers: tuple[Layer, ...]
    source: str

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def flops(self) -> float:
        return sum(layer.flops for layer in self.layers)

    @property
    def weight_bytes(self) -> int:
        return self.params * BYTES_FP16


def _conv(h_out: int, k: int, c_in: int, c_out: int) -> tuple[int, float]:
    params = k * k * c_in * c_out
    return params, 2.0 * h_out * h_out * params


def resnet(depth: int, image: int = 224, classes: int = 1000) -> Architecture:
    """ResNet-50/101/152 (He et al. 2016, Table 1): bottleneck blocks [3,4,6,3] / [3,4,23,3] / [3,8,36,3]."""
    blocks = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}[depth]
    layers: list[Layer] = []
    side = image // 2
    params, flops = _conv(side, 7, 3, 64)
    side //= 2  # max pool
    layers.append(Layer("stem", params + 2 * 64, flops, side * side * 64 * BYTES_FP16, image * image * 3 * BYTES_FP16))
    c_in = 64
    for stage, count in enumerate(blocks):
        mid = 64 * 2 ** stage
        out = mid * 4
        for block in range(count):
            stride = 2 if block == 0 and stage > 0 else 1
            side_out = side // stride
            p1, f1 = _conv(side, 1, c_in, mid)  # torchvision puts the stride on the 3x3
            f1 = 2.0 * side * side * p1
            p2, f2 = _conv(side_out, 3, mid, mid)
            p3, f3 = _conv(side_out, 1, mid, out)
            params, flops = p1 + p2 + p3 + 2 * (mid * 2 + out), f1 + f2 + f3
            if block == 0:
                pd, fd = _conv(side_out, 1, c_in, out)
                params, flops = params + pd + 2 * out, flops + fd
            layers.append(Layer(f"layer{stage + 1}.{block}", params, flops, side_out * side_out * out * BYTES_FP16))
            c_in, side = out, side_out
    layers.append(Layer("fc", c_in * classes + classes, 2.0 * c_in * classes, classes * BYTES_FP16))
    return Architecture(f"resnet{depth}", tuple(layers), f"He et al. 2016 Table 1, {image}x{image} input")


def _encoder_block(name: str, d: int, ffn: int, tokens: int, kv: int | None = None, gated: bool = False) -> Layer:
    kv = d if kv is None else kv
    attention = 2 * d * d + 2 * d * kv  # q, o; k, v (grouped-query attention: narrower k, v)
    mlp = (3 if gated else 2) * d * ffn
    params = attention + mlp + (2 * d if gated else 4 * d + 2 * ffn + 2 * kv + 2 * d)  # norms (+ biases)
    flops = 2.0 * (attention + mlp) * tokens + 4.0 * tokens * tokens * d
    return Layer(name, params, flops, tokens * d * BYTES_FP16)


def transformer(name: str, *, d: int, layers: int, ffn: int, tokens: int, vocab: int = 0, kv: int | None = None,
                gated: bool = False, head: int = 0, source: str, extra_in: int = 0) -> Architecture:
    table: list[Layer] = []
    if vocab:
        table.append(Layer("embed", vocab * d + extra_in, 0.0, tokens * d * BYTES_FP16, tokens * 4))
    for index in range(layers):
        table.append(_encoder_block(f"block{index}", d, ffn, tokens, kv, gated))
    if head:
        table.append(Layer("head", d * head, 2.0 * d * head, head * BYTES_FP16))
    return Architecture(name, tuple(table), source)


def vit(size: str = "b16", image: int = 224) -> Architecture:
    d, depth, ffn = {"b16": (768, 12, 3072), "l16": (1024, 24, 4096)}[size]
    tokens = (image // 16) ** 2 + 1
    arch = transformer(f"vit_{size}", d=d, layers=depth, ffn=ffn, tokens=tokens, head=1000,
                       source=f"Dosovitskiy et al. 2021 Table 1 (ViT-{size[0].upper()}/16), {image}x{image} input")
    patch = 16 * 16 * 3 * d
    embed = Layer("patch_embed", patch + tokens * d, 2.0 * patch * (tokens - 1), tokens * d * BYTES_FP16,
                  image * image * 3 * BYTES_FP16)
    return Architecture(arch.name, (embed, *arch.layers), arch.source)


def bert(size: str = "base", tokens: int = 128) -> Architecture:
    d, depth, ffn = {"base": (768, 12, 3072), "large": (1024, 24, 4096)}[size]
    return transformer(f"bert_{size}", d=d, layers=depth, ffn=ffn, tokens=tokens, vocab=30522, extra_in=514 * d,
                       head=2, source=f"Devlin et al. 2019 (BERT-{size}: hidden {d}, {depth} layers), {tokens} tokens")


def gpt2(size: str = "small", tokens: int = 512) -> Architecture:
    d, depth = {"small": (768, 12), "medium": (1024, 24), "large": (1280, 36), "xl": (1600, 48)}[size]
    return transformer(f"gpt2_{size}", d=d, layers=depth, ffn=4 * d, tokens=tokens, vocab=50257, extra_in=1024 * d,
                       source=f"GPT-2 {size} config (n_embd {d}, n_layer {depth}), {tokens}-token prompt")


def llama2(size: str = "7b", tokens: int = 512) -> Architecture:
    d, depth, ffn, kv = {"7b": (4096, 32, 11008, 4096), "13b": (5120, 40, 13824, 5120),
                         "70b": (8192, 80, 28672, 1024)}[size]
    return transformer(f"llama2_{size}", d=d, layers=depth, ffn=ffn, tokens=tokens, vocab=32000, kv=kv, gated=True,
                       head=32000, source=f"Llama 2 {size} config (hidden {d}, {depth} layers, intermediate {ffn}, "
                       f"k/v width {kv}), {tokens}-token prompt")


ARCHITECTURES = {
    "resnet50": lambda: resnet(50),
    "resnet101": lambda: resnet(101),
    "resnet152": lambda: resnet(152),
    "vit_b16": lambda: vit("b16"),
    "vit_l16": lambda: vit("l16"),
    "bert_base": lambda: bert("base"),
    "bert_large": lambda: bert("large"),
    "gpt2_small": lambda: gpt2("small"),
    "gpt2_medium": lambda: gpt2("medium"),
    "gpt2_xl": lambda: gpt2("xl"),
    "llama2_7b": lambda: llama2("7b"),
    "llama2_13b": lambda: llama2("13b"),
    "llama2_70b": lambda: llama2("70b"),
}


class UnknownArchitecture(KeyError):
    pass


def architecture(name: str) -> Architecture:
    try:
        return ARCHITECTURES[name]()
    except KeyError:
        raise UnknownArchitecture(f"unknown architecture {name!r}; known: {', '.join(ARCHITECTURES)}") from None
