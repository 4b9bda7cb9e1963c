"""Pass: checkpoint (AO401). Trade recomputation for memory.

* `checkpoint="auto"` (the default) plans under the memory budget (`memory_budget`; "auto" is
  the free CUDA memory, no limit on CPU, so on CPU it acts only with an explicit budget). It
  works on the repeated block stacks of any model (`autoopt.runtime.checkpointing.block_stacks`: transformer
  layers in an `nn.ModuleList`, ResNet stages): at the first training forward it measures what
  each block saves for backward and checkpoints the fewest blocks that bring parameters,
  gradients, optimizer state and activations under the budget, selectively where that is enough
  (`autoopt.runtime.checkpointing.checkpoint_plan`; how a block runs: `autoopt.runtime.checkpointing.block_checkpoint`).
* `checkpoint=N` (int): every deep `nn.Sequential` (at least `MIN_LAYERS`, 8, direct children;
  the outermost ones) runs as `torch.utils.checkpoint.checkpoint_sequential(seq, N, x,
  use_reentrant=False)`: the first N - 1 segments are checkpointed, the last runs normally (its
  activations are needed at once by backward). N=1 has nothing to checkpoint: skipped.
* `checkpoint=False`: skipped.

Patching is in place (classes, parameters and `state_dict` keys stay) and acts only when grad is
enabled and the module is in training mode. The RNG state is preserved, so dropout masks in the
recomputation equal the first pass and the gradients equal the un-checkpointed ones; batch-norm
running statistics are restored after the recomputation, so they are updated once per step.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from autoopt.runtime.checkpointing.block_checkpoint import STATE_ATTR as BLOCK_STATE_ATTR
from autoopt.runtime.checkpointing.block_checkpoint import (
    BlockCheckpoint,
    BlockState,
    checkpoint_contexts,
    checkpoints_now,
)
from autoopt.runtime.checkpointing.block_stacks import find_block_stacks
from autoopt.runtime.checkpointing.checkpoint_plan import PLANNER_ATTR, Planner, PlanOnFirstForward
from autoopt.runtime.context import Context, Forward, ForwardLayer, Stage
from autoopt.runtime.forward import compose_forward
from autoopt.runtime.hardware import module_device
from autoopt.runtime.memory import AUTO, describe_budget, state_memory
from autoopt.runtime.report import PassResult

NAME = "checkpoint"
MIN_LAYERS = 8
_STATE_ATTR = "_autoopt_checkpoint"  # the CheckpointState, on a deep Sequential (checkpoint=N)
LAZY = "lazy"  # choose(): "auto" under a budget, decided at the first training forward


def find_deep_sequentials(
    model: nn.Module, min_layers: int = MIN_LAYERS
) -> list[tuple[str, nn.Sequential]]:
    """The outermost `nn.Sequential` modules with at least `min_layers` children, by name."""
    found: list[tuple[str, nn.Sequential]] = []

    def visit(prefix: str, module: nn.Module) -> None:
        if isinstance(module, nn.Sequential) and len(module) >= min_layers:
            found.append((prefix, module))
            return
        for name, child in module.named_children():
            visit(f"{prefix}.{name}" if prefix else name, child)

    visit("", model)
    return found


def choose(
    option: str | bool | int,
    model: nn.Module,
    device: torch.device | None,
    budget: int | str | None = AUTO,
) -> tuple[int | str | None, str]:
    """Segments per deep Sequential (an int >= 2), `LAZY` (plan the block stacks under the
    budget at the first training forward), or None (not applied), and why."""
    if option is False:
        return None, "checkpoint=False"
    if isinstance(option, int):
        stacks = _deep_sequentials(model)
        if not stacks:
            return None, f"no nn.Sequential with >= {MIN_LAYERS} layers"
        if option < 2:
            return None, f"checkpoint={option}: one segment is run plainly; ask for >= 2 segments"
        names = ", ".join(f"{n or '<model>'} ({len(s)} layers)" for n, s in stacks)
        return option, f"{names}: {option} segments each"
    blocks = _block_stacks(model)
    if not blocks:
        return (
            None,
            "no repeated block stack (an nn.ModuleList or nn.Sequential of same-class blocks)",
        )
    names = ", ".join(f"{n or '<model>'} ({len(b)} x {type(b[0]).__name__})" for n, _c, b in blocks)
    if budget is None:
        return None, f"memory_budget=None: no limit to plan for ({names})"
    device = device if device is not None else module_device(model)
    if budget == AUTO and device.type != "cuda":
        return None, (
            f"auto on {device.type}: memory_budget='auto' sets no limit off CUDA ({names}); "
            "pass memory_budget=<bytes> to plan checkpointing under it"
        )
    limit = describe_budget(budget)
    return LAZY, f"auto: {names}; blocks chosen at the first training forward to fit {limit}"


def run(ctx: Context) -> PassResult | None:
    """Patch the model as the `checkpoint` option asks (see the module docstring)."""
    budget = ctx.options.memory_budget
    decision, why = choose(ctx.options.checkpoint, ctx.model, ctx.device, budget)
    if decision is None:
        return PassResult.skipped(NAME, why)
    if isinstance(decision, int):
        for name, stack in _deep_sequentials(ctx.model):
            _patch_segments(stack, CheckpointState(name, min(decision, len(stack))))
        return PassResult.applied(NAME, why)
    ctx.memory = state_memory(ctx.model, ctx.optimizer)
    blocks = [
        (block, BlockState(name, index))
        for name, _container, stack in _block_stacks(ctx.model)
        for index, block in enumerate(stack)
    ]
    verbose = ctx.options.verbose and (ctx.dist is None or ctx.dist.rank == 0)
    planner = Planner(ctx.model, blocks, budget, ctx.memory, ctx.report, verbose)
    for block, state in blocks:
        state.planner = planner
        layer = functools.partial(BlockCheckpoint, block=block, state=state)
        compose_forward(block, [ForwardLayer(NAME, Stage.INNER, layer)])
        object.__setattr__(block, BLOCK_STATE_ATTR, state)
    object.__setattr__(ctx.model, PLANNER_ATTR, planner)
    # Outside compile: the measuring forward runs hooks that a compiled graph cannot hold.
    ctx.forward_layers.append(
        ForwardLayer(NAME, Stage.OUTER, functools.partial(PlanOnFirstForward, planner=planner))
    )
    return PassResult.skipped(NAME, why)


def _deep_sequentials(model: nn.Module) -> list[tuple[str, nn.Sequential]]:
    return [(n, s) for n, s in find_deep_sequentials(model) if not hasattr(s, _STATE_ATTR)]


def _block_stacks(model: nn.Module) -> list[tuple[str, nn.Module, list[nn.Module]]]:
    return [
        (n, c, b)
        for n, c, b in find_block_stacks(model)
        if not any(hasattr(block, BLOCK_STATE_ATTR) for block in b)
    ]


# --- checkpoint=N: segments of a deep Sequential ----------------------------------------------


@dataclass
class CheckpointState:
    """The segments of one deep Sequential; kept on it as `_autoopt_checkpoint`."""

    name: str
    segments: int


class CheckpointedForward:
    """A deep stack's forward: segmented with recomputation in training, plain otherwise."""

    def __init__(self, forward: Forward, stack: nn.Sequential, state: CheckpointState) -> None:
        self.forward = forward
        self.stack = stack
        self.state = state

    def __call__(self, input: Any) -> Any:
        if not checkpoints_now(self.stack):
            return self.forward(input)
        return run_segmented(list(self.stack.children()), self.state.segments, input)


