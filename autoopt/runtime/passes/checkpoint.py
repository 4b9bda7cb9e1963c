"""Pass: checkpoint (AO401). Deep `nn.Sequential` stacks trade recomputation for memory.

Which stacks: every `nn.Sequential` with at least `MIN_LAYERS` (8) direct children, anywhere in
the model. Only the outermost such stack is patched; one nested inside it is recomputed as part
of its segment, and checkpointing both would recompute it twice.

How: the stack's `forward` is patched in place (its class, parameters and `state_dict` keys stay
the same) to run like `torch.utils.checkpoint.checkpoint_sequential(seq, segments, x,
use_reentrant=False)`: the first `segments - 1` segments are checkpointed, the last runs
normally (its activations are needed at once by backward). This happens only when grad is
enabled and the stack is in training mode; evaluation runs the plain forward. The RNG state is
preserved, so dropout masks in the recomputation equal the first pass and the gradients equal
the un-checkpointed ones. Batch-norm running statistics are restored after the recomputation,
so they are updated once per step, as without checkpointing.

Options:
* `checkpoint=False`: skipped.
* `checkpoint=N` (int): N segments per stack (capped at its length). N=1 has nothing to
  checkpoint (the single segment is the last one) and is reported as skipped.
* `checkpoint="auto"`: about sqrt(n) segments, and only where it pays. On CPU it is skipped:
  host memory is rarely the limit and recomputation costs time. On CUDA the decision waits for
  the first training forward, where the activation memory the stack would keep is estimated
  for that input on the meta device (shapes only, no real memory) and compared with
  `torch.cuda.mem_get_info`: checkpointing is applied when the estimate exceeds
  `AUTO_FREE_FRACTION` (25%) of the free device memory and `AUTO_GRAD_RATIO` (2x) the
  stack's gradient memory. The second test comes from measurement (benchmarks/
  checkpoint_memory.py): backward frees activations while it allocates gradients, so without
  checkpointing the peak is about max(activations, gradients), and checkpointing, which adds
  one recomputed segment on top of the gradients, lowers the peak only when activations
  clearly dominate. Seed 003's stack at batch 64 (17.6 MiB of activations, 275 MiB of
  gradients) does not qualify.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

from autoopt.runtime.batch import map_tensors
from autoopt.runtime.context import Context, Forward, ForwardLayer, Stage
from autoopt.runtime.forward import compose_forward
from autoopt.runtime.memory import saved_tensor_bytes
from autoopt.runtime.report import PassResult, Report

NAME = "checkpoint"
MIN_LAYERS = 8
AUTO_FREE_FRACTION = 0.25
AUTO_GRAD_RATIO = 2.0
_STATE_ATTR = "_autoopt_checkpoint"


def default_segments(layers: int) -> int:
    """About sqrt(n) segments: each keeps ~sqrt(n) boundary activations and recomputes ~sqrt(n)
    layers, the classic memory/compute balance."""
    return max(2, round(math.sqrt(layers)))


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


@dataclass
class _Decisions:
    """Per-stack outcomes of a lazy ("auto") decision, rendered into one report entry."""

    report: Report
    pending: int
    lines: list[str] = field(default_factory=list)
    applied: bool = False

    def record(self, line: str, applied: bool) -> None:
        self.lines.append(line)
        self.applied = self.applied or applied
        self.pending -= 1
        detail = "; ".join(self.lines)
        if self.pending > 0:
            detail += f"; {self.pending} stack(s) not run in training yet"
        make = PassResult.applied if self.applied else PassResult.skipped
        self.report.replace(make(NAME, detail))


@dataclass
class CheckpointState:
    """What the patched forward of one stack does; kept on the stack as `_autoopt_checkpoint`."""

    name: str
    segments: int | None  # None: not decided yet ("auto" on CUDA); 0 or 1: run plainly
    decisions: _Decisions | None = None
    estimating: bool = False
    estimate_bytes: int | None = None


LAZY = "lazy"  # choose(): "auto" on CUDA, decided per stack at its first training forward


def choose(
    option: str | bool | int, model: nn.Module, device: torch.device | None
) -> tuple[int | str | None, str]:
    """Segments per deep stack (an int >= 2), `LAZY`, or None (not applied), and why."""
    if option is False:
        return None, "checkpoint=False"
    stacks = _stacks(model)
    if not stacks:
        return None, f"no nn.Sequential with >= {MIN_LAYERS} layers"
    names = ", ".join(f"{n or '<model>'} ({len(s)} layers)" for n, s in stacks)
    if isinstance(option, int):
        if option < 2:
            return None, f"checkpoint={option}: one segment is run plainly; ask for >= 2 segments"
        return option, f"{names}: {option} segments each"
    device = device if device is not None else _module_device(model)
    if device.type != "cuda":
        return None, (
            f"auto on {device.type}: memory is rarely the limit off-GPU and recomputation costs "
            f"time ({names}); pass checkpoint=<segments> to force it"
        )
    return LAZY, (
        f"auto: decided at the first training forward from the activation estimate ({names})"
    )


def run(ctx: Context) -> PassResult | None:
    """Patch the deep Sequential stacks of `ctx.model` as the `checkpoint` option asks."""
    segments, why = choose(ctx.options.checkpoint, ctx.model, ctx.device)
    if segments is None:
        return PassResult.skipped(NAME, why)
    stacks = _stacks(ctx.model)
    if isinstance(segments, int):
        for name, stack in stacks:
            _patch(stack, CheckpointState(name, min(segments, len(stack))))
        return PassResult.applied(NAME, why)
    decisions = _Decisions(ctx.report, pending=len(stacks))
    for name, stack in stacks:
        _patch(stack, CheckpointState(name, None, decisions))
    return PassResult.skipped(NAME, why)


def _stacks(model: nn.Module) -> list[tuple[str, nn.Sequential]]:
    return [(n, s) for n, s in find_deep_sequentials(model) if not hasattr(s, _STATE_ATTR)]


class CheckpointedForward:
    """A deep stack's forward: segmented with recomputation in training, plain otherwise."""

    def __init__(self, forward: Forward, stack: nn.Sequential, state: CheckpointState) -> None:
        self.forward = forward
        self.stack = stack
        self.state = state

    def __call__(self, input: Any) -> Any:
        state = self.state
        if state.estimating or not (torch.is_grad_enabled() and self.stack.training):
            return self.forward(input)
        if state.segments is None:
            _decide(self.stack, state, input)
        if state.segments is None or state.segments < 2:
            return self.forward(input)
        return run_segmented(list(self.stack.children()), state.segments, input)


