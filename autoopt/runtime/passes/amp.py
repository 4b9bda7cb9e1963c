"""Pass: amp. Autocast the forward in bf16 or fp16; floating outputs come back as fp32.

"auto" picks bf16 where the hardware computes it natively (CUDA compute capability >= 8.0, or a
CPU with AVX512-BF16/AMX: measured ~17x on a small CNN on this project's CPUs), else fp16 on
CUDA, else nothing: fp16 autocast on a CPU without native half math is slower than fp32.
Explicit "bf16"/"fp16" are honoured on any device autocast supports (fp16 on CPU is how the
fp16 path is tested without a GPU). fp16 adds dynamic loss scaling (see `loss_scaling`).
"""

from __future__ import annotations

from typing import Any

import torch

from autoopt.runtime import hardware, loss_scaling
from autoopt.runtime.batch import map_tensors
from autoopt.runtime.context import Context, Forward, ForwardLayer, Stage, StepLayer
from autoopt.runtime.report import PassResult

NAME = "amp"

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def run(ctx: Context) -> PassResult:
    """Decide the autocast dtype, register the autocast layer and, for fp16, loss scaling."""
    choice = ctx.options.amp
    if choice is False:
        return PassResult.skipped(NAME, "amp=False")
    device = ctx.device if ctx.device is not None else _model_device(ctx.model)
    if choice == "auto":
        dtype, why = _auto(ctx, device)
        if dtype is None:
            return PassResult.skipped(NAME, why)
    else:
        dtype, why = _DTYPES[choice], f"amp={choice!r}"
        if not torch.amp.is_autocast_available(device.type):
            return PassResult.skipped(NAME, f"autocast is not available on {device.type}")
    ctx.amp_dtype = dtype
    ctx.forward_layers.append(ForwardLayer(NAME, Stage.INNER, _autocast_layer(device.type, dtype)))
    name = "bf16" if dtype is torch.bfloat16 else "fp16"
    if dtype is not torch.float16:
        return PassResult.applied(NAME, f"{name} autocast: {why}")
    scaler = loss_scaling.LossScaler(device)
    hooked = scaler.attach(ctx.model)
    loss_scaling.install(ctx.model, scaler)
    ctx.extras["loss_scaler"] = scaler
    ctx.forward_layers.append(ForwardLayer("loss_scaling", Stage.OUTER, _scaling_layer(scaler)))
    if ctx.optimizer is not None:
        ctx.step_layers.append(StepLayer(NAME, _scaled_step(ctx.optimizer, scaler)))
        step_note = "optimizer.step() skips non-finite steps"
    else:
        step_note = "no optimizer given, so non-finite steps are not skipped"
    return PassResult.applied(
        NAME,
        f"fp16 autocast: {why}; dynamic loss scaling (init {scaler.scale:g}, "
        f"{hooked} parameter hooks; {step_note})",
    )


def _auto(ctx: Context, device: torch.device) -> tuple[torch.dtype | None, str]:
    floating = {p.dtype for p in ctx.model.parameters() if p.is_floating_point()}
    if floating and floating != {torch.float32}:
        shown = ", ".join(sorted(str(d).removeprefix("torch.") for d in floating))
        return None, f"the model's parameters are already {shown}, not float32"
    if device.type == "cuda":
        if hardware.cuda_supports_bf16(device):
            return torch.bfloat16, f"{torch.cuda.get_device_name(device)} has native bf16"
        return torch.float16, "this GPU has no native bf16 (compute capability < 8.0)"
    if device.type == "cpu":
        if hardware.cpu_supports_bf16():
            feats = hardware.cpu_features()
            has = "AMX" if feats.get("amx_tile") else "AVX512-BF16"
            return torch.bfloat16, f"CPU has {has}"
        return None, (
            "CPU has no native bf16 (AVX512-BF16/AMX) and fp16 autocast on CPU is slower than "
            "fp32; pass amp='bf16' to force it"
        )
    return None, f"no automatic choice for device type {device.type!r}; pass amp='bf16'/'fp16'"


def _model_device(model: torch.nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def _autocast_layer(device_type: str, dtype: torch.dtype) -> Any:
    def to_fp32(t: torch.Tensor) -> torch.Tensor:
        return t.float() if t.dtype == dtype else t

    def wrap(forward: Forward) -> Forward:
        def autocast_forward(*args: Any, **kwargs: Any) -> Any:
            with torch.autocast(device_type, dtype=dtype):
                out = forward(*args, **kwargs)
            if isinstance(out, torch.Tensor):  # the common case, without a container walk
                return to_fp32(out)
            return map_tensors(out, to_fp32)

        return autocast_forward

    return wrap


def _scaling_layer(scaler: loss_scaling.LossScaler) -> Any:
    def wrap(forward: Forward) -> Forward:
        def scaled_forward(*args: Any, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():
                return forward(*args, **kwargs)
            if _any_requires_grad(args, kwargs):
                args, kwargs = map_tensors((args, kwargs), scaler.unscale_input)
            return scaler.scale_outputs(forward(*args, **kwargs))

        return scaled_forward

    return wrap


def _any_requires_grad(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            if value.requires_grad:
                return True
        elif isinstance(value, list | tuple | dict) or hasattr(value, "__dataclass_fields__"):
            found = False

            def check(t: torch.Tensor) -> torch.Tensor:
                nonlocal found
                found = found or t.requires_grad
                return t

            map_tensors(value, check)
            if found:
                return True
    return False


def _scaled_step(optimizer: torch.optim.Optimizer, scaler: loss_scaling.LossScaler) -> Any:
    def wrap_step(step: Any) -> Any:
        def step_with_scaling(*args: Any, **kwargs: Any) -> Any:
            if args or kwargs:
                # A closure re-runs backward inside step(); gradients are unscaled by the hooks
                # already, but the inf check cannot run first, so hand it straight through.
                return step(*args, **kwargs)
            return scaler.step(optimizer, step)

        return step_with_scaling

    return wrap_step
