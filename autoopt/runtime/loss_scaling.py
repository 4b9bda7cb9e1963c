"""Dynamic loss scaling for fp16 that needs no change to the user's training loop.

`torch.amp.GradScaler` asks the user to write `scaler.scale(loss).backward()`,
`scaler.unscale_(opt)` before clipping, `scaler.step(opt)` and `scaler.update()`. Here the same
arithmetic happens inside the objects the user already calls:

* the model's outputs carry a gradient hook that multiplies the incoming gradient by the current
  scale, so the whole backward through the fp16 graph runs scaled (small gradients survive);
* every trainable parameter has a tensor hook (it runs before the gradient is accumulated into
  `.grad`) that multiplies by `1/scale`. The scale is a power of two, so this unscaling is exact:
  `.grad` holds true-scale gradients after every `backward()`. Gradient accumulation over several
  `backward()` calls sums true gradients, and `clip_grad_norm_` after `backward()` sees them;
* `optimizer.step()` first checks every gradient for inf/nan in one foreach kernel (the one
  GradScaler uses), skips the update when any is non-finite (parameters untouched), and updates
  the scale as GradScaler does (x0.5 on overflow, x2 after 2000 clean steps).

Inputs that require grad get the same `1/scale` hook, so `x.grad` is at true scale too.

Limitation: a loss term computed from the parameters directly, not through the model's outputs
(e.g. `loss = loss_fn(model(x), y) + 1e-4 * sum(p.pow(2).sum() for p in model.parameters())`) is
not multiplied by the scale on the way back, yet its gradient still passes the parameter hooks,
so it arrives divided by the scale. Use the optimizer's `weight_decay` for such terms, or use
bf16 / `amp=False`. Parameters frozen at `optimize()` time and unfrozen later carry no hook.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from autoopt.runtime.grad_hooks import ScaleGradient, scale_output_gradients

_ATTR = "_autoopt_loss_scaler"


class LossScaler:
    """The scale, its growth tracker and the hooks of one model. Defaults are GradScaler's."""

    def __init__(
        self,
        device: torch.device,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ) -> None:
        self.device = torch.device(device)
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        # 0-d tensors updated in place, so hooks created once always read the current value.
        self._scale = torch.full((), init_scale, dtype=torch.float32, device=self.device)
        self._inv_scale = torch.reciprocal(self._scale)
        self._growth_tracker = torch.zeros((), dtype=torch.int32, device=self.device)
        self._one: dict[torch.device, torch.Tensor] = {}
        self._handles: list[RemovableHandle] = []
        self.steps = 0  # optimizer steps taken
        self.skipped_steps = 0  # optimizer steps skipped because a gradient was inf/nan

    @property
    def scale(self) -> float:
        """The current loss scale (a host sync; for logging and tests)."""
        return float(self._scale.item())

    def attach(self, model: nn.Module) -> int:
        """Register the `1/scale` hook on every trainable parameter; returns how many."""
        seen: set[int] = set()
        for param in model.parameters():
            if param.requires_grad and id(param) not in seen:  # tied weights: hook once
                seen.add(id(param))
                self._handles.append(param.register_hook(self._unscale))
        return len(seen)

    def detach(self) -> None:
        """Remove every hook this scaler registered."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _unscale(self, grad: torch.Tensor) -> torch.Tensor:
        return grad * self._inv_scale.to(grad.device)

    def scale_outputs(self, outputs: Any) -> Any:
        """Outputs whose gradient is multiplied by the current scale on the way back."""
        return scale_output_gradients(outputs, self._scale)

    def unscale_input(self, tensor: torch.Tensor) -> torch.Tensor:
        """An input that requires grad, so that its own `.grad` comes out at true scale."""
        if tensor.requires_grad and tensor.is_floating_point():
            return ScaleGradient.apply(tensor, self._inv_scale)
        return tensor

    def found_nonfinite(self, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """A 1-element float tensor on the scaler's device: 1.0 if any gradient is inf/nan.

        `_amp_foreach_non_finite_check_and_unscale_` with `inv_scale=1` is GradScaler's own check
        (one kernel per device and dtype); the gradients are already unscaled by the hooks."""
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
        torch.reciprocal(self._scale, out=self._inv_scale)

    def step(self, optimizer: torch.optim.Optimizer, step: Any) -> Any:
        """Run `step()` unless a gradient is non-finite, then update the scale."""
        found = self.found_nonfinite(optimizer)
        if found.item():  # one host sync per step, as GradScaler.step has
            self.skipped_steps += 1
            result = None
        else:
            self.steps += 1
            result = step()
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
        torch.reciprocal(self._scale, out=self._inv_scale)
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