def _patch(stack: nn.Sequential, state: CheckpointState) -> None:
    layer = functools.partial(CheckpointedForward, stack=stack, state=state)
    compose_forward(stack, [ForwardLayer(NAME, Stage.INNER, layer)])
    object.__setattr__(stack, _STATE_ATTR, state)


def _decide(stack: nn.Sequential, state: CheckpointState, input: Any) -> None:
    """The lazy "auto" decision at the first training forward (CUDA only)."""
    label = state.name or "<model>"
    state.estimating = True  # the meta pass below calls the stack, which must run plainly
    try:
        estimate = estimate_activation_bytes(stack, input)
    except Exception as err:  # an op without a meta kernel, a data-dependent shape, ...
        state.segments = 0
        if state.decisions is not None:
            state.decisions.record(f"{label}: could not estimate activations ({err})", False)
        return
    finally:
        state.estimating = False
    state.estimate_bytes = estimate
    free = free_device_memory(_module_device(stack))
    # Without checkpointing, backward frees activations while it allocates gradients, so the
    # peak is about max(activations, gradients); with it, gradients plus the boundaries plus
    # one recomputed segment. It pays only when activations clearly exceed the gradients.
    grad_bytes = sum(p.numel() * p.element_size() for p in stack.parameters() if p.requires_grad)
    pays = estimate > AUTO_FREE_FRACTION * free and estimate > AUTO_GRAD_RATIO * grad_bytes
    state.segments = default_segments(len(stack)) if pays else 0
    mib = 1 << 20
    if pays:
        line = (
            f"{label}: {state.segments} segments (activations ~{estimate / mib:.0f} MiB > "
            f"{AUTO_FREE_FRACTION:.0%} of {free / mib:.0f} MiB free)"
        )
    else:
        line = (
            f"{label}: not needed (activations ~{estimate / mib:.0f} MiB: <= "
            f"{AUTO_FREE_FRACTION:.0%} of {free / mib:.0f} MiB free, or <= "
            f"{AUTO_GRAD_RATIO:g}x the {grad_bytes / mib:.0f} MiB of gradients)"
        )
    if state.decisions is not None:
        state.decisions.record(line, pays)


def run_segmented(modules: list[nn.Module], segments: int, input: Any) -> Any:
    """`checkpoint_sequential(modules, segments, input, use_reentrant=False)`, plus restoring
    batch-norm running statistics after each recomputation (checkpoint_sequential takes no
    `context_fn`, so the segments are laid out here the same way it lays them out)."""
    size = len(modules) // segments
    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        segment = modules[start : end + 1]
        input = checkpoint(
            _Segment(segment),
            input,
            use_reentrant=False,
            preserve_rng_state=True,
            context_fn=_context_fn(segment),
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


def _context_fn(segment: list[nn.Module]) -> Callable[[], tuple[Any, Any]]:
    norms = [
        m
        for top in segment
        for m in top.modules()
        if isinstance(m, _BatchNorm) and m.track_running_stats and m.training
    ]
    if not norms:
        return lambda: (contextlib.nullcontext(), contextlib.nullcontext())
    return lambda: (contextlib.nullcontext(), _keep_running_stats(norms))


@contextlib.contextmanager
def _keep_running_stats(norms: list[_BatchNorm]) -> Iterator[None]:
    """Undo the running-stat update that the recomputation of a batch norm makes."""
    saved = [
        [b.clone() if b is not None else None for b in (m.running_mean, m.running_var)]
        + [m.num_batches_tracked.clone() if m.num_batches_tracked is not None else None]
        for m in norms
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, (mean, var, count) in zip(norms, saved, strict=True):
                for live, old in (
                    (m.running_mean, mean),
                    (m.running_var, var),
                    (m.num_batches_tracked, count),
                ):
                    if live is not None and old is not None:
                        live.copy_(old)


def estimate_activation_bytes(module: nn.Module, input: Any) -> int:
    """Bytes of activations autograd would keep for backward on `module(input)` in the current
    mode, computed on the meta device: only shapes, no real memory and no real compute."""
    params = {
        n: torch.empty_like(p, device="meta").requires_grad_(p.requires_grad)
        for n, p in module.named_parameters()
    }
    buffers = {n: torch.empty_like(b, device="meta") for n, b in module.named_buffers()}
    meta_input = map_tensors(input, lambda t: torch.empty_like(t, device="meta"))
    return saved_tensor_bytes(
        lambda: torch.func.functional_call(module, {**params, **buffers}, (meta_input,))
    )


def free_device_memory(device: torch.device) -> int:
    """Bytes free on a CUDA device now (what the caching allocator and others left)."""
    free, _total = torch.cuda.mem_get_info(device)
    return free


def _module_device(module: nn.Module) -> torch.device:
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return torch.device("cpu")
