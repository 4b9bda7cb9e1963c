"""The loss tuning trains with. autoopt does not see the user's loss function, so it is inferred:
a `loss` the model returns (Hugging Face style), else cross entropy when the batch's target is an
integer class tensor that fits the output, else MSE when it is a float tensor of the output's
shape, else a surrogate (mean of squares of the floating outputs)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.nn import functional as F

from autoopt.runtime.loading.batch import tensors_in

LossFn = Callable[[Any, Any], torch.Tensor]


def infer_loss(outputs: Any, target: Any) -> torch.Tensor:
    """The loss of `outputs` against `target`, as the module docstring describes."""
    own = outputs.get("loss") if isinstance(outputs, Mapping) else getattr(outputs, "loss", None)
    if isinstance(own, torch.Tensor) and own.numel() == 1:
        return own.float()
    floats = floating_tensors(outputs)
    if not floats:
        raise ValueError("the model returned no floating-point tensor to train on")
    out = floats[0].float()
    if isinstance(target, torch.Tensor):
        if not target.is_floating_point() and not target.is_complex() and out.ndim >= 2:
            if out.shape[:-1] == target.shape:  # (..., classes) logits, e.g. a language model
                return F.cross_entropy(out.flatten(0, -2), target.flatten().long())
            if out.shape[0] == target.shape[0] and out.shape[2:] == target.shape[1:]:
                return F.cross_entropy(out, target.long())  # (N, C, ...) as torch expects
        if target.is_floating_point() and target.shape == out.shape:
            return F.mse_loss(out, target.float())
    return sum((t.float().square().mean() for t in floats), torch.zeros((), device=out.device))


def model_inputs(batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """What the model is called with: a tensor as is, the first item of an (x, y, ...) tuple or
    list, a dict's items as keyword arguments (the Hugging Face convention)."""
    if isinstance(batch, Mapping):
        return (), dict(batch)
    if isinstance(batch, list | tuple) and not hasattr(batch, "_fields") and batch:
        return (batch[0],), {}
    return (batch,), {}


def target_of(batch: Any) -> Any:
    """The second item of an (x, y, ...) batch, else None."""
    if isinstance(batch, list | tuple) and not hasattr(batch, "_fields") and len(batch) >= 2:
        return batch[1]
    return None


def floating_tensors(outputs: Any) -> list[torch.Tensor]:
    """The floating-point tensors inside `outputs`, in order."""
    return [t for t in tensors_in(outputs) if t.is_floating_point()]
