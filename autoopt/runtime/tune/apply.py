"""The one place tuning calls `optimize()`: on copies of the model and optimizer, to apply a
candidate's options or to learn which options it chooses by default, and to read its report."""

from __future__ import annotations

from typing import Any

from torch import nn

from autoopt.runtime.options import Options
from autoopt.runtime.report import Status

# The options of the user's that a candidate holds (the searched ones come from the candidate).
_HELD = ("device", "checkpoint", "accumulate", "deterministic")


def optimize_copy(
    model: nn.Module,
    batches: list[Any],
    optimizer: Any,
    options: Options,
    searched: dict[str, Any],
) -> tuple[nn.Module, list[Any], Any]:
    """`optimize()` on `model`/`optimizer` (copies the caller owns) with the user's held options
    and the `searched` ones; returns (model, batches on the device, optimizer)."""
    from autoopt.runtime.optimize import optimize  # late: optimize imports tune

    kwargs: dict[str, Any] = {name: getattr(options, name) for name in _HELD}
    kwargs.update(searched)
    # A list of batches is a loader optimize() wraps; it yields them moved and converted.
    got = optimize(model, list(batches), optimizer, **kwargs, distributed=False, verbose=False)
    if optimizer is None:
        model, loader = got
    else:
        model, loader, optimizer = got
    return model, list(loader), optimizer


def failed_passes(model: nn.Module) -> str:
    """The passes of `model`'s optimize() that failed and fell back, or "" (also for a model
    that did not go through optimize(): a custom Plan)."""
    results = _results(model)
    return "; ".join(f"{r.name} failed ({r.detail})" for r in results if r.status is Status.FAILED)


def choices_made(model: nn.Module, options: Options) -> dict[str, Any] | None:
    """The values of the searched options that `model`'s optimize() ran with (its "auto"
    choices decided), read from its report; None when they cannot be told."""
    applied = {r.name: r for r in _results(model) if r.status is Status.APPLIED}
    amp = applied.get("amp")
    dtype = next((d for d in ("bf16", "fp16") if amp and amp.detail.startswith(d)), None)
    if amp is not None and dtype is None:
        return None
    compiled = "jit" if options.compile == "jit" else True
    return {
        "amp": dtype or False,
        "compile": compiled if "compile" in applied else False,
        "channels_last": "channels_last" in applied,
    }


def _results(model: nn.Module) -> list[Any]:
    from autoopt.runtime.optimize import report  # late: optimize imports tune

    try:
        return report(model).results
    except ValueError:
        return []
