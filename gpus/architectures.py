"""Real model architectures from their published configurations: layer counts and widths, no weights.

The performance model (``gpus.performance``) turns these into FLOPs, bytes moved and memory per step.
Transformers are given by their Hugging Face ``config.json`` figures (layers, hidden size, feed-forward
size, attention heads and key/value heads, vocabulary, gated MLP or not, tied embeddings or not); vision
transformers by the same figures with 16×16 patches. Convolutional networks by torchvision's published
multiply-accumulates and parameters at 224×224 (torchvision's model tables list them as "GFLOPS", which
count multiply-accumulates); their forward activation sizes are our estimate from the layer output shapes
(sum of each stage's feature-map elements), which the docs say plainly (docs/tiering.md §1).

Nothing here is downloaded or loaded: the figures are typed in, each with where it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Transformer:
    name: str
    kind: str  # "decoder" (causal LM), "encoder" (BERT-like), "vit" (image patches)
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    gated: bool = False  # SwiGLU MLP: three ffn matrices instead of two
    tied: bool = True  # the output head shares the embedding matrix
    patch: int = 0  # vision transformers: patch size in pixels
    # how a framework runs a layer (config.json: the norm, the position encoding, the activation function); they
    # decide how many operations an eager step dispatches and how much unfused elementwise traffic it moves
    norm: str = "layer"  # "layer" (LayerNorm, one kernel) or "rms" (RMSNorm, written out: eight operations)
    rope: bool = False  # rotary position embedding applied to queries and keys (about seven operations each)
    activation: str = "gelu"  # "gelu" / "relu" (one kernel), "gelu_new" (tanh approximation, eight), "silu"

    @property
    def kv_dim(self) -> int:
        return self.hidden * self.kv_heads // self.heads

    @property
    def layer_params(self) -> int:
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_dim
        mlp = (3 if self.gated else 2) * self.hidden * self.ffn
        return attention + mlp

    @property
    def nonembedding_params(self) -> int:
        return self.layers * self.layer_params

    @property
    def embedding_params(self) -> int:
        if self.kind == "vit":
            return 3 * self.patch * self.patch * self.hidden
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def params(self) -> int:
        return self.nonembedding_params + self.embedding_params

    def tokens(self, seq_len: int, image_size: int) -> int:
        """Tokens of one sample: the sequence length, or the patches (+ class token) of an image."""
        if self.kind == "vit":
            return (image_size // self.patch) ** 2 + 1
        return seq_len


@dataclass(frozen=True, slots=True)
class ConvNet:
    name: str
    gmacs: float  # multiply-accumulates per 224×224 image, billions (torchvision)
    params_m: float  # parameters, millions (torchvision)
    activations_m: float  # forward activation elements per 224×224 image, millions (our estimate)
    kind: str = "cnn"
    convs: int = 50  # convolution and linear layers (torchvision's model definitions)
    peak_map_m: float = 0.8  # the largest feature map of one 224×224 image, millions of elements (layer shapes)
    # the tensors an eager forward pass holds at its peak, in largest feature maps per sample (beside the input
    # image, which the caller holds): counted from torchvision's module code and the layer shapes, not fitted —
    # a convolution's output and its batch norm's (not in place) are both alive while the norm runs, ReLU runs in
    # place, a residual block keeps its input until the add (the comment on each architecture says where the
    # peak is)
    live_maps: float = 2.0

    @property
    def params(self) -> int:
        return int(self.params_m * 1e6)


def _t(name, kind, layers, hidden, ffn, heads, kv_heads, vocab, **extra) -> Transformer:
    return Transformer(name, kind, layers, hidden, ffn, heads, kv_heads, vocab, **extra)


_LLAMA = {"norm": "rms", "rope": True, "activation": "silu"}  # LLaMA's layer: RMSNorm, rotary, SwiGLU

ARCHITECTURES: dict[str, Transformer | ConvNet] = {a.name: a for a in (
    # encoders (config.json of the Hugging Face checkpoints)
    _t("distilbert-base", "encoder", 6, 768, 3072, 12, 12, 30522),
    _t("bert-base", "encoder", 12, 768, 3072, 12, 12, 30522),
    _t("bert-large", "encoder", 24, 1024, 4096, 16, 16, 30522),
    _t("roberta-large", "encoder", 24, 1024, 4096, 16, 16, 50265),
    # decoders
    _t("gpt2", "decoder", 12, 768, 3072, 12, 12, 50257, activation="gelu_new"),
    _t("gpt2-medium", "decoder", 24, 1024, 4096, 16, 16, 50257, activation="gelu_new"),
    _t("gpt2-large", "decoder", 36, 1280, 5120, 20, 20, 50257, activation="gelu_new"),
    _t("gpt2-xl", "decoder", 48, 1600, 6400, 25, 25, 50257, activation="gelu_new"),
    _t("qwen2-0.5b", "decoder", 24, 896, 4864, 14, 2, 151936, gated=True, norm="rms", rope=True,
       activation="silu"),
    _t("tinyllama-1.1b", "decoder", 22, 2048, 5632, 32, 4, 32000, gated=True, tied=False, **_LLAMA),
    _t("opt-1.3b", "decoder", 24, 2048, 8192, 32, 32, 50272, activation="relu"),
    _t("phi-2", "decoder", 32, 2560, 10240, 32, 32, 51200, tied=False, rope=True, activation="gelu_new"),
    _t("opt-6.7b", "decoder", 32, 4096, 16384, 32, 32, 50272, activation="relu"),
    _t("gpt-j-6b", "decoder", 28, 4096, 16384, 16, 16, 50400, tied=False, rope=True, activation="gelu_new"),
    _t("llama-2-7b", "decoder", 32, 4096, 11008, 32, 32, 32000, gated=True, tied=False, **_LLAMA),
    _t("mistral-7b", "decoder", 32, 4096, 14336, 32, 8, 32000, gated=True, tied=False, **_LLAMA),
    _t("llama-3-8b", "decoder", 32, 4096, 14336, 32, 8, 128256, gated=True, tied=False, **_LLAMA),
    _t("llama-2-13b", "decoder", 40, 5120, 13824, 40, 40, 32000, gated=True, tied=False, **_LLAMA),
    # vision transformers (ViT-B/16, ViT-L/16)
    _t("vit-b-16", "vit", 12, 768, 3072, 12, 12, 0, patch=16),
    _t("vit-l-16", "vit", 24, 1024, 4096, 16, 16, 0, patch=16),
    # convolutional networks (torchvision: GMACs and parameters at 224×224)
    # features[2]'s expansion (16 → 96 channels at 112²): the convolution's output and its batch norm's (ReLU6 in
    # place) beside the block's input (16 channels: 1/6 map)
    ConvNet("mobilenet-v2", 0.30, 3.5, 6.7, convs=52, peak_map_m=1.20, live_maps=2.17),
    # stage 2's first MBConv expansion (16 → 96 channels at 112²), as mobilenet-v2 (SiLU in place)
    ConvNet("efficientnet-b0", 0.39, 5.3, 8.0, convs=81, peak_map_m=1.20, live_maps=2.17),
    # the stem (64 channels at 112²): the convolution's output and its batch norm's; layer1's blocks hold 1/4 map each
    ConvNet("resnet-18", 1.81, 11.7, 2.5, convs=20, peak_map_m=0.80, live_maps=2.0),
    ConvNet("resnet-34", 3.66, 21.8, 3.7, convs=36, peak_map_m=0.80, live_maps=2.0),  # as resnet-18
    # the end of dense block 1 (256 channels at 56²): the layers' outputs kept in the block's list, their
    # concatenation and the transition's batch norm
    ConvNet("densenet-121", 2.83, 8.0, 9.0, convs=120, peak_map_m=0.80, live_maps=3.0),
    # layer1's first bottleneck (256 channels at 56²) computing its downsample: the block's input (64 channels:
    # 1/4 map), the third batch norm's output, the downsample convolution's and its batch norm's
    ConvNet("resnet-50", 4.09, 25.6, 10.0, convs=53, peak_map_m=0.80, live_maps=3.25),
    # stage 1's block (96 channels at 56², the MLP 4× wider): the block's input (1/4 map), the first linear layer's
    # output and GELU's (not in place)
    ConvNet("convnext-tiny", 4.46, 28.6, 8.0, convs=58, peak_map_m=1.20, live_maps=2.25),
    ConvNet("resnet-101", 7.80, 44.5, 15.0, convs=104, peak_map_m=0.80, live_maps=3.25),  # as resnet-50
    ConvNet("resnet-152", 11.51, 60.2, 21.0, convs=155, peak_map_m=0.80, live_maps=3.25),  # as resnet-50
    # conv1_2 (64 channels at 224²): its input and its output (ReLU in place, no batch norm)
    ConvNet("vgg-16", 15.47, 138.4, 15.0, convs=16, peak_map_m=3.21, live_maps=2.0),
)}

FAMILIES = ("encoder", "decoder", "vit", "cnn")


class UnknownArchitecture(KeyError):
    pass


def architecture_get(name: str) -> Transformer | ConvNet:
    try:
        return ARCHITECTURES[name.lower()]
    except KeyError:
        raise UnknownArchitecture(f"unknown architecture {name!r}; known: {', '.join(sorted(ARCHITECTURES))}") from None
