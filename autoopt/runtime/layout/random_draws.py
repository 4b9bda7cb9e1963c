"""Random draws that follow the memory layout, under channels_last.

A dropout mask is drawn in memory order: `nn.Dropout` on a 4-D activation fills
`torch.empty_like(x)` with Bernoulli draws, and `empty_like` keeps x's layout, so the same seed
gives an NHWC activation other masks than the NCHW one of the user's own loop (measured: every
loss apart by ~1e-3 after a few steps). Dropout2d and stochastic depth draw one number per
channel or sample into a fresh contiguous tensor: the same in both layouts.

- `nn.Dropout` and `nn.AlphaDropout` modules: a forward pre-hook hands them their 4-D NHWC
  input in NCHW, so they draw the user's masks (the next convolution takes NCHW input as it is).
- Draws written in a forward (`F.dropout(x, ...)`, `torch.rand_like(x)`, ...) cannot be hooked:
  `memory_order_draws` finds them in the source of the model's own classes, and the pass reports
  each place (the draw may be on a 2-D tensor, where nothing changes: the source does not say).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

import torch
from torch import nn

from autoopt.runtime.report import Event

DROPOUT_MODULES = (nn.Dropout, nn.AlphaDropout)

# Calls that draw into a tensor laid out like their argument.
_LIKE_DRAWS = {"rand_like", "randn_like", "randint_like", "bernoulli"}
_FUNCTIONAL_DROPOUTS = {"dropout", "alpha_dropout"}
_IN_PLACE_DRAWS = {"bernoulli_", "uniform_", "normal_", "exponential_"}
_LIKE_ALLOCATIONS = {"empty_like", "zeros_like", "ones_like"}


def draw_dropout_in_nchw(model: nn.Module) -> int:
    """Register `nchw_input` on the dropout modules of `model`; how many there are."""
    modules = [m for m in model.modules() if isinstance(m, DROPOUT_MODULES)]
    for module in modules:
        module.register_forward_pre_hook(nchw_input)
    return len(modules)


def nchw_input(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Forward pre-hook: a 4-D channels_last input in NCHW, when the module draws a mask."""
    x = args[0] if args else None
    if (
        module.training
        and getattr(module, "p", 0) > 0
        and isinstance(x, torch.Tensor)
        and x.dim() == 4
        and not x.is_contiguous()
        and x.is_contiguous(memory_format=torch.channels_last)
    ):
        return (x.contiguous(), *args[1:])
    return None


def memory_order_draws(model: nn.Module) -> list[Event]:
    """The places in the forwards of `model`'s own classes (not torch's) that draw random
    numbers laid out like an activation, one event each."""
    events: list[Event] = []
    seen: set[type] = set()
    for module in model.modules():
        cls = type(module)
        if cls in seen or cls.__module__.split(".")[0] == "torch":
            continue
        seen.add(cls)
        forward = cls.__dict__.get("forward")
        if forward is None:
            continue
        events.extend(_draws_in(forward, cls.__name__))
    return list(dict.fromkeys(events))


def _draws_in(function: Any, owner: str) -> list[Event]:
    try:
        lines, start = inspect.getsourcelines(function)
        filename = inspect.getsourcefile(function) or "<unknown>"
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return []
    events = []
    for node in ast.walk(tree):
        what = _draw(node)
        if what is not None:
            reason = (
                f"{what} in {owner}.forward: on a 4-D activation it draws in the NHWC "
                "layout, so the same seed gives other numbers than the NCHW loop "
                "(channels_last=False keeps them)"
            )
            events.append(Event("random draw", filename, start + node.lineno - 1, reason))
    return events


def _draw(node: ast.AST) -> str | None:
    """The call's text when it draws into a tensor laid out like its argument."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name in _LIKE_DRAWS:
        return f"{ast.unparse(func)}(...)"
    if name in _FUNCTIONAL_DROPOUTS and not _on_self(func):
        return f"{ast.unparse(func)}(...)"  # `self.dropout(x)` is a module: hooked
    if name in _IN_PLACE_DRAWS and isinstance(func, ast.Attribute):
        inner = func.value
        if isinstance(inner, ast.Call):
            allocation = inner.func
            alloc = getattr(allocation, "attr", None) or getattr(allocation, "id", None)
            if alloc in _LIKE_ALLOCATIONS:
                return f"{ast.unparse(inner.func)}(...).{name}()"
    return None


def _on_self(func: ast.expr) -> bool:
    while isinstance(func, ast.Attribute):
        func = func.value
    return isinstance(func, ast.Name) and func.id == "self"
