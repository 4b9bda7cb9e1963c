"""Pass: backends. cuDNN/TF32 flags on CUDA, and the fused (else foreach) optimizer step.

CUDA: `cudnn.benchmark=True` and TF32 matmul/convolutions (Ampere+), unless `deterministic=True`,
which sets `cudnn.deterministic=True, benchmark=False` instead.

Optimizer: torch's default step on CPU is a Python loop over tensors. Measured on this project's
CPU (1 thread, ~300k params in 32 tensors, per step): AdamW 1563 us default, 1154 us foreach,
367 us fused; Adam 2279 / 1112 / 353 us; SGD(momentum) 375 / 305 / 158 us. So fused is chosen on
CPU as on CUDA, wherever this torch has it for the optimizer class on that device; else foreach
(on CPU torch runs foreach as a per-tensor fallback, which still beat the default loop).
Support is probed by building and stepping a throwaway optimizer of the same class, which covers
every version- and device-specific check torch makes. The user's param groups and their options
stay as they are; only `fused`/`foreach` change. An explicit `fused=`/`foreach=` is respected.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

from autoopt.runtime import hardware
from autoopt.runtime.context import Context
from autoopt.runtime.report import PassResult

NAME = "backends"


def run(ctx: Context) -> PassResult:
    """Set the backend flags and pick the optimizer implementation."""
    device = ctx.device if ctx.device is not None else torch.device("cpu")
    notes = [_flags(device, ctx.options.deterministic)]
    applied = device.type == "cuda" or ctx.options.deterministic
    if ctx.optimizer is None:
        notes.append("no optimizer given")
    else:
        did, note = _optimizer_impl(ctx.optimizer, device)
        applied = applied or did
        notes.append(note)
    detail = "; ".join(n for n in notes if n)
    return PassResult.applied(NAME, detail) if applied else PassResult.skipped(NAME, detail)


def _flags(device: torch.device, deterministic: bool) -> str:
    if deterministic:
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        return "deterministic=True: cudnn.deterministic=True, cudnn.benchmark=False, no TF32"
    if device.type != "cuda":
        return f"no cuDNN/TF32 flags on {device.type}"
    torch.backends.cudnn.benchmark = True
    if not hardware.cuda_supports_tf32(device):
        return "cudnn.benchmark=True (no TF32 before compute capability 8.0)"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    return "cudnn.benchmark=True, TF32 matmul and convolutions"


def _optimizer_impl(optimizer: torch.optim.Optimizer, device: torch.device) -> tuple[bool, str]:
    cls = type(optimizer)
    accepted = inspect.signature(cls.__init__).parameters
    groups = optimizer.param_groups
    if any(g.get("fused") is not None or g.get("foreach") is not None for g in groups):
        return False, f"{cls.__name__} sets fused/foreach explicitly: kept"
    if any(g.get("differentiable") for g in groups):
        return False, f"{cls.__name__} is differentiable: kept the default step"
    params = [p for g in groups for p in g["params"]]
    same_place = all(p.is_floating_point() and p.device == device for p in params)
    fused_ok = (
        "fused" in accepted
        and device.type in _get_fused_kernels_supported_devices()
        and same_place
        and not optimizer.state  # fused wants its `step` state on the device; none exists yet
        and _probe(optimizer, device, fused=True, foreach=False)
    )
    if fused_ok:
        _set(optimizer, fused=True, foreach=False)
        why = " (the default step on CPU is a loop over tensors)" if device.type == "cpu" else ""
        return True, f"fused {cls.__name__} step{why}"
    # Not limited to `_get_foreach_kernels_supported_devices()`: on CPU the foreach ops run as a
    # per-tensor fallback that still beat the default step here (see the module docstring).
    foreach_ok = "foreach" in accepted and same_place and _probe(optimizer, device, foreach=True)
    if foreach_ok:
        _set(optimizer, foreach=True)
        return True, f"foreach {cls.__name__} step (no fused kernel for it here)"
    return False, f"{cls.__name__}: no fused or foreach step available here"


def _probe(optimizer: torch.optim.Optimizer, device: torch.device, **flags: Any) -> bool:
    """Can this optimizer class, with the user's defaults, build and step with `flags`?"""
    dtype = next((p.dtype for g in optimizer.param_groups for p in g["params"]), torch.float32)
    accepted = inspect.signature(type(optimizer).__init__).parameters
    options = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    options.update(flags)
    param = torch.zeros(2, device=device, dtype=dtype, requires_grad=True)
    param.grad = torch.ones_like(param)
    try:
        probe = type(optimizer)([param], **options)
        # Flags a fused optimizer sets in __init__ and its step() reads (read before stepping).
        attrs = {
            a: getattr(probe, a)
            for a in ("_step_supports_amp_scaling", "_need_device_dtype_check_for_fused")
            if hasattr(probe, a)
        }
        probe.step()
    except Exception:  # noqa: BLE001 - any refusal means "not supported here"
        return False
    for attr, value in attrs.items():
        setattr(optimizer, attr, value)
    return True


def _set(optimizer: torch.optim.Optimizer, **flags: Any) -> None:
    optimizer.defaults.update(flags)
    for group in optimizer.param_groups:
        group.update(flags)
