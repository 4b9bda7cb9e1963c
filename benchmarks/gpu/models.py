"""The real-size workloads of the quick GPU check, written in plain torch (no transformers, no
torchvision: the lent image may lack them), each at its real size and at a tiny size for the CPU
rehearsal. The same classes build both, so the rehearsal runs the code the GPU runs.

- GPT-2 small (124M): 12 pre-LN blocks, d=768, 12 heads, vocab 50257, dropout 0.1, tied
  embeddings, as GPT-2 has them; sequence 512, batch 8.
- ResNet-50 (bottleneck blocks 3-4-6-3, 1000 classes) at 224px, batch 64.
- ResNet-18 (basic blocks 2-2-2-2, 10 classes) at 32px, batch 128, with the CIFAR stem (a 3x3
  convolution, no max-pool) as pytorch-autotune's table uses.
- A 6-layer transformer encoder LM (`nn.TransformerEncoder`, d=512, 8 heads, feed-forward 2048,
  vocab 10000) at sequence 128, batch 32: pytorch-autotune's "Transformer 6L, s128, b32".

Data are synthetic from fixed seeds (`Workload` of the bench package), so every configuration
trains on the same batches.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from autoopt.diagnostics.bench.workloads import Workload, token_data

SIZES = ("real", "tiny")


# --- GPT-2 ------------------------------------------------------------------------------------


class GPT2Block(nn.Module):
    """Pre-LN: x + attn(ln(x)), then x + mlp(ln(x)); causal attention through SDPA."""

    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.ln_1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(
            nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.mlp(self.ln_2(x)))


class GPT2(nn.Module):
    """GPT-2: token and position embeddings, pre-LN blocks, a final LayerNorm, the head tied to
    the token embedding."""

    def __init__(
        self, vocab: int, context: int, layers: int, d: int, heads: int, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(GPT2Block(d, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight
        for name, p in self.named_parameters():  # GPT-2's initialisation
            if p.dim() == 2:
                std = 0.02 / (2 * layers) ** 0.5 if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.wte(tokens) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


# --- ResNets ----------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.shortcut = _shortcut(cin, width, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)  # stride here (v1.5)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.shortcut = _shortcut(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        return F.relu(self.bn3(self.conv3(out)) + self.shortcut(x))


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    """A ResNet of `block`s, four stages; `cifar_stem`: a 3x3 stride-1 convolution and no
    max-pool (32px images) instead of the 7x7 stride-2 convolution and max-pool."""

    def __init__(
        self,
        block: type[BasicBlock | Bottleneck],
        stages: tuple[int, ...],
        classes: int,
        width: int = 64,
        cifar_stem: bool = False,
    ) -> None:
        super().__init__()
        if cifar_stem:
            stem: list[nn.Module] = [nn.Conv2d(3, width, 3, 1, 1, bias=False)]
        else:
            stem = [nn.Conv2d(3, width, 7, 2, 3, bias=False)]
        stem += [nn.BatchNorm2d(width), nn.ReLU()]
        if not cifar_stem:
            stem.append(nn.MaxPool2d(3, 2, 1))
        self.stem = nn.Sequential(*stem)
        layers: list[nn.Module] = []
        cin = width
        for i, count in enumerate(stages):
            w = width * 2**i
            for j in range(count):
                layers.append(block(cin, w, 2 if j == 0 and i > 0 else 1))
                cin = w * block.expansion
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.layers(self.stem(x)).mean((2, 3)))


# --- transformer encoder ----------------------------------------------------------------------


class EncoderLM(nn.Module):
    """`nn.TransformerEncoder` (post-norm, torch's default layer) with learned positions and a
    next-token head, causal."""

    def __init__(self, vocab: int, seq: int, layers: int, d: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        h = self.embed(tokens) + self.pos[:t]
        return self.head(self.encoder(h, mask=self.mask[:t, :t], is_causal=True))


# --- data -------------------------------------------------------------------------------------


def _images(side: int, classes: int) -> Callable[[int, torch.Generator], tuple[torch.Tensor, ...]]:
    def make(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, 3, side, side, generator=g)
        # Labels from a fixed random teacher on an 8x8 summary: learnable, cheap at 224px.
        teacher = torch.randn(3 * 8 * 8, classes, generator=g)
        return x, (F.adaptive_avg_pool2d(x, 8).flatten(1) @ teacher).argmax(1)

    return make


def _lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


# --- the workloads ----------------------------------------------------------------------------


def workloads(size: str) -> dict[str, Workload]:
    """The four workloads at `size` ("real": what users train; "tiny": seconds on a CPU)."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose from {SIZES}")
    real = size == "real"
    # (vocab, seq, layers, d, heads, batch)
    g_vocab, g_seq, g_layers, g_d, g_heads, g_batch = (
        (50257, 512, 12, 768, 12, 8) if real else (512, 32, 2, 64, 4, 4)
    )
    e_vocab, e_seq, e_layers, e_d, e_heads, e_batch = (
        (10000, 128, 6, 512, 8, 32) if real else (512, 32, 2, 64, 4, 4)
    )
    width = 64 if real else 8
    r50_stages, r18_stages = ((3, 4, 6, 3), (2, 2, 2, 2)) if real else ((1, 1, 1, 1),) * 2
    r50_side, r50_batch, r18_batch = (224, 64, 128) if real else (32, 4, 8)
    found = [
        Workload(
            "gpt2",
            f"GPT-2 {'small (124M)' if real else 'tiny'}: {g_layers} pre-LN blocks, d={g_d}, "
            f"{g_heads} heads, vocab {g_vocab}, seq {g_seq}, batch {g_batch}",
            lambda: GPT2(g_vocab, 1024 if real else g_seq, g_layers, g_d, g_heads),
            token_data(g_seq, g_vocab),
            _lm_loss,
            batch_size=g_batch,
        ),
        Workload(
            "resnet50",
            f"ResNet-50{'' if real else ' (tiny: one block a stage, width 8)'}, "
            f"{r50_side}px, batch {r50_batch}",
            lambda: ResNet(Bottleneck, r50_stages, 1000 if real else 10, width),
            _images(r50_side, 1000 if real else 10),
            F.cross_entropy,
            batch_size=r50_batch,
            conv=True,
        ),
        Workload(
            "resnet18",
            f"ResNet-18{'' if real else ' (tiny: one block a stage, width 8)'}, CIFAR stem, "
            f"32px, batch {r18_batch}",
            lambda: ResNet(BasicBlock, r18_stages, 10, width, cifar_stem=True),
            _images(32, 10),
            F.cross_entropy,
            batch_size=r18_batch,
            conv=True,
        ),
        Workload(
            "encoder",
            f"{e_layers}-layer nn.TransformerEncoder LM, d={e_d}, {e_heads} heads, "
            f"vocab {e_vocab}, seq {e_seq}, batch {e_batch}",
            lambda: EncoderLM(e_vocab, e_seq, e_layers, e_d, e_heads),
            token_data(e_seq, e_vocab),
            _lm_loss,
            batch_size=e_batch,
        ),
    ]
    return {w.name: w for w in found}
