"""Patching the model's forward and the optimizer's step in place, so that the user's objects
(and their `isinstance`, attributes and `state_dict` keys) stay what they were."""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

from autoopt.runtime.context import Context, Forward, ForwardLayer, StepLayer

_ORIGINAL_FORWARD = "_autoopt_original_forward"
_ORIGINAL_STEP = "_autoopt_original_step"
_ORIGINAL_ZERO_GRAD = "_autoopt_original_zero_grad"


def compose_forward(
    module: nn.Module, layers: list[ForwardLayer], base: Forward | None = None
) -> None:
    """Install `module.forward` = the layers around the module's own forward (by stage).

    `base`, when given, stands in for the module's own forward at the bottom of the stack (a
    TorchScript version of it); `original_forward()` still returns the user's forward."""
    original = getattr(module, _ORIGINAL_FORWARD, None) or module.forward
    forward = original if base is None else base
    for layer in sorted(layers, key=lambda layer: layer.stage):  # stable: registration order
        forward = layer.wrap(forward)
    if forward is original:
        return
    functools.update_wrapper(forward, original)  # keep name/doc/signature for introspection
    object.__setattr__(module, _ORIGINAL_FORWARD, original)
    object.__setattr__(module, "forward", forward)


def original_forward(module: nn.Module) -> Any:
    """The forward the module had before autoopt patched it."""
    return getattr(module, _ORIGINAL_FORWARD, module.forward)


def compose_step(optimizer: Any, layers: list[StepLayer]) -> None:
    """Install the step layers around `optimizer.step` (and `zero_grad`), in registration order."""
    if not layers:
        return
    step = getattr(optimizer, _ORIGINAL_STEP, None) or optimizer.step
    zero_grad = getattr(optimizer, _ORIGINAL_ZERO_GRAD, None) or optimizer.zero_grad
    setattr(optimizer, _ORIGINAL_STEP, step)
    setattr(optimizer, _ORIGINAL_ZERO_GRAD, zero_grad)
    new_step, new_zero = step, zero_grad
    for layer in layers:
        new_step = layer.wrap_step(new_step)
        if layer.wrap_zero_grad is not None:
            new_zero = layer.wrap_zero_grad(new_zero)
    # Instance attributes shadow the class's methods; the originals stay reachable above.
    optimizer.step = new_step
    optimizer.zero_grad = new_zero


def install(ctx: Context) -> None:
    """Compose every registered layer onto the user's objects, then run the finalizers."""
    compose_forward(ctx.model, ctx.forward_layers, base=ctx.base_forward)
    if ctx.optimizer is not None:
        compose_step(ctx.optimizer, ctx.step_layers)
    for finalize in ctx.finalizers:
        finalize(ctx)
