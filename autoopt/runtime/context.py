"""The state that the passes of one `optimize()` call share and hand to each other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import torch
from torch import nn

from autoopt.runtime.memory import StepMemory
from autoopt.runtime.options import Options
from autoopt.runtime.report import Report

Forward = Callable[..., Any]


class Stage(IntEnum):
    """Where a forward layer sits. Lower stages wrap closer to the user's forward, so
    INPUT layers see the raw call first and OUTER layers see outputs last:
    call -> OUTER -> COMPILE -> INNER -> INPUT(x) -> user forward."""

    INPUT = 10  # input conversions inside the compiled region (channels-last inputs)
    INNER = 20  # autocast + fp32 outputs (traced by compile)
    COMPILE = 30  # torch.compile / TorchScript of everything below
    OUTER = 40  # outside compile: loss-scaling hooks on outputs, device moves of inputs


@dataclass
class ForwardLayer:
    """`wrap(forward) -> forward`: a pass's change to the model's forward.

    The returned forward is stored on the model, so it must survive `copy.deepcopy` and pickle
    with the model: an instance of a module-level class, or a `functools.partial` of the methods
    of such objects, holding the module itself (never a closure or one of its bound methods)."""

    name: str
    stage: Stage
    wrap: Callable[[Forward], Forward]


@dataclass
class StepLayer:
    """`wrap(step) -> step` around `optimizer.step`; `zero_grad` may be wrapped likewise. Like
    forward layers, the results are objects of module-level classes (or partials of their
    methods), not closures."""

    name: str
    wrap_step: Callable[[Callable[..., Any]], Callable[..., Any]]
    wrap_zero_grad: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None


@dataclass
class DistState:
    """Set by the distributed pass when running under torchrun with WORLD_SIZE > 1."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    # How the model is spread over the ranks: "ddp" (replicated) or "fsdp" (sharded, FSDP2).
    strategy: str = "ddp"


@dataclass
class Context:
    """Mutable state of one optimize() call. Passes read what earlier passes decided
    (device, amp dtype, distributed state) and register layers; `optimize()` composes them."""

    options: Options
    model: nn.Module
    loader: Any | None
    optimizer: torch.optim.Optimizer | None
    report: Report = field(default_factory=Report)
    device: torch.device | None = None
    amp_dtype: torch.dtype | None = None
    dist: DistState | None = None
    # What one step holds on the device, as the memory-aware passes planned it (None: not asked).
    memory: StepMemory | None = None
    forward_layers: list[ForwardLayer] = field(default_factory=list)
    step_layers: list[StepLayer] = field(default_factory=list)
    # Applied by the loader wrapper to every batch, in order (device move, channels-last, ...).
    batch_transforms: list[Callable[[Any], Any]] = field(default_factory=list)
    # Run after the forward and optimizer have been patched (e.g. wrap the model in DDP).
    finalizers: list[Callable[[Context], None]] = field(default_factory=list)
    # What optimize() hands back as the model (the DDP wrapper when distributed).
    returned_model: nn.Module | None = None
    # Free-form notes passes leave for later passes (e.g. "loss_scaler").
    extras: dict[str, Any] = field(default_factory=dict)
    # Undo what a pass changed outside the model, optimizer and loader (global torch flags),
    # run newest first if optimize() fails after the pass ran.
    undo: list[Callable[[], object]] = field(default_factory=list)
    # Replaces the module's own forward at the bottom of the layer stack (TorchScript does this);
    # None keeps the user's forward. It must fall back to the user's forward by itself, and
    # follow the same rule as a forward layer's result (see ForwardLayer).
    base_forward: Forward | None = None
