"""Another mixed-precision system in a script: the one fact every precision trick must check.

A script that already trains in reduced precision its own way must not get torch autocast and a
`GradScaler` on top (two loss scalers, casts fighting casts), nor have `--wrap` hand it to
`autoopt.optimize()` with AMP: NVIDIA apex `amp.initialize`/`amp.scale_loss`, a hand-written
loss scale (fp16 master weights and `loss * loss_scale`), or models and inputs cast to
`.half()`/`.bfloat16()`/`.to(torch.float16)`. (torch's own `autocast`/`GradScaler` and the
libraries that set precision themselves, Accelerate and Lightning, are checked where they are
used: `handled.library_handles_precision`, AO201's own words.)

Plain syntax only (no metadata): rules and the `--wrap` planner both call it on a parsed module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from autoopt.lint.calls import arg, has_star_kwargs
from autoopt.lint.nodes import code_of, dotted, string_value, walk

if TYPE_CHECKING:
    from autoopt.lint.rule import Rule

# Text one of the systems below needs: files without any are not walked.
_MARKERS = ("apex", "amp.", "half", "bfloat16", "float16", "loss_scale", "scale_loss", "Half")
_HALF_METHODS = frozenset({"half", "bfloat16"})
_HALF_DTYPES = frozenset(
    {"torch.float16", "torch.half", "torch.bfloat16", "float16", "half", "bfloat16"}
)
_HALF_TENSOR_TYPES = ("HalfTensor", "BFloat16Tensor")
# Names a hand-written loss-scaling scheme keeps its scale (or master weights) in.
_SCALING_NAMES = ("loss_scale", "scale_loss", "dynamic_loss_scale", "master_params")
_APEX_AMP_CALLS = frozenset({"initialize", "scale_loss", "master_params"})


def other_precision_system(module: cst.Module, source: str | None = None) -> str | None:
    """What already runs this script in reduced precision ("apex amp (amp.initialize)", "a
    hand-written loss scale (loss_scale)", "the script casts to half precision (.half())"), or
    None. `source` (the module's text, when the caller has it) lets most files skip the walk."""
    text = source if source is not None else module.code
    if not any(marker in text for marker in _MARKERS):
        return None
    apex = "apex" in text
    for node in walk(module):
        kind = type(node)
        if kind is cst.ImportFrom and apex:
            if (dotted(node.module) or "").startswith("apex"):
                names = node.names
                if not isinstance(names, cst.ImportStar) and any(
                    code_of(a.name) in ("amp", "fp16_utils") for a in names
                ):
                    return "apex amp (from apex import amp)"
        elif kind is cst.Call:
            found = _precision_call(node, apex)
            if found is not None:
                return found
        elif kind is cst.Name and any(word in node.value for word in _SCALING_NAMES):
            return f"a hand-written loss scale ({node.value})"
    return None


def _precision_call(call: cst.Call, apex: bool) -> str | None:
    func = call.func
    if not isinstance(func, cst.Attribute):
        return None
    method = func.attr.value
    if apex and method in _APEX_AMP_CALLS and (dotted(func.value) or "").endswith("amp"):
        return f"apex amp (amp.{method})"
    if method in _HALF_METHODS and not call.args:
        return f"the script casts to half precision (.{method}())"
    if method in ("to", "type"):
        for a in call.args:
            if a.keyword is not None and a.keyword.value != "dtype":
                continue
            name = dotted(a.value) or ""
            if name in _HALF_DTYPES or name.endswith(_HALF_TENSOR_TYPES):
                return f"the script casts to half precision (.{method}({name}))"
    return None


# ----- torch's own AMP calls (AO204, AO205) ---------------------------------------------------
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
