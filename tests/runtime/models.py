"""Tiny models shared by the runtime tests (other test modules import these: keep them stable).

All are small enough that a training step takes milliseconds on one CPU thread."""

from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    """Two 3x3 convolutions and a small head on 3x16x16 images, 10 classes. Conv-dominated."""

    def __init__(self, channels: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
        )
        self.head = nn.Linear(2 * channels * 4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


class ViewCNN(SmallCNN):
    """SmallCNN whose forward flattens with `.view`, which fails on channels-last activations."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x)
        return self.head(h.view(h.size(0), -1))


class MLP(nn.Module):
    """A 2-layer MLP: 16 features in, 4 classes out."""

    def __init__(self, features: int = 16, hidden: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def cnn_data(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random 3x16x16 images whose class is decided by per-channel mean brightness (learnable)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 16, 16, generator=g)
    y = (x.mean(dim=(2, 3)) @ torch.tensor([3.0, -2.0, 1.0]) * 4).long().clamp(-4, 5) + 4
    return x, y


def mlp_data(n: int = 128, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian features whose class is the argmax of a fixed linear map (learnable)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 4, generator=torch.Generator().manual_seed(1234))
    return x, (x @ w).argmax(dim=1)


def batches(x: torch.Tensor, y: torch.Tensor, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`(x, y)` cut into a list of batches (a plain list is a valid loader for optimize())."""
    return [(x[i : i + size], y[i : i + size]) for i in range(0, len(x), size)]


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: object,
    epochs: int = 1,
    clip: float | None = 1.0,
) -> list[float]:
    """The user's loop, exactly as a user writes it, returning every step's loss."""
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            losses.append(loss.item())
    return losses
