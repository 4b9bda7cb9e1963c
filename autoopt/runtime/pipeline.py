"""The pass loop: check the arguments, run every pass, install what they registered; all or
nothing. `optimize()` and `tune` (on its copies) both call `prepare()`.

All or nothing: every argument is checked before anything changes, and if a pass or the
install fails anyway, the model, the optimizer and the global settings a pass recorded in
`ctx.undo` are put back as they were given (so calling again works and stacks nothing). The
loader is never changed in place: the loader pass builds a new one."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import nn

from autoopt.runtime import forward, pickling
from autoopt.runtime.compiling import cache as compile_cache
from autoopt.runtime.context import Context
from autoopt.runtime.options import Options
from autoopt.runtime.passes import PASSES
from autoopt.runtime.report import PassResult
from autoopt.runtime.trials import choices
from autoopt.runtime.trials.record import TrialRecord

APPLIED_ATTR = "_autoopt_report"  # the report, on every model optimize() returned


def validate(model: Any, loader: Any, optimizer: Any) -> None:
    """Raise TypeError/ValueError for arguments `optimize()` cannot take, changing nothing."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"optimize(model=...) needs a torch.nn.Module, got {type(model).__name__}")
    if hasattr(model, APPLIED_ATTR):
        raise ValueError(
            "optimize() was already applied to this model; call it once, on the plain model"
        )
    # Patched twice, a forward would autocast inside autocast and a step chain would call itself.
    inner = next((name for name, m in model.named_modules() if hasattr(m, APPLIED_ATTR)), None)
    if inner is not None:
        raise ValueError(
            f"optimize() was already applied to the submodule {inner!r} of this model, and "
            "patched it in place; call optimize() once per module: either optimize the parts "
            "separately and train them as they are, or build the container from plain modules "
            "(not ones optimize() returned) and optimize only the container"
        )
    # Not `iter(loader)`: on a DataLoader with workers that would start the worker processes.
    if loader is not None and not (hasattr(loader, "__iter__") or hasattr(loader, "__getitem__")):
        raise TypeError(
            f"optimize(loader=...) needs an iterable of batches (a DataLoader, a list of "
            f"batches, ...), got {type(loader).__name__}"
        )
    if optimizer is None:
        return
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimize(optimizer=...) needs a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    if forward._STEP_CHAIN in optimizer.__dict__:  # what compose_step installs
        raise ValueError(
            "this optimizer was already given to optimize(), which patched its step() in place; "
            "give each optimizer to optimize() once: build a new optimizer over this model's "
            "parameters (e.g. type(optimizer)(model.parameters(), **optimizer.defaults)), or "
            "optimize once a model holding every module the optimizer trains"
        )
    model_params = {id(p) for p in model.parameters()}
    foreign = [
        p for group in optimizer.param_groups for p in group["params"] if id(p) not in model_params
    ]
    if foreign:
        raise ValueError(
            f"the optimizer holds {len(foreign)} tensor(s) that are not parameters of the model; "
            "pass the optimizer built over model.parameters()"
        )


def prepare(
    model: nn.Module,
    loader: Any,
    optimizer: torch.optim.Optimizer | None,
    options: Options,
    first: PassResult | None = None,
) -> Context:
    """Validate, run every pass and install the result on `model` and `optimizer`.

    Returns the context: `ctx.returned_model` (or `ctx.model`), `ctx.loader` and
    `ctx.optimizer` are what the training loop uses; `ctx.report` says what was done. `first`
    is put at the top of the report (tune's decision). On any error nothing stays changed."""
    validate(model, loader, optimizer)
    ctx = Context(options=options, model=model, loader=loader, optimizer=optimizer)
    if first is not None:
        ctx.report.add(first)
    saved = _Saved(model, optimizer)
    try:
        for run_pass in PASSES:
            result = run_pass(ctx)
            if result is not None:
                ctx.report.add(result)
        measured = ctx.extras.get(choices.EXTRA)
        if measured is not None:  # the trials' schedule, cost and the run they must pay within
            if ctx.loader is not None:
                measured.run_length = choices.LoaderLength(ctx.loader)
            directory = compile_cache.cache_dir(options.compile_cache)
            if directory is not None and ctx.dist is None:  # what an earlier run decided here
                measured.record = TrialRecord(directory, _trials_key(model, measured))
            ctx.report.add(measured.pending())
        forward.install(ctx)
    except BaseException:
        saved.restore()
        for undo in reversed(ctx.undo):
            undo()
        raise
    object.__setattr__(model, APPLIED_ATTR, ctx.report)
    returned = ctx.returned_model
    if returned is not None and returned is not model:
        object.__setattr__(returned, APPLIED_ATTR, ctx.report)
    # A pickle (torch.save) of the model holds none of the above; a deep copy keeps it all.
    pickling.install(model, returned)
    return ctx


def _trials_key(model: nn.Module, measured: choices.Trials) -> str:
    """The name of the model's trial record: its structure, torch and the hardware (the
    compile cache's key), and the choices with their options."""
    asked = " ".join(f"{c.name}:{'/'.join(sorted(c.options))}" for c in measured.choices)
    return compile_cache.key(model, (), {}, f"trials {asked}")


class _Saved:
    """The model's and optimizer's attributes, hooks, parameters and state, to put back.

    Shallow: it keeps the objects and the contents of their dicts and lists (cheap), which is
    what the passes change: attributes set on modules, `param.data` swapped by `module.to()`,
    hooks registered, param-group flags, optimizer state replaced by a reload."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self.dicts = [_DictContents(m.__dict__) for m in model.modules()]
        self.params = [
            (p, p.data, p.grad, p.grad.data if p.grad is not None else None, p._backward_hooks)
            for m in model.modules()
            for p in m._parameters.values()
            if p is not None
        ]
        self.hooks = [
            (p._backward_hooks, OrderedDict(p._backward_hooks))
            for p, *_ in self.params
            if p._backward_hooks is not None
        ]
        if optimizer is not None:  # its __dict__ holds `defaults`, `state` and the group list
            self.dicts.append(_DictContents(optimizer.__dict__))
            self.dicts.extend(_DictContents(g) for g in optimizer.param_groups)

    def restore(self) -> None:
        """Put everything back as it was when this was taken."""
        for saved in self.dicts:
            saved.restore()
        with torch.no_grad():
            for param, data, grad, grad_data, hooks in self.params:
                param.data = data
                if grad is not None:
                    grad.data = grad_data
                param.grad = grad
                param._backward_hooks = hooks
        for hooks, contents in self.hooks:
            hooks.clear()
            hooks.update(contents)


class _DictContents:
    """A dict's items, and the contents of the dicts and lists among its values."""

    def __init__(self, d: dict[str, Any]) -> None:
        self.d = d
        self.items = dict(d)
        self.inner = {
            k: dict(v) if isinstance(v, dict) else list(v)
            for k, v in d.items()
            if isinstance(v, dict | list)
        }

    def restore(self) -> None:
        self.d.clear()
        self.d.update(self.items)
        for key, contents in self.inner.items():
            value = self.items[key]
            value.clear()
            if isinstance(value, dict):
                value.update(contents)
            else:
                value.extend(contents)
