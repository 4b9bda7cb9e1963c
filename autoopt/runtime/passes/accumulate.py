"""Pass: accumulate (AO405). `accumulate=N` turns the user's unchanged loop into gradient
accumulation over N micro-batches per optimizer step.

Semantics (those of HF Accelerate's `accumulate()`, without its context manager):
* `optimizer.step()` acts on every N-th call only; the other calls return None and do nothing.
* `optimizer.zero_grad()` (and `model.zero_grad()`) act only at the start of a cycle, i.e.
  when the number of `step()` calls so far is a multiple of N. This is right for both loop
  orders: `zero_grad(); forward; backward; step()` and `forward; backward; step(); zero_grad()`.
* The gradients reaching the model's outputs are multiplied by 1/N, so after N micro-batches
  the accumulated gradient is the mean of the N micro-batch gradients: one step equals one step
  on the N-times larger batch for a mean-reduced loss (the seed's `loss / accumulation_steps`).
  A `reduction="sum"` loss gets the mean of the N sums, not their sum.
* Under DDP only the last micro-batch of a cycle all-reduces gradients: before each forward with
  grad enabled, `require_backward_grad_sync` is set on the DDP module exactly as `no_sync()`
  does, so the other N-1 backward passes stay local.
* Cycles count `step()` calls over the whole run, not per epoch: when an epoch's batch count is
  not a multiple of N, the last partial cycle continues into the next epoch; nothing is dropped.
* `step(closure)` is passed on at the N-th call only; closure-based optimizers (LBFGS) do not
  mix with accumulation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autoopt.runtime.context import Context, ForwardLayer, Stage, StepLayer
from autoopt.runtime.grad_hooks import scale_output_gradients
from autoopt.runtime.report import PassResult

NAME = "accumulate"


@dataclass
class Accumulator:
    """The shared counter of one accumulation: N micro-batches per optimizer step."""

    steps: int
    step_calls: int = 0  # calls of optimizer.step() by the user's loop
    optimizer_steps: int = 0  # of which reached the real optimizer

    @property
    def at_cycle_start(self) -> bool:
        """No micro-batch of the current cycle has stepped yet: zero_grad may act."""
        return self.step_calls % self.steps == 0

    @property
    def at_last_micro_step(self) -> bool:
        """The next backward completes a cycle (the step after it will act)."""
        return self.step_calls % self.steps == self.steps - 1

    def wrap_step(self, step: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(step)
        def accumulating_step(*args: Any, **kwargs: Any) -> Any:
            self.step_calls += 1
            if self.step_calls % self.steps:
                return None
            self.optimizer_steps += 1
            return step(*args, **kwargs)

        return accumulating_step

    def wrap_zero_grad(self, zero_grad: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(zero_grad)
        def accumulating_zero_grad(*args: Any, **kwargs: Any) -> Any:
            if self.at_cycle_start:
                return zero_grad(*args, **kwargs)
            return None

        return accumulating_zero_grad

    def wrap_forward(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        factor = 1.0 / self.steps

        @functools.wraps(forward)
        def accumulating_forward(*args: Any, **kwargs: Any) -> Any:
            return scale_output_gradients(forward(*args, **kwargs), factor)

        return accumulating_forward


def run(ctx: Context) -> PassResult | None:
    """Register the step/zero_grad gating, the 1/N gradient scaling and the DDP sync control."""
    steps = ctx.options.accumulate
    if steps == 1:
        return PassResult.skipped(NAME, "accumulate=1")
    if ctx.optimizer is None:
        return PassResult.skipped(
            NAME, f"accumulate={steps} needs the optimizer: pass it to optimize()"
        )
    acc = Accumulator(steps)
    ctx.extras[NAME] = acc
    ctx.step_layers.append(StepLayer(NAME, acc.wrap_step, acc.wrap_zero_grad))
    ctx.forward_layers.append(ForwardLayer(NAME, Stage.OUTER, acc.wrap_forward))
    _gate_module_zero_grad(ctx.model, acc)
    ctx.finalizers.append(functools.partial(_finalize, acc=acc))
    detail = f"{steps} micro-batches per optimizer step, gradients averaged (x1/{steps})"
    if ctx.dist is not None:
        detail += "; DDP all-reduces on the last micro-batch only"
    return PassResult.applied(NAME, detail)


def _gate_module_zero_grad(module: nn.Module, acc: Accumulator) -> None:
    """`model.zero_grad()` (the seed's spelling) must follow the same cycle as the optimizer's."""
    if getattr(module, "_autoopt_accumulate", None) is acc:
        return
    object.__setattr__(module, "zero_grad", acc.wrap_zero_grad(module.zero_grad))
    object.__setattr__(module, "_autoopt_accumulate", acc)


def _finalize(ctx: Context, *, acc: Accumulator) -> None:
    """After the DDP wrap: gate the wrapper's zero_grad and control its gradient sync."""
    returned = ctx.returned_model
    if returned is None or returned is ctx.model:
        return
    _gate_module_zero_grad(returned, acc)
    if isinstance(returned, nn.parallel.DistributedDataParallel):

        def set_sync(module: nn.Module, args: Any) -> None:
            # DDP reads this flag in its own forward, so it must be set before that runs: a
            # forward pre-hook on the DDP module (the inner forward layers run too late).
            if torch.is_grad_enabled():
                module.require_backward_grad_sync = acc.at_last_micro_step

        returned.register_forward_pre_hook(set_sync)
