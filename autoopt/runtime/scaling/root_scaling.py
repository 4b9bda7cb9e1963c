"""Scaling every backward at its root, for the models `optimize()` gave fp16 loss scaling or
gradient accumulation.

Torch's own recipe is `scaler.scale(loss / N).backward()`: the seed of the backward is multiplied
once, whatever path each gradient then takes. Here the same happens without the user writing it:
`torch.autograd`'s module-global `_engine_run_backward` (which `Tensor.backward`,
`torch.autograd.backward` and `torch.autograd.grad` all call, also when imported by name before
`optimize()`) is wrapped while a registered model is alive. For a call whose graph reaches a
registered model's parameters (found by walking the graph from its roots):

* `backward()`: the seed is multiplied by the loss scale (fp16) and divided by N (accumulate),
  or multiplied by a micro-batch's share of its batch (rows / batch rows, `accumulate="auto"`);
  every leaf the backward accumulates into gets a one-shot pre-hook that multiplies its gradient
  by `1/scale` before it is added to `.grad` (powers of two: exact), so `.grad` holds true-scale
  gradients after every backward, whatever path they took (loss terms built from parameters,
  other methods of the model, parameters unfrozen later, several backward calls per step);
* `autograd.grad()`: the seed is multiplied by the scale and the results by `1/scale` (as graph
  operations under `create_graph=True`), so gradient penalties read true-scale values: this is
  the gradient-penalty recipe of torch's AMP examples. No `1/N` here: a hand-written accumulating
  loop divides the loss, not the inner gradient.

A graph that touches no registered parameter runs untouched. A backward that the engine starts
inside another one (reentrant checkpointing) is not seeded again; its leaves are unscaled with the
outer backward's scale, except the ones whose gradient the caller hands back into the outer graph:
torch's `CheckpointFunction` re-runs its function on detached copies of its inputs and returns
their `.grad` as the gradient of the inputs, which must stay scaled (unscaled there, every layer
before a checkpoint would be divided by the scale once more per checkpoint). For torch's
checkpoint those copies are known exactly (its `detached_inputs`); for any other reentrant caller,
a leaf that is not a parameter cannot be told from a copy, so it is left scaled and fp16 stands
down with a warning and a report line. Hooks the user put on intermediate tensors see scaled
gradients, as under `GradScaler`.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.autograd
import torch.utils.checkpoint

if TYPE_CHECKING:
    from autoopt.runtime.accumulation.accumulator import Accumulator
    from autoopt.runtime.scaling.loss_scaling import LossScaler


@dataclass
class Registration:
    """One optimized model: its parameters (frozen ones too: they may be unfrozen later) and
    what its backward passes need (a loss scaler, an accumulation count)."""

    model: weakref.ref[torch.nn.Module]
    # id -> the tensor, weakly: an id alone would match an unrelated tensor that reuses the
    # address of a dead one (FSDP2's freed all-gathered copies, a discarded model's parameters).
    params: dict[int, weakref.ref[torch.Tensor]]
    scaler: LossScaler | None = None
    accumulator: Accumulator | None = None

    def owns_any(self, tensors: Iterable[torch.Tensor]) -> bool:
        """Whether any of `tensors` is one of this model's parameters."""
        return any((ref := self.params.get(id(t))) is not None and ref() is t for t in tensors)

    def scaling(self) -> LossScaler | None:
        """The loss scaler while it is in charge (not stood down for the user's own AMP)."""
        if self.scaler is not None and self.scaler.user_amp.reason is None:
            return self.scaler
        return None


_registered: list[Registration] = []
_original_engine_run_backward = torch.autograd._engine_run_backward
# The 1/scale of the backward in progress: a reentrant backward inside it unscales its leaves
# with it.
_outer_inv_scale: list[torch.Tensor] = []


def register(
    model: torch.nn.Module,
    *,
    scaler: LossScaler | None = None,
    accumulator: Accumulator | None = None,
) -> Registration:
    """Scale the backward passes that reach `model`'s parameters (merging with an earlier
    registration of the same model), and install the root wrapper."""
    for reg in _live():
        if reg.model() is model:
            reg.scaler = scaler or reg.scaler
            reg.accumulator = accumulator or reg.accumulator
            return reg
    reg = Registration(weakref.ref(model), _weak(model.parameters()))
    reg.scaler, reg.accumulator = scaler, accumulator
    _registered.append(reg)
    torch.autograd._engine_run_backward = _engine_run_backward
    return reg


