"""Pass: backends. cuDNN/TF32 flags on CUDA, and the fused (else foreach) optimizer step.

CUDA: `cudnn.benchmark=True` and TF32 matmul/convolutions (Ampere+), unless `deterministic=True`,
which sets `cudnn.deterministic=True, benchmark=False` instead.

Optimizer: torch's default step on CPU is a Python loop over tensors; the fused step does the
whole update in one kernel and foreach in a few, both faster (figures in
docs/benchmarks/optimizer-step.md). So fused is chosen on CPU as on CUDA, wherever this torch
has it for the optimizer class on that device; else foreach (on CPU torch runs foreach as a
per-tensor fallback, which is still faster than the default loop).
Support is probed by building and stepping a throwaway optimizer of the same class, which covers
every version- and device-specific check torch makes. The user's param groups and their options
stay as they are; only `fused`/`foreach` change. An explicit `fused=`/`foreach=` is respected.
`optimizer.state_dict()` still holds the user's own flags (see `optimizer_state`).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

from autoopt.runtime import hardware, optimizer_state
from autoopt.runtime.context import Context
from autoopt.runtime.report import PassResult

NAME = "backends"


@dataclass
class OptimizerImpl:
    """The step implementation chosen for an optimizer: the flags its param groups get, and the
    attributes a fused optimizer sets in `__init__` that its `step()` reads."""

    flags: dict[str, bool]
    attrs: dict[str, Any] = field(default_factory=dict)


def choose_flags(device: torch.device, deterministic: bool) -> tuple[dict[str, Any], str]:
    """The torch backend settings to make (name -> value), and why."""
    if deterministic:
        return {"cudnn.deterministic": True, "cudnn.benchmark": False}, (
            "deterministic=True: cudnn.deterministic=True, cudnn.benchmark=False, no TF32"
        )
    if device.type != "cuda":
        return {}, f"no cuDNN/TF32 flags on {device.type}"
    if not hardware.cuda_supports_tf32(device):
        return {
            "cudnn.benchmark": True
        }, "cudnn.benchmark=True (no TF32 before compute capability 8.0)"
    settings = {
        "cudnn.benchmark": True,
        "matmul.allow_tf32": True,
        "cudnn.allow_tf32": True,
        "float32_matmul_precision": "high",
    }
    return settings, "cudnn.benchmark=True, TF32 matmul and convolutions"


# The optimizers whose fused kernel has a DTensor sharding rule (torch's
# distributed/tensor/_ops/_pointwise_ops.py); any other fused step fails on FSDP2's parameters.
_FUSED_ON_DTENSOR = (torch.optim.Adam, torch.optim.AdamW)


def choose_optimizer(
    optimizer: torch.optim.Optimizer, device: torch.device, sharded: bool = False
) -> tuple[OptimizerImpl | None, str]:
    """Fused, else foreach, else the optimizer as it is (None), and why. `sharded`: the
    parameters become FSDP2 DTensors, whose fused step exists for `_FUSED_ON_DTENSOR` only."""
    cls = type(optimizer)
    accepted = inspect.signature(cls.__init__).parameters
    groups = optimizer.param_groups
    if any(g.get("fused") is not None or g.get("foreach") is not None for g in groups):
        return None, f"{cls.__name__} sets fused/foreach explicitly: kept"
    if any(g.get("differentiable") for g in groups):
        return None, f"{cls.__name__} is differentiable: kept the default step"
    params = [p for g in groups for p in g["params"]]
    same_place = all(p.is_floating_point() and p.device == device for p in params)
    if (
        "fused" in accepted
        and device.type in _get_fused_kernels_supported_devices()
        and same_place
        and (not sharded or cls in _FUSED_ON_DTENSOR)
        and not optimizer.state  # fused wants its `step` state on the device; none exists yet
        and (attrs := _probe(optimizer, device, fused=True, foreach=False)) is not None
    ):
        why = " (the default step on CPU is a loop over tensors)" if device.type == "cpu" else ""
        return OptimizerImpl({"fused": True, "foreach": False}, attrs), (
            f"fused {cls.__name__} step{why}"
        )
    # Not limited to `_get_foreach_kernels_supported_devices()`: on CPU the foreach ops run as a
    # per-tensor fallback that still beat the default step here (see the module docstring).
    if (
        "foreach" in accepted
        and same_place
        and (attrs := _probe(optimizer, device, foreach=True)) is not None
    ):
        why = (
            "its fused step has no DTensor rule for FSDP2"
            if sharded
            else "no fused kernel for it here"
        )
        return OptimizerImpl({"foreach": True}, attrs), f"foreach {cls.__name__} step ({why})"
    return None, f"{cls.__name__}: no fused or foreach step available here"


def run(ctx: Context) -> PassResult:
    """Set the backend flags and pick the optimizer implementation."""
    device = ctx.device if ctx.device is not None else torch.device("cpu")
    settings, note = choose_flags(device, ctx.options.deterministic)
    _apply_flags(ctx, settings)
    notes = [note]
    applied = bool(settings)
    if ctx.optimizer is None:
        notes.append("no optimizer given")
    else:
        sharded = ctx.dist is not None and ctx.dist.strategy == "fsdp"
        impl, note = choose_optimizer(ctx.optimizer, device, sharded)
        if impl is not None:
            _apply_optimizer(ctx.optimizer, impl)
            applied = True
        notes.append(note)
    detail = "; ".join(n for n in notes if n)
    return PassResult.applied(NAME, detail) if applied else PassResult.skipped(NAME, detail)


_SETTINGS = {
    "cudnn.deterministic": (torch.backends.cudnn, "deterministic"),
    "cudnn.benchmark": (torch.backends.cudnn, "benchmark"),
    "cudnn.allow_tf32": (torch.backends.cudnn, "allow_tf32"),
    "matmul.allow_tf32": (torch.backends.cuda.matmul, "allow_tf32"),
}


def _apply_flags(ctx: Context, settings: dict[str, Any]) -> None:
    """Make the settings; the previous values come back if optimize() fails later."""
    for name, value in settings.items():
        if name == "float32_matmul_precision":
            before = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision(value)
            ctx.undo.append(functools.partial(torch.set_float32_matmul_precision, before))
            continue
        owner, attr = _SETTINGS[name]
        ctx.undo.append(functools.partial(setattr, owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)


def _apply_optimizer(optimizer: torch.optim.Optimizer, impl: OptimizerImpl) -> None:
    user = {key: optimizer.defaults.get(key) for key in impl.flags}
    optimizer.defaults.update(impl.flags)
    for group in optimizer.param_groups:
        group.update(impl.flags)
    for attr, value in impl.attrs.items():
        setattr(optimizer, attr, value)
    optimizer_state.hide_flags(optimizer, user, impl.flags)


def _probe(
    optimizer: torch.optim.Optimizer, device: torch.device, **flags: Any
) -> dict[str, Any] | None:
    """Can this optimizer class, with the user's defaults, build and step with `flags`? The
    attributes a fused optimizer sets in `__init__` and its `step()` reads, or None."""
    dtype = next((p.dtype for g in optimizer.param_groups for p in g["params"]), torch.float32)
    accepted = inspect.signature(type(optimizer).__init__).parameters
    options = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    options.update(flags)
    param = torch.zeros(2, device=device, dtype=dtype, requires_grad=True)
    param.grad = torch.ones_like(param)
    try:
        probe = type(optimizer)([param], **options)
        attrs = {  # read before stepping
            a: getattr(probe, a)
            for a in ("_step_supports_amp_scaling", "_need_device_dtype_check_for_fused")
            if hasattr(probe, a)
        }
        probe.step()
    except Exception:  # noqa: BLE001 - any refusal means "not supported here"
        return None
    return attrs
