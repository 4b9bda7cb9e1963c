"""Scaling a gradient on its way back through the graph, without touching the forward value."""

from __future__ import annotations

from typing import Any

import torch

from autoopt.runtime.batch import map_tensors


class ScaleGradient(torch.autograd.Function):
    """Identity forward; backward multiplies the incoming gradient by `factor` (a float or a
    0-d tensor read at backward time, so a scale that changes between steps needs no re-wrap)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, factor: Any) -> torch.Tensor:
        ctx.factor = factor
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        factor = ctx.factor() if callable(ctx.factor) else ctx.factor
        if isinstance(factor, torch.Tensor):
            return grad * factor.to(grad.dtype), None
        return grad * factor, None


def scale_output_gradients(outputs: Any, factor: Any) -> Any:
    """Wrap every floating tensor in `outputs` that requires grad so its gradient is scaled."""

    def wrap(t: torch.Tensor) -> torch.Tensor:
        if t.requires_grad and t.is_floating_point():
            return ScaleGradient.apply(t, factor)
        return t

    if not torch.is_grad_enabled():
        return outputs
    return map_tensors(outputs, wrap)