def add_params(model: torch.nn.Module, params: Iterable[torch.Tensor]) -> None:
    """Count `params` as `model`'s too, if it is registered: FSDP2 replaces the parameters with
    sharded ones after registration, and autograd's leaves are its all-gathered copies."""
    for reg in _live():
        if reg.model() is model:
            reg.params = {**reg.params, **_weak(params)}


def unregister(model: torch.nn.Module) -> None:
    """Stop scaling the backward passes of `model` (what `optimize()` undoes when it fails after
    registering it); the root wrapper goes when no registered model is left."""
    _registered[:] = [reg for reg in _registered if reg.model() is not model]
    _live()


def registrations_of(tensors: Iterable[Any]) -> list[Registration]:
    """The live registrations whose parameters the graph of `tensors` reaches."""
    return _involved(_walk(_roots(tensors)))


def registration_of_params(params: Iterable[torch.Tensor]) -> list[Registration]:
    """The live registrations owning any of `params`."""
    params = list(params)
    return [reg for reg in _live() if reg.owns_any(params)]


def _weak(params: Iterable[torch.Tensor]) -> dict[int, weakref.ref[torch.Tensor]]:
    return {id(p): weakref.ref(p) for p in params}


def _live() -> list[Registration]:
    _registered[:] = [reg for reg in _registered if reg.model() is not None]
    if not _registered:
        torch.autograd._engine_run_backward = _original_engine_run_backward
    return _registered


def _roots(tensors: Iterable[Any]) -> list[Any]:
    roots = []
    for t in tensors:
        if isinstance(t, torch.autograd.graph.GradientEdge):
            roots.append(t.node)
        elif isinstance(t, torch.Tensor) and t.requires_grad:
            roots.append(torch.autograd.graph.get_gradient_edge(t).node)
    return roots


def _walk(roots: list[Any]) -> list[Any]:
    """Every AccumulateGrad node (one per leaf) reachable from `roots`."""
    seen: set[Any] = set()
    stack = list(roots)
    leaves = []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if getattr(node, "variable", None) is not None:
            leaves.append(node)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return leaves


def _involved(leaves: list[Any]) -> list[Registration]:
    live = _live()
    if not live:
        return []
    variables = [node.variable for node in leaves]
    return [reg for reg in live if reg.owns_any(variables)]


def _seed_scale(regs: list[Registration]) -> torch.Tensor | None:
    """One scale for the whole backward: the smallest of the scalers involved (two models in
    one graph, e.g. a GAN's generator loss through the discriminator). Every leaf divides by
    this same value, so each gradient is still scaled and unscaled exactly once."""
    scales = [s._scale for reg in regs if (s := reg.scaling()) is not None]
    if not scales:
        return None
    if len(scales) == 1:
        return scales[0].clone()
    device = scales[0].device
    return torch.stack([s.to(device) for s in scales]).min()


def _accumulation(regs: list[Registration]) -> tuple[int, int]:
    """The (numerator, denominator) of this backward's seed: 1/N, or a split batch's share."""
    fractions = {reg.accumulator.seed_fraction for reg in regs if reg.accumulator is not None}
    if len(fractions) > 1:
        raise RuntimeError(
            f"one backward reaches models optimized with different accumulate= values "
            f"(seeds {sorted(f'{a}/{b}' for a, b in fractions)}); give every model of one loss "
            "the same accumulate="
        )
    return fractions.pop() if fractions else (1, 1)


