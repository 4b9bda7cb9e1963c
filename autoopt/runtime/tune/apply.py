"""The one place tuning runs the passes (`pipeline.prepare`, what `optimize()` runs): on copies
of the model and optimizer, to apply a candidate's options, and reads what they reported. It
does not import `optimize`, which imports tune."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from autoopt.runtime import pipeline
from autoopt.runtime.options import Options
from autoopt.runtime.report import Report, Status


def optimize_copy(
    model: nn.Module,
    batches: list[Any],
    optimizer: Any,
    options: Options,
    searched: dict[str, Any],
) -> tuple[nn.Module, list[Any], Any]:
    """The passes on `model`/`optimizer` (copies the caller owns) with the user's options and
    the `searched` ones; returns (model, batches on the device, optimizer)."""
    options = dataclasses.replace(options, **searched, distributed=False, verbose=False, tune=False)
    if options.accumulate == "auto":  # the trial batches are timed whole, not split
        options = dataclasses.replace(options, accumulate=1)
    # A list of batches is a loader the passes wrap; it yields them moved and converted.
    ctx = pipeline.prepare(model, list(batches), optimizer, options)
    returned = ctx.returned_model if ctx.returned_model is not None else ctx.model
    return returned, list(ctx.loader), ctx.optimizer


def failed_passes(model: nn.Module) -> str:
    """The passes run on `model` that failed and fell back, or "" (also for a model that did
    not go through the passes: a custom Plan)."""
    report: Report | None = getattr(model, pipeline.APPLIED_ATTR, None)
    results = report.results if report is not None else []
    return "; ".join(f"{r.name} failed ({r.detail})" for r in results if r.status is Status.FAILED)
