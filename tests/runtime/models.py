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


# --- models that draw random numbers in training: autoopt must draw the same as eager ---------


class DropoutMLP(MLP):
    """MLP with Dropout between its layers."""

    def __init__(self, features: int = 16, hidden: int = 32, classes: int = 4) -> None:
        super().__init__(features, hidden, classes)
        self.net.insert(2, nn.Dropout(0.3))


class DropPath(nn.Module):
    """Stochastic depth as timm writes it: a residual branch dropped per sample."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(1 - self.p)
        return x * keep / (1 - self.p)


class DropPathNet(nn.Module):
    """Two residual blocks with drop-path: 16 features in, 4 classes out."""

    def __init__(self, features: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(features, features), nn.GELU()) for _ in range(2)
        )
        self.drop_path = DropPath(0.25)
        self.head = nn.Linear(features, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + self.drop_path(block(x))
        return self.head(x)


class VAE(nn.Module):
    """A VAE classifier head: the latent is reparameterised with `randn_like`."""

    def __init__(self, features: int = 16, latent: int = 8, classes: int = 4) -> None:
        super().__init__()
        self.encoder = nn.Linear(features, 2 * latent)
        self.decoder = nn.Linear(latent, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu, logvar = self.encoder(x).chunk(2, dim=1)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.decoder(z)


RANDOM_MODELS = {"dropout": DropoutMLP, "drop-path": DropPathNet, "randn_like": VAE}