def _patch_segments(stack: nn.Sequential, state: CheckpointState) -> None:
    layer = functools.partial(CheckpointedForward, stack=stack, state=state)
    compose_forward(stack, [ForwardLayer(NAME, Stage.INNER, layer)])
    object.__setattr__(stack, _STATE_ATTR, state)


def run_segmented(modules: list[nn.Module], segments: int, input: Any) -> Any:
    """`checkpoint_sequential(modules, segments, input, use_reentrant=False)`, plus restoring
    batch-norm running statistics after each recomputation (checkpoint_sequential takes no
    `context_fn`, so the segments are laid out here the same way it lays them out)."""
    size = len(modules) // segments
    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        segment = modules[start : end + 1]
        contexts = checkpoint_contexts(segment, selective=False)
        input = checkpoint(
            _Segment(segment),
            input,
            use_reentrant=False,
            preserve_rng_state=True,
            **({"context_fn": contexts} if contexts is not None else {}),
        )
    for module in modules[end + 1 :]:
        input = module(input)
    return input


class _Segment:
    """Runs a slice of the stack; a class rather than a closure so the slice is explicit."""

    def __init__(self, modules: list[nn.Module]) -> None:
        self.modules = modules

    def __call__(self, input: Any) -> Any:
        for module in self.modules:
            input = module(input)
        return input
