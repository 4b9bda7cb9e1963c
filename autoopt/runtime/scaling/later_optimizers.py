"""The fp16 step skip for optimizers that `optimize()` never saw.

The optimizer given to `optimize()` skips non-finite steps in its patched `step()` (`ScaledStep`).
An optimizer built afterwards over the same parameters (a second fine-tuning phase, a head
unfrozen later) would step on inf/nan gradients: one overflowing batch puts NaN in every parameter
it updates, where GradScaler would have skipped the step. So while a model has fp16 loss scaling,
torch's global optimizer-step hooks check every other optimizer that steps its parameters, as
`GradScaler.step` would: before its `step()`, GradScaler's inf/nan check over its gradients; on a
non-finite one the gradients are set aside for the duration of the call (torch's optimizers
update only parameters that have a gradient, so the step changes no parameter and no state) and
put back after it, and the scale is updated as after the patched step (x0.5 on overflow, growth
after `growth_interval` clean steps; one update per optimizer step, so two optimizers stepping
in one iteration update it twice). A step with a closure recomputes the gradients inside it:
it cannot be checked first and runs as it is, as with the patched step.
"""

from __future__ import annotations

from typing import Any

import torch

from autoopt.runtime.scaling import root_scaling
from autoopt.runtime.scaling.loss_scaling import LossScaler, stepping

# optimizer id -> (its scaler, what the check found, the gradients set aside when it found a
# non-finite one, else None): from the pre-hook to the post-hook of one step() call.
_open: dict[int, tuple[LossScaler, torch.Tensor, dict[torch.Tensor, torch.Tensor] | None]] = {}
_handles: list[Any] = []


def watch() -> None:
    """Install the global optimizer-step hooks (once per process; they do nothing while no
    model has fp16 loss scaling)."""
    if _handles:
        return
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    _handles.append(register_optimizer_step_pre_hook(_before_step))
    _handles.append(register_optimizer_step_post_hook(_after_step))


def scaler_for(optimizer: torch.optim.Optimizer) -> LossScaler | None:
    """The loss scaler in charge of the parameters `optimizer` steps, if any."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for reg in root_scaling.registration_of_params(params):
        scaler = reg.scaling()
        if scaler is not None:
            return scaler
    return None


def _before_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    # `args` starts with the optimizer itself; anything after it is a closure.
    if id(optimizer) in stepping or len(args) > 1 or kwargs:  # its patched step checks
        return
    scaler = scaler_for(optimizer)
    if scaler is None:
        return
    found = scaler.found_nonfinite(optimizer)
    aside: dict[torch.Tensor, torch.Tensor] | None = None
    if found.item():  # one host sync per step, as GradScaler.step has
        aside = {}
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    aside[param] = param.grad
                    param.grad = None
    _open[id(optimizer)] = (scaler, found, aside)


def _after_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    opened = _open.pop(id(optimizer), None)
    if opened is None:
        return
    scaler, found, aside = opened
    if aside is not None:
        for param, grad in aside.items():
            param.grad = grad
        scaler.skipped_steps += 1
    else:
        scaler.steps += 1
    scaler.update(found)
