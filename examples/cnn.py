"""A small CNN on synthetic CIFAR-sized data, trained by a plain loop plus one autoopt line.

    python examples/cnn.py                 # with autoopt.optimize()
    python examples/cnn.py --no-optimize   # the same loop without it
    python examples/cnn.py --compare       # both, side by side, and the speed-up
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import autoopt


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def synthetic_cifar(n: int, seed: int = 0) -> TensorDataset:
    """Random 3x32x32 images labelled by a fixed random teacher, so the task is learnable."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 32, 32, generator=g)
    teacher = torch.randn(3 * 32 * 32, 10, generator=g)
    y = (x.flatten(1) @ teacher).argmax(1)
    return TensorDataset(x, y)


class Session:
    """One training run of the loop below, stepped on demand (the demo times two side by side)."""

    def __init__(self, use_autoopt: bool, batch_size: int, verbose: bool = True) -> None:
        torch.manual_seed(0)
        model = SmallCNN()
        loader = DataLoader(synthetic_cifar(batch_size * 16), batch_size=batch_size, shuffle=True)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        if use_autoopt:
            model, loader, optimizer = autoopt.optimize(model, loader, optimizer, verbose=verbose)
        self.model, self.loader, self.optimizer = model, loader, optimizer
        self.loss_fn = nn.CrossEntropyLoss()
        self.losses: list[float] = []
        self.model.train()
        self._batches = iter(())

    def _next(self) -> tuple[torch.Tensor, torch.Tensor]:
        for _ in range(2):
            try:
                return next(self._batches)
            except StopIteration:
                self._batches = iter(self.loader)  # a new epoch
        raise RuntimeError("the loader is empty")

    def steps(self, n: int) -> None:
        """`n` steps of the user's loop, unchanged."""
        model, optimizer, loss_fn = self.model, self.optimizer, self.loss_fn
        for _ in range(n):
            x, y = self._next()
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            self.losses.append(loss.item())

    def decided(self) -> dict[str, str]:
        """What optimize() decided on the first steps (backends, channels_last, amp)."""
        report = autoopt.report(self.model)
        return {p: report[p].detail for p in ("backends", "channels_last", "amp")}


# 10 warm-up steps: optimize() times its optimizer step over the first 10 on CPU.
WARMUP = 10


def train(use_autoopt: bool, steps: int, batch_size: int, verbose: bool = True) -> dict:
    """Train for `steps` batches; returns steps/s (warm-up excluded), first/last loss and, with
    autoopt, the decisions it took on the first steps (report lines of backends, channels_last,
    amp)."""
    run = Session(use_autoopt, batch_size, verbose)
    run.steps(WARMUP)
    start = time.perf_counter()
    run.steps(steps)
    elapsed = time.perf_counter() - start
    result = {"steps_per_s": steps / elapsed, "first_loss": run.losses[0], "last_loss": run.losses[-1]}
    if use_autoopt:
        result["decided"] = run.decided()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--no-optimize", action="store_true", help="run the loop without autoopt")
    mode.add_argument("--compare", action="store_true", help="run both ways and compare")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    runs = [False, True] if args.compare else [not args.no_optimize]
    results = {}
    for use in runs:
        r = train(use, args.steps, args.batch_size)
        label = "autoopt" if use else "eager"
        results[label] = r
        print(f"cnn {label:>7}: {r['steps_per_s']:7.2f} steps/s  "
              f"loss {r['first_loss']:.3f} -> {r['last_loss']:.3f}")
    if args.compare:
        print(f"cnn speed-up: {results['autoopt']['steps_per_s'] / results['eager']['steps_per_s']:.2f}x")


if __name__ == "__main__":
    main()
