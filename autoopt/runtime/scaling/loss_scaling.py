"""Dynamic loss scaling for fp16 that needs no change to the user's training loop.

`torch.amp.GradScaler` asks the user to write `scaler.scale(loss).backward()`,
`scaler.unscale_(opt)` before clipping, `scaler.step(opt)` and `scaler.update()`. Here the same
arithmetic happens inside the objects the user already calls:

* every backward that reaches the model's parameters is seeded with the current scale at its
  root, and every gradient is multiplied by `1/scale` just before it is accumulated into `.grad`
  (see `root_scaling`). The scale is a power of two, so this unscaling is exact: `.grad` holds
  true-scale gradients after every `backward()`, whatever path they took, and
  `clip_grad_norm_` after `backward()` sees them;
* `optimizer.step()` first checks every gradient for inf/nan in one foreach kernel (the one
  GradScaler uses), skips the update when any is non-finite (parameters untouched), and updates
  the scale as GradScaler does (x0.5 on overflow, x2 after 2000 clean steps).

When the loop brings its own autocast or GradScaler, the scaler stands down (`user_amp`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch import nn

from autoopt.runtime.scaling.user_amp import UserAmp

_ATTR = "_autoopt_loss_scaler"
# The ids of the optimizers inside `LossScaler.step` now: the global step hooks for optimizers
# built later (`later_optimizers`) leave them to it.
stepping: set[int] = set()


class LossScaler:
    """The scale and growth tracker of one model, and the inf/nan check of its optimizer step.
    Defaults are GradScaler's. Holds only tensors and numbers: copies and pickles with the model."""

    def __init__(
        self,
        device: torch.device,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        user_amp: UserAmp | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        # 0-d tensors updated in place, so hooks created once always read the current value.
        self._scale = torch.full((), init_scale, dtype=torch.float32, device=self.device)
        self._growth_tracker = torch.zeros((), dtype=torch.int32, device=self.device)
        self._one: dict[torch.device, torch.Tensor] = {}
        # Set when the loop turns out to bring its own autocast/GradScaler: then it scales nothing.
        self.user_amp = user_amp if user_amp is not None else UserAmp()
        self.steps = 0  # optimizer steps taken
        self.skipped_steps = 0  # optimizer steps skipped because a gradient was inf/nan

    @property
    def scale(self) -> float:
        """The current loss scale (a host sync; for logging and tests)."""
        return float(self._scale.item())

    def found_nonfinite(self, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """A 1-element float tensor on the scaler's device: 1.0 if any gradient is inf/nan.

        `_amp_foreach_non_finite_check_and_unscale_` with `inv_scale=1` is GradScaler's own check
        (one kernel per device and dtype); the gradients are already unscaled at accumulation."""
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
        for group in optimizer.param_groups:
            for param in group["params"]:
                grad = param.grad
                if grad is None:
                    continue
                if grad.is_sparse:
                    grad = grad._values()
                groups[(grad.device, grad.dtype)].append(grad)
        found = torch.zeros(1, dtype=torch.float32, device=self.device)
        for (device, _), grads in groups.items():
            one = self._one.get(device)
            if one is None:
                one = self._one[device] = torch.ones((), dtype=torch.float32, device=device)
            here = found if device == self.device else torch.zeros(1, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(grads, here, one)
            if here is not found:
                found += here.to(self.device)
        return found

    def update(self, found: torch.Tensor) -> None:
        """Back off after a non-finite step, grow after `growth_interval` clean ones."""
        torch._amp_update_scale_(
            self._scale,
            self._growth_tracker,
            found,
            self.growth_factor,
            self.backoff_factor,
            self.growth_interval,
        )

    def step(self, optimizer: torch.optim.Optimizer, step: Any) -> Any:
        """Run `step()` unless a gradient is non-finite, then update the scale."""
        if self.user_amp.reason is not None:  # the user's own GradScaler does this part
            return step()
        found = self.found_nonfinite(optimizer)
        if found.item():  # one host sync per step, as GradScaler.step has
            self.skipped_steps += 1
            result = None
        else:
            self.steps += 1
            stepping.add(id(optimizer))
            try:
                result = step()
            finally:
                stepping.discard(id(optimizer))
        self.update(found)
        return result

    def state_dict(self) -> dict[str, Any]:
        """For checkpoints: resume with the scale training had reached."""
        return {
            "scale": self.scale,
            "growth_tracker": int(self._growth_tracker.item()),
            "steps": self.steps,
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict()` returned."""
        self._scale.fill_(state["scale"])
        self._growth_tracker.fill_(state["growth_tracker"])
        self.steps = state.get("steps", 0)
        self.skipped_steps = state.get("skipped_steps", 0)

    def __repr__(self) -> str:
        return (
            f"LossScaler(scale={self.scale}, steps={self.steps}, "
            f"skipped_steps={self.skipped_steps})"
        )


def install(model: nn.Module, scaler: LossScaler) -> None:
    """Remember `scaler` on the model so `scaler_of` finds it."""
    object.__setattr__(model, _ATTR, scaler)


def scaler_of(model: nn.Module) -> LossScaler:
    """The loss scaler `optimize(amp="fp16")` attached to this model (or its DDP wrapper)."""
    while isinstance(model, nn.parallel.DistributedDataParallel | nn.DataParallel):
        model = model.module
    scaler = getattr(model, _ATTR, None)
    if scaler is None:
        raise ValueError(
            "this model has no loss scaler: it was not returned by optimize(), or amp is not "
            "fp16 (see autoopt.report(model))"
        )
    return scaler
