"""Patching the model's forward and the optimizer's step in place, so that the user's objects
(and their `isinstance`, attributes and `state_dict` keys) stay what they were.

Everything stored on the user's objects is an instance of a module-level class (or a
`functools.partial` of such objects' methods) that holds the module or optimizer itself, never
one of its bound methods or a closure. `copy.deepcopy(model)` then rebinds every layer to the
copy (its memo maps the module to the copy); a layer that holds something that cannot be copied
(a compiled graph) drops it in `__getstate__` and rebuilds it. `torch.save(model)` leaves the
whole chain out: the file holds the user's plain module (`pickling`).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from autoopt.runtime.context import Context, Forward, ForwardLayer, Stage, StepLayer


class ModuleForward:
    """The bottom of a forward chain: the forward of the module's class, called on the module."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return type(self.module).forward(self.module, *args, **kwargs)


class PatchedForward:
    """What `module.forward` becomes: the chain of layers, introspectable as the user's forward
    (`__wrapped__`, `__name__`, `__doc__` are read from it, so `inspect.signature` works)."""

    def __init__(self, module: nn.Module, chain: Forward, user: Forward | None) -> None:
        self.module = module
        self.chain = chain
        self.user = user  # an instance-level forward the user had set before optimize(), if any
        own = user if user is not None else type(module).forward
        self.__name__ = getattr(own, "__name__", "forward")
        self.__doc__ = getattr(own, "__doc__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.chain(*args, **kwargs)

    @property
    def __wrapped__(self) -> Forward:
        return original_forward(self.module)


class OutsideCompiled:
    """`module._compiled_call_impl` of a module the user compiled in place (`Module.compile()`):
    autoopt's OUTER layers (the trials' bookkeeping and clocks, the layout guard, device moves)
    around the user's compiled call, so that dynamo never traces them; the layers below run
    inside it, in `forward`, as the layers under autoopt's own compile do."""

    def __init__(self, chain: Forward, compiled: Forward) -> None:
        self.chain = chain
        self.compiled = compiled  # the user's compiled call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.chain(*args, **kwargs)


def compose_forward(
    module: nn.Module, layers: list[ForwardLayer], base: Forward | None = None
) -> None:
    """Install `module.forward` = the layers around the module's own forward (by stage).

    `base`, when given, stands in for the module's own forward at the bottom of the stack (a
    TorchScript version of it); `original_forward()` still returns the user's forward. A module
    compiled in place by the user gets its OUTER layers around its compiled call instead."""
    compiled = module.__dict__.get("_compiled_call_impl")
    if isinstance(compiled, OutsideCompiled):
        compiled = compiled.compiled
    if compiled is not None:
        outer = [layer for layer in layers if layer.stage > Stage.COMPILE]
        layers = [layer for layer in layers if layer.stage <= Stage.COMPILE]
        call: Forward = compiled
        for layer in sorted(outer, key=lambda layer: layer.stage):
            call = layer.wrap(call)
        if outer:
            object.__setattr__(module, "_compiled_call_impl", OutsideCompiled(call, compiled))
    current = module.__dict__.get("forward")
    user = current.user if isinstance(current, PatchedForward) else current
    forward: Forward = base if base is not None else (user or ModuleForward(module))
    for layer in sorted(layers, key=lambda layer: layer.stage):  # stable: registration order
        forward = layer.wrap(forward)
    if base is None and not layers:
        return
    object.__setattr__(module, "forward", PatchedForward(module, forward, user))


def original_forward(module: nn.Module) -> Forward:
    """The forward the module had before autoopt patched it (bound to the module)."""
    current = module.__dict__.get("forward")
    if not isinstance(current, PatchedForward):
        return module.forward
    if current.user is not None:
        return current.user
    return types.MethodType(type(module).forward, module)


# --- optimizer.step / zero_grad ------------------------------------------------------------------
# `optimizer.step` stays a bound method: torch's LR schedulers re-bind `step.__func__` to the
# optimizer, and warn when `step` lacks their `_wrapped_by_lr_sched` mark. The method runs the
# chain stored on the optimizer, so the functions below hold no state of their own.

_STEP_CHAIN = "_autoopt_step"
_ZERO_GRAD_CHAIN = "_autoopt_zero_grad"


def _layered_step(optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
    return optimizer.__dict__[_STEP_CHAIN](*args, **kwargs)


def _scheduled_layered_step(optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
    optimizer._opt_called = True  # type: ignore[attr-defined] # what the scheduler's wrapper did
    return optimizer.__dict__[_STEP_CHAIN](*args, **kwargs)


# A scheduler created before optimize() had wrapped `step` (to record that it was called, and
# to warn if `step` is replaced later); this stands in for its wrapper, with its mark.
_scheduled_layered_step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]


def _layered_zero_grad(optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
    return optimizer.__dict__[_ZERO_GRAD_CHAIN](*args, **kwargs)


class ClassStep:
    """The bottom of the step chain: the optimizer class's own step (torch's step hooks run)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return type(self.optimizer).step(self.optimizer, *args, **kwargs)


class ClassZeroGrad:
    """The bottom of the zero_grad chain: the optimizer class's own zero_grad."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return type(self.optimizer).zero_grad(self.optimizer, *args, **kwargs)


def _step_base(optimizer: torch.optim.Optimizer) -> tuple[Any, bool]:
    """The bottom of the step chain and whether an LR scheduler had wrapped `step` already."""
    current = optimizer.__dict__.get("step")
    if current is None:
        return ClassStep(optimizer), False
    scheduled = hasattr(current, "_wrapped_by_lr_sched")
    if scheduled and getattr(current, "__wrapped__", None) is type(optimizer).step:
        # The scheduler's wrapper around the class's step: `_scheduled_layered_step` replaces it.
        return ClassStep(optimizer), True
    return current, scheduled  # the user's own patch: kept at the bottom, as it is


def compose_step(optimizer: torch.optim.Optimizer, layers: list[StepLayer]) -> None:
    """Install the step layers around `optimizer.step` (and `zero_grad`), in registration order."""
    if not layers:
        return
    step, scheduled = _step_base(optimizer)
    zero_grad = optimizer.__dict__.get("zero_grad") or ClassZeroGrad(optimizer)
    wraps_zero_grad = False
    for layer in layers:
        step = layer.wrap_step(step)
        if layer.wrap_zero_grad is not None:
            zero_grad = layer.wrap_zero_grad(zero_grad)
            wraps_zero_grad = True
    # Instance attributes shadow the class's methods.
    optimizer.__dict__[_STEP_CHAIN] = step
    method = _scheduled_layered_step if scheduled else _layered_step
    optimizer.step = types.MethodType(method, optimizer)  # type: ignore[method-assign]
    if wraps_zero_grad:
        optimizer.__dict__[_ZERO_GRAD_CHAIN] = zero_grad
        optimizer.zero_grad = types.MethodType(_layered_zero_grad, optimizer)  # type: ignore[method-assign]


def install(ctx: Context) -> None:
    """Compose every registered layer onto the user's objects, then run the finalizers."""
    compose_forward(ctx.model, ctx.forward_layers, base=ctx.base_forward)
    if ctx.optimizer is not None:
        compose_step(ctx.optimizer, ctx.step_layers)
    for finalize in ctx.finalizers:
        finalize(ctx)