def _engine_run_backward(
    t_outputs: Sequence[Any], grads: Sequence[torch.Tensor | None], *args: Any, **kwargs: Any
) -> Any:
    """`torch.autograd._engine_run_backward`, seeded and unscaled for registered models."""
    if not _registered:
        return _original_engine_run_backward(t_outputs, grads, *args, **kwargs)
    leaves = _walk(_roots(t_outputs))
    regs = _involved(leaves)
    if not regs:
        return _original_engine_run_backward(t_outputs, grads, *args, **kwargs)
    accumulate_grad = kwargs.get("accumulate_grad", False)
    if torch._C._current_graph_task_id() != -1:  # reentrant: the outer call seeded it already
        if not (_outer_inv_scale and accumulate_grad):
            return _original_engine_run_backward(t_outputs, grads, *args, **kwargs)
        real = _real_leaves(leaves, regs)
        with _unscaled_leaves(real, _outer_inv_scale[-1]):
            return _original_engine_run_backward(t_outputs, grads, *args, **kwargs)
    scale = _seed_scale(regs)
    fraction = _accumulation(regs) if accumulate_grad else (1, 1)
    if scale is None and fraction == (1, 1):
        return _original_engine_run_backward(t_outputs, grads, *args, **kwargs)
    grads = tuple(_seed(g, scale, fraction) for g in grads)
    if scale is None:
        return _original_engine_run_backward(t_outputs, grads, *args, **kwargs)
    inv_scale = torch.reciprocal(scale)
    if not accumulate_grad:  # autograd.grad: hand back true-scale results
        results = _original_engine_run_backward(t_outputs, grads, *args, **kwargs)
        return tuple(r if r is None else r * inv_scale.to(r.device) for r in results)
    _outer_inv_scale.append(inv_scale)
    try:
        with _unscaled_leaves(leaves, inv_scale):
            return _original_engine_run_backward(t_outputs, grads, *args, **kwargs)
    finally:
        _outer_inv_scale.pop()


# The frames between `_engine_run_backward` and the code that started a reentrant backward.
_AUTOGRAD_ENTRIES = {torch.autograd.backward.__code__, torch.Tensor.backward.__code__}
_CHECKPOINT_BACKWARD = torch.utils.checkpoint.CheckpointFunction.backward.__code__


def _real_leaves(leaves: list[Any], regs: list[Registration]) -> list[Any]:
    """The leaves of a reentrant backward whose gradients stay where they accumulate: not the
    ones its caller hands back into the outer graph (those must stay scaled, since the outer
    backward unscales where they end up)."""
    handed_back = _checkpoint_inputs()
    if handed_back is not None:
        ids = {id(t) for t in handed_back}
        return [node for node in leaves if id(node.variable) not in ids]
    real = [node for node in leaves if any(reg.owns_any([node.variable]) for reg in regs)]
    if len(real) < len(leaves):
        for reg in regs:
            if (scaler := reg.scaling()) is not None:
                scaler.user_amp.stand_down(
                    "a backward ran inside another backward (a reentrant autograd.Function "
                    "other than torch.utils.checkpoint) with leaves that are not parameters: "
                    "autoopt cannot tell whether their gradients are handed back (to stay "
                    "scaled) or kept (to be unscaled); this step left them scaled",
                    own=False,
                )
    return real


def _checkpoint_inputs() -> list[Any] | None:
    """The detached inputs of torch's reentrant `CheckpointFunction.backward`, when that is what
    started the backward in progress (read from its frame); None for any other caller."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_globals is globals() or frame.f_code in _AUTOGRAD_ENTRIES):
        frame = frame.f_back
    if frame is None or frame.f_code is not _CHECKPOINT_BACKWARD:
        return None
    inputs = frame.f_locals.get("detached_inputs")
    return list(inputs) if isinstance(inputs, tuple | list) else None


def _seed(grad: torch.Tensor | None, scale: torch.Tensor | None, fraction: tuple[int, int]) -> Any:
    if grad is None:
        return None
    if scale is not None:
        grad = grad * scale.to(grad.device)  # in the seed's dtype, as `GradScaler.scale` does
    share, whole = fraction
    if share != 1:
        grad = grad * share
    if whole != 1:
        grad = grad / whole  # what `(loss / steps).backward()` seeds
    return grad


# AccumulateGrad nodes that carry an unscaling pre-hook now: a reentrant backward reaching a leaf
# that its outer backward reaches too must not hook it a second time.
_hooked: set[Any] = set()


class _unscaled_leaves:  # noqa: N801 (a context manager, named for what it gives)
    """One-shot pre-hooks on the leaves' AccumulateGrad nodes: x`inv_scale` before `.grad`."""

    def __init__(self, leaves: list[Any], inv_scale: torch.Tensor) -> None:
        self.leaves = [node for node in leaves if node not in _hooked]
        self.inv_scale, self.handles = inv_scale, []

    def _unscale(self, grads: tuple[torch.Tensor | None, ...]) -> tuple[Any, ...]:
        return tuple(g if g is None else g * self.inv_scale.to(g.device) for g in grads)

    def __enter__(self) -> None:
        self.handles = [node.register_prehook(self._unscale) for node in self.leaves]
        _hooked.update(self.leaves)

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        _hooked.difference_update(self.leaves)
