"""Noticing the user's own AMP and stepping aside for it.

A loop that already runs its forward under `torch.autocast`, or scales its loss with a
`torch.amp.GradScaler` (`torch.cuda.amp.GradScaler` is a subclass), must not be autocast and
scaled a second time: that double scaling skips most steps. Detection happens before any damage:
autocast at the model's forward (`AutocastLayer`), a GradScaler when its `scale()` is called on a
loss whose graph reaches an optimized model (before that loss's backward runs).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch

from autoopt.runtime.report import PassResult, Report
from autoopt.runtime.scaling import root_scaling

_original_grad_scaler_scale = torch.amp.GradScaler.scale


class UserAmp:
    """Whether autoopt's AMP for one model stepped aside for the user's own, and why. Shared by
    the model's autocast layer and its loss scaler; `report` gets the reason."""

    def __init__(self, report: Report | None = None, pass_name: str = "amp") -> None:
        self.report = report
        self.pass_name = pass_name
        self.reason: str | None = None

    def stand_down(self, reason: str, own: bool = True) -> None:
        """Stop autocasting and scaling this model from now on; warn once and say why. `own`:
        for the user's own AMP (else for a case autoopt's AMP cannot verify)."""
        if self.reason is not None:
            return
        self.reason = reason
        warnings.warn(
            f"autoopt: {reason}, so autoopt's own autocast and loss scaling step aside",
            stacklevel=3,
        )
        if self.report is not None:
            why = "stood down for the user's own AMP" if own else "stood down"
            self.report.replace(PassResult.skipped(self.pass_name, f"{why}: {reason}"))


def watch_grad_scalers() -> bool:
    """Wrap `torch.amp.GradScaler.scale` (once) so a user's scaler is noticed at its first use.
    True when this call installed the wrapper (`unwatch_grad_scalers` undoes it)."""
    if torch.amp.GradScaler.scale is _scale:
        return False
    torch.amp.GradScaler.scale = _scale  # type: ignore[method-assign]
    return True


def unwatch_grad_scalers() -> None:
    """Put torch's own `GradScaler.scale` back."""
    torch.amp.GradScaler.scale = _original_grad_scaler_scale  # type: ignore[method-assign]


def _scale(self: torch.amp.GradScaler, outputs: Any) -> Any:
    if self.is_enabled():
        tensors = [outputs] if isinstance(outputs, torch.Tensor) else list(_flat(outputs))
        for reg in root_scaling.registrations_of(tensors):
            if reg.accumulator is not None:
                raise RuntimeError(
                    f"optimize(accumulate={reg.accumulator.option!r}) cannot be combined with a "
                    "GradScaler in the loop: scaler.step() unscales the partial sums at every "
                    "micro-batch. Drop the GradScaler (amp='fp16' scales the loss for you) or "
                    "accumulate by hand"
                )
            if reg.scaler is not None:
                reg.scaler.user_amp.stand_down("the loop scales its loss with its own GradScaler")
    return _original_grad_scaler_scale(self, outputs)


def _flat(outputs: Any) -> Iterable[torch.Tensor]:
    if isinstance(outputs, torch.Tensor):
        yield outputs
    elif isinstance(outputs, list | tuple):  # not a generator: GradScaler still has to read it
        for item in outputs:
            yield from _flat(item)
