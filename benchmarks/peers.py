"""The peers, configured as their users would when they are installed: Hugging Face Accelerate
and Lightning Fabric. Both are optional; a missing one is a skip with a note, never an error."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

# step(x, y) -> loss as a float; the loop around it is the harness's.
Step = Callable[[Any, Any], torch.Tensor]


def missing(package: str) -> str | None:
    """Why a peer cannot run here (None when it can)."""
    if importlib.util.find_spec(package) is None:
        return f"{package} is not installed (pip install {package})"
    return None


def accelerate(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    compile: bool,
) -> tuple[Any, Callable[[Any, Any], torch.Tensor]]:
    """`Accelerator(mixed_precision="bf16")`, with torch.compile through its `dynamo_backend`
    option as the Accelerate docs suggest; the loop calls `accelerator.backward(loss)`."""
    from accelerate import Accelerator

    accelerator = Accelerator(
        mixed_precision="bf16", dynamo_backend="inductor" if compile else "no"
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    def step(x: Any, y: Any) -> torch.Tensor:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        return loss

    return loader, step


def fabric(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor],
) -> tuple[Any, Callable[[Any, Any], torch.Tensor]]:
    """`Fabric(precision="bf16-mixed")` on one device; the loop calls `fabric.backward(loss)`."""
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="auto", devices=1, precision="bf16-mixed")
    fabric.launch()
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)

    def step(x: Any, y: Any) -> torch.Tensor:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        fabric.backward(loss)
        optimizer.step()
        return loss

    return loader, step
