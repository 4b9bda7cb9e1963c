"""The peers, configured as their users would when they are installed: Hugging Face Accelerate
and Lightning Fabric, each in its bf16 mixed-precision and its fp32 configuration (a user on a
CPU without native bf16 picks fp32: there bf16 is emulated and slower), and pytorch-autotune
(its search, then its `result.step(x, y)`; the real-size GPU bench uses it). All are optional;
a missing one is a skip with a note, never an error."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

# step(x, y) -> loss as a float; the loop around it is the harness's.
Step = Callable[[Any, Any], torch.Tensor]


# The peers `pip install "autoopt[bench]"` brings.
BENCH_EXTRA = ("accelerate", "lightning")


def missing(package: str) -> str | None:
    """Why a peer cannot run here (None when it can)."""
    if importlib.util.find_spec(package) is None:
        extra = ', or "autoopt[bench]"' if package in BENCH_EXTRA else ""
        return f"{package} is not installed (pip install {package}{extra})"
    return None


def describe(packages: Sequence[str]) -> str:
    """`accelerate 1.15.0, lightning is not installed (...)`: what `bench` will compare with."""
    said = []
    for package in packages:
        why = missing(package)
        said.append(why or f"{package} {_version(package)}")
    return "; ".join(said)


def _version(package: str) -> str:
    """The installed version; a package importable without its metadata (a source tree on the
    path, a module put in place by a test) says so instead of failing the bench's header."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown: no package metadata)"


def accelerate(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    precision: str,
    compile: bool,
) -> tuple[Any, Callable[[Any, Any], torch.Tensor]]:
    """`Accelerator(mixed_precision=precision)` ("bf16" or "no"), with torch.compile through
    its `dynamo_backend` option as the Accelerate docs suggest; the loop calls
    `accelerator.backward(loss)`."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    # One process may set up several configurations (interleaved runs): Accelerate keeps its
    # state in a process-wide singleton that refuses a second, different mixed_precision.
    AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = Accelerator(
        mixed_precision=precision, dynamo_backend="inductor" if compile else "no"
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
    precision: str,
) -> tuple[Any, Callable[[Any, Any], torch.Tensor]]:
    """`Fabric(precision=precision)` ("bf16-mixed" or "32-true") on one device; the loop calls
    `fabric.backward(loss)`."""
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="auto", devices=1, precision=precision)
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


def pytorch_autotune(
    model: nn.Module,
    loader: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    device: torch.device,
    lr: float,
    search_s: float,
) -> tuple[Any, Callable[[Any, Any], torch.Tensor], dict[str, Any]]:
    """`autotune(model, (x, y), loss_fn=..., budget=search_s)` on the loader's first batch, as its
    README shows, then `result.step(x, y)` in the loop. It builds its own AdamW (`lr`) and
    leaves the winner's global flags (TF32, cudnn.benchmark) set; `cache=False`, so the search
    is measured every run. Returns the loader, the step and what it picked."""
    from pytorch_autotune import autotune

    x, y = next(iter(loader))
    result = autotune(
        model,
        (x.to(device), y.to(device)),
        loss_fn=loss_fn,
        optimizer="adamw",
        lr=lr,
        budget=max(1, round(search_s)),
        device=device.type,
        cache=False,
        verbose=False,
    )

    def step(x: Any, y: Any) -> torch.Tensor:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        return result.step(x, y)

    notes = {"pick": result.config.label, "search": result.summary(), "trials": str(result.report)}
    return loader, step, notes
