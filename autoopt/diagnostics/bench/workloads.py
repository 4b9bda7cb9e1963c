"""The reference workloads: small enough to time on 2 CPU cores, each with synthetic data from a
fixed seed, so every configuration of a run trains on exactly the same batches."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

SEED = 0


@dataclass(frozen=True)
class Workload:
    """A model, its data and its loss. `build()` is deterministic (seeded), so two calls give the
    same initial weights; `dataset()` likewise gives the same batches."""

    name: str
    description: str
    build: Callable[[], nn.Module]
    make_data: Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    batch_size: int
    batches: int = 8  # distinct batches in the dataset; epochs cycle over them
    conv: bool = False  # channels-last is a candidate trick only for convolutional models
    sequential: bool = False  # activation checkpointing is a candidate only for nn.Sequential

    def model(self) -> nn.Module:
        torch.manual_seed(SEED)
        return self.build()

    def dataset(self) -> TensorDataset:
        g = torch.Generator().manual_seed(SEED + 1)
        x, y = self.make_data(self.batch_size * self.batches, g)
        return TensorDataset(x, y)

    def loader(self) -> DataLoader:
        """The loader a user would write: shuffled with a seeded generator, no workers."""
        g = torch.Generator().manual_seed(SEED + 2)
        return DataLoader(
            self.dataset(), batch_size=self.batch_size, shuffle=True, drop_last=True, generator=g
        )

    def example_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.dataset().tensors
        return x[: self.batch_size], y[: self.batch_size]


# --- models ---------------------------------------------------------------------------------


class SmallCNN(nn.Module):
    """Three conv blocks and a linear head for 3x32x32 images (CIFAR-sized)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1),
            nn.BatchNorm2d(128),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def mlp(inputs: int = 784, width: int = 512, depth: int = 6, classes: int = 10) -> nn.Sequential:
    """A plain ReLU MLP, `depth` linear layers."""
    layers: list[nn.Module] = [nn.Linear(inputs, width), nn.ReLU()]
    for _ in range(depth - 2):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


class TransformerLM(nn.Module):
    """A causal transformer-encoder language model (pre-norm, learned positions)."""

    def __init__(
        self, vocab: int = 1000, d_model: int = 128, heads: int = 4, layers: int = 4, seq: int = 64
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(seq, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(
            d_model, heads, 4 * d_model, dropout=0.1, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        h = self.embed(tokens) + self.pos[:t]
        h = self.encoder(h, mask=self.mask[:t, :t], is_causal=True)
        return self.head(h)


class LSTMLM(nn.Module):
    """A two-layer LSTM language model."""

    def __init__(self, vocab: int = 1000, embed: int = 128, hidden: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=2, batch_first=True, dropout=0.1)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out)


def deep_linear(depth: int = 72, width: int = 1000) -> nn.Sequential:
    """Seed 003's memory workload: 72 x Linear(1000, 1000) in one nn.Sequential."""
    return nn.Sequential(*(nn.Linear(width, width) for _ in range(depth)))


# --- data -----------------------------------------------------------------------------------


def _images(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    # Labels from a fixed random teacher so the task is learnable (the loss falls).
    x = torch.randn(n, 3, 32, 32, generator=g)
    teacher = torch.randn(3 * 32 * 32, 10, generator=g)
    return x, (x.flatten(1) @ teacher).argmax(1)


def _vectors(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 784, generator=g)
    teacher = torch.randn(784, 10, generator=g)
    return x, (x @ teacher).argmax(1)


def token_data(seq: int, vocab: int = 1000) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """Sequences of `seq` tokens in a repeating pattern (next-token prediction is learnable),
    and their targets shifted by one: a workload's `make_data`."""

    def make(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        start = torch.randint(0, vocab, (n, 1), generator=g)
        stride = torch.randint(1, 7, (n, 1), generator=g)
        seqs = (start + stride * torch.arange(seq + 1)) % vocab
        return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()

    return make


def _regression(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 1000, generator=g)
    return x, torch.randn(n, 1000, generator=g)


def _lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "cnn",
            "3-block CNN, 3x32x32 images, batch 64",
            SmallCNN,
            _images,
            F.cross_entropy,
            batch_size=64,
            conv=True,
        ),
        Workload(
            "mlp",
            "6-layer ReLU MLP 784-512-10, batch 256",
            mlp,
            _vectors,
            F.cross_entropy,
            batch_size=256,
            sequential=True,
        ),
        Workload(
            "transformer",
            "4-layer causal transformer encoder LM, d=128, seq 64, vocab 1000, batch 16",
            TransformerLM,
            token_data(64),
            _lm_loss,
            batch_size=16,
        ),
        Workload(
            "lstm",
            "2-layer LSTM LM, hidden 256, seq 32, vocab 1000, batch 32",
            LSTMLM,
            token_data(32),
            _lm_loss,
            batch_size=32,
        ),
        Workload(
            "deep_linear",
            "72 x Linear(1000, 1000) nn.Sequential (from a widely read PyTorch tutorial), batch 64",
            deep_linear,
            _regression,
            F.mse_loss,
            batch_size=64,
            batches=4,
            sequential=True,
        ),
    )
}


def checkpoint_segments(model: nn.Sequential) -> int:
    """About sqrt(n) segments, the classic memory/compute balance for checkpoint_sequential."""
    return max(1, round(math.sqrt(len(model))))
