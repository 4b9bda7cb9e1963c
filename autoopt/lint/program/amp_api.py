"""What the lint knows about torch's own AMP calls: which `autocast` a call opens and in which
dtype, and the `GradScaler` spellings (AO204, AO205)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from autoopt.lint.tree.calls import arg, has_star_kwargs
from autoopt.lint.tree.nodes import string_value

if TYPE_CHECKING:
    from autoopt.lint.engine.rule import Rule

AUTOCAST = ("torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast")
CUDA_AUTOCAST = ("torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast")
GRAD_SCALER = (
    "torch.amp.GradScaler",
    "torch.amp.grad_scaler.GradScaler",
    "torch.cuda.amp.GradScaler",
    "torch.cuda.amp.grad_scaler.GradScaler",
)
_FP16 = frozenset({"torch.float16", "torch.half"})
_BF16 = frozenset({"torch.bfloat16"})


def is_autocast(rule: Rule, call: cst.Call) -> bool:
    """`call` opens torch's autocast (any spelling)."""
    return rule.is_call_to(call, *AUTOCAST, *CUDA_AUTOCAST)


def autocast_dtype(rule: Rule, call: cst.Call) -> str | None:
    """ "fp16", "bf16", "off" (enabled=False) or None (decided at run time: a variable, an
    expression, **kwargs) for an autocast call; CUDA's default dtype is fp16, the CPU's bf16."""
    if has_star_kwargs(call):
        return None
    cuda_only = rule.is_call_to(call, *CUDA_AUTOCAST)  # (enabled, dtype, ...) not (device, ...)
    enabled = arg(call, "enabled", 0 if cuda_only else 2)
    if enabled is not None:
        flag = enabled.value.value if isinstance(enabled.value, cst.Name) else None
        if flag == "False":
            return "off"
        if flag != "True":
            return None
    dtype = arg(call, "dtype", 1)
    if dtype is not None:
        names = rule.qualified_names(dtype.value)
        return "fp16" if names & _FP16 else "bf16" if names & _BF16 else None
    if cuda_only:
        return "fp16"
    device = arg(call, "device_type", 0)
    kind = string_value(device.value) if device is not None else None
    return {"cuda": "fp16", "cpu": "bf16"}.get(kind or "")
