"""Noticing the user's own GradScaler at its first use, before the backward of the loss it scales:
`torch.amp.GradScaler.scale` is wrapped while a model with loss scaling or accumulation is
optimized. Its model's loss scaler then stands down (`user_amp`); under accumulation it is an
error (the scaler would unscale partial sums at every micro-batch)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from autoopt.runtime.scaling import root_scaling

_original_grad_scaler_scale = torch.amp.GradScaler.scale


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
