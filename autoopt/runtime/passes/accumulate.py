"""Pass: accumulate (AO405). `accumulate=N` turns the user's unchanged loop into gradient
accumulation over N micro-batches per optimizer step.

Semantics (those of HF Accelerate's `accumulate()`, without its context manager):
* `optimizer.step()` acts on every N-th call only; the other calls return None and do nothing.
* `optimizer.zero_grad()` (and `model.zero_grad()`) act only at the start of a cycle, i.e.
  when the number of `step()` calls so far is a multiple of N. This is right for both loop
  orders: `zero_grad(); forward; backward; step()` and `forward; backward; step(); zero_grad()`.
* Every backward that reaches the model's parameters is seeded with 1/N at its root
  (`root_scaling`), exactly what `(loss / N).backward()` does, whatever the loss is built from
  (outputs, terms computed from the parameters, other methods of the model). After N
  micro-batches `.grad` holds the mean of the N micro-batch gradients.
* `clip_grad_norm_` / `clip_grad_value_` on the model's parameters clip only at the last
  micro-batch of a cycle, the one whose `step()` acts: a hand-written loop clips the full sum
  once before its step. On the other micro-batches `clip_grad_norm_` returns the partial sum's
  norm and clips nothing. (`clip_grad_norm_` is caught however it was imported; a
  `clip_grad_value_` or `clip_grads_with_norm_` imported by name before `optimize()` is not.)
* A `GradScaler` in the loop is refused with an error (its `step()` would unscale partial sums).
* Under DDP only the last micro-batch of a cycle all-reduces gradients: before each forward with
  grad enabled, `require_backward_grad_sync` is set on the DDP module exactly as `no_sync()`
  does, so the other N-1 backward passes stay local.
* Cycles count `step()` calls over the whole run, not per epoch: when an epoch's batch count is
  not a multiple of N, the last partial cycle continues into the next epoch; nothing is dropped.
* `step(closure)` is passed on at the N-th call only; closure-based optimizers (LBFGS) do not
  mix with accumulation.

`accumulate="auto"` keeps one optimizer step per batch of the user's loader and, when a step of
it does not fit `memory_budget` even with checkpointing, has the loader yield each batch in the
fewest micro-batches that fit (`autoopt.runtime.accumulation.micro_batches`). The same gating applies, with a
cycle per batch set by the loader and each backward seeded with its part's share of the loss's
normaliser (samples or labelled tokens, measured on the first batch; it stands down otherwise);
LR schedulers on the optimizer step once per batch too (their `step()` acts between batches
only). `choose_auto` says when it stands down before the first batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.utils import clip_grad
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from autoopt.runtime.accumulation import accumulator, micro_batches
from autoopt.runtime.context import Context, ForwardLayer, Stage, StepLayer
from autoopt.runtime.memory import AUTO, describe_budget, state_memory
from autoopt.runtime.report import PassResult
from autoopt.runtime.scaling import root_scaling
from autoopt.runtime.scaling.grad_scalers import unwatch_grad_scalers, watch_grad_scalers

NAME = "accumulate"
# The Accumulator, on the model (and its DDP wrapper) whose zero_grad it gates, and under "auto" on
# the optimizer, where LR schedulers find it.
ACCUMULATOR_ATTR = "_autoopt_accumulate"


def run(ctx: Context) -> PassResult | None:
    """Register the step/zero_grad gating, the gradient seeding and the DDP sync control; for
    "auto", also the micro-batch decision and the loader that splits batches."""
    steps = ctx.options.accumulate
    if steps == 1:
        return PassResult.skipped(NAME, "accumulate=1")
    if steps == AUTO:
        return _run_auto(ctx)
    if ctx.optimizer is None:
        return PassResult.skipped(
            NAME, f"accumulate={steps} needs the optimizer: pass it to optimize()"
        )
    acc = accumulator.Accumulator(steps)
    _install(ctx, acc)
    detail = (
        f"{steps} micro-batches per optimizer step, every backward seeded x1/{steps}, "
        "gradient clipping on the last micro-batch only"
    )
    if ctx.dist is not None and ctx.dist.strategy == "fsdp":
        detail += "; FSDP reduce-scatters on the last micro-batch only"
    elif ctx.dist is not None:
        detail += "; DDP all-reduces on the last micro-batch only"
    return PassResult.applied(NAME, detail)


def choose_auto(ctx: Context) -> str | None:
    """Why `accumulate="auto"` cannot split this loop's batches, or None when it can (whether
    it will is decided at the first batch)."""
    budget = ctx.options.memory_budget
    device = ctx.device if ctx.device is not None else torch.device("cpu")
    if ctx.optimizer is None:
        return "it needs the optimizer: pass it to optimize()"
    if ctx.loader is None:
        return "it needs the loader: pass it to optimize(), the micro-batches are cut from it"
    norms = [type(m).__name__ for m in ctx.model.modules() if isinstance(m, _BatchNorm)]
    if norms:
        return (
            f"the model has {norms[0]}: its batch statistics would change with the micro-batch size"
        )
    if budget is None:
        return "memory_budget=None: no limit to fit"
    if budget == AUTO and device.type != "cuda":
        return (
            f"memory_budget='auto' sets no limit on {device.type}; pass memory_budget=<bytes> "
            "to split batches under it"
        )
    if ctx.dist is not None and ctx.dist.strategy == "fsdp":
        return "not with FSDP2 (distributed='fsdp') yet"
    return None


def _run_auto(ctx: Context) -> PassResult:
    reason = choose_auto(ctx)
    if reason is not None:
        micro_batches.warn_stand_down(reason)
        return PassResult.skipped(NAME, micro_batches.stand_down_line(reason))
    assert ctx.optimizer is not None
    acc = accumulator.Accumulator(1, auto=True)
    _install(ctx, acc)
    # LR schedulers find the accumulator through their optimizer: one step per batch.
    ctx.optimizer.__dict__[ACCUMULATOR_ATTR] = acc
    if gated := _gate_schedulers():
        ctx.undo.append(functools.partial(_ungate_schedulers, gated))
    batcher = micro_batches.MicroBatcher(
        ctx.model,
        acc,
        ctx.options.memory_budget,
        state_memory(ctx.model, ctx.optimizer),
        ctx.report,
        ctx.dist,
    )
    # Outside compile and outside checkpoint's planning layer (registered after it).
    layer = functools.partial(micro_batches.DecideOnFirstForward, batcher=batcher)
    ctx.forward_layers.append(ForwardLayer(NAME, Stage.OUTER, layer))
    ctx.finalizers.append(functools.partial(_split_batches, batcher=batcher))
    assert ctx.options.memory_budget is not None  # choose_auto stood down on None
    limit = describe_budget(ctx.options.memory_budget)
    return PassResult.skipped(
        NAME, f"auto: micro-batches chosen at the first training batch to fit {limit}"
    )


def _install(ctx: Context, acc: accumulator.Accumulator) -> None:
    ctx.extras[NAME] = acc
    ctx.step_layers.append(StepLayer(NAME, acc.wrap_step, acc.wrap_zero_grad))
    root_scaling.register(ctx.model, accumulator=acc)
    ctx.undo.append(functools.partial(root_scaling.unregister, ctx.model))
    if watch_grad_scalers():
        ctx.undo.append(unwatch_grad_scalers)
    if _gate_clipping():
        ctx.undo.append(_ungate_clipping)
    _gate_module_zero_grad(ctx.model, acc)
    ctx.finalizers.append(functools.partial(_finalize, acc=acc))


def _split_batches(ctx: Context, *, batcher: micro_batches.MicroBatcher) -> None:
    """After the loader pass: the loader handed back yields micro-batches."""
    ctx.loader = micro_batches.MicroBatchLoader(ctx.loader, batcher)


def _gate_module_zero_grad(module: nn.Module, acc: accumulator.Accumulator) -> None:
    """`model.zero_grad()` (the seed's spelling) must follow the same cycle as the optimizer's."""
    if getattr(module, ACCUMULATOR_ATTR, None) is acc:
        return
    object.__setattr__(module, "zero_grad", GatedZeroGrad(module, acc))
    object.__setattr__(module, ACCUMULATOR_ATTR, acc)


@dataclass
class GatedZeroGrad:
    """`module.zero_grad` that acts at the start of a cycle only. An object holding the module,
    not a closure over its bound method, so a copy (deepcopy, pickle) zeroes its own gradients.
    A copy does not accumulate (no optimizer of its own is gated, its backward is not seeded
    with 1/N): it drops the accumulator, and its zero_grad always acts."""

    module: nn.Module
    acc: accumulator.Accumulator | None

    def __getstate__(self) -> dict[str, Any]:
        return {"module": self.module, "acc": None}

    def __call__(self, set_to_none: bool = True) -> None:
        if self.acc is None or self.acc.at_cycle_start:
            type(self.module).zero_grad(self.module, set_to_none)


_original_clip_grads_with_norm = clip_grad._clip_grads_with_norm_
_original_clip_grad_value = clip_grad.clip_grad_value_
# torch >= 2.6's public spelling of the second half of clip_grad_norm_ (after get_total_norm).
_original_public_clip_grads_with_norm = getattr(torch.nn.utils, "clip_grads_with_norm_", None)


def _mid_cycle(parameters: Any) -> bool:
    """Some of `parameters` belong to an accumulating model whose cycle is not at its last
    micro-batch: their `.grad` is a partial sum that must not be clipped."""
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    return any(
        reg.accumulator is not None and not reg.accumulator.at_last_micro_step
        for reg in root_scaling.registration_of_params(params)
    )


def _clip_grads_with_norm_(parameters: Any, *args: Any, **kwargs: Any) -> None:
    if isinstance(parameters, Iterable) and not isinstance(parameters, torch.Tensor):
        parameters = list(parameters)  # a generator from the public spelling: read twice
    if not _mid_cycle(parameters):
        _original_clip_grads_with_norm(parameters, *args, **kwargs)


def _clip_grad_value_(parameters: Any, *args: Any, **kwargs: Any) -> None:
    if isinstance(parameters, Iterable) and not isinstance(parameters, torch.Tensor):
        parameters = list(parameters)  # read twice: once here, once by torch
    if not _mid_cycle(parameters):
        _original_clip_grad_value(parameters, *args, **kwargs)


def _gate_clipping() -> bool:
    """`clip_grad_norm_` calls the module-global `_clip_grads_with_norm_` of
    `torch.nn.utils.clip_grad`, so wrapping that global reaches every spelling of it. True when
    this call installed the gates (`_ungate_clipping` undoes it)."""
    if clip_grad._clip_grads_with_norm_ is _clip_grads_with_norm_:
        return False
    clip_grad._clip_grads_with_norm_ = _clip_grads_with_norm_
    clip_grad.clip_grad_value_ = _clip_grad_value_
    torch.nn.utils.clip_grad_value_ = _clip_grad_value_
    if _original_public_clip_grads_with_norm is not None:
        torch.nn.utils.clip_grads_with_norm_ = _clip_grads_with_norm_
    return True


def _ungate_clipping() -> None:
    clip_grad._clip_grads_with_norm_ = _original_clip_grads_with_norm
    clip_grad.clip_grad_value_ = _original_clip_grad_value
    torch.nn.utils.clip_grad_value_ = _original_clip_grad_value
    if _original_public_clip_grads_with_norm is not None:
        torch.nn.utils.clip_grads_with_norm_ = _original_public_clip_grads_with_norm


def _scheduler_classes() -> list[type]:
    """torch's LR schedulers and every subclass defined so far that has a `step` of its own."""
    found, stack = [], [LRScheduler, ReduceLROnPlateau]
    while stack:
        cls = stack.pop()
        if "step" in vars(cls) and cls not in found:
            found.append(cls)
        stack.extend(cls.__subclasses__())
    return found


_original_scheduler_steps: dict[type, Callable[..., Any]] = {}


def _gated_scheduler_step(step: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(step)
    def scheduler_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        acc = getattr(getattr(self, "optimizer", None), ACCUMULATOR_ATTR, None)
        if acc is not None and not acc.at_cycle_start:
            return None  # mid-batch: the optimizer has not stepped for this batch yet
        return step(self, *args, **kwargs)

    return scheduler_step


def _gate_schedulers() -> list[type]:
    """Under `accumulate="auto"` the loop sees micro-batches, so a scheduler stepped per
    iteration would step several times per batch: `step()` of every LR scheduler class acts
    only between batches (at the start of a cycle) when its optimizer is split by autoopt. Returns
    the classes this call gated (`_ungate_schedulers` undoes it)."""
    new = [cls for cls in _scheduler_classes() if cls not in _original_scheduler_steps]
    for cls in new:
        _original_scheduler_steps[cls] = vars(cls)["step"]
        cls.step = _gated_scheduler_step(vars(cls)["step"])  # type: ignore[attr-defined]
    return new


def _ungate_schedulers(classes: list[type]) -> None:
    for cls in classes:
        cls.step = _original_scheduler_steps.pop(cls)  # type: ignore[attr-defined]


def _finalize(ctx: Context, *, acc: accumulator.Accumulator) -> None:
    """After the DDP wrap: gate the wrapper's zero_grad and control its gradient sync."""
    returned = ctx.returned_model
    if returned is None or returned is ctx.model:
        return
    _gate_module_zero_grad(returned, acc)
    if isinstance(returned, nn.parallel.DistributedDataParallel):
        # DDP reads this flag in its own forward, so it must be set before that runs: a
        # forward pre-hook on the DDP module (the inner forward layers run too late).
        returned.register_forward_pre_hook(SyncOnLastMicroStep(acc))


@dataclass
class SyncOnLastMicroStep:
    """DDP forward pre-hook: all-reduce gradients in the last micro-batch's backward only, as
    `no_sync()` around the others would."""

    acc: accumulator.Accumulator

    def __call__(self, module: nn.Module, args: Any) -> None:
        if torch.is_grad_enabled():
            module.require_backward_grad_sync = self.acc.at_last_micro_step


def __getattr__(name: str) -> Any:
    from autoopt.runtime import moved

    return moved.moved_name(__name__, name)
